package live

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// Placed is a request Place, PlaceUtility or PlaceStored placed on a
// worker.
type Placed struct {
	// Handle books the request on its worker: the face reports the
	// answer's first byte (FirstByte), its chunks (Answer) and its end
	// (Finish), which ends the handle exactly once. nil for a request
	// that is not booked (PlaceUtility, PlaceStored) and for one refused.
	Handle *admission.Handle
	// Decision is the placement; Decision.Worker is the chosen worker
	// (for an unbooked request, the only field set).
	Decision router.Decision
	// URL is the chosen worker's engine base URL (Workers.URL), without a
	// trailing "/".
	URL string
	// PromptTokens is the prompt's length in tokens as it was routed (its
	// token ids, its model's tokenizer's count, or the character
	// estimate; a pooling or pass-through request's inputs' size,
	// PoolRequest.Tokens): the context tokens the face books at the end
	// of an answer whose tokens it did not see.
	PromptTokens int
	// Prefill is the prefill hop of a disaggregated request (Place walks
	// admission.Disaggregated for a model no aggregated worker serves);
	// nil for an aggregated one. Then Handle, Decision and URL are the
	// decode hop's.
	Prefill *PrefillHop

	start time.Time // the request's arrival (Place's start)
	label string    // the model's metrics label; "" before the body parsed
	meter Meter     // reads a generation answer; unused otherwise
	// api is the request's schema; model its body's model; stream
	// whether it asked for a streamed answer.
	api    API
	model  string
	stream bool
	// status is the answer's HTTP status (AnswerStatus); 0 while unknown.
	status int
	// bind: a Responses answer whose id is not bound yet (bindAnswer).
	bind bool
}

// Model returns the model of the request p placed (its body's; for a
// stored response's GET or cancel, the model it was made for); "" before
// its body was read.
func (p *Placed) Model() string { return p.model }

// ResponseNotFoundError is the error of a Responses request continuing a
// stored response (previous_response_id), or of a stored response's GET
// or cancel (PlaceStored), that the runtime cannot send to the engine
// holding that response: it knows no binding of ID (never seen, expired,
// pushed out, or over MaxResponseIDBytes), or the bound worker left the
// fleet, or it does not serve the request's model, or the request's
// candidates exclude it. A face answers it as vLLM answers an id it does
// not hold (vllm/entrypoints/openai/serving_responses.py,
// _make_not_found_error: 404, invalid_request_error, param
// "response_id"); Error is vLLM's message.
type ResponseNotFoundError struct {
	// ID is the response id the request named, as it named it.
	ID string
}

// Error returns vLLM's message: "Response with id '<id>' not found.".
func (e *ResponseNotFoundError) Error() string { return "Response with id '" + e.ID + "' not found." }

// ResponseHolderDownError is the error of a Responses follow-up, or of a
// stored response's GET or cancel, whose response is bound to a worker
// this router still has configured but which is not ready now (its
// engine is down, restarting, or failing its probes): the response may
// come back with it, so a face answers 503 (retryable), not the 404 of a
// response that is gone (ResponseNotFoundError). It wraps
// shared.ErrNoWorkers.
type ResponseHolderDownError struct {
	// ID is the response id; Worker the name of the worker holding it.
	ID, Worker string
}

// Error says which worker holds the response and that it is not ready.
func (e *ResponseHolderDownError) Error() string {
	return fmt.Sprintf("the engine holding response %q (worker %s) is not ready; retry shortly", e.ID, e.Worker)
}

// Unwrap returns shared.ErrNoWorkers.
func (e *ResponseHolderDownError) Unwrap() error { return shared.ErrNoWorkers }

// responseHolder is ResponseWorker for a request naming the stored
// response id: the worker holding it and the model it was made for, or
// *ResponseHolderDownError when this router's binding names a worker
// still configured but not ready, else *ResponseNotFoundError.
func (rt *Runtime) responseHolder(model, id string) (*fleet.Worker, string, error) {
	if w, m, ok := rt.ResponseWorker(model, id); ok {
		return w, m, nil
	}
	if len(id) <= MaxResponseIDBytes {
		if rb, ok := rt.responses.peek(id); ok {
			if _, configured := rt.workers.URL(rb.name); configured {
				return nil, rb.model, &ResponseHolderDownError{ID: id, Worker: rb.name}
			}
		}
	}
	return nil, "", &ResponseNotFoundError{ID: id}
}

