package envoysim

import (
	"context"

	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/router/epp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handle records what the EPP reported for one picked request.
type handle struct {
	mu     sync.Mutex
	served []string
	first  int
	ends   []epp.Outcome
}

func (h *handle) Served(ep string) { h.mu.Lock(); h.served = append(h.served, ep); h.mu.Unlock() }
func (h *handle) FirstToken()      { h.mu.Lock(); h.first++; h.mu.Unlock() }
func (h *handle) Status(int)       {}
func (h *handle) Body([]byte)      {}
func (h *handle) End(o epp.Outcome) {
	h.mu.Lock()
	h.ends = append(h.ends, o)
	h.mu.Unlock()
}

func (h *handle) snapshot() ([]string, int, []epp.Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.served), h.first, slices.Clone(h.ends)
}

// picker answers with endpoint and fallbacks (or err) and keeps the
// requests and handles.
type picker struct {
	endpoint  string
	fallbacks []string
	err       error

	mu      sync.Mutex
	reqs    []epp.Request
	handles []*handle
}

func (p *picker) Pick(_ context.Context, r *epp.Request) (epp.Pick, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, epp.Request{Headers: r.Headers, Body: slices.Clone(r.Body), Subset: r.Subset})
	if p.err != nil {
		return epp.Pick{}, p.err
	}
	h := &handle{}
	p.handles = append(p.handles, h)
	return epp.Pick{Endpoint: p.endpoint, Fallbacks: p.fallbacks, Handle: h}, nil
}

func (p *picker) state() ([]epp.Request, []*handle) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs), slices.Clone(p.handles)
}

// recorder is the ext_proc service epp.Server, keeping every message it
// received, stream by stream.
type recorder struct {
	s       *epp.Server
	mu      sync.Mutex
	streams [][]*extprocv3.ProcessingRequest
}

type recordingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	rec *recorder
	i   int
}

func (r *recordingStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := r.ExternalProcessor_ProcessServer.Recv()
	if err == nil {
		r.rec.mu.Lock()
		r.rec.streams[r.i] = append(r.rec.streams[r.i], m)
		r.rec.mu.Unlock()
	}
	return m, err
}

func (r *recorder) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	r.mu.Lock()
	r.streams = append(r.streams, nil)
	i := len(r.streams) - 1
	r.mu.Unlock()
	return r.s.Process(&recordingStream{ExternalProcessor_ProcessServer: srv, rec: r, i: i})
}

func (r *recorder) messages() [][]*extprocv3.ProcessingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.streams)
}

// startEPP serves epp.Server over p on loopback TCP and returns its
// address and the recorder.
func startEPP(t *testing.T, p epp.Picker) (string, *recorder) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{s: &epp.Server{Picker: p}}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, rec)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return ln.Addr().String(), rec
}

