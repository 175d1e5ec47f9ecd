package serve

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
)

// Placed is a request Place placed on a worker.
type Placed struct {
	// Handle books the request on its worker: call FirstToken at the
	// answer's first byte and End exactly once (then Wake, so queued
	// requests are looked at), as the API's proxy does.
	Handle *admission.Handle
	// Decision is the placement; Decision.Worker is the chosen worker.
	Decision router.Decision
	// URL is the chosen worker's engine base URL (Workers.URL), without a
	// trailing "/".
	URL string
	// PromptTokens is the prompt's length in tokens as it was routed (its
	// token ids, its model's tokenizer's count, or the character
	// estimate): the context tokens the API books at the end of an answer
	// whose tokens it did not see.
	PromptTokens int
}

// Place does for one completion request what the API does before it sends
// the request's first hop (the aggregated role), and nothing more: it
// parses body with the API's parser and bound (chat: the chat schema,
// else the completions one), keys the prompt (token ids, the model's
// tokenizer or character blocks), builds the shared.Request from header
// (X-Request-Id, else a generated id; X-Session-Id; the other headers but
// the credentials as Metadata), admits it with opts (admission.Exclude
// narrows the candidates) and waits for its placement while it is queued,
// up to ctx and the request timeout. The caller ends the handle.
//
// Errors: ErrBadRequest (wrapped, naming the field) for a body the API
// answers 400, a body over MaxBodyBytes included; the admission's errors
// (admission.ErrQueueFull, admission.ErrDue, shared.ErrNoWorkers,
// router.ErrAllExcluded, admission.ErrUnknownClass, *admission.ClassifyError,
// ...); ctx's error, or context.DeadlineExceeded when the request timeout
// passed while it was queued. The handle has ended on every error.
// Disaggregated models are placed on the aggregated role too: Place does
// not walk a prefill/decode path.
func (s *Server) Place(ctx context.Context, chat bool, header http.Header, body []byte, opts ...admission.Option) (Placed, error) {
	if int64(len(body)) > s.maxBody {
		return Placed{}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), s.maxBody)
	}
	req, err := parseRequest(body, chat)
	if err != nil {
		return Placed{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ex := &exchange{ctx: ctx, start: time.Now(), body: body, model: req.Model, stream: req.Stream,
		id: header.Get("X-Request-Id"), session: header.Get("X-Session-Id"), meta: requestMetadata(header)}
	if ex.id == "" {
		ex.id = s.newID()
	}
	ex.label, ex.labelSet = s.modelLabel(ex.model), true
	s.routingHashes(ex, req.key())
	h, err := s.admitHop(ex, hopSpec{hop: admission.Aggregated.Hop(0), tag: "#"}, opts...)
	if err != nil {
		return Placed{}, err
	}
	d, err := h.Wait(ctx)
	if err != nil {
		s.End(h, admission.Aborted("not placed: "+err.Error()))
		return Placed{}, err
	}
	url, ok := s.workers.URL(d.Worker.Name)
	if !ok {
		s.End(h, admission.Aborted("worker unknown"))
		return Placed{}, fmt.Errorf("serve: placed on worker %q, which the workers do not know", d.Worker.Name)
	}
	return Placed{Handle: h, Decision: d, URL: url, PromptTokens: ex.tokens}, nil
}

// Workers returns the workers the Server resolves and reports on
// (Options.Workers).
func (s *Server) Workers() Workers { return s.workers }
