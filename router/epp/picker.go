package epp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// RouterPicker is the Picker of Switchyard's own policies: each request is
// parsed, keyed, classified, queued and placed by the live runtime's
// intake exactly as `router serve` places a generation request
// (live.Runtime.Place: the aggregated role, or a disaggregated model's
// prefill and decode hops), and its endpoint is the chosen worker's URL
// host:port (the decode worker's, with the prefill worker's in
// Pick.Prefill). Its fallbacks are the policy's runners-up
// (router.Placement.Alternates).
//
// The answer is read by the runtime's answer meter (live.Meter, as
// serve's proxy reads its own), and the request is counted in the
// runtime's metric families as the HTTP face counts its own
// (live.Runtime.FirstByte, Finish): switchyard_requests_total by the
// status the client got, switchyard_request_duration_seconds, and the
// time to first token of streamed requests, beside the selection and
// tokenizer families Place feeds.
type RouterPicker struct {
	// Runtime places the requests; its dispatcher
	// (live.Runtime.Dispatcher; a live.Daemon runs it) must run for
	// queued requests to be placed. Required.
	Runtime *live.Runtime
	// Fallbacks is how many of the policy's runners-up follow the pick in
	// the destination list, best first (at most router.MaxAlternates;
	// 0: none). The proxy tries them, in order, when its retry policy
	// retries. They are not booked; the proxy's served-endpoint report
	// moves the booking to the one that served.
	Fallbacks int
	// DisablePassThrough turns off the pass-through of unknown paths
	// (`router epp --pass-through=false`, serve.Options'
	// DisablePassThrough): by default a POST to a path under /v1/ that
	// the endpoints' table does not know is picked like a pooling
	// request among the workers serving its body's "model"; with it set,
	// such a path is ErrNotFound.
	DisablePassThrough bool
}

var _ Picker = (*RouterPicker)(nil)

// Pick places req. The method (":method"; absent: POST) and path
// (":path", its query aside; absent: "/v1/chat/completions") say what it
// is (route):
//
//   - a generation endpoint (chat, completions, Responses, Messages) is
//     placed by the policy as `router serve` places it
//     (live.Runtime.Place): keyed by its prompt, booked until the answer
//     ends, metered; a disaggregated model (live.Runtime.Disaggregated)
//     on a prefill worker and a decode worker, each by its role's policy:
//     the pick's Endpoint is the decode worker's, its Prefill the prefill
//     worker's (sent in PrefillHeader for the decode pod's sidecar,
//     router/epp/sidecar), and the handle books both hops. A Responses
//     request with previous_response_id goes to the worker whose engine
//     holds that response, alone; a Responses answer's id is bound to
//     its worker as the answer passes (live.Runtime.Answer);
//   - a pooling or scoring endpoint, and a POST under /v1/ that the table
//     does not know (pass-through, unless DisablePassThrough), is placed
//     by the policy among the workers serving the body's model, with no
//     prefix key, booked with its inputs' size until the answer ends;
//   - an engine utility (tokenize, detokenize) goes to the least busy
//     ready worker serving the model (live.Runtime.PlaceUtility), not
//     booked, with no fallbacks;
//   - GET (or HEAD) /v1/responses/{id} and POST /v1/responses/{id}/cancel
//     go to the worker whose engine holds that response
//     (live.Runtime.PlaceStored), not booked, with no fallbacks.
//
// With a subset hint, the workers whose URL host:port is not in it are
// excluded; none left is ErrNoEndpoint. Errors: ErrNotFound (a path it
// does not route, a pass-through body naming no model), ErrMethodNotAllowed
// (a *MethodError naming the methods the path takes), ErrBadRequest (a
// body the intake refuses, live.ErrBadRequest: malformed, a field of the
// wrong type, over its bound, no model; an unknown class),
// *live.ResponseNotFoundError (a follow-up, GET or cancel of a response
// no live binding reaches), ErrNoEndpoint (no ready worker for the
// model, or none in the subset), a *live.ModelNotFoundError (no
// configured worker serves or lists the model: 404 model_not_found, as
// serve answers it), ErrShed (the queue is full, or the
// request timeout passed while it waited), ErrPastDue (its due time
// passed while it waited), each wrapping the runtime's error and worded
// by it; a *shared.NoHeadroomError (no worker predicted to meet the
// request's latency targets: Server answers it 429 with retry-after,
// counted by live.Runtime.CountRefusal) and other errors as Place
// returns them.
func (p *RouterPicker) Pick(ctx context.Context, req *Request) (Pick, error) {
	rt, err := route(req.Headers[":method"], req.Headers[":path"], !p.DisablePassThrough)
	if err != nil {
		return Pick{}, err
	}
	header := make(http.Header, len(req.Headers))
	for k, v := range req.Headers {
		if !strings.HasPrefix(k, ":") {
			header.Set(k, v)
		}
	}
	var skip []shared.WorkerID
	if req.Subset != nil {
		out, ok := p.outside(req.Subset)
		if !ok {
			return Pick{}, fmt.Errorf("%w: no worker is at an endpoint of the subset hint %s", ErrNoEndpoint, hintWords(req.Subset))
		}
		skip = out
	}
	var placed live.Placed
	switch {
	case rt.stored != "":
		placed, err = p.Runtime.PlaceStored(rt.stored, skip)
	case rt.api == live.APIUtility:
		placed, err = p.Runtime.PlaceUtility(header, req.Body, skip)
	default:
		var opts []admission.Option
		if skip != nil {
			opts = append(opts, admission.Exclude(skip...))
		}
		if p.Fallbacks > 0 {
			opts = append(opts, admission.Alternates(p.Fallbacks))
		}
		placed, err = p.Runtime.Place(ctx, rt.api, header, req.Body, opts...)
	}
	if err != nil {
		err = mapErr(ctx, p.Runtime.ModelNotFound(placed.Model(), err))
		code := StatusOf(err)
		if ctx.Err() != nil {
			code = live.CodeClientGone
		} else {
			p.Runtime.CountRefusal(p.Runtime.ModelLabel(placed.Model()), err)
		}
		p.Runtime.Finish(&placed, code, admission.Outcome{})
		return Pick{}, err
	}
	ep, err := Endpoint(placed.URL)
	var prefill string
	if err == nil && placed.Prefill != nil {
		prefill, err = Endpoint(placed.Prefill.URL)
	}
	if err != nil {
		p.Runtime.Finish(&placed, StatusOf(err), admission.Aborted("worker url has no endpoint"))
		return Pick{}, err
	}
	return Pick{Endpoint: ep, Fallbacks: p.fallbacks(ep, placed.Decision.Alternates), Prefill: prefill,
		Handle: &routerHandle{p: p, placed: placed, endpoint: ep}}, nil
}

