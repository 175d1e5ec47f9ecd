package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

func TestStreamPassesThroughChunkByChunk(t *testing.T) {
	eng := newEngine(t, 5, time.Millisecond)
	eng.gate = make(chan struct{})
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", true, "hi"), "X-Request-Id", "req-1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if got := resp.Header.Get("X-Switchyard-Worker"); got != "w1" {
		t.Errorf("x-switchyard-worker = %q, want w1", got)
	}
	if got := resp.Header.Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("content-type = %q", got)
	}
	br := bufio.NewReader(resp.Body)
	// The engine holds everything after its first chunk until the gate
	// opens: the client reading it proves the router does not buffer.
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") || !strings.Contains(line, `"t0"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	if got := e.workers[0].ActiveRequests(); got != 1 {
		t.Errorf("mid-stream active = %d, want 1", got)
	}
	close(eng.gate)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(rest), "data: "); n != 5 { // 4 chunks and [DONE]
		t.Errorf("rest has %d events, want 5:\n%s", n, rest)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]: %q", rest)
	}
	e.settle(t)
	if got := eng.headers[0].Get("X-Request-Id"); got != "req-1" {
		t.Errorf("engine saw x-request-id %q, want req-1", got)
	}
	if got := e.metric(t, "switchyard_requests_total", "model", "m", "code", "200"); got != 1 {
		t.Errorf("requests_total{m,200} = %v", got)
	}
	if got := e.series(t, "switchyard_time_to_first_token_seconds"); got != 1 {
		t.Errorf("ttft series = %d, want 1", got)
	}
}

func TestNonStreamedPassesTheBodyThrough(t *testing.T) {
	eng := newEngine(t, 3, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	body := `{"model":"m","prompt":[1,2,3,4,5],"max_tokens":3}`
	resp, err := post(t, context.Background(), e.url+"/v1/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), `"content":"hello"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, got)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no x-request-id on the answer")
	}
	if string(eng.bodies[0]) != body {
		t.Errorf("engine got %s, want the client's body unchanged", eng.bodies[0])
	}
	e.settle(t)
}

func TestErrorShapes(t *testing.T) {
	eng := newEngine(t, 3, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	for _, tc := range []struct {
		name, path, body string
		status           int
		typ              string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, 400, live.TypeInvalidRequest},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, live.TypeInvalidRequest},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, 400, live.TypeInvalidRequest},
		{"no prompt", "/v1/completions", `{"model":"m"}`, 400, live.TypeInvalidRequest},
		{"bad content", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":3}]}`, 400, live.TypeInvalidRequest},
		{"unknown model", "/v1/chat/completions", chatBody("nope", false, "x"), 503, live.TypeServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := post(t, context.Background(), e.url+tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := decodeError(t, resp); got.Type != tc.typ {
				t.Errorf("type %q, want %q", got.Type, tc.typ)
			}
		})
	}
	if got := e.metric(t, "switchyard_requests_total", "model", "unknown", "code", "503"); got != 1 {
		t.Errorf("requests_total{unknown,503} = %v, want 1", got)
	}
	e.settle(t)
}

func capacityQueue(active, waiting int) config.Queue {
	q := config.DefaultQueue()
	q.MaxActiveRequests, q.MaxWaiting = active, waiting
	return q
}

func TestQueueFullAnswers429AndQueuedRequestsDispatch(t *testing.T) {
	eng := newEngine(t, 2, 0)
	eng.gate = make(chan struct{})
	e := newEnv(t, envOptions{queue: capacityQueue(1, 1)}, backend{name: "w1", url: eng.URL})
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
		// The first holds the worker; the second waits in the queue.
		testkit.Eventually(t, "the awaited condition", func() bool {
			return eng.requests.Load() == 1 && e.rt.Waiting(shared.RoleAggregated) == i
		})
	}
	if got := e.series(t, "switchyard_requests_total"); got != 0 {
		t.Fatalf("requests counted before any ended: %v", got)
	}
	if n, err := testutil.GatherAndCount(e.reg, "switchyard_queue_depth"); err != nil || n != 1 {
		t.Errorf("queue_depth series %d, %v", n, err)
	}
	postWantError(t, e.url, http.StatusTooManyRequests, "queue_full") // the third request
	close(eng.gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("held request answered %d, want 200", c)
		}
	}
	e.settle(t)
}

