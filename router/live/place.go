package live

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
	// Handle books the request on its worker: the face reports the
	// answer's first byte (FirstByte), its chunks (Answer) and its end
	// (Finish), which ends the handle exactly once.
	Handle *admission.Handle
	// Decision is the placement; Decision.Worker is the chosen worker.
	Decision router.Decision
	// URL is the chosen worker's engine base URL (Workers.URL), without a
	// trailing "/".
	URL string
	// PromptTokens is the prompt's length in tokens as it was routed (its
	// token ids, its model's tokenizer's count, or the character
	// estimate): the context tokens the face books at the end of an
	// answer whose tokens it did not see.
	PromptTokens int
	// Prefill is the prefill hop of a disaggregated request (Place walks
	// admission.Disaggregated for a model no aggregated worker serves);
	// nil for an aggregated one. Then Handle, Decision and URL are the
	// decode hop's.
	Prefill *PrefillHop

	start time.Time // the request's arrival (Place's start)
	label string    // the model's metrics label; "" before the body parsed
	meter Meter     // reads the answer; unused when refused (no Handle)
}

// Place does for one completion request what the HTTP face does before
// it sends the request's first hop (the aggregated role), and nothing
// more: it parses body, of schema api, with the intake's parser and bound, keys the prompt (Key: token ids,
// the model's tokenizer or character blocks), builds the request from
// header (X-Request-Id, else a generated id; X-Session-Id; the other
// headers but the credentials as Metadata), admits it with opts
// (admission.Exclude narrows the candidates) and waits for its placement
// while it is queued, up to ctx and the request timeout. The caller ends
// the handle (Finish).
//
// Errors: ErrBadRequest (wrapped, naming the field) for a body the HTTP
// face answers 400, a body over MaxBodyBytes included; the admission's
// errors (admission.ErrQueueFull, admission.ErrDue, shared.ErrNoWorkers,
// router.ErrAllExcluded, admission.ErrUnknownClass, *admission.ClassifyError,
// ...); ctx's error, or context.DeadlineExceeded when the request timeout
// passed while it was queued. The handle has ended on every error.
// A disaggregated model (Disaggregated) walks admission.Disaggregated
// instead: see placeDisaggregated.
//
// On an error the Placed has no Handle but can still be counted
// (Finish with the code the caller answers).
func (rt *Runtime) Place(ctx context.Context, api API, header http.Header, body []byte, opts ...admission.Option) (Placed, error) {
	start := time.Now()
	if int64(len(body)) > rt.maxBody {
		return Placed{start: start}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), rt.maxBody)
	}
	parsed, err := ParseRequest(body, api)
	if err != nil {
		return Placed{start: start}, err
	}
	label := rt.ModelLabel(parsed.Model)
	refused := Placed{start: start, label: label}
	ctx, cancel := context.WithTimeout(ctx, rt.timeout)
	defer cancel()
	req := &Request{Start: start, Model: parsed.Model, Stream: parsed.Stream, API: api, Label: label,
		ID: header.Get("X-Request-Id"), Session: header.Get("X-Session-Id"), Meta: RequestMetadata(header)}
	if req.ID == "" {
		req.ID = rt.NewID()
	}
	rt.Key(ctx, req, parsed.Key())
	if rt.Disaggregated(req.Model) {
		return rt.placeDisaggregated(ctx, req, refused, opts)
	}
	h, err := rt.Admit(ctx, req, admission.Aggregated.Hop(0), "#", opts...)
	if err != nil {
		return refused, err
	}
	d, err := h.Wait(ctx)
	if err != nil {
		rt.End(h, admission.Aborted("not placed: "+err.Error()))
		return refused, err
	}
	url, ok := rt.workers.URL(d.Worker.Name)
	if !ok {
		rt.End(h, admission.Aborted("worker unknown"))
		return refused, fmt.Errorf("live: placed on worker %q, which the workers do not know", d.Worker.Name)
	}
	p := refused
	p.Handle, p.Decision, p.URL, p.PromptTokens = h, d, url, req.Tokens
	p.meter = rt.Meter(h, d, req, true, 0)
	return p, nil
}

// Answer reads a chunk of p's answer as the HTTP face's proxy reads what
// it copies (Meter.Read): a stream's SSE events advance the request's
// progress, and a non-streamed answer's body (up to 1 MiB) and a stream's
// last chunk mentioning "usage" are kept for Finish. Linear in the chunk;
// call it with every chunk, in order.
func (rt *Runtime) Answer(p *Placed, chunk []byte) {
	if p.Handle != nil {
		p.meter.Read(chunk)
	}
}

// FirstByte records the first byte of p's answer as the HTTP face's proxy
// does (Meter.FirstByte): the handle's FirstToken and, for a streamed
// request, switchyard_time_to_first_token_seconds since Place began.
func (rt *Runtime) FirstByte(p *Placed) {
	if p.Handle != nil {
		rt.EndPrefill(p, true, "")
		p.meter.FirstByte()
	}
}

// Finish ends p's handle with o (End: the dispatcher wakes) and counts the
// request as the HTTP face counts its own (CountRequest): under the
// status code the client got (CodeClientGone when it left first), its
// duration since Place began. A Placed that Place refused (no Handle) is
// only counted: call Finish with the code the refusal was answered with.
//
// A disaggregated request's prefill hop still booked ends too, as
// EndPrefill(p, o.Completed, ...).
//
// A completed answer's usage that Answer saw is counted (Meter.Done), and
// the context tokens Meter.Done returns replace o's.
func (rt *Runtime) Finish(p *Placed, code int, o admission.Outcome) {
	if p.Handle != nil {
		rt.EndPrefill(p, o.Completed, "the decode hop ended before its answer's first byte")
		if o.Completed {
			o.ContextTokens = p.meter.Done()
		}
		rt.End(p.Handle, o)
	}
	rt.CountRequest(p.label, code, p.start)
}
