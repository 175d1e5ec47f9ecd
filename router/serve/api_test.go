package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/workers"
)

// apiEngine is a fake engine on a real loopback server serving every
// endpoint class: each POST answers, as JSON, the worker's name, the
// path and query it was asked and the body it received; /v1/responses
// stores the responses it answers (vLLM's response store), continues only
// those it holds (previous_response_id), and serves GET
// /v1/responses/{id} and POST /v1/responses/{id}/cancel for them,
// answering vLLM's 404 for others.
type apiEngine struct {
	*httptest.Server
	name string
	// gate, when set, holds every answer until it is closed.
	gate     chan struct{}
	requests atomic.Int64
	mu       sync.Mutex
	paths    []string
	stored   map[string]bool
	next     int
}

func newAPIEngine(t *testing.T, name string) *apiEngine {
	t.Helper()
	e := &apiEngine{name: name, stored: map[string]bool{}}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *apiEngine) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.paths...)
}

func (e *apiEngine) serve(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.paths = append(e.paths, r.Method+" "+r.URL.RequestURI())
	e.mu.Unlock()
	if e.gate != nil {
		select {
		case <-e.gate:
		case <-r.Context().Done():
			return
		}
	}
	notFound := func(id string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
	}
	switch {
	case r.URL.Path == "/v1/responses" && r.Method == http.MethodPost:
		var req struct {
			Stream bool   `json:"stream"`
			Prev   string `json:"previous_response_id"`
		}
		_ = json.Unmarshal(body, &req)
		e.mu.Lock()
		if req.Prev != "" && !e.stored[req.Prev] {
			e.mu.Unlock()
			notFound(req.Prev)
			return
		}
		e.next++
		id := fmt.Sprintf("resp_%s_%d", e.name, e.next)
		e.stored[id] = true
		e.mu.Unlock()
		obj := fmt.Sprintf(`{"id":%q,"object":"response","status":"completed","model":"m","previous_response_id":%q,"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"from %s"}]}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}`, id, req.Prev, e.name)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, obj)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\"}}\n\n", id)
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"from %s\"}\n\n", e.name)
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":%s}\n\n", obj)
	case strings.HasPrefix(r.URL.Path, "/v1/responses/"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/cancel")
		e.mu.Lock()
		ok := e.stored[id]
		e.mu.Unlock()
		if !ok {
			notFound(id)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","worker":%q,"method":%q}`, id, e.name, r.Method)
	default:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"worker": e.name, "path": r.URL.RequestURI(), "body": string(body)})
	}
}

// echoed is what an apiEngine answers a POST it echoes.
type echoed struct {
	Worker, Path, Body string
}