// dueIn classifies every request with a due time d from now.
type dueIn time.Duration

func (dueIn) Inputs() shared.Inputs { return 0 }
func (d dueIn) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return d, nil
}
func (d dueIn) Classify(context.Context, *shared.Request) (shared.Classification, error) {
	return shared.Classification{DueAt: time.Now().Add(time.Duration(d))}, nil
}

func TestDueTimeAnswers429(t *testing.T) {
	eng := newEngine(t, 2, 0)
	eng.gate = make(chan struct{})
	defer close(eng.gate)
	e := newEnv(t, envOptions{queue: capacityQueue(1, 0), classifier: dueIn(30 * time.Millisecond)}, backend{name: "w1", url: eng.URL})
	go func() {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"))
		if err == nil {
			_ = resp.Body.Close()
		}
	}()
	testkit.Eventually(t, "the awaited condition", func() bool { return eng.requests.Load() == 1 })
	postWantError(t, e.url, http.StatusTooManyRequests, "due_time_passed")
}

func TestRetriesOnARefusingWorkerThenSucceeds(t *testing.T) {
	eng := newEngine(t, 2, 0)
	e := newEnv(t, envOptions{}, backend{name: "dead", url: closedURL(t)}, backend{name: "live", url: eng.URL})
	for range 4 {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", true, "x"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "live" {
			t.Errorf("status %d worker %q, want 200 from live", resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"))
		}
	}
	if got := e.ws.failuresOf("dead"); got == 0 {
		t.Error("the refusing worker's failure was not reported")
	}
	e.settle(t)
}

func TestEveryWorkerRefusingAnswers502(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)}, backend{name: "b", url: closedURL(t)})
	postWantError(t, e.url, http.StatusBadGateway, "worker_failed")
	// Each attempt excludes the workers that failed before it: one attempt
	// per worker, then no worker is left to try.
	if a, b := e.ws.failuresOf("a"), e.ws.failuresOf("b"); a != 1 || b != 1 {
		t.Errorf("failures reported: a %d, b %d; want one each", a, b)
	}
	e.settle(t)
}

// TestCancellationAccounting sends 1,000 requests over three slowly
// streaming engines, a fifth of them cancelled at a random point (queued,
// before the headers, mid-stream), with more concurrency than capacity so
// requests queue; afterwards every booking is released and the queue is
// empty.
func TestCancellationAccounting(t *testing.T) {
	var backends []backend
	for _, name := range []string{"a", "b", "c"} {
		eng := newEngine(t, 8, 500*time.Microsecond)
		backends = append(backends, backend{name: name, url: eng.URL})
	}
	e := newEnv(t, envOptions{queue: capacityQueue(4, 0)}, backends...)
	run := runCancelling(t, e.url+"/v1/chat/completions", 1000, 32, 5, 8*time.Millisecond, 1, func(stream bool) string {
		return chatBody("m", stream, "shared prefix "+time.Now().String())
	})
	codes, cancelled := run.codes, run.cancelled
	e.settle(t)
	t.Logf("answers %v, cancelled %d", codes, cancelled)
	if cancelled == 0 || codes[200] == 0 {
		t.Errorf("want both cancelled and completed requests: %v, %d cancelled", codes, cancelled)
	}
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("unexpected status %d (%d times)", c, codes[c])
		}
	}
	if n := e.rt.Queued(); n != 0 {
		t.Errorf("the queue holds %d", n)
	}
}

func TestModelsIsTheUnion(t *testing.T) {
	e := newEnv(t, envOptions{},
		backend{name: "a", url: "http://127.0.0.1:1", models: []string{"llama", "qwen"}},
		backend{name: "b", url: "http://127.0.0.1:1", models: []string{"qwen", "mistral"}})
	resp, err := http.Get(e.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" {
			t.Errorf("object %q", m.Object)
		}
	}
	if list.Object != "list" {
		t.Errorf("object %q", list.Object)
	}
	if diff := cmp.Diff([]string{"llama", "mistral", "qwen"}, ids); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}
}

