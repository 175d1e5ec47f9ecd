package epp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
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
}

var _ Picker = (*RouterPicker)(nil)

// Pick places req. The path (":path", its query aside) says the schema,
// by the engine endpoints' table (pathAPI: the generation endpoints,
// "/v1/chat/completions" when there is no path); another path is
// ErrBadRequest, and a method (":method") other than POST on a known
// one is ErrMethodNotAllowed. A disaggregated model (live.Runtime.
// Disaggregated) is placed on a prefill worker and a decode worker, each
// by its role's policy: the pick's Endpoint is the decode worker's, its
// Prefill the prefill worker's (sent in PrefillHeader for the decode
// pod's sidecar, router/epp/sidecar), and the handle books both hops. With a subset
// hint, the workers whose URL host:port is not in it are excluded; none
// left is ErrNoEndpoint. Errors: ErrBadRequest (a body the intake refuses,
// live.ErrBadRequest: malformed, a field of the wrong type, over its bound, an unknown
// class), ErrNoEndpoint (no ready worker for the model, or none in the
// subset), ErrShed (the queue is full, or the request timeout passed while
// it waited), ErrPastDue (its due time passed while it waited), each
// wrapping the runtime's error and worded by it; other errors as Place returns
// them.
func (p *RouterPicker) Pick(ctx context.Context, req *Request) (Pick, error) {
	api, err := pathAPI(req.Headers[":method"], req.Headers[":path"])
	if err != nil {
		return Pick{}, err
	}
	header := make(http.Header, len(req.Headers))
	for k, v := range req.Headers {
		if !strings.HasPrefix(k, ":") {
			header.Set(k, v)
		}
	}
	var opts []admission.Option
	if req.Subset != nil {
		out, ok := p.outside(req.Subset)
		if !ok {
			return Pick{}, fmt.Errorf("%w: no worker is at an endpoint of the subset hint %s", ErrNoEndpoint, hintWords(req.Subset))
		}
		opts = append(opts, admission.Exclude(out...))
	}
	if p.Fallbacks > 0 {
		opts = append(opts, admission.Alternates(p.Fallbacks))
	}
	placed, err := p.Runtime.Place(ctx, api, header, req.Body, opts...)
	if err != nil {
		err = mapErr(ctx, err)
		code := StatusOf(err)
		if ctx.Err() != nil {
			code = live.CodeClientGone
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

// pathAPI returns the schema of path (":path", its query aside) by the
// engine endpoints' table (live.EndpointFor); no path is the chat
// completions endpoint. The method (":method"; absent: POST) must be
// POST. Errors: ErrMethodNotAllowed for another method on a known
// endpoint; ErrBadRequest for a path the table does not know, and for a
// pooling or utility endpoint (live.APIPool, live.APIUtility), which the
// picker does not route yet: each names the method and path (bounded,
// escaped).
func pathAPI(method, path string) (live.API, error) {
	route, _, _ := strings.Cut(path, "?")
	if method == "" {
		method = http.MethodPost
	}
	if route == "" {
		route = "/v1/chat/completions"
	}
	e, ok := live.EndpointFor(route)
	if !ok {
		return live.APIOther, fmt.Errorf("%w: no endpoint %s %s: the picker routes POST %s",
			ErrBadRequest, untrusted.Text(method, untrusted.MaxClient), untrusted.Text(route, untrusted.MaxClient), generationPaths)
	}
	if method != http.MethodPost {
		return e.API, fmt.Errorf("%w: %s is not allowed on %s: an inference request is a POST",
			ErrMethodNotAllowed, untrusted.Text(method, untrusted.MaxClient), route)
	}
	if !e.API.Generates() {
		return e.API, fmt.Errorf("%w: %s is a %s endpoint, which the picker does not route yet: it routes POST %s",
			ErrBadRequest, route, e.API, generationPaths)
	}
	return e.API, nil
}

// generationPaths lists the generation endpoints of the table, for
// messages: "/v1/completions, /v1/chat/completions, ...".
var generationPaths = func() string {
	var paths []string
	for _, e := range live.Endpoints() {
		if e.API.Generates() {
			paths = append(paths, e.Path)
		}
	}
	return strings.Join(paths, ", ")
}()

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
func (rh *routerHandle) Served(endpoint string) {
	if endpoint == rh.endpoint {
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
func (rh *routerHandle) Status(code int) {
	rh.code = code
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
		if w := rh.placed.Handle.Decision().Worker; w != nil {
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