func postJSON(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := post(t, context.Background(), url, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestPoolingEndpointsPassThroughAndBook: every pooling and scoring
// endpoint reaches an engine serving the body's model with its path and
// body unchanged, and its answer comes back unchanged; while the engine
// holds it, it is booked on that worker with its inputs' size as load
// (prefill tokens: the runtime's 4 characters a token); it ends booked
// nowhere.
func TestPoolingEndpointsPassThroughAndBook(t *testing.T) {
	a, b := newAPIEngine(t, "a"), newAPIEngine(t, "b")
	e := newEnv(t, envOptions{}, backend{name: "a", url: a.URL, models: []string{"emb"}}, backend{name: "b", url: b.URL, models: []string{"emb"}})
	pooling := 0
	for _, ep := range live.Endpoints() {
		if ep.API != live.APIPool {
			continue
		}
		pooling++
		t.Run(ep.Path, func(t *testing.T) {
			body := `{"model":"emb","input":["abcdefgh","abcd"],"query":"abcd","documents":["abcdefghijkl"]}`
			resp, got := postJSON(t, e.url+ep.Path, body)
			var ans echoed
			if err := json.Unmarshal(got, &ans); err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d, %s", resp.StatusCode, got)
			}
			if ans.Path != ep.Path || ans.Body != body || resp.Header.Get("X-Switchyard-Worker") != ans.Worker {
				t.Errorf("engine %s saw %s %q (worker header %q)", ans.Worker, ans.Path, ans.Body, resp.Header.Get("X-Switchyard-Worker"))
			}
		})
	}
	if pooling != 9 {
		t.Errorf("%d pooling endpoints, want 9", pooling)
	}
	e.settle(t)
	// Booked while held: 2+1+1+3 = 7 tokens of prefill on one worker.
	gate := make(chan struct{})
	a.gate, b.gate = gate, gate
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := post(t, context.Background(), e.url+"/v1/embeddings", `{"model":"emb","input":["abcdefgh","abcd"],"query":"abcd","documents":["abcdefghijkl"]}`)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	testkit.Eventually(t, "booked", func() bool { return e.workers[0].ActiveRequests()+e.workers[1].ActiveRequests() == 1 })
	var prefill int64
	for _, w := range e.workers {
		prefill += w.Load(false).ActivePrefillTokens
	}
	if prefill != 7 {
		t.Errorf("prefill tokens booked = %d, want 7 (the inputs' size)", prefill)
	}
	close(gate)
	if resp := <-done; resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	e.settle(t)
	// The nine pooling endpoints and the held request answered 200,
	// counted under the model.
	if got := e.metric(t, "switchyard_requests_total", "model", "emb", "code", "200"); got != 10 {
		t.Errorf("requests_total{model=emb,code=200} = %v, want 10", got)
	}
}

// TestPoolingRetriesAnotherWorker: an engine that refuses the connection
// is replaced, as for generation.
func TestPoolingRetriesAnotherWorker(t *testing.T) {
	good := newAPIEngine(t, "good")
	e := newEnv(t, envOptions{}, backend{name: "dead", url: closedURL(t), models: []string{"emb"}}, backend{name: "good", url: good.URL, models: []string{"emb"}})
	for range 3 {
		resp, got := postJSON(t, e.url+"/v1/embeddings", `{"model":"emb","input":"x"}`)
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Worker") != "good" {
			t.Errorf("status %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), got)
		}
	}
	e.settle(t)
	if e.ws.failuresOf("dead") == 0 {
		t.Error("the refusing worker's failure was not reported")
	}
}

// TestUtilitiesAreNotBooked: tokenize and detokenize reach an engine
// serving the model, unchanged, and are never booked: while the engines
// hold them no worker has a request in flight.
func TestUtilitiesAreNotBooked(t *testing.T) {
	a, b := newAPIEngine(t, "a"), newAPIEngine(t, "b")
	other := newAPIEngine(t, "other")
	e := newEnv(t, envOptions{models: []string{"m", "o"}}, backend{name: "a", url: a.URL}, backend{name: "b", url: b.URL}, backend{name: "other", url: other.URL, models: []string{"o"}})
	gate := make(chan struct{})
	a.gate, b.gate = gate, gate
	var wg sync.WaitGroup
	paths := []string{"/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize", "/v1/messages/count_tokens"}
	answers := make([]echoed, len(paths))
	for i, p := range paths {
		wg.Go(func() {
			resp, got := postJSON(t, e.url+p, `{"model":"m","prompt":"hello"}`)
			if resp.StatusCode != 200 || json.Unmarshal(got, &answers[i]) != nil {
				t.Errorf("%s: status %d, %s", p, resp.StatusCode, got)
			}
		})
	}
	testkit.Eventually(t, "held by the engines", func() bool { return a.requests.Load()+b.requests.Load() == int64(len(paths)) })
	for _, w := range e.workers {
		if n := w.ActiveRequests(); n != 0 {
			t.Errorf("worker %s has %d requests booked for utilities", w.Name, n)
		}
	}
	if e.s.InFlight() != int64(len(paths)) {
		t.Errorf("in flight %d, want %d", e.s.InFlight(), len(paths))
	}
	close(gate)
	wg.Wait()
	for i, p := range paths {
		if answers[i].Path != p || answers[i].Body != `{"model":"m","prompt":"hello"}` || answers[i].Worker == "other" {
			t.Errorf("%s answered %+v", p, answers[i])
		}
	}
	if other.requests.Load() != 0 {
		t.Error("a worker not serving the model got a utility request")
	}
	// Spread over both (least busy, ties round-robin).
	if a.requests.Load() == 0 || b.requests.Load() == 0 {
		t.Errorf("utilities went to a %d times, b %d times; want both", a.requests.Load(), b.requests.Load())
	}
	e.settle(t)
	resp, got := postJSON(t, e.url+"/tokenize", `{"model":"nope","prompt":"x"}`)
	if resp.StatusCode != 404 || !strings.Contains(string(got), `"code":"model_not_found"`) {
		t.Errorf("tokenize for an unknown model: %d %s", resp.StatusCode, got)
	}
}

// TestPassThrough: an unknown path under /v1/ naming a model reaches an
// engine serving it, with its query, booked while held; naming none is
// 404; with pass-through off every unknown path is 404.
func TestPassThrough(t *testing.T) {
	a := newAPIEngine(t, "a")
	e := newEnv(t, envOptions{}, backend{name: "a", url: a.URL})
	gate := make(chan struct{})
	a.gate = gate
	done := make(chan []byte, 1)
	go func() {
		_, got := postJSON(t, e.url+"/v1/images/generations?x=1", `{"model":"m","prompt":"abcdefgh"}`)
		done <- got
	}()
	testkit.Eventually(t, "booked", func() bool { return e.workers[0].ActiveRequests() == 1 })
	if got := e.workers[0].Load(false).ActivePrefillTokens; got != 2 {
		t.Errorf("prefill booked %d, want 2", got)
	}
	close(gate)
	var ans echoed
	if err := json.Unmarshal(<-done, &ans); err != nil || ans.Path != "/v1/images/generations?x=1" {
		t.Errorf("engine saw %+v (%v)", ans, err)
	}
	e.settle(t)
	resp, got := postJSON(t, e.url+"/v1/images/generations", `{"prompt":"x"}`)
	if resp.StatusCode != 404 || !strings.Contains(string(got), `"code":"not_found"`) || !strings.Contains(string(got), `names none`) {
		t.Errorf("no model: %d %s", resp.StatusCode, got)
	}

	off := newAPIEngine(t, "off")
	e2 := newEnv(t, envOptions{}, backend{name: "off", url: off.URL})
	s2, err := New(e2.rt, Options{DisablePassThrough: true})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s2.Handler())
	t.Cleanup(hs.Close)
	resp, got = postJSON(t, hs.URL+"/v1/images/generations", `{"model":"m"}`)
	if resp.StatusCode != 404 || !strings.Contains(string(got), `"code":"not_found"`) || off.requests.Load() != 0 {
		t.Errorf("pass-through off: %d %s; engine asked %d times", resp.StatusCode, got, off.requests.Load())
	}
}