func TestReadyz(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)})
	e.ws.ready.Store(false)
	if code, a := getReadyz(t, e.url); code != http.StatusServiceUnavailable || a.Ready || a.Reason != "no worker ready" ||
		len(a.Workers) != 1 || a.Workers[0].Ready || a.Policy.State != "loaded" {
		t.Errorf("no worker ready: %d %+v, want 503 saying so", code, a)
	}
	e.ws.ready.Store(true)
	if code, a := getReadyz(t, e.url); code != http.StatusOK || !a.Ready || a.Reason != "" || len(a.Workers) != 1 || !a.Workers[0].Ready {
		t.Errorf("a worker ready: %d %+v, want 200", code, a)
	}
	resp, err := http.Get(e.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz %d", resp.StatusCode)
	}
	resp, err = http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(b), "switchyard_queue_depth{class=\"default\"} 0") {
		t.Errorf("metrics lack the queue depth:\n%s", b)
	}
}

func TestShutdownDrainsAnInFlightStream(t *testing.T) {
	eng := newEngine(t, 4, time.Millisecond)
	eng.gate = make(chan struct{})
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	resp, err := post(t, context.Background(), url+"/v1/chat/completions", chatBody("m", true, "x"))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel() // SIGTERM
	// New connections are refused once the listener closed.
	testkit.Eventually(t, "the awaited condition", func() bool {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with a stream in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(eng.gate)
	rest, err := io.ReadAll(br)
	_ = resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("drained stream: %q, %v", rest, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	e.settle(t)
}

func TestShutdownCutsStreamsAfterTheDrainTimeout(t *testing.T) {
	eng := newEngine(t, 4, time.Millisecond)
	eng.gate = make(chan struct{})
	defer close(eng.gate)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	e.s.drain = 50 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.s.Serve(ctx, ln) }()
	resp, err := post(t, context.Background(), "http://"+ln.Addr().String()+"/v1/chat/completions", chatBody("m", true, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return after its drain timeout")
	}
	e.settle(t)
}

func TestRequestTimeoutEndsAHeldRequest(t *testing.T) {
	eng := newEngine(t, 4, time.Millisecond)
	eng.gate = make(chan struct{})
	defer close(eng.gate)
	e := newEnv(t, envOptions{timeout: 50 * time.Millisecond}, backend{name: "w1", url: eng.URL})
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("status %d, want 504", resp.StatusCode)
	}
	decodeError(t, resp)
	// A stream the timeout ends mid-answer ends with an error event and
	// its terminator: a well-formed stream that says why.
	resp, err = post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", true, "x"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(b), `{"error":{"message":"the request timed out","type":"server_error","param":null,"code":"timeout"}}`+"\n\ndata: [DONE]\n\n") {
		t.Errorf("reading a stream ended by the timeout: %v, %q", err, b)
	}
	e.settle(t)
}

// servingSet knows which models its workers list, as workers.Manager does.
type servingSet struct {
	*workerSet
	models []string
}

func (s servingSet) Serves(model string) bool { return slices.Contains(s.models, model) }
func (s servingSet) Models() []string         { return slices.Sorted(slices.Values(s.models)) }

// A model no worker lists is OpenAI's 404 model_not_found (not retryable);
// a listed model whose workers are all out is a 503. Unknown endpoints and
// methods, and wrongly typed fields, get OpenAI-shaped errors too.
func TestNotFoundShapes(t *testing.T) {
	eng := newEngine(t, 3, 0)
	e := newEnv(t, envOptions{models: []string{"m", "down"}}, backend{name: "w1", url: eng.URL})
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown model", "POST", "/v1/chat/completions", chatBody("nope", false, "x"), 404, "model_not_found"},
		{"model with no ready worker", "POST", "/v1/chat/completions", chatBody("down", false, "x"), 503, "no_worker"},
		{"unknown endpoint", "POST", "/v2/embeddings", `{"model":"m"}`, 404, "not_found"},
		{"pass-through naming no model", "POST", "/v1/unknown", `{}`, 404, "not_found"},
		{"pooling naming no model", "POST", "/v1/embeddings", `{}`, 400, "invalid_request"},
		{"wrong method", "GET", "/v1/chat/completions", "", 405, "method_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, e.url+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := decodeError(t, resp); got.Code != tc.code {
				t.Errorf("code %q, want %q", got.Code, tc.code)
			}
		})
	}
	if _, err := live.ParseRequest([]byte(`{"model":"m","messages":"hi"}`), live.APIChat); err == nil || !strings.Contains(err.Error(), `"messages" must not be a JSON string`) {
		t.Errorf("typed field error = %v", err)
	}
	// A configured model whose workers are all down keeps its name in the
	// metrics and in /v1/models.
	if got := e.metric(t, "switchyard_requests_total", "model", "down", "code", "503"); got != 1 {
		t.Errorf(`requests_total{model="down",code="503"} = %v, want 1`, got)
	}
	if got := e.metric(t, "switchyard_requests_total", "model", "unknown", "code", "404"); got != 1 {
		t.Errorf(`requests_total{model="unknown",code="404"} = %v, want 1 (the unlisted model)`, got)
	}
	resp, err := http.Get(e.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if len(list.Data) != 2 || list.Data[0].ID != "down" || list.Data[1].ID != "m" {
		t.Errorf("/v1/models = %+v, want down and m", list.Data)
	}
	e.settle(t)
}

