package serve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// contEngine is an engine that continues its answers: token i of an
// answer is "t<i> " (id 100+i), whatever attempt generates it: a chat
// request continuing its final assistant message (vLLM's
// continue_final_message) starts after the tokens that message holds, a
// completions request after the ids past its 3 prompt ids. Its first
// attempts (not continuations) are cut after cutAfter tokens as cut says.
type contEngine struct {
	*httptest.Server
	cut      string // "eof", "reset", "error", "stall", "finished", "" (none)
	cutAll   bool   // continuations are cut too
	cutAfter int
	refuse   bool          // continuations are answered 400
	delay    time.Duration // between tokens
	hangCont bool          // continuations get no answer

	mu     sync.Mutex
	bodies [][]byte
}

const contDefaultMax = 8

func newContEngine(t *testing.T, cut string, cutAfter int) *contEngine {
	e := &contEngine{cut: cut, cutAfter: cutAfter}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *contEngine) requests() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]byte(nil), e.bodies...)
}

func (e *contEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.mu.Unlock()
	g := func(p string) gjson.Result { return gjson.GetBytes(body, p) }
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	start, prompt := 0, 3
	cont := false
	if chat && g("continue_final_message").Bool() {
		start = len(strings.Fields(g("messages.@reverse.0.content").Str))
		prompt += start
		cont = true
	}
	if !chat && g("prompt").IsArray() {
		ids := g("prompt").Array()
		start, prompt = len(ids)-3, len(ids)
		cont = start > 0
	}
	if cont && e.hangCont {
		<-r.Context().Done()
		return
	}
	if cont && e.refuse {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","param":null,"code":400}}`)
		return
	}
	n := contDefaultMax
	if m := g("max_tokens"); m.Exists() {
		n = int(m.Int())
	}
	ids := g("return_token_ids").Bool()
	object, id := "text_completion", fmt.Sprintf("cmpl-%p-%d", e, len(e.requests()))
	if chat {
		object = "chat.completion.chunk"
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	ev := func(choice string, extra string) {
		fmt.Fprintf(w, "data: {\"id\":%q,\"object\":%q,\"created\":1,\"model\":\"m\",\"choices\":[%s]%s}\n\n", id, object, choice, extra)
		f.Flush()
	}
	cutting := e.cut != "" && (!cont || e.cutAll)
	if cutting && e.cut == "headers" {
		// Headers, then the connection closed before any event (vLLM
		// killed during the prefill sends its headers first).
		f.Flush()
		e.doCut(w, r, id)
		return
	}
	if chat {
		extra := ""
		if ids {
			extra = `,"prompt_token_ids":[1,2,3]`
		}
		ev(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`, extra)
	}
	for i := range n {
		tok := start + i
		if e.delay > 0 && i > 0 {
			select {
			case <-time.After(e.delay):
			case <-r.Context().Done():
				return
			}
		}
		if cutting && e.cut != "finished" && i == e.cutAfter {
			e.doCut(w, r, id)
			return
		}
		finish := "null"
		if i == n-1 {
			finish = `"length"`
		}
		tids := ""
		if ids {
			tids = fmt.Sprintf(`,"token_ids":[%d]`, 100+tok)
		}
		if chat {
			ev(fmt.Sprintf(`{"index":0,"delta":{"content":"t%d "},"logprobs":null,"finish_reason":%s%s}`, tok, finish, tids), "")
		} else {
			pids := ""
			if ids && i == 0 {
				pids = `,"prompt_token_ids":[1,2,3]`
			}
			ev(fmt.Sprintf(`{"index":0,"text":"t%d ","logprobs":null,"finish_reason":%s%s%s}`, tok, finish, pids, tids), "")
		}
	}
	if g("stream_options.include_usage").Bool() {
		ev("", fmt.Sprintf(`,"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}`, prompt, prompt+n, n))
	}
	if cutting && e.cut == "finished" {
		e.doCut(w, r, id)
		return
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	f.Flush()
}

// doCut cuts the answer: the connection closed cleanly mid-stream (eof:
// an unchunked stream ends so), broken (reset), an error event, or
// nothing more (stall).
func (e *contEngine) doCut(w http.ResponseWriter, r *http.Request, id string) {
	switch e.cut {
	case "eof", "finished", "headers":
		// A chunked body would read as broken: end the stream as an engine
		// that sends it unchunked does, by closing the connection after a
		// clean end. The router's transport sees EOF.
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = buf.Flush()
			// The chunked framing's terminator: a clean end of body.
			_, _ = conn.Write([]byte("0\r\n\r\n"))
			_ = conn.Close()
		}
	case "reset":
		panic(http.ErrAbortHandler)
	case "error":
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine failed\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	case "stall":
		<-r.Context().Done()
	}
}

// readStream reads a client's stream: every event's data.
func readStream(t *testing.T, resp *http.Response) []string {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	var events []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v (events %q)", err, events)
	}
	return events
}

// checkWhole asserts that events are one well-formed answer of want
// tokens: one id, one role chunk (chat), tokens t0.. once in order, one
// finish, one [DONE] last, no token ids, and when usage, a usage chunk
// counting the whole answer.
func checkWhole(t *testing.T, events []string, chat bool, want int, usage bool) {
	t.Helper()
	var text strings.Builder
	ids := map[string]bool{}
	roles, finishes, usages := 0, 0, 0
	for i, ev := range events {
		if ev == "[DONE]" {
			if i != len(events)-1 {
				t.Fatalf("[DONE] at %d of %d: %q", i, len(events), events)
			}
			continue
		}
		if strings.Contains(ev, `_ids":[`) {
			t.Fatalf("token ids reached the client: %s", ev)
		}
		if gjson.Get(ev, "error").Exists() {
			t.Fatalf("error event: %s", ev)
		}
		ids[gjson.Get(ev, "id").Str] = true
		c := gjson.Get(ev, "choices.0")
		if chat {
			if c.Get("delta.role").Exists() {
				roles++
			}
			text.WriteString(c.Get("delta.content").Str)
		} else {
			text.WriteString(c.Get("text").Str)
		}
		if fr := c.Get("finish_reason"); fr.Exists() && fr.Type != gjson.Null {
			finishes++
		}
		if u := gjson.Get(ev, "usage"); u.IsObject() {
			usages++
			if u.Get("prompt_tokens").Int() != 3 || u.Get("completion_tokens").Int() != int64(want) || u.Get("total_tokens").Int() != int64(3+want) {
				t.Errorf("usage %s, want prompt 3, completion %d", u.Raw, want)
			}
		}
	}
	var wantText strings.Builder
	for i := range want {
		fmt.Fprintf(&wantText, "t%d ", i)
	}
	if text.String() != wantText.String() {
		t.Errorf("text %q, want %q", text.String(), wantText.String())
	}
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Errorf("no [DONE] at the end: %q", events)
	}
	if len(ids) != 1 {
		t.Errorf("chunk ids %v, want one", ids)
	}
	if chat && roles != 1 {
		t.Errorf("%d role chunks, want 1", roles)
	}
	if finishes != 1 {
		t.Errorf("%d finishes, want 1", finishes)
	}
	if want := map[bool]int{true: 1, false: 0}[usage]; usages != want {
		t.Errorf("%d usage chunks, want %d", usages, want)
	}
}

