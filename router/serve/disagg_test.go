package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/shared"
)

// mockEngine is a router/mockworker engine (or another handler) on a
// loopback server that records every request it gets and the answer it
// gave.
type mockEngine struct {
	*httptest.Server
	h  http.Handler
	mu sync.Mutex
	// calls are the requests in the order their answers ended.
	calls []engineCall
}

type engineCall struct {
	path   string
	header http.Header
	body   []byte // as received
	answer []byte // as sent
}

// newMock starts a mock engine serving any model, whose prefill answers
// name engineID, at speedup times real time, with the router's 16-token
// hashing block.
func newMock(t *testing.T, engineID string, speedup float64) *mockEngine {
	t.Helper()
	m, err := mockworker.New(mockworker.Config{Speedup: speedup, BlockTokens: 16, EngineID: engineID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close) // after the server's Close below
	return newRecorded(t, m)
}

// newRecorded serves h on a loopback server, recording its calls.
func newRecorded(t *testing.T, h http.Handler) *mockEngine {
	t.Helper()
	e := &mockEngine{h: h}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(func() {
		e.CloseClientConnections()
		e.Close()
	})
	return e
}

func (e *mockEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	tw := &teeWriter{ResponseWriter: w}
	e.h.ServeHTTP(tw, r)
	e.mu.Lock()
	e.calls = append(e.calls, engineCall{path: r.URL.Path, header: r.Header.Clone(), body: body, answer: tw.buf.Bytes()})
	e.mu.Unlock()
}

func (e *mockEngine) callsSoFar() []engineCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

// teeWriter keeps a copy of what passes through it; Unwrap lets the
// handler's ResponseController reach the flusher.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (t *teeWriter) Write(b []byte) (int, error) {
	t.buf.Write(b)
	return t.ResponseWriter.Write(b)
}

func (t *teeWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// jsonObject decodes a JSON object for comparisons.
func jsonObject(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, b)
	}
	return m
}

// findCall returns the call whose body has x-request-id id.
func findCall(t *testing.T, e *mockEngine, id string) engineCall {
	t.Helper()
	for _, c := range e.callsSoFar() {
		if c.header.Get("X-Request-Id") == id {
			return c
		}
	}
	t.Fatalf("engine %s got no request %s", e.URL, id)
	return engineCall{}
}

// pdFleet is two prefill and two decode mock engines, engine ids
// "engine-NAME".
func pdFleet(t *testing.T, speedup float64) (map[string]*mockEngine, []backend) {
	t.Helper()
	engines := map[string]*mockEngine{}
	var bs []backend
	for _, w := range []struct {
		name string
		role shared.Role
	}{{"p1", shared.RolePrefill}, {"p2", shared.RolePrefill}, {"d1", shared.RoleDecode}, {"d2", shared.RoleDecode}} {
		engines[w.name] = newMock(t, "engine-"+w.name, speedup)
		bs = append(bs, backend{name: w.name, url: engines[w.name].URL, role: w.role})
	}
	return engines, bs
}

var pdRoles = map[string]shared.Role{"p1": shared.RolePrefill, "p2": shared.RolePrefill, "d1": shared.RoleDecode, "d2": shared.RoleDecode}