// metaRecorder is a classifier that keeps the metadata of the requests it
// classifies.
type metaRecorder struct {
	mu   sync.Mutex
	seen []map[string]string
}

func (*metaRecorder) Inputs() shared.Inputs { return 0 }
func (m *metaRecorder) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return m, nil
}
func (m *metaRecorder) Classify(_ context.Context, r *shared.Request) (shared.Classification, error) {
	m.mu.Lock()
	m.seen = append(m.seen, maps.Clone(r.Metadata))
	m.mu.Unlock()
	return shared.Classification{}, nil
}

// Classifiers (and policy plugins) see the request's headers, lowercased,
// but not its credentials; the engine still gets them.
func TestMetadataLeavesOutCredentials(t *testing.T) {
	eng := newEngine(t, 1, 0)
	rec := &metaRecorder{}
	e := newEnv(t, envOptions{classifier: rec}, backend{name: "w1", url: eng.URL})
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"),
		"Authorization", "Bearer sk-secret", "Cookie", "s=1", "X-Api-Key", "k", "X-Priority", "3", "X-Tenant", "blue")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen) != 1 {
		t.Fatalf("classified %d requests, want 1", len(rec.seen))
	}
	md := rec.seen[0]
	for _, k := range []string{"authorization", "cookie", "x-api-key"} {
		if v, ok := md[k]; ok {
			t.Errorf("metadata carries %s = %q", k, v)
		}
	}
	if md["x-priority"] != "3" || md["x-tenant"] != "blue" {
		t.Errorf("metadata %v lacks x-priority=3 and x-tenant=blue", md)
	}
	eng.mu.Lock()
	got := eng.headers[0].Get("Authorization")
	eng.mu.Unlock()
	if got != "Bearer sk-secret" {
		t.Errorf("the engine got Authorization %q, want it forwarded", got)
	}
	e.settle(t)
}

// rawExchange writes req on a new connection to the server at url, then
// half-closes it when halfClose is set, and returns what came back
// before the server closed the connection (or 5s passed).
func rawExchange(t *testing.T, url, req string, halfClose bool) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// A client that half-closes after its request is gone as far as net/http
// can tell: it must not get an empty 200 (the connection is cut instead),
// and the booking is released.
func TestHalfClosedClientGetsNoFalseAnswer(t *testing.T) {
	eng := newEngine(t, 3, 20*time.Millisecond)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	for _, stream := range []bool{false, true} {
		body := chatBody("m", stream, "hello")
		got := rawExchange(t, e.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body), true)
		if strings.HasPrefix(got, "HTTP/1.1 200") && !strings.Contains(got, "data: [DONE]") && !strings.Contains(got, `"choices"`) {
			t.Errorf("stream %v: an answer claiming success without content:\n%s", stream, got)
		}
	}
	e.settle(t)
}