func TestMigrationContinuesACutStream(t *testing.T) {
	for _, cut := range []string{"eof", "reset", "error", "stall", "headers"} {
		for _, chat := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/chat=%v", cut, chat), func(t *testing.T) {
				e1, e2 := newContEngine(t, cut, 3), newContEngine(t, cut, 3)
				if cut == "headers" {
					// Sent again as it was, the request reads as a first
					// attempt: only one engine cuts.
					e2.cut = ""
				}
				o := envOptions{}
				if cut == "stall" {
					o.stall = 100 * time.Millisecond
				}
				env := newEnv(t, o, backend{name: "w1", url: e1.URL}, backend{name: "w2", url: e2.URL})
				path, body := "/v1/completions", `{"model":"m","stream":true,"prompt":"hi","max_tokens":8,"stream_options":{"include_usage":true}}`
				if chat {
					path, body = "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":8,"seed":5,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
				}
				resp, err := post(t, context.Background(), env.url+path, body)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				checkWhole(t, readStream(t, resp), chat, 8, true)
				// One engine was cut, the other continued: its request is
				// the first's with the 3 tokens so far and 5 to go.
				first, next := e1.requests(), e2.requests()
				if len(first) == 0 {
					first, next = next, first
				}
				if len(first) != 1 || len(next) != 1 {
					t.Fatalf("requests %d and %d, want 1 each", len(first), len(next))
				}
				g := func(p string) gjson.Result { return gjson.GetBytes(next[0], p) }
				if cut == "headers" {
					// Cut before any token: the request itself, again.
					if string(next[0]) != string(first[0]) {
						t.Errorf("sent again %s, first %s", next[0], first[0])
					}
				} else if g("max_tokens").Int() != 5 || !g("return_token_ids").Bool() || !gjson.GetBytes(first[0], "return_token_ids").Bool() {
					t.Errorf("continuation %s", next[0])
				}
				if cut == "headers" {
				} else if chat {
					if g("messages.#").Int() != 2 || g("messages.1.content").Str != "t0 t1 t2 " || !g("continue_final_message").Bool() ||
						g("add_generation_prompt").Bool() || g("seed").Int() != 5 {
						t.Errorf("chat continuation %s", next[0])
					}
				} else if g("prompt").Raw != "[1,2,3,100,101,102]" {
					t.Errorf("completions continuation %s", next[0])
				}
				env.settle(t)
				cause := map[string]string{"eof": "eof", "reset": "reset", "error": "engine_error", "stall": "stall", "headers": "eof"}[cut]
				if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", cause, "outcome", "migrated"); n != 1 {
					t.Errorf("switchyard_migrations_total{cause=%q,outcome=migrated} = %v, want 1", cause, n)
				}
				if n := testkit.MetricValue(t, env.reg, "switchyard_migration_kept_bytes"); n != 0 {
					t.Errorf("kept bytes %v after the request, want 0", n)
				}
			})
		}
	}
}