// ErrNoRoute is Place's error for a pass-through body (APIOther) that
// names no model: nothing chooses its engines, and a face answers as for
// a path it does not know (serve: 404 not_found).
var ErrNoRoute = errors.New("the path is not one the router routes by its schema, and the body names no \"model\" to pass it through to")

// Place does for one request what the HTTP face does before it sends
// the request's first hop, and nothing more.
//
// A generation request (api.Generates) is parsed with the intake's
// parser and bound (ParseRequest), its latency targets read from its
// headers (ParseSLO), its prompt keyed (Key: token ids, the
// model's tokenizer or character blocks), the request built from header
// (X-Request-Id, else a generated id; X-Session-Id; the other headers but
// the credentials as Metadata), admitted on the aggregated role with opts
// (admission.Exclude narrows the candidates) and waited for while it is
// queued, up to ctx and the request timeout. A disaggregated model
// (Disaggregated) walks admission.Disaggregated instead: see
// placeDisaggregated. A Responses request with previous_response_id is
// admitted on the worker holding that response alone (placeFollowUp).
//
// A pooling or scoring request (APIPool), a speech-to-text one (APIAudio)
// or a pass-through (APIOther) is read by ParsePoolBody (a form, by its
// Content-Type header, or JSON) and admitted the same way among the workers serving
// its body's model (a model served disaggregated only: its prefill
// workers), with no prefix key, booked with its inputs' size
// (PoolRequest.Tokens, also Placed.PromptTokens) until Finish; its answer
// is not metered. An engine utility (APIUtility) is not booked: use
// PlaceUtility.
//
// The caller ends the handle (Finish).
//
// Errors: ErrBadRequest (wrapped, naming the field) for a body the HTTP
// face answers 400, a body over MaxBodyBytes and a pooling body without
// a model included; ErrNoRoute for a pass-through body naming no model;
// *ResponseNotFoundError for a follow-up the runtime cannot send to the
// engine holding its previous response; the admission's errors
// (admission.ErrQueueFull, admission.ErrDue, shared.ErrNoWorkers,
// router.ErrAllExcluded, admission.ErrUnknownClass,
// *admission.ClassifyError, ...); ctx's error, or
// context.DeadlineExceeded when the request timeout passed while it was
// queued. The handle has ended on every error.
//
// On an error the Placed has no Handle but can still be counted
// (Finish with the code the caller answers).
func (rt *Runtime) Place(ctx context.Context, api API, header http.Header, body []byte, opts ...admission.Option) (Placed, error) {
	start := time.Now()
	if int64(len(body)) > rt.maxBody {
		return Placed{start: start}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), rt.maxBody)
	}
	switch api {
	case APIPool, APIOther, APIAudio:
		return rt.placePool(ctx, api, header, body, start, opts)
	case APIUtility:
		return Placed{start: start}, errors.New("live: Place does not place an engine utility request, which is not booked: use PlaceUtility")
	}
	parsed, err := ParseRequest(body, api)
	if err != nil {
		return Placed{start: start}, err
	}
	label := rt.ModelLabel(parsed.Model)
	refused := Placed{start: start, label: label, api: api, model: parsed.Model, stream: parsed.Stream}
	ctx, cancel := context.WithTimeout(ctx, rt.timeout)
	defer cancel()
	req := rt.request(start, parsed.Model, label, api, header)
	req.Stream, req.MaxTokens = parsed.Stream, parsed.MaxTokens
	if req.SLO, err = ParseSLO(header); err != nil {
		return refused, err
	}
	rt.Key(ctx, req, parsed.Key())
	if parsed.PreviousResponseID != "" {
		return rt.placeFollowUp(ctx, req, parsed.PreviousResponseID, refused, opts)
	}
	if rt.Disaggregated(req.Model) {
		return rt.placeDisaggregated(ctx, req, refused, opts)
	}
	return rt.placeOne(ctx, req, admission.Aggregated.Hop(0), refused, opts)
}