// A body declared larger than the limit is refused before it is read:
// no 100 Continue, an immediate 413.
func TestDeclaredOversizedBodyIsRefusedAtOnce(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	got := rawExchange(t, e.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Expect: 100-continue\r\nContent-Length: 1000000000000\r\n\r\n", false)
	if !strings.HasPrefix(got, "HTTP/1.1 413") || strings.Contains(got, "100 Continue") || !strings.Contains(got, `"body_too_large"`) {
		t.Errorf("answer:\n%s\nwant an immediate 413 body_too_large", got)
	}
	if eng.requests.Load() != 0 {
		t.Errorf("the engine got %d requests", eng.requests.Load())
	}
	e.settle(t)
}

// failingClassifier fails every request: with an error, or by panicking,
// or, with plugin set, with a plugin call error of that cause as an
// out-of-process classifier does.
type failingClassifier struct {
	panics bool
	plugin string
}

func (failingClassifier) Inputs() shared.Inputs { return 0 }
func (f failingClassifier) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return f, nil
}
func (f failingClassifier) Classify(context.Context, *shared.Request) (shared.Classification, error) {
	if f.panics {
		panic("classifier bug")
	}
	if f.plugin != "" {
		return shared.Classification{}, &supervisor.CallError{Plugin: "p", Cause: f.plugin, Err: errors.New(`plugin "p": ` + f.plugin)}
	}
	return shared.Classification{}, errors.New(`x-priority "high" is not an integer`)
}

// A request the classifier refuses is the client's 400, in the
// classifier's words and without the router's ids; a classifier that
// panics, in process or in its plugin, is the router's 500; a plugin that
// does not answer (timeout, restarting, breaker open) is a 503 the client
// may retry, not the client's fault. Nothing reaches the engine in any
// case.
func TestClassifierFailures(t *testing.T) {
	for _, tc := range []struct {
		panics bool
		plugin string
		status int
		code   string
		msg    string
	}{
		{false, "", 400, "classification_failed", `the request could not be classified: x-priority "high" is not an integer`},
		{true, "", 500, "classification_failed", "the request classifier failed"},
		{false, "panic", 500, "classification_failed", "the request classifier failed"},
		{false, "timeout", 503, "classifier_unavailable", `the request classifier is unavailable: plugin "p": timeout`},
		{false, "breaker_open", 503, "classifier_unavailable", `the request classifier is unavailable: plugin "p": breaker_open`},
	} {
		eng := newEngine(t, 1, 0)
		e := newEnv(t, envOptions{classifier: failingClassifier{panics: tc.panics, plugin: tc.plugin}}, backend{name: "w1", url: eng.URL})
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status {
			t.Errorf("panics %v, plugin %q: status %d, want %d", tc.panics, tc.plugin, resp.StatusCode, tc.status)
		}
		if got := decodeError(t, resp); got.Code != tc.code || got.Message != tc.msg {
			t.Errorf("panics %v, plugin %q: error %+v, want %s %q", tc.panics, tc.plugin, got, tc.code, tc.msg)
		}
		if eng.requests.Load() != 0 {
			t.Errorf("panics %v: the engine got %d requests", tc.panics, eng.requests.Load())
		}
		e.settle(t)
	}
}

