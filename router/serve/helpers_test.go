package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// engine is a fake OpenAI engine on a real loopback server: it streams
// chunks SSE events with delay between them, or answers one JSON body.
type engine struct {
	*httptest.Server
	chunks int
	delay  time.Duration
	// gate, when set, holds every answer after its first chunk until it is
	// closed.
	gate     chan struct{}
	requests atomic.Int64
	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
}

func newEngine(t *testing.T, chunks int, delay time.Duration) *engine {
	t.Helper()
	e := &engine{chunks: chunks, delay: delay}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.headers = append(e.headers, r.Header.Clone())
	e.mu.Unlock()
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if !req.Stream {
		if e.gate != nil {
			select {
			case <-e.gate:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"completion_tokens":%d}}`, e.chunks)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	for i := range e.chunks {
		if i > 0 {
			select {
			case <-time.After(e.delay):
			case <-r.Context().Done():
				return
			}
		}
		if i == 1 && e.gate != nil {
			select {
			case <-e.gate:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		f.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	f.Flush()
}

// workerSet is a fake worker manager.
type workerSet struct {
	mu       sync.Mutex
	urls     map[string]string
	failures map[string]int
	success  map[string]int
	ready    atomic.Bool
}

func newWorkerSet() *workerSet {
	ws := &workerSet{urls: map[string]string{}, failures: map[string]int{}, success: map[string]int{}}
	ws.ready.Store(true)
	return ws
}

func (ws *workerSet) URL(name string) (string, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	u, ok := ws.urls[name]
	return u, ok
}

func (ws *workerSet) ReportFailure(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.failures[name]++
}

func (ws *workerSet) ReportSuccess(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.success[name]++
}

// Status lists the workers by name, all ready or none as ready says.
func (ws *workerSet) Status() []workers.Status {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []workers.Status
	for name, url := range ws.urls {
		out = append(out, workers.Status{Config: config.Worker{Name: name, URL: url, Role: shared.RoleAggregated}, Ready: ws.ready.Load()})
	}
	slices.SortFunc(out, func(a, b workers.Status) int { return strings.Compare(a.Config.Name, b.Config.Name) })
	return out
}

func (ws *workerSet) failuresOf(name string) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.failures[name]
}

// backend is one worker of a test fleet.
type backend struct {
	name   string
	url    string
	models []string
	role   shared.Role // "": aggregated
	// dp: a data-parallel engine's rank (fleet.Spec.DataParallel,
	// DPRank); its id is the first backend's of its name.
	dp   bool
	rank uint32
}

// env is a router, its runtime, its Server on a real loopback listener
// and the fleet.
type env struct {
	r       *router.Router
	rt      *live.Runtime
	s       *Server
	ws      *workerSet
	reg     *prometheus.Registry
	url     string
	workers []*fleet.Worker
}

type envOptions struct {
	queue          config.Queue
	classifier     shared.ClassifierFactory
	timeout        time.Duration
	bodiesInFlight int64 // Options.MaxBodyBytesInFlight
	maxBody        int64 // Options.MaxBodyBytes
	perClient      int64 // Options.MaxBodyBytesPerClient
	drain          time.Duration
	logger         hclog.Logger // nil: none
	// models, when set, are the models the workers list (servingSet, as
	// workers.Manager knows them); nil: the workers know no model list.
	models []string
	// migrationLimit and stall: Options.MigrationLimit and StallTimeout.
	migrationLimit int
	stall, grace   time.Duration
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
		role := b.role
		if role == "" {
			role = shared.RoleAggregated
		}
		id := shared.WorkerID(i + 1)
		for j, o := range backends[:i] {
			if o.name == b.name {
				id = shared.WorkerID(j + 1)
				break
			}
		}
		w, err := r.AddWorker(fleet.Spec{ID: id, DPRank: b.rank, DataParallel: b.dp, Role: role, TotalKVBlocks: 1000, Name: b.name, Models: models})
		if err != nil {
			t.Fatal(err)
		}
		e.workers = append(e.workers, w)
		e.ws.urls[b.name] = b.url
	}
	var ws live.Workers = e.ws
	if o.models != nil {
		ws = servingSet{workerSet: e.ws, models: o.models}
	}
	e.rt, err = live.New(live.Options{Router: r, Queue: o.queue, Classifier: o.classifier, MaxBodyBytes: o.maxBody, Workers: ws, Registry: e.reg,
		RequestTimeout: o.timeout, DispatchInterval: 5 * time.Millisecond, Logger: o.logger})
	if err != nil {
		t.Fatal(err)
	}
	e.s, err = New(e.rt, Options{MaxBodyBytesInFlight: o.bodiesInFlight, MaxBodyBytesPerClient: o.perClient, DrainTimeout: o.drain,
		MigrationLimit: o.migrationLimit, StallTimeout: o.stall, WorkerDrainGrace: o.grace})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.rt.Dispatcher(ctx) }()
	hs := httptest.NewServer(e.s.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections() // a failed test may leave requests held
		hs.Close()
		cancel()
		<-done
		e.rt.Close()
	})
	e.url = hs.URL
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

// settle waits until the server has no request in flight and every
// booking is released.
func (e *env) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for e.s.InFlight() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still in flight", e.s.InFlight())
		}
		time.Sleep(2 * time.Millisecond)
	}
	for _, w := range e.workers {
		l := w.Load(false)
		if l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 0 {
			t.Errorf("worker %s: active %d, prefill tokens %d, decode blocks %d; want 0",
				w.Name, l.ActiveRequests, l.ActivePrefillTokens, l.ActiveDecodeBlocks)
		}
	}
	for _, role := range config.Roles {
		if n := e.rt.Waiting(role); n != 0 {
			t.Errorf("%s queue holds %d", role, n)
		}
	}
}

// errorBody is the OpenAI error body's "error" object as a client reads
// it (live.WriteError writes it).
type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// metric returns the value of the counter or gauge series of e's registry
// named name with the labels (name, value pairs); 0 when there is none.
func (e *env) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, _ := testkit.MetricSeries(t, e.reg, name, labels...)
	return v
}

// series returns how many series of the family name e's registry holds.
func (e *env) series(t *testing.T, name string) int {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

func decodeError(t *testing.T, resp *http.Response) errorBody {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	var e struct {
		Error errorBody `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("error body: %v", err)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body %+v lacks message or type", e.Error)
	}
	return e.Error
}