// request builds the Request of a request for model arriving at start
// from its headers: X-Request-Id (else a generated id), X-Session-Id, and
// the others but the credentials as Metadata (RequestMetadata).
func (rt *Runtime) request(start time.Time, model, label string, api API, header http.Header) *Request {
	req := &Request{Start: start, Model: model, API: api, Label: label,
		ID: header.Get("X-Request-Id"), Session: header.Get("X-Session-Id"), Meta: RequestMetadata(header)}
	if req.ID == "" {
		req.ID = rt.NewID()
	}
	return req
}

// placeOne admits req's hop (tag "#") with opts, waits for its
// placement, and returns the Placed (refused's fields, with the handle,
// the decision, the worker's URL, the request's tokens, and for a
// generation request its meter); on an error the handle has ended.
func (rt *Runtime) placeOne(ctx context.Context, req *Request, hop admission.Hop, refused Placed, opts []admission.Option) (Placed, error) {
	h, d, url, err := rt.placeHop(ctx, req, hop, "#", opts)
	if err != nil {
		return refused, err
	}
	p := refused
	p.Handle, p.Decision, p.URL, p.PromptTokens = h, d, url, req.Tokens
	if req.API.Generates() {
		p.meter = rt.Meter(h, d, req, true, 0)
		p.bind = req.API == APIResponses
	}
	return p, nil
}

// placePool is Place for a request whose body carries no prompt to key
// (APIPool, APIOther, APIAudio): read by ParsePoolBody at header's
// Content-Type (a multipart/form-data speech-to-text or pass-through
// body is read as a form), admitted by load among the workers serving
// its model with its inputs' size as its prompt tokens, no block hashes
// (serve's exchangePool does the same).
func (rt *Runtime) placePool(ctx context.Context, api API, header http.Header, body []byte, start time.Time, opts []admission.Option) (Placed, error) {
	pr, err := rt.ParsePoolBody(api, header.Get("Content-Type"), body)
	if err != nil {
		return Placed{start: start}, err
	}
	if pr.Model == "" {
		if api == APIOther {
			return Placed{start: start}, ErrNoRoute
		}
		// vLLM's and OpenAI's words for a request without a model.
		return Placed{start: start}, fmt.Errorf("%w: you must provide a model parameter", ErrBadRequest)
	}
	label := rt.ModelLabel(pr.Model)
	refused := Placed{start: start, label: label, api: api, model: pr.Model}
	ctx, cancel := context.WithTimeout(ctx, rt.timeout)
	defer cancel()
	req := rt.request(start, pr.Model, label, api, header)
	req.Tokens = pr.Tokens
	hop := admission.Aggregated.Hop(0)
	if rt.Disaggregated(req.Model) {
		// A model served disaggregated only: its prefill engines compute
		// inputs.
		hop = admission.Hop{Role: shared.RolePrefill, Final: true}
	}
	return rt.placeOne(ctx, req, hop, refused, opts)
}

// placeFollowUp places a Responses request continuing the stored
// response prev: only the engine that answered prev holds it (and its
// KV cache), so the request is admitted on that worker alone in one hop
// (FollowUpHop: a disaggregated model's runs on its decode worker, with no
// prefill hop), every other member of the hop's partition excluded (it
// waits in the queue while that worker is at capacity), as serve's
// followUp does.
// Errors: *ResponseNotFoundError when the runtime knows no live binding
// of prev (ResponseWorker), the bound worker does not serve req's model,
// or it is excluded (it left between the lookup and the placement, or
// opts exclude it); else Place's.
func (rt *Runtime) placeFollowUp(ctx context.Context, req *Request, prev string, refused Placed, opts []admission.Option) (Placed, error) {
	notFound := &ResponseNotFoundError{ID: prev}
	w, hop, only, err := rt.FollowUp(req.Model, prev)
	if err != nil {
		return refused, err
	}
	p, err := rt.placeOne(ctx, req, hop, refused, append(opts[:len(opts):len(opts)], only))
	if errors.Is(err, router.ErrAllExcluded) {
		return refused, notFound
	}
	if err != nil {
		return refused, err
	}
	if p.Decision.Worker.ID != w.ID {
		// A worker that joined after the lookup, and so was not
		// excluded: never send the follow-up there.
		rt.End(p.Handle, admission.Aborted("not the worker holding the previous response"))
		return refused, notFound
	}
	return p, nil
}