// sseUpstream answers with n SSE events and [DONE], flushing each, after
// checking that the request body is chat's: a 400 otherwise.
func sseUpstream(t *testing.T, n int) (*httptest.Server, string) {
	t.Helper()
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, err := io.ReadAll(r.Body); err != nil || string(b) != chat {
			http.Error(w, fmt.Sprintf("body %q, %v", b, err), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.Close)
	return u, strings.TrimPrefix(u.URL, "http://")
}

func newProxy(t *testing.T, cfg Config) (*Proxy, string) {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(func() { front.Close(); _ = p.Close() })
	return p, front.URL
}

const chat = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`

func post(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// kinds names each message's phase, with "+eos" when it ends its
// direction and "+cfg" when it carries the protocol configuration.
func kinds(ms []*extprocv3.ProcessingRequest) []string {
	var out []string
	for _, m := range ms {
		var k string
		switch r := m.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			k = "req-headers"
			if r.RequestHeaders.GetEndOfStream() {
				k += "+eos"
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			k = "req-body"
			if r.RequestBody.GetEndOfStream() {
				k += "+eos"
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			k = "resp-headers"
		case *extprocv3.ProcessingRequest_ResponseBody:
			k = "resp-body"
			if r.ResponseBody.GetEndOfStream() {
				k += "+eos"
			}
		default:
			k = fmt.Sprintf("%T", r)
		}
		if m.GetProtocolConfig() != nil {
			k += "+cfg"
		}
		out = append(out, k)
	}
	return out
}

// TestPicksForwardsAndReports: in both modes a request is picked by the
// real ext_proc handler, forwarded to the picked endpoint and streamed
// back whole; the handler saw the phases in Envoy's order (protocol
// configuration on the first message only, with the mode), the served
// endpoint in envoy.lb on the response phases, and ended the request
// completed after its first token.
func TestPicksForwardsAndReports(t *testing.T) {
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			_, ep := sseUpstream(t, 5)
			pk := &picker{endpoint: ep}
			addr, rec := startEPP(t, pk)
			p, url := newProxy(t, Config{EPP: addr, Mode: mode})
			code, h, body := post(t, url, chat)
			if code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Count(body, "data: {") != 5 {
				t.Fatalf("got %d %q", code, body)
			}
			if got := h.Get(UpstreamHeader); got != ep {
				t.Errorf("%s %q, want %q", UpstreamHeader, got, ep)
			}
			reqs, hs := pk.state()
			if len(reqs) != 1 || string(reqs[0].Body) != chat || reqs[0].Headers[":path"] != "/v1/chat/completions" || reqs[0].Headers["x-request-id"] == "" {
				t.Fatalf("picker saw %+v", reqs)
			}
			served, first, ends := hs[0].snapshot()
			if !slices.Equal(served, []string{ep}) || first != 1 || !slices.Equal(ends, []epp.Outcome{epp.Completed}) {
				t.Errorf("handle: served %v first %d ends %v", served, first, ends)
			}
			ms := rec.messages()
			if len(ms) != 1 {
				t.Fatalf("%d streams, want 1", len(ms))
			}
			k := kinds(ms[0])
			if k[0] != "req-headers+cfg" || k[1] != "req-body+eos" || k[2] != "resp-headers" || k[len(k)-1] != "resp-body+eos" {
				t.Errorf("phases %v", k)
			}
			for i, m := range ms[0] {
				if i > 0 && m.GetProtocolConfig() != nil {
					t.Errorf("protocol_config on message %d", i)
				}
				if i >= 2 && m.GetMetadataContext().GetFilterMetadata()[epp.MetadataNamespace].GetFields()[epp.ServedKey].GetStringValue() != ep {
					t.Errorf("message %d (%s) lacks the served endpoint", i, k[i])
				}
			}
			want := filterv3.ProcessingMode_BUFFERED
			if mode == FullDuplex {
				want = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			}
			if got := ms[0][0].GetProtocolConfig().GetRequestBodyMode(); got != want {
				t.Errorf("request body mode %v, want %v", got, want)
			}
			if s := p.Stats(); s != (Stats{Picked: 1}) {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestFallbackWhenPrimaryRefuses: the primary endpoint refuses
// connections; the request goes to the next of the destination list, and
// that one is reported as served.
func TestFallbackWhenPrimaryRefuses(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	primary := closed.Addr().String()
	_ = closed.Close()
	_, ep := sseUpstream(t, 2)
	pk := &picker{endpoint: primary, fallbacks: []string{ep}}
	addr, _ := startEPP(t, pk)
	p, url := newProxy(t, Config{EPP: addr, Mode: FullDuplex})
	code, h, body := post(t, url, chat)
	if code != 200 || h.Get(UpstreamHeader) != ep || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("got %d %v %q", code, h, body)
	}
	if s := p.Stats(); s != (Stats{Picked: 1, FellBack: 1}) {
		t.Errorf("stats %+v, want one pick served by its fallback", s)
	}
	_, hs := pk.state()
	served, _, ends := hs[0].snapshot()
	if !slices.Equal(served, []string{ep}) || !slices.Equal(ends, []epp.Outcome{epp.Completed}) {
		t.Errorf("served %v ends %v, want [%s] [completed]", served, ends, ep)
	}
}

// TestServedAs: the served endpoint reported is the one ServedAs maps
// the used one to.
func TestServedAs(t *testing.T) {
	_, ep := sseUpstream(t, 1)
	pk := &picker{endpoint: ep}
	addr, _ := startEPP(t, pk)
	_, url := newProxy(t, Config{EPP: addr, ServedAs: func(string) string { return "10.9.9.9:80" }})
	if code, _, body := post(t, url, chat); code != 200 {
		t.Fatalf("got %d %q", code, body)
	}
	_, hs := pk.state()
	if served, _, _ := hs[0].snapshot(); !slices.Equal(served, []string{"10.9.9.9:80"}) {
		t.Errorf("served %v", served)
	}
}

// TestImmediateResponseAsIs: a picker error's immediate response reaches
// the client as the handler built it.
func TestImmediateResponseAsIs(t *testing.T) {
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			addr, _ := startEPP(t, &picker{err: epp.ErrShed})
			p, url := newProxy(t, Config{EPP: addr, Mode: mode, FailOpen: true, Fallbacks: []string{"127.0.0.1:1"}})
			code, h, body := post(t, url, chat)
			if code != 429 || h.Get("Content-Type") != "application/json" || !strings.Contains(body, `"code":"queue_full"`) {
				t.Fatalf("got %d %v %q", code, h, body)
			}
			if s := p.Stats(); s != (Stats{Immediate: 1}) {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestSubsetHintSent: the configured subset hint reaches the picker.
func TestSubsetHintSent(t *testing.T) {
	_, ep := sseUpstream(t, 1)
	pk := &picker{endpoint: ep}
	addr, _ := startEPP(t, pk)
	_, url := newProxy(t, Config{EPP: addr, Mode: FullDuplex, Subset: func(*http.Request) []string { return []string{ep, "10.0.0.2:8000"} }})
	if code, _, body := post(t, url, chat); code != 200 {
		t.Fatalf("got %d %q", code, body)
	}
	reqs, _ := pk.state()
	if !slices.Equal(reqs[0].Subset, []string{ep, "10.0.0.2:8000"}) {
		t.Errorf("subset %v", reqs[0].Subset)
	}
}

// TestFailOpen: with the EPP unreachable, a FailOpen proxy sends requests
// to its fallbacks in turn and counts them; without FailOpen it answers
// 500.
func TestFailOpen(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.Addr().String()
	_ = closed.Close()
	_, a := sseUpstream(t, 1)
	_, b := sseUpstream(t, 1)
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			p, url := newProxy(t, Config{EPP: dead, Mode: mode, FailOpen: true, Fallbacks: []string{a, b}})
			var got []string
			for range 4 {
				code, h, body := post(t, url, chat)
				if code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Fatalf("got %d %q", code, body)
				}
				got = append(got, h.Get(UpstreamHeader))
			}
			if !slices.Equal(got, []string{a, b, a, b}) {
				t.Errorf("fallbacks used %v", got)
			}
			if s := p.Stats(); s.FailedOpen != 4 || s.Picked != 0 || s.StreamErrors != 4 {
				t.Errorf("stats %+v", s)
			}
			closedP, url2 := newProxy(t, Config{EPP: dead, Mode: mode, Fallbacks: []string{a}})
			if code, _, _ := post(t, url2, chat); code != 500 {
				t.Errorf("without FailOpen: %d, want 500", code)
			}
			if s := closedP.Stats(); s.FailedOpen != 0 || s.LocalReplies != 1 {
				t.Errorf("stats without FailOpen %+v", s)
			}
		})
	}
}

// TestClientResetAbortsTheStream: a client that goes away mid-response
// resets the ext_proc stream; the handler ends the request aborted.
func TestClientResetAbortsTheStream(t *testing.T) {
	release := make(chan struct{})
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer u.Close()
	defer close(release)
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			pk := &picker{endpoint: strings.TrimPrefix(u.URL, "http://")}
			addr, _ := startEPP(t, pk)
			_, url := newProxy(t, Config{EPP: addr, Mode: mode})
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			if n, err := resp.Body.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "data: first") {
				t.Fatalf("first chunk %q %v", buf[:n], err)
			}
			cancel()
			_ = resp.Body.Close()
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, hs := pk.state()
				_, first, ends := hs[0].snapshot()
				if slices.Equal(ends, []epp.Outcome{epp.Aborted}) && first == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("ends %v first %d, want [aborted] after the first token", ends, first)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestBodyBound: a request body over MaxBodyBytes is answered 413
// without reaching the picker.
func TestBodyBound(t *testing.T) {
	pk := &picker{endpoint: "127.0.0.1:1"}
	addr, _ := startEPP(t, pk)
	for _, mode := range []Mode{Buffered, FullDuplex} {
		_, url := newProxy(t, Config{EPP: addr, Mode: mode, MaxBodyBytes: 10})
		if code, _, _ := post(t, url, chat); code != http.StatusRequestEntityTooLarge {
			t.Errorf("%s: %d, want 413", mode, code)
		}
	}
	if reqs, _ := pk.state(); len(reqs) != 0 {
		t.Errorf("the picker saw %d requests", len(reqs))
	}
}