// twoEngines returns an env over two contEngines that cut as cut after
// `after` tokens, each first adjusted by set (nil: none).
func twoEngines(t *testing.T, o envOptions, cut string, after int, set func(*contEngine)) (*env, *contEngine, *contEngine) {
	t.Helper()
	e1, e2 := newContEngine(t, cut, after), newContEngine(t, cut, after)
	if set != nil {
		set(e1)
		set(e2)
	}
	return newEnv(t, o, backend{name: "w1", url: e1.URL}, backend{name: "w2", url: e2.URL}), e1, e2
}

// endedWith posts body to env's chat endpoint and returns its stream's
// events, which must end with an event holding every one of want and
// then "[DONE]".
func endedWith(t *testing.T, env *env, body string, want ...string) []string {
	t.Helper()
	resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	events := readStream(t, resp)
	n := len(events)
	if n < 2 || events[n-1] != "[DONE]" {
		t.Fatalf("events %q, want [DONE] last", events)
	}
	for _, w := range want {
		if !strings.Contains(events[n-2], w) {
			t.Fatalf("events %q, want the last before [DONE] to hold %q", events, w)
		}
	}
	return events
}

func TestMigrationEnds(t *testing.T) {
	chat := `{"model":"m","stream":true,"max_tokens":8,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	t.Run("finished before the cut: nothing sent again", func(t *testing.T) {
		env, e1, e2 := twoEngines(t, envOptions{}, "finished", 0, nil)
		resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", chat)
		if err != nil {
			t.Fatal(err)
		}
		checkWhole(t, readStream(t, resp), true, 8, true)
		if n := len(e1.requests()) + len(e2.requests()); n != 1 {
			t.Errorf("%d engine requests, want 1", n)
		}
		env.settle(t)
		if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "eof", "outcome", "finished"); n != 1 {
			t.Errorf("finished cuts %v, want 1", n)
		}
	})
	t.Run("every worker cuts: an error event", func(t *testing.T) {
		env, _, _ := twoEngines(t, envOptions{}, "reset", 2, func(e *contEngine) { e.cutAll = true })
		events := endedWith(t, env, chat, `"code":"worker_failed"`, "no other worker")
		n := len(events)
		// The tokens that reached the client are t0.. once, in order.
		var text strings.Builder
		for _, ev := range events[:n-2] {
			text.WriteString(gjson.Get(ev, "choices.0.delta.content").Str)
		}
		if text.String() != "t0 t1 t2 t3 " {
			t.Errorf("text %q", text.String())
		}
		env.settle(t)
		if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "reset", "outcome", "no_worker"); n != 1 {
			t.Errorf("no_worker %v, want 1", n)
		}
	})
	t.Run("the continuation refused: the engine's error", func(t *testing.T) {
		env, _, _ := twoEngines(t, envOptions{}, "eof", 2, func(e *contEngine) { e.refuse = true })
		endedWith(t, env, chat, "maximum context length")
		env.settle(t)
		if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "eof", "outcome", "refused"); n != 1 {
			t.Errorf("refused %v, want 1", n)
		}
	})
	t.Run("migration off: an error event", func(t *testing.T) {
		e1 := newContEngine(t, "eof", 2)
		env := newEnv(t, envOptions{migrationLimit: -1}, backend{name: "w1", url: e1.URL})
		endedWith(t, env, chat, "migration is off")
		if len(e1.requests()) != 1 || gjson.GetBytes(e1.requests()[0], "return_token_ids").Exists() {
			t.Errorf("with migration off the request is the client's: %s", e1.requests()[0])
		}
	})
	t.Run("over the limit", func(t *testing.T) {
		var backends []backend
		var engines []*contEngine
		for i := range 6 {
			e := newContEngine(t, "eof", 1)
			e.cutAll = true
			engines = append(engines, e)
			backends = append(backends, backend{name: fmt.Sprintf("w%d", i), url: e.URL})
		}
		env := newEnv(t, envOptions{migrationLimit: 2}, backends...)
		endedWith(t, env, chat, "migration limit")
		total := 0
		for _, e := range engines {
			total += len(e.requests())
		}
		if total != 3 {
			t.Errorf("%d engine requests, want 3 (the first and 2 migrations)", total)
		}
	})
}

// TestMigrationOnDrain: a worker that leaves the fleet mid-stream keeps
// its stream for the drain grace, then the stream migrates (cause
// drain); a non-streamed request without an answer yet is placed again.
func TestMigrationOnDrain(t *testing.T) {
	e1, e2 := newContEngine(t, "", 0), newContEngine(t, "", 0)
	e1.delay, e2.delay = 10*time.Millisecond, 10*time.Millisecond
	env := newEnv(t, envOptions{grace: 50 * time.Millisecond}, backend{name: "w1", url: e1.URL}, backend{name: "w2", url: e2.URL})
	body := `{"model":"m","stream":true,"max_tokens":60,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	first := resp.Header.Get("X-Switchyard-Worker")
	var events []string
	sc := bufio.NewScanner(resp.Body)
	removed := false
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events = append(events, d)
		if !removed && len(events) == 4 { // the role chunk and 3 tokens
			removed = true
			for i, w := range env.workers {
				if w.Name == first {
					if err := env.r.RemoveWorker(shared.WorkerID(i+1), 0); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	checkWhole(t, events, true, 60, true)
	moved, stayed := e2, e1
	if first == "w2" {
		moved, stayed = e1, e2
	}
	if len(stayed.requests()) != 1 || len(moved.requests()) != 1 || !gjson.GetBytes(moved.requests()[0], "continue_final_message").Bool() {
		t.Fatalf("requests: %d on %s, %d on the other", len(stayed.requests()), first, len(moved.requests()))
	}
	env.settle(t)
	if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "drain", "outcome", "migrated"); n != 1 {
		t.Errorf("drain migrations %v, want 1", n)
	}
}

// TestCutStreamsThatDoNotMigrate: a Responses or Messages stream that
// ends without its final event, however cleanly its connection ends, is
// a cut: the client's connection is cut (it reads an error, not a clean
// end), the worker is reported, the cut counted. One that ends with it
// is whole.
func TestCutStreamsThatDoNotMigrate(t *testing.T) {
	for _, c := range []struct {
		path, body, events, last string
	}{
		{"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`,
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"t0 \"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n"},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"t0 \"}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	} {
		for _, whole := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/whole=%v", c.path, whole), func(t *testing.T) {
				eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush() // a stream: no Content-Length
					_, _ = io.WriteString(w, c.events)
					if whole {
						_, _ = io.WriteString(w, c.last)
					}
				}))
				t.Cleanup(eng.Close)
				env := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
				resp, err := post(t, context.Background(), env.url+c.path, c.body)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if whole {
					if err != nil || !strings.HasSuffix(string(b), c.last) {
						t.Fatalf("a whole stream: %v, %q", err, b)
					}
				} else if err == nil {
					t.Fatalf("a stream cut before its final event read as whole: %q", b)
				}
				env.settle(t)
				want := map[bool]float64{false: 1, true: 0}[whole]
				if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "eof", "outcome", "not_migratable"); n != want {
					t.Errorf("cuts counted %v, want %v", n, want)
				}
				if n := env.ws.failures["w1"]; float64(n) != want {
					t.Errorf("failures reported %d, want %v", n, want)
				}
			})
		}
	}
}