// fallbacks returns the endpoints of the runners-up, best first, without
// the primary's and without repeats (ranks of one worker share its URL).
func (p *RouterPicker) fallbacks(primary string, alts []*fleet.Worker) []string {
	if len(alts) == 0 {
		return nil
	}
	out := make([]string, 0, len(alts))
	for _, w := range alts {
		u, ok := p.Runtime.Workers().URL(w.Name)
		if !ok {
			continue
		}
		ep, err := Endpoint(u)
		if err != nil || ep == primary || slices.Contains(out, ep) {
			continue
		}
		out = append(out, ep)
	}
	return out
}

// hintWords words a subset hint for an error message, bounded whatever
// the hint's size: all of it when short, else its length and its first
// 8 entries, each cut at 64 bytes.
func hintWords(subset []string) string {
	const entries, entryBytes = 8, 64
	var b strings.Builder
	if len(subset) > entries {
		fmt.Fprintf(&b, "(%d endpoints): ", len(subset))
	}
	for i, ep := range subset[:min(len(subset), entries)] {
		if i > 0 {
			b.WriteByte(',')
		}
		if len(ep) > entryBytes {
			ep = ep[:entryBytes] + "..."
		}
		b.WriteString(ep)
	}
	if len(subset) > entries {
		b.WriteString(",...")
	}
	return b.String()
}

// routed is what a request's method and path say it is (route).
type routed struct {
	// api is a POST endpoint's schema (live.EndpointFor), or
	// live.APIOther for a pass-through; unset when stored is set.
	api live.API
	// stored is the response id of GET /v1/responses/{id} or POST
	// /v1/responses/{id}/cancel (unescaped); "" for the others.
	stored string
}

