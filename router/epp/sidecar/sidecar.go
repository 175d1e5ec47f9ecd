// Package sidecar is the routing sidecar of a decode pod in a
// disaggregated fleet behind a gateway, following llm-d's P/D protocol
// (llm-d/llm-d-inference-scheduler pkg/sidecar/proxy, commit
// 520af47896e5f06e43d09aca281a1149187b0ffd): it stands in front of its
// pod's engine and passes every request through to it, except a
// generation request that carries the prefill endpoint the endpoint
// picker chose (epp.PrefillHeader, "x-prefiller-host-port": set by
// router/epp's RouterPicker for a disaggregated model). That one runs in
// two hops, as vLLM's disaggregated-serving proxies run it: the prefill
// request (PrefillBody: kv_transfer_params with do_remote_decode, one
// token, not streamed) to the prefill endpoint, then the client's request
// with the prefill answer's kv_transfer_params (DecodeBody) to the local
// engine, whose answer, streamed or not, goes back as it comes.
//
// `router pd-sidecar` runs it; docs/epp.md ("Disaggregated fleets")
// describes the deployment.
package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/live"
)

// PrefillEndpointHeader is set on the answer of a request run in two
// hops: the prefill endpoint, "host:port", that computed its prompt.
const PrefillEndpointHeader = "X-Switchyard-Prefill-Endpoint"

// Config configures a Handler.
type Config struct {
	// Engine is the local engine's base URL ("http://127.0.0.1:8001"):
	// every request goes there, a two-hop request's decode included.
	// Required.
	Engine *url.URL
	// Transport sends both hops; nil: a clone of http.DefaultTransport.
	Transport http.RoundTripper
	// AllowPrefill, when non-nil, lists the networks a prefill endpoint
	// may be in (its host an IP address inside one of them; a name is
	// refused): a request naming another is answered 403, as llm-d's
	// sidecar answers when its SSRF protection is on. Nil allows any
	// endpoint (llm-d's default): then only the gateway, whose picker
	// sets the header (and removes a client's), should reach the
	// sidecar.
	AllowPrefill []netip.Prefix
	// MaxBodyBytes bounds a two-hop request's body, read whole to
	// rewrite it (a larger one is answered 413); 0:
	// live.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Logger logs the hops' failures; nil: none.
	Logger hclog.Logger
}

// Handler is the sidecar's http.Handler.
type Handler struct {
	cfg   Config
	proxy *httputil.ReverseProxy
}

// New returns the Handler of cfg. Errors: no engine URL, or one that is
// not http or https with a host.
func New(cfg Config) (*Handler, error) {
	if cfg.Engine == nil || (cfg.Engine.Scheme != "http" && cfg.Engine.Scheme != "https") || cfg.Engine.Host == "" {
		return nil, fmt.Errorf("sidecar: engine URL %v: want http://HOST:PORT or https://HOST:PORT", cfg.Engine)
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = live.DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	h := &Handler{cfg: cfg}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(cfg.Engine)
			pr.Out.Host = pr.In.Host
		},
		Transport:     cfg.Transport,
		FlushInterval: -1, // a stream's events go on as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client left
			}
			cfg.Logger.Warn("engine failed", "path", r.URL.Path, "error", err)
			writeError(w, r.URL.Path, http.StatusBadGateway, live.TypeServer, "engine_failed", "the local engine failed: "+err.Error())
		},
	}
	return h, nil
}

// twoHop reports whether path is a generation endpoint whose requests
// carry kv_transfer_params in vLLM (chat, completions, Responses,
// Messages), and whether it is the Responses API's.
func twoHop(path string) (ok, responses bool) {
	e, ok := live.EndpointFor(path)
	if !ok || !e.API.Generates() {
		return false, false
	}
	return true, e.API == live.APIResponses
}

