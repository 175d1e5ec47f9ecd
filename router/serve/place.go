package serve

import (
	"bytes"
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

	start     time.Time // the request's arrival (Place's start)
	id        string    // the request's id (logs)
	blockSize int       // the prompt's key block size (countBelief)
	chat      bool      // a chat request (checkPromptTokens)
	exact     bool      // PromptTokens counts the prompt's token ids (checkPromptTokens)
	label     string    // the model's metrics label; "" before the body parsed
	stream    bool      // the client asked for a streamed answer
	ans       answerSeen
}

// answerSeen is what Answer has seen of a Placed request's answer, as the
// API's proxy keeps it while it copies an answer: SSE events (about one
// token each), a non-streamed answer's body (at most maxUsageBody; over
// it, dropped) and a stream's last chunk mentioning its usage.
type answerSeen struct {
	events   int64
	last     byte
	kept     []byte
	over     bool
	streamed []byte
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
	refused := Placed{start: start, label: s.modelLabel(req.Model), stream: req.Stream, chat: chat}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ex := &exchange{ctx: ctx, start: start, body: body, model: req.Model, stream: req.Stream, chat: chat,
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
	p.Handle, p.Decision, p.URL, p.PromptTokens, p.id, p.blockSize = h, d, url, ex.tokens, ex.id, ex.blockSize
	p.exact = ex.ids != nil
	return p, nil
}

// Answer reads a chunk of p's answer as the API's proxy reads what it
// copies: a stream's SSE events advance the request's progress (prompt
// plus one token per event, admission.Handle.Progress); a non-streamed
// answer's body (up to 1 MiB) and a stream's last chunk mentioning
// "usage" are kept for Finish, which reads the engine's usage from them.
// Linear in the chunk; call it with every chunk, in order.
func (s *Server) Answer(p *Placed, chunk []byte) {
	if p.Handle == nil || len(chunk) == 0 {
		return
	}
	a := &p.ans
	before := a.events
	for _, c := range chunk {
		if c == '\n' && a.last == '\n' {
			a.events++
		}
		a.last = c
	}
	switch {
	case !p.stream:
		if !a.over && len(a.kept)+len(chunk) <= maxUsageBody {
			a.kept = append(a.kept, chunk...)
		} else {
			a.over, a.kept = true, nil
		}
	case s.met != nil && bytes.Contains(chunk, usageKey):
		a.streamed = append(a.streamed[:0], chunk...)
	}
	if p.stream && a.events > before {
		p.Handle.Progress(int64(p.PromptTokens) + a.events)
	}
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
//
// A completed answer's usage that Answer saw is counted as the API counts
// it (the token families, switchyard_prefix_belief_total,
// switchyard_prompt_token_match_total), and its
// total_tokens, else the prompt plus the stream's events, replace o's
// context tokens.
func (s *Server) Finish(p *Placed, code int, o admission.Outcome) {
	if p.Handle != nil {
		if o.Completed {
			o.ContextTokens = s.answered(p, o.ContextTokens)
		}
		s.End(p.Handle, o)
	}
	if s.met != nil {
		s.met.requests.WithLabelValues(p.label, strconv.Itoa(code)).Inc()
		s.met.duration.WithLabelValues(p.label).Observe(time.Since(p.start).Seconds())
	}
}

// answered counts the usage of p's completed answer and returns its
// context tokens: the usage's total_tokens, else the prompt plus a
// stream's events, else tokens.
func (s *Server) answered(p *Placed, tokens int64) int64 {
	a := &p.ans
	var u usage
	switch {
	case !p.stream && a.kept != nil:
		u = readUsage(a.kept)
	case a.streamed != nil:
		u = streamUsage(a.streamed)
	}
	s.countUsage(p.label, u)
	s.countBelief(&exchange{id: p.id, blockSize: p.blockSize}, p.Decision, u)
	s.checkPromptTokens(promptCount{label: p.label, id: p.id, worker: p.Decision.Worker.Name, chat: p.chat,
		exact: p.exact, tokens: p.PromptTokens}, u)
	switch {
	case u.total > 0 && !p.stream:
		return u.total
	case p.stream && a.events > 0:
		return int64(p.PromptTokens) + a.events
	}
	return tokens
}

// CodeClientGone is the status code Finish counts for a request whose
// client (or proxy) left before the answer's end, as the API counts it
// (nginx's 499).
const CodeClientGone = codeClientGone

// Workers returns the workers the Server resolves and reports on
// (Options.Workers).
func (s *Server) Workers() Workers { return s.workers }