// Hop-by-hop headers, and the headers a Connection header names, are not
// forwarded either way; end-to-end ones are.
func TestCopyHeadersDropsHopByHop(t *testing.T) {
	src := http.Header{
		"Connection":    {"keep-alive, X-Hop-Secret"},
		"X-Hop-Secret":  {"s"},
		"Keep-Alive":    {"timeout=5"},
		"Upgrade":       {"h2c"},
		"Te":            {"trailers"},
		"Authorization": {"Bearer k"},
		"X-Session-Id":  {"abc"},
	}
	dst := http.Header{}
	copyHeaders(dst, src)
	want := http.Header{"Authorization": {"Bearer k"}, "X-Session-Id": {"abc"}}
	if diff := cmp.Diff(want, dst); diff != "" {
		t.Errorf("copied headers (-want +got):\n%s", diff)
	}
}

// classOf classifies every request into one policy class.
type classOf string

func (classOf) Inputs() shared.Inputs { return 0 }
func (c classOf) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return c, nil
}
func (c classOf) Classify(context.Context, *shared.Request) (shared.Classification, error) {
	return shared.Classification{PolicyClass: string(c)}, nil
}

// A class the queue does not have is the client's 400, naming the class
// and the queue's classes but not the router's request id.
func TestUnknownClassAnswer(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{classifier: classOf("gold")}, backend{name: "w1", url: eng.URL})
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"), "X-Request-Id", "client-7")
	if err != nil {
		t.Fatal(err)
	}
	got := decodeError(t, resp)
	want := `the request could not be classified: unknown policy class "gold" (queue classes: default)`
	if resp.StatusCode != http.StatusBadRequest || got.Code != "classification_failed" || got.Message != want {
		t.Errorf("%d %+v, want 400 classification_failed %q", resp.StatusCode, got, want)
	}
	e.settle(t)
}

// The denial of service: 100 KB of unclosed brackets (or of
// nested objects) to the chat endpoint was never answered; it is now
// refused with 400 invalid_request, and the engine never sees it.
func TestDeeplyNestedBodiesAreRefused(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The intake's refusal, worded by it.
	_, errTooDeep := live.ParseRequest([]byte(strings.Repeat("[", 100_000)), live.APIChat)
	if errTooDeep == nil || !strings.Contains(errTooDeep.Error(), "nested too deeply") {
		t.Fatalf("the intake parses 100,000 open brackets: %v", errTooDeep)
	}
	for name, body := range map[string]string{
		"arrays":                strings.Repeat("[", 100_000),
		"objects":               strings.Repeat(`{"a":`, 20_000),
		"arrays in a chat body": `{"model":"m","messages":[{"role":"user","content":"x"}],"junk":` + strings.Repeat("[", 100_000),
		"closed arrays":         `{"model":"m","messages":[{"role":"user","content":"x"}],"junk":` + strings.Repeat("[", 50_000) + strings.Repeat("]", 50_000) + `}`,
	} {
		resp, err := post(t, ctx, e.url+"/v1/chat/completions", body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", name, resp.StatusCode)
		}
		got := decodeError(t, resp)
		if got.Code != "invalid_request" || got.Type != live.TypeInvalidRequest || got.Message != errTooDeep.Error() {
			t.Errorf("%s: error %+v, want invalid_request saying %q", name, got, errTooDeep)
		}
	}
	if n := eng.requests.Load(); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
	e.settle(t)
}