// ServeHTTP passes r to the engine, or runs it in two hops when it is a
// POST to a generation endpoint carrying epp.PrefillHeader (its first
// entry, when the header lists several "host:port" separated by commas, as
// llm-d's sidecar reads it without sampling). The header never reaches
// the engine. Errors are answered in the endpoint's error shape
// (Anthropic's for /v1/messages, OpenAI's otherwise): 400 for a body that
// is not a JSON object or a malformed endpoint, 403 for an endpoint
// outside AllowPrefill, 413 for a body over MaxBodyBytes, 502 when the
// prefill endpoint fails or answers without kv_transfer_params (a
// non-2xx prefill answer is passed through as it is).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(epp.PrefillHeader)
	r.Header.Del(epp.PrefillHeader)
	ok, responses := twoHop(r.URL.Path)
	if len(values) == 0 || r.Method != http.MethodPost || !ok {
		h.proxy.ServeHTTP(w, r)
		return
	}
	first, _, _ := strings.Cut(values[0], ",")
	prefill, err := h.endpoint(strings.TrimSpace(first))
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, errNotAllowed) {
			code = http.StatusForbidden
		}
		writeError(w, r.URL.Path, code, live.TypeInvalidRequest, "bad_prefill_endpoint", err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, h.cfg.MaxBodyBytes+1))
	if err != nil {
		writeError(w, r.URL.Path, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", "reading the request body: "+err.Error())
		return
	}
	if int64(len(body)) > h.cfg.MaxBodyBytes {
		writeError(w, r.URL.Path, http.StatusRequestEntityTooLarge, live.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", h.cfg.MaxBodyBytes))
		return
	}
	pbody, err := PrefillBody(body, responses)
	if err != nil {
		writeError(w, r.URL.Path, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return
	}
	kv, ok := h.prefill(w, r, prefill, pbody)
	if !ok {
		return
	}
	dbody, err := DecodeBody(body, kv)
	if err != nil {
		// body was decoded as a JSON object already: unreachable.
		writeError(w, r.URL.Path, http.StatusInternalServerError, live.TypeServer, "internal", err.Error())
		return
	}
	w.Header().Set(PrefillEndpointHeader, prefill)
	r.Body = io.NopCloser(bytes.NewReader(dbody))
	r.ContentLength = int64(len(dbody))
	r.Header.Del("Content-Length")
	h.proxy.ServeHTTP(w, r)
}

// errNotAllowed: a prefill endpoint outside Config.AllowPrefill.
var errNotAllowed = errors.New("not an allowed prefill endpoint")

// endpoint checks a prefill endpoint: "host:port" with a port from 1 to
// 65535, and, with AllowPrefill, an IP address inside one of its
// networks. It returns it as given.
func (h *Handler) endpoint(ep string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	n, perr := strconv.Atoi(port)
	if err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%s %s: want host:port", epp.PrefillHeader, untrusted.Text(ep, untrusted.MaxClient))
	}
	if h.cfg.AllowPrefill == nil {
		return ep, nil
	}
	ip, err := netip.ParseAddr(host)
	if err == nil {
		ip = ip.Unmap()
		for _, p := range h.cfg.AllowPrefill {
			if p.Contains(ip) {
				return ep, nil
			}
		}
	}
	return "", fmt.Errorf("%s %s: %w (the sidecar's --prefill-allow)", epp.PrefillHeader, untrusted.Text(ep, untrusted.MaxClient), errNotAllowed)
}

// prefill sends the prefill request to the endpoint and returns its
// answer's kv_transfer_params; false when it answered the client instead
// (or the client left).
func (h *Handler) prefill(w http.ResponseWriter, r *http.Request, endpoint string, body []byte) (json.RawMessage, bool) {
	ctx := r.Context()
	target := url.URL{Scheme: "http", Host: endpoint, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		writeError(w, r.URL.Path, http.StatusBadRequest, live.TypeInvalidRequest, "bad_prefill_endpoint", err.Error())
		return nil, false
	}
	up.Header = r.Header.Clone()
	for _, k := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length",
		"Accept-Encoding"} { // the sidecar reads the answer itself: no compressed encoding
		up.Header.Del(k)
	}
	up.ContentLength = int64(len(body))
	resp, err := h.cfg.Transport.RoundTrip(up)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, MaxPrefillAnswer+1))
		_ = resp.Body.Close()
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, false // the client left
	case err != nil:
		h.cfg.Logger.Warn("prefill endpoint failed", "endpoint", endpoint, "error", err)
		writeError(w, r.URL.Path, http.StatusBadGateway, live.TypeServer, "prefill_failed",
			fmt.Sprintf("the prefill endpoint %s failed: %v", endpoint, err))
		return nil, false
	}
	w.Header().Set(PrefillEndpointHeader, endpoint)
	if len(answer) > MaxPrefillAnswer {
		writeError(w, r.URL.Path, http.StatusBadGateway, live.TypeServer, "bad_prefill_answer",
			fmt.Sprintf("the prefill endpoint %s answered more than %d bytes", endpoint, MaxPrefillAnswer))
		return nil, false
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
		return nil, false
	}
	kv, ok := KVTransferParams(answer)
	if !ok {
		h.cfg.Logger.Warn("prefill answer without kv_transfer_params", "endpoint", endpoint)
		writeError(w, r.URL.Path, http.StatusBadGateway, live.TypeServer, "bad_prefill_answer",
			fmt.Sprintf("the prefill endpoint %s answered without a kv_transfer_params object: is it an engine with a KV connector producing KV (vLLM --kv-transfer-config kv_role kv_producer or kv_both)?", endpoint))
		return nil, false
	}
	return kv, true
}

// writeError answers status in path's error shape: Anthropic's
// ({"type": "error", "error": {"type", "message"}}: AnthropicErrorResponse
// in vllm/entrypoints/anthropic/protocol.py) for /v1/messages, OpenAI's
// (live.WriteError) otherwise.
func writeError(w http.ResponseWriter, path string, status int, typ, code, msg string) {
	if e, ok := live.EndpointFor(path); ok && e.API == live.APIMessages {
		if typ == live.TypeServer {
			typ = "api_error" // Anthropic's type of a server-side error
		}
		live.WriteJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
		return
	}
	live.WriteError(w, status, typ, code, msg)
}