// FollowUp says where a Responses request of model continuing the stored
// response prev (previous_response_id) runs, on both faces: on w, the
// worker holding prev (ResponseWorker), in hop (FollowUpHop), admitted
// with only, which excludes every other member of the hop's partition
// for the model. Errors: *ResponseHolderDownError when prev's worker is
// configured but not ready (a face answers 503: retry), else
// *ResponseNotFoundError when the runtime knows no live binding of prev or
// its worker does not serve model in that hop's role (a face answers as
// the engine answers an unknown id). Linear in the partition's workers.
func (rt *Runtime) FollowUp(model, prev string) (w *fleet.Worker, hop admission.Hop, only admission.Option, err error) {
	w, _, err = rt.responseHolder(model, prev)
	if err != nil {
		return nil, hop, nil, err
	}
	hop = rt.FollowUpHop(model)
	var others []shared.WorkerID
	member := false
	for _, m := range rt.r.Workers(model, hop.Role) {
		if m.ID == w.ID {
			member = true
		} else if !containsWorker(others, m.ID) {
			others = append(others, m.ID)
		}
	}
	if !member {
		return nil, hop, nil, &ResponseNotFoundError{ID: prev}
	}
	return w, hop, admission.Exclude(others...), nil
}

// PlaceUtility places an engine utility request (APIUtility: tokenize,
// detokenize) on one ready engine serving its body's model, of any role
// (UtilityWorker: the least busy, ties round-robin), the workers in skip
// left out. It is not admitted and not booked (a tokenizer call costs
// the engine no KV cache): the Placed has no Handle, only the Decision's
// Worker and the URL, and Finish only counts it. The body is read by
// ParsePool and forwarded unchanged.
//
// Errors: ErrBadRequest (wrapped) for a body ParsePool refuses or one
// naming no model; shared.ErrNoWorkers (wrapped, naming the model) when
// no ready worker outside skip serves the model.
func (rt *Runtime) PlaceUtility(header http.Header, body []byte, skip []shared.WorkerID) (Placed, error) {
	start := time.Now()
	pr, err := rt.ParsePool(body)
	if err != nil {
		return Placed{start: start}, err
	}
	if pr.Model == "" {
		return Placed{start: start}, fmt.Errorf("%w: you must provide a model parameter", ErrBadRequest)
	}
	p := Placed{start: start, label: rt.ModelLabel(pr.Model), api: APIUtility, model: pr.Model}
	w := rt.UtilityWorker(pr.Model, skip)
	if w == nil {
		return p, fmt.Errorf("%w for model %q: none serving it is ready", shared.ErrNoWorkers, pr.Model)
	}
	url, ok := rt.workers.URL(w.Name)
	if !ok {
		return p, fmt.Errorf("live: worker %q, which the workers do not know", w.Name)
	}
	p.Decision, p.URL = router.Decision{Worker: w}, url
	return p, nil
}

// PlaceStored places a request for the stored response id (GET
// /v1/responses/{id}, which reads it or, with ?stream=true, resumes its
// stream; POST /v1/responses/{id}/cancel) on the worker whose engine
// holds it (ResponseWorker), as serve's storedResponse sends it. It is
// not admitted and not booked: the Placed has no Handle, only the
// Decision's Worker and the URL. Errors: *ResponseHolderDownError when
// its worker is configured but not ready, *ResponseNotFoundError when the
// runtime knows no live binding of id or its worker is in skip.
func (rt *Runtime) PlaceStored(id string, skip []shared.WorkerID) (Placed, error) {
	start := time.Now()
	w, model, err := rt.responseHolder("", id)
	p := Placed{start: start, label: rt.ModelLabel(model), model: model, api: APIResponses}
	if err != nil {
		return p, err
	}
	if containsWorker(skip, w.ID) {
		return p, &ResponseNotFoundError{ID: id}
	}
	url, ok := rt.workers.URL(w.Name)
	if !ok {
		return p, &ResponseNotFoundError{ID: id}
	}
	p.Decision, p.URL = router.Decision{Worker: w}, url
	return p, nil
}

