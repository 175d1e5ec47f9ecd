package epp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/serve"
	"github.com/switchyard-router/switchyard/shared"
)

// RouterPicker is the Picker of Switchyard's own policies: each request is
// parsed, keyed, classified, queued and placed exactly as `router serve`
// places the first hop of a completion request (serve.Server.Place, the
// aggregated role), and its endpoint is the chosen worker's URL host:port.
//
// The policies rank no runner-up, so Pick.Fallbacks is always empty. The
// booking stays on the picked worker even when the proxy reports that
// another endpoint served (admission moves a booking only by re-placing
// it through the policy, not onto a named worker).
type RouterPicker struct {
	// Server places the requests; its dispatcher (Server.Dispatcher, or
	// Serve) must run for queued requests to be placed. Required.
	Server *serve.Server
}

var _ Picker = (*RouterPicker)(nil)

// Pick places req. The path (":path", its query aside) says the schema:
// "/v1/completions" the completions one, "/v1/chat/completions" (or no
// path) the chat one; any other path is ErrBadRequest. With a subset
// hint, the workers whose URL host:port is not in it are excluded; none
// left is ErrNoEndpoint. Errors: ErrBadRequest (a body serve answers 400:
// malformed, a field of the wrong type, over serve's bound, an unknown
// class), ErrNoEndpoint (no ready worker for the model, or none in the
// subset), ErrShed (the queue is full, or the request timeout passed while
// it waited), ErrPastDue (its due time passed while it waited), each
// wrapping serve's error and worded by it; other errors as Place returns
// them.
func (p *RouterPicker) Pick(ctx context.Context, req *Request) (Pick, error) {
	chat, err := chatPath(req.Headers[":path"])
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
			return Pick{}, fmt.Errorf("%w: no worker is at an endpoint of the subset hint %s", ErrNoEndpoint, strings.Join(req.Subset, ","))
		}
		opts = append(opts, admission.Exclude(out...))
	}
	placed, err := p.Server.Place(ctx, chat, header, req.Body, opts...)
	if err != nil {
		return Pick{}, mapErr(ctx, err)
	}
	ep, err := Endpoint(placed.URL)
	if err != nil {
		p.Server.End(placed.Handle, admission.Aborted("worker url has no endpoint"))
		return Pick{}, err
	}
	return Pick{Endpoint: ep, Handle: &routerHandle{s: p.Server, h: placed.Handle, tokens: int64(placed.PromptTokens)}}, nil
}

// chatPath says whether path (":path") is the chat schema's.
func chatPath(path string) (bool, error) {
	path, _, _ = strings.Cut(path, "?")
	switch path {
	case "", "/v1/chat/completions":
		return true, nil
	case "/v1/completions":
		return false, nil
	}
	return false, fmt.Errorf("%w: no endpoint POST %s: the picker routes /v1/chat/completions and /v1/completions", ErrBadRequest, path)
}

// outside returns the ids of the workers whose endpoint is not in subset,
// and false when no worker's is.
func (p *RouterPicker) outside(subset []string) ([]shared.WorkerID, bool) {
	var out []shared.WorkerID
	in := false
	for _, st := range p.Server.Workers().Status() {
		ep, err := Endpoint(st.Config.URL)
		if err == nil && slices.Contains(subset, ep) {
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

// mapped is a serve error as a Picker error: it reads as serve's error and
// is both kind and it for errors.Is.
type mapped struct{ kind, err error }

func (m mapped) Error() string   { return m.err.Error() }
func (m mapped) Unwrap() []error { return []error{m.kind, m.err} }

// mapErr maps Place's errors to the Picker's.
func mapErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return err // the stream is gone: nobody reads the answer
	case errors.Is(err, serve.ErrBadRequest), errors.Is(err, admission.ErrUnknownClass):
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

// routerHandle is a RouterPicker pick's Handle: the admission handle.
type routerHandle struct {
	s      *serve.Server
	h      *admission.Handle
	tokens int64 // the prompt's tokens, the context tokens booked at completion
}

// Served does nothing: the booking stays on the picked worker (see
// RouterPicker).
func (rh *routerHandle) Served(string) {}

// FirstToken records the first token (the worker's prefill is done).
func (rh *routerHandle) FirstToken() { rh.h.FirstToken() }

// End ends the booking: completed with the prompt's tokens as context
// tokens (the proxy's answer is not read for its usage), or aborted.
func (rh *routerHandle) End(o Outcome) {
	if o == Completed {
		rh.s.End(rh.h, admission.Completed(rh.tokens))
		return
	}
	rh.s.End(rh.h, admission.Aborted("ext_proc stream ended before the response did"))
}
