package serve

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
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

	start  time.Time // the request's arrival (Place's start)
	label  string    // the model's metrics label; "" before the body parsed
	stream bool      // the client asked for a streamed answer
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
//
// On an error the Placed has no Handle but can still be counted
// (Finish with the code the caller answers).
func (s *Server) Place(ctx context.Context, chat bool, header http.Header, body []byte, opts ...admission.Option) (Placed, error) {
	start := time.Now()
	if int64(len(body)) > s.maxBody {
		return Placed{start: start}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), s.maxBody)
	}
	req, err := parseRequest(body, chat)
	if err != nil {
		return Placed{start: start}, err
	}
	refused := Placed{start: start, label: s.modelLabel(req.Model), stream: req.Stream}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ex := &exchange{ctx: ctx, start: start, body: body, model: req.Model, stream: req.Stream,
		id: header.Get("X-Request-Id"), session: header.Get("X-Session-Id"), meta: requestMetadata(header)}
	if ex.id == "" {
		ex.id = s.newID()
	}
	ex.label, ex.labelSet = refused.label, true
	s.routingHashes(ex, req.key())
	h, err := s.admitHop(ex, hopSpec{hop: admission.Aggregated.Hop(0), tag: "#"}, opts...)
	if err != nil {
		return refused, err
	}
	d, err := h.Wait(ctx)
	if err != nil {
		s.End(h, admission.Aborted("not placed: "+err.Error()))
		return refused, err
	}
	url, ok := s.workers.URL(d.Worker.Name)
	if !ok {
		s.End(h, admission.Aborted("worker unknown"))
		return refused, fmt.Errorf("serve: placed on worker %q, which the workers do not know", d.Worker.Name)
	}
	p := refused
	p.Handle, p.Decision, p.URL, p.PromptTokens = h, d, url, ex.tokens
	return p, nil
}

// FirstByte records the first byte of p's answer as the API's proxy does:
// the handle's FirstToken (its prefill is done) and, for a streamed
// request, switchyard_time_to_first_token_seconds since Place began.
func (s *Server) FirstByte(p *Placed) {
	if p.Handle == nil {
		return
	}
	p.Handle.FirstToken()
	if s.met != nil && p.stream {
		s.met.ttft.WithLabelValues(p.label).Observe(time.Since(p.start).Seconds())
	}
}

// Finish ends p's handle with o (End: the dispatcher wakes) and counts the
// request as the API counts its own: switchyard_requests_total under the
// HTTP status code the client got (499 when it left first) and
// switchyard_request_duration_seconds since Place began. A Placed that
// Place refused (no Handle) is only counted: call Finish with the code
// the refusal was answered with.
func (s *Server) Finish(p *Placed, code int, o admission.Outcome) {
	if p.Handle != nil {
		s.End(p.Handle, o)
	}
	if s.met != nil {
		s.met.requests.WithLabelValues(p.label, strconv.Itoa(code)).Inc()
		s.met.duration.WithLabelValues(p.label).Observe(time.Since(p.start).Seconds())
	}
}

// CodeClientGone is the status code Finish counts for a request whose
// client (or proxy) left before the answer's end, as the API counts it
// (nginx's 499).
const CodeClientGone = codeClientGone

// Workers returns the workers the Server resolves and reports on
// (Options.Workers).
func (s *Server) Workers() Workers { return s.workers }