// TestErrorShapesPerAPI: /v1/messages answers errors in Anthropic's
// shape, the others in OpenAI's; a body for one API on another's path is
// refused naming the missing field and the right path; a known path with
// the wrong method is 405 with Allow.
func TestErrorShapesPerAPI(t *testing.T) {
	a := newAPIEngine(t, "a")
	e := newEnv(t, envOptions{models: []string{"m"}}, backend{name: "a", url: a.URL})
	// Anthropic's shape.
	resp, got := postJSON(t, e.url+"/v1/messages", `{"model":`)
	var ant struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(got, &ant); err != nil || resp.StatusCode != 400 || ant.Type != "error" || ant.Error.Type != "invalid_request_error" || ant.Error.Message == "" {
		t.Errorf("/v1/messages bad body: %d %s", resp.StatusCode, got)
	}
	req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/messages", nil)
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 405 || r2.Header.Get("Allow") != "POST" || !bytes.HasPrefix(b2, []byte(`{"type":"error","error":{"type":"invalid_request_error"`)) {
		t.Errorf("GET /v1/messages: %d Allow %q %s", r2.StatusCode, r2.Header.Get("Allow"), b2)
	}
	// OpenAI's shape, and the wrong path named.
	for _, tt := range []struct{ path, body, want string }{
		{"/v1/responses", chatBody("m", false, "hi"), `has no \"input\"`},
		{"/v1/responses", chatBody("m", false, "hi"), "/v1/chat/completions"},
		{"/v1/chat/completions", `{"model":"m","input":"hi"}`, "/v1/responses"},
		{"/v1/completions", chatBody("m", false, "hi"), "/v1/chat/completions"},
	} {
		resp, got := postJSON(t, e.url+tt.path, tt.body)
		if resp.StatusCode != 400 || !strings.Contains(string(got), tt.want) || !strings.Contains(string(got), `"type":"invalid_request_error"`) {
			t.Errorf("%s with %s: %d %s; want 400 saying %s", tt.path, tt.body, resp.StatusCode, got, tt.want)
		}
	}
	if a.requests.Load() != 0 {
		t.Errorf("refused bodies reached the engine %d times", a.requests.Load())
	}
	for _, tt := range []struct{ method, path, allow string }{
		{"GET", "/v1/embeddings", "POST"}, {"POST", "/v1/models", "GET"}, {"DELETE", "/ping", "GET, POST"}, {"POST", "/v1/models/m", "GET"},
	} {
		req, _ := http.NewRequest(tt.method, e.url+tt.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if eb := decodeError(t, resp); resp.StatusCode != 405 || eb.Code != "method_not_allowed" || resp.Header.Get("Allow") != tt.allow {
			t.Errorf("%s %s: %d %q Allow %q", tt.method, tt.path, resp.StatusCode, eb.Code, resp.Header.Get("Allow"))
		}
	}
}

// cardWorkers is a workerSet whose engines listed model cards
// (workers.Manager.ModelCards).
type cardWorkers struct {
	*workerSet
	cards []workers.ModelCard
}

func (c cardWorkers) ModelCards() []workers.ModelCard { return c.cards }

// TestFleetViews: /v1/models lists each engine's own object unchanged,
// /v1/models/{id} answers one of them (an id with '/', sent as is or
// escaped) or 404 model_not_found; /health, /ping and /version.
func TestFleetViews(t *testing.T) {
	a := newAPIEngine(t, "a")
	e := newEnv(t, envOptions{}, backend{name: "a", url: a.URL, models: []string{"meta-llama/Llama-3.1-8B", "sql-lora", "bare"}})
	llama := `{"id":"meta-llama/Llama-3.1-8B","object":"model","created":1700000000,"owned_by":"vllm","root":"/models/llama","parent":null,"max_model_len":131072,"permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]}`
	lora := `{"id":"sql-lora","object":"model","created":1700000001,"owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B","max_model_len":null}`
	cw := cardWorkers{workerSet: e.ws, cards: []workers.ModelCard{
		{ID: "bare", MaxModelLen: 4096},
		{ID: "meta-llama/Llama-3.1-8B", Raw: llama},
		{ID: "sql-lora", Parent: "meta-llama/Llama-3.1-8B", Raw: lora},
	}}
	rt, err := live.New(live.Options{Router: e.r, Workers: cw})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(rt, Options{Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/v1/models")
	want := `{"object":"list","data":[{"id":"bare","object":"model","created":0,"owned_by":"switchyard","max_model_len":4096},` + llama + "," + lora + "]}\n"
	if code != 200 || body != want {
		t.Errorf("/v1/models = %d\n%s\nwant\n%s", code, body, want)
	}
	for _, p := range []string{"/v1/models/meta-llama/Llama-3.1-8B", "/v1/models/meta-llama%2FLlama-3.1-8B"} {
		if code, body := get(p); code != 200 || body != llama+"\n" {
			t.Errorf("%s = %d %s", p, code, body)
		}
	}
	if code, body := get("/v1/models/sql-lora"); code != 200 || !strings.Contains(body, `"parent":"meta-llama/Llama-3.1-8B"`) {
		t.Errorf("adapter = %d %s", code, body)
	}
	if code, body := get("/v1/models/nope/x"); code != 404 || !strings.Contains(body, `"code":"model_not_found"`) || !strings.Contains(body, "nope/x") {
		t.Errorf("unknown model = %d %s", code, body)
	}
	if code, body := get("/version"); code != 200 || body != `{"version":"1.2.3"}`+"\n" {
		t.Errorf("/version = %d %q", code, body)
	}
	for _, p := range []string{"/health", "/ping"} {
		if code, body := get(p); code != 200 || body != "" {
			t.Errorf("%s ready = %d %q", p, code, body)
		}
	}
	resp, err := http.Post(hs.URL+"/ping", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /ping = %d", resp.StatusCode)
	}
	e.ws.ready.Store(false)
	for _, p := range []string{"/health", "/ping"} {
		if code, body := get(p); code != 503 || body != "" {
			t.Errorf("%s unready = %d %q", p, code, body)
		}
	}
}

// TestResponsesFollowUpReachesTheIssuingEngine: among three engines
// (round-robin would spread the turns), each follow-up naming a previous
// response (streamed or not) reaches the engine that answered it, as do
// GET /v1/responses/{id} and its cancel; an id the router never saw, or
// whose engine left, is answered as vLLM answers an unknown id, and no
// engine is asked.
func TestResponsesFollowUpReachesTheIssuingEngine(t *testing.T) {
	engines := []*apiEngine{newAPIEngine(t, "a"), newAPIEngine(t, "b"), newAPIEngine(t, "c")}
	var backends []backend
	for _, en := range engines {
		backends = append(backends, backend{name: en.name, url: en.URL})
	}
	e := newEnv(t, envOptions{}, backends...)
	turn := func(prev string, stream bool) (string, string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","input":"next turn","stream":%v`, stream)
		if prev != "" {
			body += fmt.Sprintf(`,"previous_response_id":%q`, prev)
		}
		resp, got := postJSON(t, e.url+"/v1/responses", body+"}")
		if resp.StatusCode != 200 {
			t.Fatalf("turn after %q: %d %s", prev, resp.StatusCode, got)
		}
		var id string
		if stream {
			i := bytes.Index(got, []byte(`"id":"`))
			if i < 0 {
				t.Fatalf("stream without an id: %s", got)
			}
			id = string(got[i+6 : i+6+bytes.IndexByte(got[i+6:], '"')])
		} else {
			var r struct{ ID string }
			if err := json.Unmarshal(got, &r); err != nil {
				t.Fatal(err)
			}
			id = r.ID
		}
		return id, resp.Header.Get("X-Switchyard-Worker")
	}
	for _, stream := range []bool{false, true} {
		first, worker := turn("", stream)
		if !strings.HasPrefix(first, "resp_"+worker+"_") {
			t.Fatalf("first turn %q answered by %q", first, worker)
		}
		prev := first
		for range 5 {
			id, w := turn(prev, stream)
			if w != worker {
				t.Errorf("stream %v: follow-up of %q went to %q, want %q", stream, prev, w, worker)
			}
			prev = id
		}
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			path := "/v1/responses/" + prev
			if method == http.MethodPost {
				path += "/cancel"
			}
			req, _ := http.NewRequest(method, e.url+path+"?include=x", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"worker":"`+worker+`"`) || !strings.Contains(string(b), `"method":"`+method+`"`) {
				t.Errorf("%s %s = %d %s; want %s's answer", method, path, resp.StatusCode, b, worker)
			}
		}
	}
	e.settle(t)
	// Unknown ids: vLLM's 404, no engine asked.
	asked := func() int64 {
		return engines[0].requests.Load() + engines[1].requests.Load() + engines[2].requests.Load()
	}
	before := asked()
	want := `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":404}}` + "\n"
	resp, got := postJSON(t, e.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_nope"}`)
	if resp.StatusCode != 404 || string(got) != want {
		t.Errorf("unknown previous_response_id: %d %s", resp.StatusCode, got)
	}
	r2, err := http.Get(e.url + "/v1/responses/resp_nope")
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 404 || string(b2) != want {
		t.Errorf("GET unknown id: %d %s", r2.StatusCode, b2)
	}
	if asked() != before {
		t.Errorf("unknown ids reached the engines %d times", asked()-before)
	}
	// The issuing engine stops being ready (out of the candidates, still
	// configured): 503, retryable, naming it; then it leaves the fleet:
	// its responses are unknown. Never sent to another engine.
	id, w := turn("", false)
	var gone int
	for i, en := range engines {
		if en.name == w {
			gone = i
		}
	}
	if err := e.r.RemoveWorker(e.workers[gone].ID, 0); err != nil {
		t.Fatal(err)
	}
	before = asked()
	resp, got = postJSON(t, e.url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"x","previous_response_id":%q}`, id))
	if resp.StatusCode != 503 || !strings.Contains(string(got), `"code":"no_worker"`) || !strings.Contains(string(got), "(worker "+w+") is not ready") {
		t.Errorf("follow-up of a not-ready engine's response: %d %s", resp.StatusCode, got)
	}
	e.ws.mu.Lock()
	delete(e.ws.urls, w)
	e.ws.mu.Unlock()
	resp, got = postJSON(t, e.url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"x","previous_response_id":%q}`, id))
	if resp.StatusCode != 404 || !strings.Contains(string(got), "Response with id '"+id+"' not found.") {
		t.Errorf("follow-up of a gone engine's response: %d %s", resp.StatusCode, got)
	}
	if asked() != before {
		t.Errorf("a gone engine's follow-up reached another engine")
	}
	if n := len(engines[gone].seen()); n == 0 {
		t.Errorf("the gone engine saw nothing")
	}
}