// UtilityWorker returns the ready worker serving model, of any role
// (aggregated, prefill, decode), with the fewest requests in flight, not
// in skip; among ties, the one a round-robin cursor (one per runtime)
// reaches first. nil when there is none. Linear in the model's workers.
// Both faces send the engine utilities there.
func (rt *Runtime) UtilityWorker(model string, skip []shared.WorkerID) *fleet.Worker {
	var ties []*fleet.Worker
	best := int64(-1)
	for _, role := range []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode} {
		for _, w := range rt.r.Workers(model, role) {
			if containsWorker(skip, w.ID) {
				continue
			}
			switch n := w.ActiveRequests(); {
			case best < 0 || n < best:
				best, ties = n, append(ties[:0], w)
			case n == best:
				ties = append(ties, w)
			}
		}
	}
	if len(ties) == 0 {
		return nil
	}
	return ties[rt.utilityNext.Add(1)%uint64(len(ties))]
}

func containsWorker(ids []shared.WorkerID, id shared.WorkerID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// Answer reads a chunk of p's answer as the HTTP face's proxy reads what
// it copies (Meter.Read): a stream's SSE events advance the request's
// progress, and a non-streamed answer's body (up to 1 MiB) and a stream's
// last chunk mentioning "usage" are kept for Finish. Linear in the chunk;
// call it with every chunk, in order.
//
// A Responses answer's id (Meter.ResponseID) is bound to the worker that
// serves it (BindResponse, under the request's model) as soon as a
// stream's response.created event is read, before the chunk carrying it
// goes on (Finish binds a whole answer's); not when the answer's status
// (AnswerStatus) is not 2xx. A request that is not generation, or not
// booked, is not read.
func (rt *Runtime) Answer(p *Placed, chunk []byte) {
	if p.Handle == nil || !p.api.Generates() {
		return
	}
	p.meter.Read(chunk)
	if p.bind && p.stream {
		rt.bindAnswer(p)
	}
}

// AnswerStatus records the answer's HTTP status (its response headers'):
// a Responses answer of another status than 2xx binds no id.
func (rt *Runtime) AnswerStatus(p *Placed, code int) {
	p.status = code
	if code/100 != 2 {
		p.bind = false
	}
}

// bindAnswer binds the id of p's Responses answer, once the meter has
// it, to the worker serving p (its handle's decision: the one the
// booking moved to, when it moved).
func (rt *Runtime) bindAnswer(p *Placed) {
	if id := p.meter.ResponseID(); id != "" {
		p.bind = false
		rt.BindResponse(p.model, id, p.Handle.Decision().Worker)
	}
}

// FirstByte records the first byte of p's answer as the HTTP face's proxy
// does (Meter.FirstByte): the handle's FirstToken and, for a streamed
// request, switchyard_time_to_first_token_seconds since Place began.
//
// A request that is not generation records only the handle's FirstToken;
// one not booked, nothing.
func (rt *Runtime) FirstByte(p *Placed) {
	if p.Handle == nil {
		return
	}
	rt.EndPrefill(p, true, "")
	if p.api.Generates() {
		p.meter.FirstByte()
	} else {
		p.Handle.FirstToken()
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
// A completed generation answer's usage that Answer saw is counted
// (Meter.Done), and the context tokens Meter.Done returns replace o's; a
// completed Responses answer's id not bound yet is bound then (Answer).
// Another request's o is kept: a pooling request ends with its size.
func (rt *Runtime) Finish(p *Placed, code int, o admission.Outcome) {
	if p.Handle != nil {
		rt.EndPrefill(p, o.Completed, "the decode hop ended before its answer's first byte")
		if o.Completed && p.api.Generates() {
			o.ContextTokens = p.meter.Done()
			if p.bind {
				rt.bindAnswer(p)
			}
		}
		rt.End(p.Handle, o)
	}
	rt.CountRequest(p.label, code, p.start)
}