// Paths not in canonical form are answered 404 in the OpenAI error shape
// (Anthropic's when the clean path is under /v1/messages), never
// redirected: net/http's ServeMux would answer 307 to the clean
// path, and a client following it would send its POST again. The raw
// request lines reach the server as written (a client could clean them);
// the Go client is told not to follow redirects.
func TestNonCanonicalPathsAre404(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	body := chatBody("m", false, "x")
	for _, p := range []string{
		"//v1/chat/completions", "/v1//chat/completions", "/v1/../v1/chat/completions", "/v1/./chat/completions",
		"/v1/chat/completions/.", "/v1/chat/completions/..", "/v1/chat/completions/", "/v1/chat%2Fcompletions",
		"/v1/ch%61t/completions", "/./v1/models",
	} {
		got := rawExchange(t, e.url, "POST "+p+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"+
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body), false)
		head, answer, _ := strings.Cut(got, "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 404 ") || strings.Contains(strings.ToLower(head), "\r\nlocation:") {
			t.Errorf("POST %s: answer head\n%s\nwant a 404 without Location", p, head)
			continue
		}
		var apiErr struct {
			Error errorBody `json:"error"`
		}
		if err := json.Unmarshal([]byte(answer), &apiErr); err != nil || apiErr.Error.Code != "not_found" || apiErr.Error.Type != live.TypeInvalidRequest {
			t.Errorf("POST %s: body %q (%v), want an OpenAI not_found error", p, answer, err)
		}
	}
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/./models"}, {"GET", "/v1/models/."}, {"POST", "/v1/../v1/completions"}, {"GET", "/healthz/"},
	} {
		req, _ := http.NewRequest(tc.method, e.url+tc.path, strings.NewReader(`{"model":"m","prompt":"x"}`))
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Location") != "" {
			t.Errorf("%s %s: status %d, Location %q; want 404 and none", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Location"))
		}
		if got := decodeError(t, resp); got.Code != "not_found" {
			t.Errorf("%s %s: code %q, want not_found", tc.method, tc.path, got.Code)
		}
	}
	// Under /v1/messages, in Anthropic's shape.
	for _, p := range []string{"/v1/messages/", "/v1/messages%2Fcount_tokens", "/v1//messages"} {
		got := rawExchange(t, e.url, "POST "+p+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"+
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body), false)
		head, answer, _ := strings.Cut(got, "\r\n\r\n")
		var a struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if !strings.HasPrefix(head, "HTTP/1.1 404 ") || json.Unmarshal([]byte(answer), &a) != nil || a.Type != "error" ||
			a.Error.Type != live.TypeInvalidRequest || !strings.Contains(a.Error.Message, "not in canonical form") {
			t.Errorf("POST %s: %s\n%s\nwant a 404 in Anthropic's error shape", p, head, answer)
		}
	}
	if n := eng.requests.Load(); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
	// The canonical paths still serve.
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /v1/chat/completions: status %d", resp.StatusCode)
	}
	e.settle(t)
}

// A request whose client left, or whose timeout passed, by the time its
// body is parsed is not admitted: no selection, nothing sent to an
// engine.
func TestExpiredRequestIsNotAdmitted(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{timeout: time.Nanosecond}, backend{name: "w1", url: eng.URL})
	rec := httptest.NewRecorder()
	e.s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody("m", false, "x"))))
	if got := decodeError(t, rec.Result()); rec.Code != http.StatusGatewayTimeout || got.Code != "timeout" {
		t.Errorf("timed out: status %d, code %q; want 504 timeout", rec.Code, got.Code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("client gone: handler ended with %v, want the connection cut (http.ErrAbortHandler)", p)
			}
		}()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody("m", false, "x"))).WithContext(ctx)
		e.s.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}()
	if got := e.metric(t, "switchyard_requests_total", "model", "m", "code", "499"); got != 1 {
		t.Errorf(`requests_total{model="m",code="499"} = %v, want 1`, got)
	}
	if n := e.series(t, "switchyard_selection_duration_seconds"); n != 0 {
		t.Errorf("%d selections observed, want none", n)
	}
	if n := eng.requests.Load(); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
	e.settle(t)
}

// A request counts under its model's name in the metrics even when the
// model's workers leave while it is served: the label is taken when the
// request arrives (it used to be taken at its end, as "unknown").
func TestMetricsLabelTakenAtArrival(t *testing.T) {
	eng := newEngine(t, 1, 0)
	eng.gate = make(chan struct{})
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	done := make(chan int, 1)
	go func() {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, "x"))
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testkit.Eventually(t, "the awaited condition", func() bool { return eng.requests.Load() == 1 })
	if err := e.r.RemoveWorker(e.workers[0].ID, 0); err != nil {
		t.Fatal(err)
	}
	close(eng.gate)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("status %d, want 200 (the answer was on its way)", code)
	}
	// The request is counted once its handler ends, which may be just
	// after the client has read the whole answer.
	testkit.Eventually(t, "the awaited condition", func() bool { return e.metric(t, "switchyard_requests_total", "model", "m", "code", "200") == 1 })
	if got := e.metric(t, "switchyard_requests_total", "model", "unknown", "code", "200"); got != 0 {
		t.Errorf(`requests_total{model="unknown",code="200"} = %v, want 0`, got)
	}
}