// cancelRun is what runCancelling saw: answers by status, requests the
// client cancelled (any error), and streams that ended with [DONE].
type cancelRun struct {
	codes                  map[int]int
	cancelled, streamsDone int
}

// runCancelling sends total chat requests to url from conc clients, three
// in four streamed, and cancels about one in cancelOneIn of them after a
// random delay below maxDelay (seeded: the same jobs each run). body
// gives a request's body. A completed stream must end with [DONE].
func runCancelling(t *testing.T, url string, total, conc, cancelOneIn int, maxDelay time.Duration, seed uint64, body func(stream bool) string) cancelRun {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	type job struct {
		stream bool
		cancel time.Duration // 0: never
	}
	jobs := make(chan job)
	var mu sync.Mutex
	out := cancelRun{codes: map[int]int{}}
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				ctx, cancel := context.WithCancel(context.Background())
				if j.cancel > 0 {
					time.AfterFunc(j.cancel, cancel)
				}
				resp, err := post(t, ctx, url, body(j.stream))
				code, done := -1, false
				if err == nil {
					code = resp.StatusCode
					sc := bufio.NewScanner(resp.Body)
					for sc.Scan() {
						done = done || sc.Text() == "data: [DONE]"
					}
					err = sc.Err()
					_ = resp.Body.Close()
					if err == nil && j.stream && code == http.StatusOK && !done {
						t.Errorf("a completed stream lacks [DONE]")
					}
				}
				cancel()
				mu.Lock()
				if err != nil {
					out.cancelled++
				} else {
					out.codes[code]++
					if done {
						out.streamsDone++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for range total {
		j := job{stream: rng.IntN(4) != 0}
		if rng.IntN(cancelOneIn) == 0 {
			j.cancel = time.Duration(rng.Int64N(int64(maxDelay)))
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	return out
}

// postWantError posts a non-streamed chat request to the server at url
// and checks that the answer is an OpenAI error of status and code; it
// returns the error body.
func postWantError(t *testing.T, url string, status int, code string) errorBody {
	t.Helper()
	resp, err := post(t, context.Background(), url+"/v1/chat/completions", chatBody("m", false, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	got := decodeError(t, resp)
	if got.Code != code {
		t.Errorf("code %q, want %q", got.Code, code)
	}
	return got
}