// TestDisaggRoutesPrefillThenDecode: a model with prefill and decode
// workers only is served in two hops, non-streamed and streamed. The
// prefill worker gets the rewritten body (kv_transfer_params asking for a
// remote decode, one token, not streamed); the decode worker gets the
// client's body plus exactly the kv_transfer_params the prefill worker
// answered; the client gets the decode worker's answer, with both workers
// named in the headers; every booking ends.
func TestDisaggRoutesPrefillThenDecode(t *testing.T) {
	engines, bs := pdFleet(t, 50)
	e := newEnv(t, envOptions{}, bs...)
	for i, stream := range []bool{false, true} {
		id := fmt.Sprintf("pd-%d", i)
		body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":4,"temperature":0.5,"min_tokens":2,"messages":[{"role":"user","content":"tell me <something> %d"}]}`, stream, i)
		if stream {
			body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
		}
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", body, "X-Request-Id", id)
		if err != nil {
			t.Fatal(err)
		}
		answer, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d, %v: %s", id, resp.StatusCode, err, answer)
		}
		pw, dw := resp.Header.Get("X-Switchyard-Prefill-Worker"), resp.Header.Get("X-Switchyard-Worker")
		if pdRoles[pw] != shared.RolePrefill || pdRoles[dw] != shared.RoleDecode {
			t.Fatalf("%s: x-switchyard-prefill-worker %q, x-switchyard-worker %q: want a prefill and a decode worker", id, pw, dw)
		}
		if got := resp.Header.Get("X-Request-Id"); got != id {
			t.Errorf("%s: x-request-id %q", id, got)
		}

		// The prefill hop.
		pc := findCall(t, engines[pw], id)
		client := jsonObject(t, []byte(body))
		want := jsonObject(t, []byte(body))
		want["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
		want["stream"], want["max_tokens"] = false, float64(1)
		delete(want, "stream_options")
		delete(want, "min_tokens")
		if diff := cmp.Diff(want, jsonObject(t, pc.body)); diff != "" {
			t.Errorf("%s: prefill body (-want +got):\n%s", id, diff)
		}
		if bytes.Contains(pc.body, []byte(`\u003c`)) {
			t.Errorf("%s: prefill body escapes HTML: %s", id, pc.body)
		}
		var pa struct {
			KV map[string]any `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(pc.answer, &pa); err != nil || pa.KV == nil {
			t.Fatalf("%s: prefill answer %s", id, pc.answer)
		}
		if pa.KV["remote_engine_id"] != "engine-"+pw || len(pa.KV["remote_block_ids"].([]any)) == 0 {
			t.Fatalf("%s: prefill answered kv_transfer_params %v", id, pa.KV)
		}

		// The decode hop: the client's body plus the prefill's
		// kv_transfer_params, verbatim.
		dc := findCall(t, engines[dw], id)
		want = client
		want["kv_transfer_params"] = pa.KV
		if diff := cmp.Diff(want, jsonObject(t, dc.body)); diff != "" {
			t.Errorf("%s: decode body (-want +got):\n%s", id, diff)
		}
		if !bytes.Equal(dc.answer, answer) {
			t.Errorf("%s: the client got\n%s\nthe decode worker answered\n%s", id, answer, dc.answer)
		}
		if other := map[string]string{"d1": "d2", "d2": "d1"}[dw]; len(engines[other].callsSoFar()) != 0 && i == 0 {
			t.Errorf("%s: the other decode worker %s got a request", id, other)
		}

		if !stream {
			var c struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(answer, &c); err != nil || len(c.Choices) != 1 ||
				c.Choices[0].Message.Content != " lorem ipsum dolor sit" || c.Usage.CompletionTokens != 4 {
				t.Errorf("%s: answer %s, want the 4 tokens", id, answer)
			}
			continue
		}
		if resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("%s: content type %q", id, resp.Header.Get("Content-Type"))
		}
		// 4 token chunks, the usage chunk, [DONE].
		if n := strings.Count(string(answer), "data: "); n != 6 || !strings.HasSuffix(string(answer), "data: [DONE]\n\n") {
			t.Errorf("%s: %d events, want 6 ending with [DONE]:\n%s", id, n, answer)
		}
	}
	e.settle(t)
	if got := e.metric(t, "switchyard_requests_total", "model", "m", "code", "200"); got != 2 {
		t.Errorf("requests_total{m,200} = %v, want 2", got)
	}
	if got := e.series(t, "switchyard_time_to_first_token_seconds"); got != 1 {
		t.Errorf("ttft series = %d, want 1", got)
	}
	if got := selections(t, e); !cmp.Equal(got, map[string]uint64{"prefill": 2, "decode": 2}) {
		t.Errorf("selection observations by role %v, want 2 prefill and 2 decode", got)
	}
}

// selections counts switchyard_selection_duration_seconds observations by
// role.
func selections(t *testing.T, e *env) map[string]uint64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_selection_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "role" {
					got[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return got
}

// cutStub answers the headers and part of a body, then drops the
// connection: a prefill worker that fails mid-answer.
func cutStub(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "1000")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"id":"cmpl-1",`)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	conn, _, err := rc.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// TestDisaggPrefillRefusingIsRetried: a prefill worker that refuses
// connections, or drops one before its answer is complete (nothing has
// reached the client), is excluded and the prefill sent to the other.
func TestDisaggPrefillRefusingIsRetried(t *testing.T) {
	live, dec := newMock(t, "engine-live", 50), newMock(t, "engine-d", 50)
	cut := newRecorded(t, http.HandlerFunc(cutStub))
	e := newEnv(t, envOptions{},
		backend{name: "dead", url: closedURL(t), role: shared.RolePrefill},
		backend{name: "cut", url: cut.URL, role: shared.RolePrefill, models: []string{"c"}},
		backend{name: "live", url: live.URL, role: shared.RolePrefill, models: []string{"m", "c"}},
		backend{name: "d", url: dec.URL, role: shared.RoleDecode, models: []string{"m", "c"}})
	for i := range 8 {
		model := []string{"m", "c"}[i%2]
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody(model, i%3 == 0, fmt.Sprintf("x %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Prefill-Worker") != "live" || resp.Header.Get("X-Switchyard-Worker") != "d" {
			t.Errorf("request %d: status %d, prefill %q, decode %q: %s", i, resp.StatusCode,
				resp.Header.Get("X-Switchyard-Prefill-Worker"), resp.Header.Get("X-Switchyard-Worker"), b)
		}
	}
	if got := e.ws.failuresOf("dead"); got == 0 {
		t.Error("the refusing prefill worker's failure was not reported")
	}
	if got, calls := e.ws.failuresOf("cut"), len(cut.callsSoFar()); got == 0 || got != calls {
		t.Errorf("the cutting prefill worker got %d requests and %d failures reported, want as many and some", calls, got)
	}
	if got := len(live.callsSoFar()); got != 8 {
		t.Errorf("live prefill worker got %d requests, want 8", got)
	}
	e.settle(t)
}

// TestDisaggDecodeRefusingIsRetried: a decode worker that refuses
// connections is excluded and the decode hop selected again; with every
// decode worker refusing, the request fails with 502 after the prefill
// completed, and nothing stays booked.
func TestDisaggDecodeRefusingIsRetried(t *testing.T) {
	pre, live := newMock(t, "engine-p", 50), newMock(t, "engine-live", 50)
	e := newEnv(t, envOptions{},
		backend{name: "p", url: pre.URL, role: shared.RolePrefill},
		backend{name: "dead", url: closedURL(t), role: shared.RoleDecode},
		backend{name: "live", url: live.URL, role: shared.RoleDecode},
		backend{name: "p2", url: pre.URL, role: shared.RolePrefill, models: []string{"gone"}},
		backend{name: "dead2", url: closedURL(t), role: shared.RoleDecode, models: []string{"gone"}},
		backend{name: "dead3", url: closedURL(t), role: shared.RoleDecode, models: []string{"gone"}})
	for i := range 4 {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", i%2 == 0, fmt.Sprintf("x %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "live" || resp.Header.Get("X-Switchyard-Prefill-Worker") != "p" {
			t.Errorf("request %d: status %d, prefill %q, decode %q: %s", i, resp.StatusCode,
				resp.Header.Get("X-Switchyard-Prefill-Worker"), resp.Header.Get("X-Switchyard-Worker"), b)
		}
	}
	if got := e.ws.failuresOf("dead"); got == 0 {
		t.Error("the refusing decode worker's failure was not reported")
	}
	if got := len(live.callsSoFar()); got != 4 {
		t.Errorf("live decode worker got %d requests, want 4", got)
	}

	before := len(pre.callsSoFar())
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("gone", true, "y"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Switchyard-Prefill-Worker") != "p2" {
		t.Errorf("every decode worker refusing: status %d, prefill worker %q; want 502 after p2's prefill", resp.StatusCode, resp.Header.Get("X-Switchyard-Prefill-Worker"))
	}
	if got := decodeError(t, resp); got.Code != "worker_failed" || !strings.Contains(got.Message, "decode") {
		t.Errorf("error %+v, want worker_failed naming the decode workers", got)
	}
	if a, b := e.ws.failuresOf("dead2"), e.ws.failuresOf("dead3"); a != 1 || b != 1 {
		t.Errorf("failures: dead2 %d, dead3 %d; want one each", a, b)
	}
	if got := len(pre.callsSoFar()) - before; got != 1 {
		t.Errorf("prefill requests for the failed request: %d, want 1", got)
	}
	e.settle(t)
}

// prefillStub answers prefill requests by model: "bad" 400 with an engine
// error, "down" 503, "nokv" 200 without kv_transfer_params.
const stubError = `{"error":{"message":"This model's maximum context length is 16 tokens.","type":"BadRequestError","param":null,"code":400}}`

func prefillStub(w http.ResponseWriter, r *http.Request) {
	var req struct{ Model string }
	_ = json.NewDecoder(r.Body).Decode(&req)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Engine", "stub")
	switch req.Model {
	case "bad":
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, stubError)
	case "down":
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`)
	default:
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}]}`)
	}
}

// TestDisaggPrefillAnswers: a non-2xx prefill answer reaches the client
// as is (status, body, headers) and ends the request; a 2xx answer without
// kv_transfer_params is a 502 naming the prefill worker. The decode worker
// gets nothing; nothing stays booked.
func TestDisaggPrefillAnswers(t *testing.T) {
	stub := newRecorded(t, http.HandlerFunc(prefillStub))
	dec := newMock(t, "engine-d", 50)
	models := []string{"bad", "down", "nokv"}
	e := newEnv(t, envOptions{},
		backend{name: "stub", url: stub.URL, role: shared.RolePrefill, models: models},
		backend{name: "d", url: dec.URL, role: shared.RoleDecode, models: models})
	for _, tc := range []struct {
		model  string
		status int
		body   string // "": an error of code
		code   string
	}{
		{"bad", http.StatusBadRequest, stubError, ""},
		{"down", http.StatusServiceUnavailable, `{"error":{"message":"overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`, ""},
		{"nokv", http.StatusBadGateway, "", "bad_prefill_answer"},
	} {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody(tc.model, true, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status || resp.Header.Get("X-Switchyard-Prefill-Worker") != "stub" {
			t.Errorf("%s: status %d, prefill worker %q; want %d from stub", tc.model, resp.StatusCode, resp.Header.Get("X-Switchyard-Prefill-Worker"), tc.status)
		}
		if tc.body == "" {
			if got := decodeError(t, resp); got.Code != tc.code || !strings.Contains(got.Message, `"stub"`) || !strings.Contains(got.Message, "kv_transfer_params") {
				t.Errorf("%s: error %+v, want %s naming the worker and kv_transfer_params", tc.model, got, tc.code)
			}
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(b) != tc.body || resp.Header.Get("X-Engine") != "stub" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: body %q, headers %v; want the prefill worker's answer as is", tc.model, b, resp.Header)
		}
	}
	if got := len(dec.callsSoFar()); got != 0 {
		t.Errorf("the decode worker got %d requests", got)
	}
	if got := e.ws.failuresOf("stub"); got != 1 {
		t.Errorf("stub failures %d, want 1 (its 503)", got)
	}
	e.settle(t)
}

// TestDisaggModeSelection: a model with an aggregated worker is served
// aggregated even when prefill workers list it too; a model with prefill
// but no decode worker is a 503 no_worker, before any prefill; a model no
// worker lists is still a 404.
func TestDisaggModeSelection(t *testing.T) {
	agg := newEngine(t, 3, 0)
	pre := newMock(t, "engine-p", 50)
	e := newEnv(t, envOptions{models: []string{"both", "ponly"}},
		backend{name: "agg", url: agg.URL, models: []string{"both"}},
		backend{name: "p", url: pre.URL, role: shared.RolePrefill, models: []string{"both", "ponly"}})

	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("both", false, "x"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "agg" || resp.Header.Get("X-Switchyard-Prefill-Worker") != "" {
		t.Errorf("model with an aggregated worker: status %d, worker %q, prefill worker %q; want 200 from agg alone",
			resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), resp.Header.Get("X-Switchyard-Prefill-Worker"))
	}
	if string(agg.bodies[0]) != chatBody("both", false, "x") {
		t.Errorf("aggregated worker got %s, want the client's body unchanged", agg.bodies[0])
	}

	for _, tc := range []struct {
		model  string
		status int
		code   string
	}{
		{"ponly", http.StatusServiceUnavailable, "no_worker"},
		{"nope", http.StatusNotFound, "model_not_found"},
	} {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody(tc.model, true, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.model, resp.StatusCode, tc.status)
		}
		if got := decodeError(t, resp); got.Code != tc.code {
			t.Errorf("%s: code %q, want %q", tc.model, got.Code, tc.code)
		}
	}
	if got := len(pre.callsSoFar()); got != 0 {
		t.Errorf("the prefill worker got %d requests, want none", got)
	}
	e.settle(t)
}

// TestDisaggCancellationAccounting: 60 streamed and non-streamed
// disaggregated requests, 12 at a time, over 2 prefill and 2 decode
// workers with a prefill capacity of 2 per worker (so prefills queue), a
// third cancelled by the client at a random point (queued for a prefill,
// during it, between the hops, before the decode's headers, mid-stream).
// Afterwards every prefill and decode worker's counts are 0 and the
// queues are empty.
func TestDisaggCancellationAccounting(t *testing.T) {
	engines, bs := pdFleet(t, 10)
	e := newEnv(t, envOptions{queue: capacityQueue(2, 0)}, bs...)
	run := runCancelling(t, e.url+"/v1/chat/completions", 60, 12, 3, 25*time.Millisecond, 3, func(stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":16,"messages":[{"role":"user","content":"shared prefix %s"}]}`, stream, time.Now())
	})
	codes, cancelled, done := run.codes, run.cancelled, run.streamsDone
	e.settle(t)
	prefills := len(engines["p1"].callsSoFar()) + len(engines["p2"].callsSoFar())
	decodes := len(engines["d1"].callsSoFar()) + len(engines["d2"].callsSoFar())
	t.Logf("answers %v (%d streams done), cancelled %d; prefill requests %d, decode requests %d", codes, done, cancelled, prefills, decodes)
	if cancelled == 0 || codes[http.StatusOK] == 0 || done == 0 {
		t.Errorf("want both cancelled and completed requests: %v, %d cancelled", codes, cancelled)
	}
	for c, n := range codes {
		if c != http.StatusOK {
			t.Errorf("unexpected status %d (%d times)", c, n)
		}
	}
	if len(e.workers) != 4 {
		t.Fatalf("%d workers", len(e.workers))
	}
	for _, w := range e.workers {
		if n := w.ActiveRequests(); n != 0 {
			t.Errorf("%s worker %s: %d active", w.Role, w.Name, n)
		}
	}
}

// The decode hop is admitted like the prefill hop: with a capacity of one
// request per worker and one decode worker busy, a second request's
// decode waits in the decode queue (its prefill done), and is dispatched
// when the first ends.
func TestDisaggDecodeWaitsForCapacity(t *testing.T) {
	pre := newMock(t, "engine-p1", 50)
	dec := newEngine(t, 1, 0)
	dec.gate = make(chan struct{})
	e := newEnv(t, envOptions{queue: capacityQueue(1, 0)},
		backend{name: "p1", url: pre.URL, role: shared.RolePrefill},
		backend{name: "d1", url: dec.URL, role: shared.RoleDecode})
	codes := make(chan int, 2)
	for i := range 2 {
		go func() {
			resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, fmt.Sprintf("request %d", i)))
			if err != nil {
				codes <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	testkit.Eventually(t, "the awaited condition", func() bool { return dec.requests.Load() == 1 && e.rt.Waiting(shared.RoleDecode) == 1 })
	if n := e.workers[1].ActiveRequests(); n != 1 {
		t.Errorf("decode worker active %d while one decode waits, want 1 (its capacity)", n)
	}
	close(dec.gate)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("status %d, want 200", c)
		}
	}
	if dec.requests.Load() != 2 {
		t.Errorf("decode worker got %d requests, want 2", dec.requests.Load())
	}
	e.settle(t)
}
