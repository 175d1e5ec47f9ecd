package live

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/upstream"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// testFace is the face the Daemon's tests serve: the least of an HTTP
// face over the runtime, as the ext_proc face uses it (Place, the meter
// through Answer and FirstByte, Finish). GET /readyz answers
// Runtime.Readiness, GET /metrics the registry, and POST
// /v1/chat/completions is placed and sent to the chosen worker's engine,
// as is POST /v1/completions, its answer copied back with the worker in
// X-Switchyard-Worker. The
// OpenAI face itself (retries, disaggregation, errors, bodies) is
// router/serve's, tested there.
type testFace struct {
	rt *Runtime
	tr *upstream.Transport
}

// newTestFace is the FaceFunc of testFace.
func newTestFace(rt *Runtime, tr *upstream.Transport) (Face, error) {
	return &testFace{rt: rt, tr: tr}, nil
}

func (f *testFace) DebugRoutes() map[string]http.Handler { return nil }

func (f *testFace) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		a := f.rt.Readiness()
		code := http.StatusOK
		if !a.Ready {
			code = http.StatusServiceUnavailable
		}
		WriteJSON(w, code, a)
	})
	if reg := f.rt.Registry(); reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	}
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { f.complete(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { f.complete(w, r, false) })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// complete places a completion request (chat: a chat one) and passes its
// answer through.
func (f *testFace) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		WriteError(w, http.StatusBadRequest, TypeInvalidRequest, "invalid_body", err.Error())
		return
	}
	p, err := f.rt.Place(r.Context(), schema(chat), r.Header, body)
	if err != nil {
		f.rt.Finish(&p, http.StatusServiceUnavailable, admission.Outcome{})
		WriteError(w, http.StatusServiceUnavailable, TypeServer, "not_placed", err.Error())
		return
	}
	up, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, p.URL+r.URL.Path, strings.NewReader(string(body)))
	up.Header.Set("Content-Type", "application/json")
	resp, err := f.tr.RoundTrip(up)
	if err != nil {
		f.rt.Finish(&p, http.StatusBadGateway, admission.Aborted("worker error"))
		WriteError(w, http.StatusBadGateway, TypeServer, "worker_failed", err.Error())
		return
	}
	defer func() { _ = resp.Body.Close() }()
	w.Header().Set("X-Switchyard-Worker", p.Decision.Worker.Name)
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			f.rt.FirstByte(&p)
			f.rt.Answer(&p, buf[:n])
			_, _ = w.Write(buf[:n])
		}
		if rerr != nil {
			if rerr == io.EOF {
				f.rt.Finish(&p, resp.StatusCode, admission.Completed(int64(p.PromptTokens)))
			} else {
				f.rt.Finish(&p, http.StatusBadGateway, admission.Aborted("worker error"))
			}
			return
		}
	}
}

// newMock starts a router/mockworker engine serving any model, whose
// prefill answers name engineID, at speedup times real time, with the
// router's 16-token hashing block, on a loopback server.
func newMock(t *testing.T, engineID string, speedup float64) *httptest.Server {
	t.Helper()
	m, err := mockworker.New(mockworker.Config{Speedup: speedup, BlockTokens: 16, EngineID: engineID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close) // after the server's Close below
	s := httptest.NewServer(m)
	t.Cleanup(func() {
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

func chatBody(model string, stream bool, text string) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":%q}]}`, model, stream, text)
}

func post(t *testing.T, ctx context.Context, url, body string, hdr ...string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return http.DefaultClient.Do(req)
}

// getReadyz gets url's /readyz and decodes it.
func getReadyz(t *testing.T, url string) (int, Readiness) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var a Readiness
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("/readyz body: %v", err)
	}
	return resp.StatusCode, a
}

// workerSet is a fake worker manager: workers by name and URL, all ready.
type workerSet struct {
	mu      sync.Mutex
	urls    map[string]string
	success map[string]int
}

func newWorkerSet() *workerSet {
	return &workerSet{urls: map[string]string{}, success: map[string]int{}}
}

func (ws *workerSet) URL(name string) (string, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	u, ok := ws.urls[name]
	return u, ok
}

func (ws *workerSet) ReportFailure(string) {}

func (ws *workerSet) ReportSuccess(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.success[name]++
}

// Status lists the workers by name, all ready.
func (ws *workerSet) Status() []workers.Status {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []workers.Status
	for name, url := range ws.urls {
		out = append(out, workers.Status{Config: config.Worker{Name: name, URL: url, Role: shared.RoleAggregated}, Ready: true})
	}
	slices.SortFunc(out, func(a, b workers.Status) int { return strings.Compare(a.Config.Name, b.Config.Name) })
	return out
}

// backend is one worker of a test fleet.
type backend struct {
	name   string
	url    string
	models []string
}

// env is a round-robin Router (block size 16) over backends, its Runtime
// with metrics, and the testFace on a loopback server at url.
type env struct {
	r   *router.Router
	rt  *Runtime
	ws  *workerSet
	reg *prometheus.Registry
	url string
}

type envOptions struct {
	logger hclog.Logger // nil: none
}

func newEnv(t *testing.T, o envOptions, backends ...backend) *env {
	t.Helper()
	roles := map[shared.Role]*policy.Policy{}
	for _, role := range config.Roles {
		roles[role] = &policy.Policy{Name: "rr", PickerName: "pick", Picker: builtin.NewRoundRobin()}
	}
	r, err := router.New(router.Options{BlockSize: 16, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	e := &env{r: r, ws: newWorkerSet(), reg: prometheus.NewRegistry()}
	for i, b := range backends {
		models := b.models
		if models == nil {
			models = []string{"m"}
		}
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 1000, Name: b.name, Models: models}); err != nil {
			t.Fatal(err)
		}
		e.ws.urls[b.name] = b.url
	}
	e.rt, err = New(Options{Router: r, Workers: e.ws, Registry: e.reg, DispatchInterval: 5 * time.Millisecond, Logger: o.logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.rt.Dispatcher(ctx) }()
	tr := NewTransport()
	face := &testFace{rt: e.rt, tr: tr}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = face.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
		<-done
		e.rt.Close()
		tr.Close()
	})
	e.url = "http://" + ln.Addr().String()
	return e
}

// closedURL returns the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

// settle waits until every booking of e's workers is released and the
// queue is empty.
func (e *env) settle(t *testing.T) {
	t.Helper()
	testkit.Eventually(t, "the awaited condition", func() bool {
		for _, role := range config.Roles {
			for _, w := range e.r.Workers("m", role) {
				if w.Load(false).ActiveRequests != 0 {
					return false
				}
			}
		}
		return e.rt.Queued() == 0
	})
}

// schema is the chat schema when chat, else the completions one.
func schema(chat bool) API {
	if chat {
		return APIChat
	}
	return APICompletions
}