// The bodies held at once are bounded: with room for one body, a second
// request while the first is served is answered 503 overloaded before its
// body is read, and once the first ends its room is free again.
func TestBodiesInFlightAreBounded(t *testing.T) {
	eng := newEngine(t, 1, 0)
	eng.gate = make(chan struct{})
	body := chatBody("m", false, strings.Repeat("x", 500))
	e := newEnv(t, envOptions{bodiesInFlight: int64(len(body)) + 100}, backend{name: "w1", url: eng.URL})
	done := make(chan int, 1)
	go func() {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", body)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testkit.Eventually(t, "the awaited condition", func() bool { return eng.requests.Load() == 1 })
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeError(t, resp); resp.StatusCode != http.StatusServiceUnavailable || got.Code != "overloaded" {
		t.Fatalf("second body: %d %+v, want 503 overloaded", resp.StatusCode, got)
	}
	close(eng.gate)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("first request: %d, want 200", code)
	}
	resp, err = post(t, context.Background(), e.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the first ended: %d, want 200", resp.StatusCode)
	}
	if eng.requests.Load() != 2 {
		t.Fatalf("the engine got %d requests, want 2 (the refused one never reached it)", eng.requests.Load())
	}
}

// Each request to a data-parallel engine names its rank in
// X-Data-Parallel-Rank (HeaderDPRank); a request to an engine without
// ranks names none; and a client's own rank header never reaches an
// engine.
func TestDataParallelRankHeader(t *testing.T) {
	dp, single := newEngine(t, 1, 0), newEngine(t, 1, 0)
	e := newEnv(t, envOptions{},
		backend{name: "dp", url: dp.URL, dp: true, rank: 0},
		backend{name: "dp", url: dp.URL, dp: true, rank: 1},
		backend{name: "single", url: single.URL})
	for i := range 6 {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", i%2 == 1, "hello"), HeaderDPRank, "7")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	ranks := func(eng *engine) []string {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		var out []string
		for _, h := range eng.headers {
			out = append(out, h.Get(HeaderDPRank))
		}
		slices.Sort(out)
		return out
	}
	if gotDP, gotSingle := ranks(dp), ranks(single); !slices.Equal(gotDP, []string{"0", "0", "1", "1"}) || !slices.Equal(gotSingle, []string{"", ""}) {
		t.Errorf("rank headers: dp %q, single %q; want dp [0 0 1 1], single none", gotDP, gotSingle)
	}
	e.settle(t)
}

// TestDebugPathsOnAPIPort: the profiler and the debug views are served only
// on --debug-listen's address; on the API's, a path under /debug is
// answered 404 not_found saying so (GET /debug/pprof/ used to be "the path
// is not in canonical form (/debug/pprof)", and GET /debug/route a bare
// "no endpoint").
func TestDebugPathsOnAPIPort(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	for _, tc := range []struct{ method, path string }{
		{"GET", "/debug/pprof/"}, {"GET", "/debug/pprof"}, {"GET", "/debug/pprof/heap"}, {"GET", "/debug"},
		{"GET", "/debug/route"}, {"GET", "/debug/workers"}, {"POST", "/debug/pprof/profile"},
	} {
		req, _ := http.NewRequest(tc.method, e.url+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		want := "no endpoint " + tc.method + " " + tc.path + ": Go's profiler (/debug/pprof/) and the router's /debug views " +
			"are served only on --debug-listen's address, not on the API's"
		if got := decodeError(t, resp); resp.StatusCode != http.StatusNotFound || got.Code != "not_found" || got.Message != want {
			t.Errorf("%s %s: status %d, %+v; want 404 not_found %q", tc.method, tc.path, resp.StatusCode, got, want)
		}
	}
	if n := eng.requests.Load(); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
}