// TestDrainMovesAWaitingNonStreamedRequest: a non-streamed request whose
// engine holds it (hung) while its worker leaves the fleet is placed
// again on another worker once the drain grace passes; it is answered
// there, counted as a drain migration, and nothing stays booked.
func TestDrainMovesAWaitingNonStreamedRequest(t *testing.T) {
	hung := newEngine(t, 4, time.Millisecond)
	hung.gate = make(chan struct{})
	defer close(hung.gate)
	free := newEngine(t, 4, time.Millisecond)
	env := newEnv(t, envOptions{grace: 50 * time.Millisecond}, backend{name: "w1", url: hung.URL})
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", chatBody("m", false, "x"))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	testkit.Eventually(t, "the request at the hung engine", func() bool { return hung.requests.Load() == 1 })
	env.ws.mu.Lock()
	env.ws.urls["w2"] = free.URL
	env.ws.mu.Unlock()
	if _, err := env.r.AddWorker(fleet.Spec{ID: 2, Role: shared.RoleAggregated, TotalKVBlocks: 1000, Name: "w2", Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.r.RemoveWorker(1, 0); err != nil {
		t.Fatal(err)
	}
	resp := <-done
	if resp == nil {
		t.FailNow()
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "w2" || free.requests.Load() != 1 {
		t.Fatalf("status %d from %q (%d requests at w2): %s", resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), free.requests.Load(), b)
	}
	env.settle(t)
	if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "drain", "outcome", "migrated"); n != 1 {
		t.Errorf("drain migrations %v, want 1", n)
	}
}

// TestMigrationTimesOut: a request whose continuation is still waiting
// for its engine when the request timeout passes ends with a timeout
// error event and the terminator, nothing else after the tokens passed.
func TestMigrationTimesOut(t *testing.T) {
	env, _, _ := twoEngines(t, envOptions{timeout: 300 * time.Millisecond}, "eof", 2, func(e *contEngine) { e.hangCont = true })
	resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	events := readStream(t, resp)
	n := len(events)
	if n != 5 || events[n-1] != "[DONE]" || events[n-2] != `{"error":{"message":"the request timed out","type":"server_error","param":null,"code":"timeout"}}` {
		t.Fatalf("events %q, want the role chunk, 2 tokens, the timeout event and [DONE]", events)
	}
	env.settle(t)
}

// TestRewrittenStreamDropsContentLength: a stream the router rewrites
// (the ids it asked for made null) does not carry the engine's
// Content-Length, which no longer holds: the client reads it whole.
func TestRewrittenStreamDropsContentLength(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		body := strings.Join(chatIDEvents, "")
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(eng.Close)
	env := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.ContentLength != -1 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Contains(string(b), `"token_ids":[`) {
		t.Fatalf("read %v, length %d: %q", err, resp.ContentLength, b)
	}
}

// chatIDEvents is a short vLLM chat stream with token ids.
var chatIDEvents = []string{
	`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}` + "\n\n",
	`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t0 "},"logprobs":null,"finish_reason":"length","token_ids":[100]}]}` + "\n\n",
	"data: [DONE]\n\n",
}

// TestNonStreamedCutAnswers: a whole answer whose engine closes its
// connection before the body (an empty 200) is placed again elsewhere;
// one cut short in its body (not a whole JSON object) cuts the client's
// connection rather than pass for a whole answer.
func TestNonStreamedCutAnswers(t *testing.T) {
	closeAfter := func(body string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + body)
			_ = buf.Flush()
			_ = conn.Close()
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	t.Run("empty: placed again", func(t *testing.T) {
		good := newEngine(t, 4, time.Millisecond)
		env := newEnv(t, envOptions{}, backend{name: "w1", url: closeAfter("").URL}, backend{name: "w2", url: good.URL})
		for range 2 { // round-robin: one of the two meets the empty answer first
			resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", chatBody("m", false, "x"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "w2" || !strings.HasSuffix(string(b), "}") {
				t.Fatalf("%d from %q: %v %q", resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), err, b)
			}
		}
		env.settle(t)
		if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "eof", "outcome", "migrated"); n < 1 {
			t.Errorf("empty answers placed again: %v, want at least 1", n)
		}
	})
	t.Run("cut in its body: the client's connection cut", func(t *testing.T) {
		env := newEnv(t, envOptions{}, backend{name: "w1", url: closeAfter(`{"id":"x","choices":[{"index":0,`).URL})
		resp, err := post(t, context.Background(), env.url+"/v1/chat/completions", chatBody("m", false, "x"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err == nil {
			t.Fatalf("a cut answer read as whole: %q", b)
		}
		env.settle(t)
		if n := testkit.MetricValue(t, env.reg, "switchyard_migrations_total", "cause", "eof", "outcome", "not_migratable"); n != 1 {
			t.Errorf("cut answers counted %v, want 1", n)
		}
	})
}