// route reads a request's method (absent: POST) and path (":path", its
// query aside; absent: the chat completions endpoint) as serve's routes
// read them:
//
//   - a POST endpoint of the engine endpoints' table (live.EndpointFor):
//     its schema; another method there is a *MethodError (allow POST);
//   - GET or HEAD /v1/responses/{id}, POST /v1/responses/{id}/cancel: the
//     stored response id, percent-escapes undone; another method there
//     is a *MethodError (allow GET, or POST for cancel);
//   - any other POST under /v1/, with passThrough: live.APIOther;
//   - anything else, and a path not in canonical form (path.Clean's, no
//     needless percent-escape: serve refuses those rather than redirect
//     them), ErrNotFound.
//
// Errors name the method and path, bounded and escaped
// (internal/untrusted).
func route(method, target string, passThrough bool) (routed, error) {
	p, _, _ := strings.Cut(target, "?")
	if method == "" {
		method = http.MethodPost
	}
	if p == "" {
		p = "/v1/chat/completions"
	}
	quoted := untrusted.Text(p, untrusted.MaxClient)
	qmethod := untrusted.Text(method, untrusted.MaxClient)
	notAllowed := func(allow string) error {
		return &MethodError{Allow: allow, Err: fmt.Errorf("%w: %s is not allowed on %s: it takes %s",
			ErrMethodNotAllowed, qmethod, quoted, allow)}
	}
	if p != path.Clean(p) {
		return routed{}, fmt.Errorf("%w: no endpoint %s %s: the path is not in canonical form (%s)",
			ErrNotFound, qmethod, quoted, untrusted.Text(path.Clean(p), untrusted.MaxClient))
	}
	if e, ok := live.EndpointFor(p); ok {
		if method != http.MethodPost {
			return routed{api: e.API}, &MethodError{Allow: http.MethodPost, Err: fmt.Errorf("%w: %s is not allowed on %s: an inference request is a POST",
				ErrMethodNotAllowed, qmethod, quoted)}
		}
		return routed{api: e.API}, nil
	}
	if rest, ok := strings.CutPrefix(p, "/v1/responses/"); ok {
		id, cancel := rest, false
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			id, cancel = rest[:i], rest[i:] == "/cancel"
			if !cancel {
				return routed{}, fmt.Errorf("%w: no endpoint %s %s", ErrNotFound, qmethod, quoted)
			}
		}
		dec, err := url.PathUnescape(id)
		if err != nil || dec == "" {
			return routed{}, fmt.Errorf("%w: no endpoint %s %s: the response id is not a valid path segment", ErrNotFound, qmethod, quoted)
		}
		switch {
		case cancel && method != http.MethodPost:
			return routed{}, notAllowed(http.MethodPost)
		case !cancel && method != http.MethodGet && method != http.MethodHead:
			return routed{}, notAllowed("GET, HEAD")
		}
		return routed{stored: dec}, nil
	}
	if dec, err := url.PathUnescape(p); err != nil || dec != p {
		return routed{}, fmt.Errorf("%w: no endpoint %s %s: the path is not in canonical form (a percent-escape where none is needed)",
			ErrNotFound, qmethod, quoted)
	}
	if method == http.MethodPost && strings.HasPrefix(p, "/v1/") {
		if passThrough {
			return routed{api: live.APIOther}, nil
		}
		return routed{}, fmt.Errorf("%w: no endpoint %s %s (the pass-through of other paths under /v1/ is off: --pass-through=false)",
			ErrNotFound, qmethod, quoted)
	}
	return routed{}, fmt.Errorf("%w: no endpoint %s %s", ErrNotFound, qmethod, quoted)
}

// outside returns the ids of the workers whose endpoint is not in subset,
// and false when no worker's is. O(workers + subset): the hint comes from
// outside and may be long.
func (p *RouterPicker) outside(subset []string) ([]shared.WorkerID, bool) {
	set := make(map[string]struct{}, len(subset))
	for _, ep := range subset {
		set[ep] = struct{}{}
	}
	var out []shared.WorkerID
	in := false
	for _, st := range p.Runtime.Workers().Status() {
		ep, err := Endpoint(st.Config.URL)
		if _, listed := set[ep]; err == nil && listed {
			in = true
			continue
		}
		out = append(out, st.ID)
	}
	return out, in
}

// Endpoint returns a worker URL's endpoint, "host:port": the URL's host
// and its port, or the scheme's (80 for http, 443 for https) when it has
// none. A worker configured by IP address has an "ip:port" endpoint, as
// the protocol wants; one configured by name keeps the name.
func Endpoint(workerURL string) (string, error) {
	u, err := url.Parse(workerURL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("epp: worker url %q has no host", workerURL)
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return "", fmt.Errorf("epp: worker url %q has no port", workerURL)
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// mapped is a runtime error as a Picker error: it reads as the runtime's error and
// is both kind and it for errors.Is.
type mapped struct{ kind, err error }

func (m mapped) Error() string   { return m.err.Error() }
func (m mapped) Unwrap() []error { return []error{m.kind, m.err} }

// mapErr maps Place's errors to the Picker's.
func mapErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return err // the stream is gone: nobody reads the answer
	case errors.Is(err, live.ErrNoRoute):
		return mapped{ErrNotFound, err}
	case errors.As(err, new(*live.ModelNotFoundError)):
		return err // answered 404 model_not_found (answerOf), as serve does
	case errors.Is(err, live.ErrBadRequest), errors.Is(err, admission.ErrUnknownClass):
		return mapped{ErrBadRequest, err}
	case errors.Is(err, shared.ErrNoWorkers), errors.Is(err, router.ErrAllExcluded):
		return mapped{ErrNoEndpoint, err}
	case errors.Is(err, admission.ErrQueueFull):
		return mapped{ErrShed, err}
	case errors.Is(err, context.DeadlineExceeded):
		return mapped{ErrShed, fmt.Errorf("every worker stayed at capacity until the request timeout: %w", err)}
	case errors.Is(err, admission.ErrDue):
		return mapped{ErrPastDue, err}
	}
	return err
}

// routerHandle is a RouterPicker pick's Handle: the placed request.
type routerHandle struct {
	p        *RouterPicker
	placed   live.Placed
	endpoint string // the picked endpoint
	code     int    // the response's status; 0 before its headers
}

// Served moves the booking to the worker at endpoint when it is not the
// picked one (admission.Handle.Move): the proxy fell back to it, the pick
// having failed, which counts as a failed request of the picked worker
// (live.Workers.ReportFailure: consecutive failures take it out, as
// serve's do). An endpoint no worker has keeps the booking where it is
// and counts nothing: it may be the pick spelled otherwise, or garbage,
// and a proxy reporting such would otherwise take every worker out.
//
// A request that is not booked (an engine utility, a stored response's
// GET or cancel) has nothing to move, and counts nothing.
func (rh *routerHandle) Served(endpoint string) {
	if endpoint == rh.endpoint || rh.placed.Handle == nil {
		return
	}
	id, ok := rh.p.workerAt(endpoint)
	if !ok {
		return
	}
	rh.p.Runtime.Workers().ReportFailure(rh.placed.Decision.Worker.Name)
	// Move runs no policy and does not block: a background context.
	if err := rh.placed.Handle.Move(context.Background(), id, "served by "+endpoint); err == nil {
		rh.endpoint = endpoint
	}
}

// Status keeps the response's status code for the request's count. For
// a disaggregated request, a status of 400 or more ends its prefill hop
// aborted (live.Runtime.EndPrefill): the sidecar passes a failed
// prefill's answer through, and a failed decode's says nothing of the
// prefill's KV either.
//
// A Responses answer of another status than 2xx binds no response id
// (live.Runtime.AnswerStatus).
func (rh *routerHandle) Status(code int) {
	rh.code = code
	rh.p.Runtime.AnswerStatus(&rh.placed, code)
	if code >= http.StatusBadRequest {
		rh.p.Runtime.EndPrefill(&rh.placed, false, "the decode endpoint answered "+strconv.Itoa(code))
	}
}

// FirstToken records the first byte of the answer (the worker's prefill
// is done; live.Runtime.FirstByte, which ends a disaggregated request's
// prefill hop completed: the decode worker has the prompt's KV).
func (rh *routerHandle) FirstToken() { rh.p.Runtime.FirstByte(&rh.placed) }

// Body reads the answer as serve's proxy does (live.Runtime.Answer): a
// stream's events advance the request's progress, and the usage is kept
// for End.
func (rh *routerHandle) Body(chunk []byte) { rh.p.Runtime.Answer(&rh.placed, chunk) }

// End ends the booking and counts the request (live.Runtime.Finish):
// a response that reached its end is completed, with the context tokens
// of its usage or its events when the proxy showed the body (else the
// prompt's), or aborted when its status was 400 or more; a stream that
// ended before the response did is aborted and counted as 499. A response
// that reached its end is the serving worker's success, or its failure
// when its status was 500 or more (live.Workers.ReportSuccess,
// ReportFailure), as serve counts its answers.
func (rh *routerHandle) End(o Outcome) {
	code := rh.code
	if o == Completed {
		w := rh.placed.Decision.Worker
		if rh.placed.Handle != nil {
			w = rh.placed.Handle.Decision().Worker
		}
		if w != nil {
			if code >= http.StatusInternalServerError {
				rh.p.Runtime.Workers().ReportFailure(w.Name)
			} else {
				rh.p.Runtime.Workers().ReportSuccess(w.Name)
			}
		}
	}
	var out admission.Outcome
	switch {
	case o != Completed:
		code, out = live.CodeClientGone, admission.Aborted("ext_proc stream ended before the response did")
	case code >= http.StatusBadRequest:
		out = admission.Aborted("the endpoint answered " + strconv.Itoa(code))
	default:
		if code == 0 {
			code = http.StatusOK // no response headers were shown to the EPP
		}
		out = admission.Completed(int64(rh.placed.PromptTokens))
	}
	rh.p.Runtime.Finish(&rh.placed, code, out)
}

// workerAt returns the id of the worker whose URL's endpoint is endpoint.
func (p *RouterPicker) workerAt(endpoint string) (shared.WorkerID, bool) {
	for _, st := range p.Runtime.Workers().Status() {
		if ep, err := Endpoint(st.Config.URL); err == nil && ep == endpoint {
			return st.ID, true
		}
	}
	return 0, false
}
