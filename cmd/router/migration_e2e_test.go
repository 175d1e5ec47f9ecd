//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The fault matrix of request migration (issue #32) against real
// processes: `router serve` in front of three `router mock-worker`
// engines, under concurrent streamed load (chat and completions, usage
// asked), one engine made to fail mid-answer in each of the ways an
// engine fails (kill -9, SIGSTOP, drain on SIGTERM, a reset, a stall, a
// close without the terminator, an error event). Every client must read
// one well-formed stream equal, byte for byte, to the answer the same
// request gets from an engine that does not fail (the mock continues its
// answers deterministically: docs/serve.md, "router mock-worker"), and
// the router must count each cut stream once under its cause, migrated.

// migPolicy is a round-robin policy, so that the load spreads evenly and
// the failing engine carries a third of it.
const migPolicy = `router {
  block_size = 16
}

policy "rr" {
  picker "pick" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`

// migRequest is one client's request: its API path and body.
type migRequest struct{ path, body string }

// migLoad is n requests, alternately chat and completions, each its own
// prompt and max_tokens (so every answer differs in length), all asking
// for the usage chunk. maxTokens is the first one's; each next one asks
// for 3 more.
func migLoad(n, maxTokens int) []migRequest {
	rs := make([]migRequest, n)
	for i := range rs {
		mt := maxTokens + 3*i
		if i%2 == 0 {
			rs[i] = migRequest{path: "/v1/chat/completions", body: fmt.Sprintf(
				`{"model":"mock","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"seed":%d,"temperature":0.7,"messages":[{"role":"system","content":"You are client %d."},{"role":"user","content":"Tell me a story about the number %d."}]}`,
				mt, i, i, i)}
		} else {
			rs[i] = migRequest{path: "/v1/completions", body: fmt.Sprintf(
				`{"model":"mock","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"seed":%d,"prompt":"Client %d asks: what comes after the number %d?"}`,
				mt, i, i, i)}
		}
	}
	return rs
}

// sseAnswer is a streamed answer as a client read it.
type sseAnswer struct {
	status   int
	worker   string // X-Switchyard-Worker
	body     string // a non-stream answer's body
	text     string // choice 0's text, concatenated
	tokens   int    // chunks carrying text
	ids      map[string]int
	roles    int // chat chunks with a delta.role
	finishes []string
	usages   []migUsage
	errors   []string // error events' data
	idsShown int      // chunks whose token_ids or prompt_token_ids were not null
	done     int      // "data: [DONE]" events
	last     string   // the last event's data
	badJSON  []string
	readErr  error
}

type migUsage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	Total      int `json:"total_tokens"`
}

// migChunk is the part of a chat or completions chunk the checks read
// (OpenAI's chunk objects; vLLM's token_ids and prompt_token_ids).
type migChunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Index int     `json:"index"`
		Text  *string `json:"text"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason   *string         `json:"finish_reason"`
		TokenIDs       json.RawMessage `json:"token_ids"`
		PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
	} `json:"choices"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
	Usage          *migUsage       `json:"usage"`
	Error          json.RawMessage `json:"error"`
}

func shown(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// readSSE reads a streamed answer to its end; progress, when set, is
// called with the number of text chunks read so far after each one.
func readSSE(resp *http.Response, progress func(int)) sseAnswer {
	a := sseAnswer{status: resp.StatusCode, worker: resp.Header.Get("X-Switchyard-Worker"), ids: map[string]int{}}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		a.body, a.readErr = string(b), err
		return a
	}
	var text strings.Builder
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var data []string
	event := func() {
		if len(data) == 0 {
			return
		}
		d := strings.Join(data, "\n")
		data = data[:0]
		a.last = d
		if d == "[DONE]" {
			a.done++
			return
		}
		var c migChunk
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			a.badJSON = append(a.badJSON, d)
			return
		}
		if shown(c.Error) {
			a.errors = append(a.errors, d)
			return
		}
		a.ids[c.ID]++
		if shown(c.PromptTokenIDs) {
			a.idsShown++
		}
		if c.Usage != nil {
			a.usages = append(a.usages, *c.Usage)
		}
		for _, ch := range c.Choices {
			if shown(ch.TokenIDs) || shown(ch.PromptTokenIDs) {
				a.idsShown++
			}
			var t string
			switch {
			case ch.Text != nil:
				t = *ch.Text
			case ch.Delta != nil:
				if ch.Delta.Role != nil {
					a.roles++
				}
				if ch.Delta.Content != nil {
					t = *ch.Delta.Content
				}
			}
			if t != "" {
				text.WriteString(t)
				a.tokens++
				if progress != nil {
					progress(a.tokens)
				}
			}
			if ch.FinishReason != nil {
				a.finishes = append(a.finishes, *ch.FinishReason)
			}
		}
	}
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			event()
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
		if err != nil {
			if err != io.EOF {
				a.readErr = err
			}
			event()
			break
		}
	}
	a.text = text.String()
	return a
}

// postSSE sends r to base and reads the answer (within ctx).
func postSSE(ctx context.Context, c *http.Client, base string, r migRequest, progress func(int)) sseAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.path, strings.NewReader(r.body))
	if err != nil {
		return sseAnswer{readErr: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return sseAnswer{readErr: err}
	}
	defer func() { _ = resp.Body.Close() }()
	return readSSE(resp, progress)
}

// wellFormed lists what is wrong with a as a whole answer equal to ref,
// the same request's answer from an engine that did not fail.
func wellFormed(a, ref sseAnswer) []string {
	var bad []string
	if a.status != http.StatusOK {
		bad = append(bad, fmt.Sprintf("status %d: %s", a.status, a.body))
		return bad
	}
	if a.readErr != nil {
		bad = append(bad, "read: "+a.readErr.Error())
	}
	if a.text != ref.text {
		bad = append(bad, "text differs from the uninterrupted answer: "+firstDiff(a.text, ref.text))
	}
	if a.tokens != ref.tokens {
		bad = append(bad, fmt.Sprintf("%d text chunks, the uninterrupted answer has %d", a.tokens, ref.tokens))
	}
	if len(a.ids) != 1 {
		bad = append(bad, fmt.Sprintf("chunk ids %v: want one", a.ids))
	}
	if a.roles != ref.roles {
		bad = append(bad, fmt.Sprintf("%d role chunks, want %d", a.roles, ref.roles))
	}
	if len(a.finishes) != 1 || a.finishes[0] != "length" {
		bad = append(bad, fmt.Sprintf("finish reasons %q: want one, length", a.finishes))
	}
	if a.done != 1 || a.last != "[DONE]" {
		bad = append(bad, fmt.Sprintf("%d [DONE], last event %q: want one, last", a.done, a.last))
	}
	if len(a.errors) > 0 || len(a.badJSON) > 0 {
		bad = append(bad, fmt.Sprintf("error events %q, not JSON %q", a.errors, a.badJSON))
	}
	if a.idsShown > 0 {
		bad = append(bad, fmt.Sprintf("%d chunks show token ids the client did not ask for", a.idsShown))
	}
	switch {
	case len(a.usages) != 1 || len(ref.usages) != 1:
		bad = append(bad, fmt.Sprintf("usage chunks %v (uninterrupted %v): want one", a.usages, ref.usages))
	default:
		u, r := a.usages[0], ref.usages[0]
		if u.Completion != a.tokens || u.Prompt != r.Prompt || u.Total != u.Prompt+u.Completion {
			bad = append(bad, fmt.Sprintf("usage %+v: want completion %d (the tokens), prompt %d (the uninterrupted answer's), total their sum", u, a.tokens, r.Prompt))
		}
	}
	return bad
}

// firstDiff words where got first differs from want.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(i-20, 0)
	return fmt.Sprintf("%d and %d bytes, first difference at byte %d: got %q, want %q",
		len(got), len(want), i, got[from:min(i+40, len(got))], want[from:min(i+40, len(want))])
}

// migReferences are the load's answers from a mock engine that does not
// fail, fast (the answer does not depend on the speed).
func migReferences(t *testing.T, routerBin string, load []migRequest) []sseAnswer {
	t.Helper()
	ref := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "1000", "--engine-block-size", "16")
	c := e2eClient(t)
	refs := make([]sseAnswer, len(load))
	for i, r := range load {
		refs[i] = postSSE(context.Background(), c, ref.url, r, nil)
		if refs[i].status != 200 || refs[i].done != 1 || len(refs[i].usages) != 1 || refs[i].tokens == 0 {
			t.Fatalf("reference %d: %+v", i, refs[i])
		}
	}
	ref.stop(t)
	return refs
}

// migFleet is the engines and the router of one case.
type migFleet struct {
	mocks  []*e2eProc
	names  []string
	router *e2eProc
	c      *http.Client
}

// startMigFleet starts three mock engines, "a" (mocks[0], the one that
// fails, at speedup aSpeed, slow, so that its streams are mid-answer
// when it fails), "b" and "c", and the router in front of them with
// routerArgs; mockArgs are a's extra flags.
func startMigFleet(t *testing.T, routerBin, aSpeed string, mockArgs []string, routerArgs ...string) *migFleet {
	t.Helper()
	f := &migFleet{names: []string{"a", "b", "c"}}
	urls := map[string]string{}
	for i, n := range f.names {
		speed := "1"
		var extra []string
		if i == 0 {
			speed, extra = aSpeed, mockArgs
		}
		args := append([]string{"mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", speed, "--engine-block-size", "16"}, extra...)
		p := startProc(t, routerBin, args...)
		f.mocks = append(f.mocks, p)
		urls[n] = p.url
	}
	dir := t.TempDir()
	policy := filepath.Join(dir, "rr.hcl")
	if err := os.WriteFile(policy, []byte(migPolicy+"\n"+workerBlocks(f.names, urls)), 0o644); err != nil {
		t.Fatal(err)
	}
	f.router = startRouter(t, routerBin, append([]string{"--policy", policy}, routerArgs...)...)
	f.c = e2eClient(t)
	waitMetrics(t, f.c, f.router, time.Minute, "all three workers ready", allReady(f.names...))
	return f
}

// runLoad sends every request of load to the router at once; once every
// stream has read at least barrier text chunks (or ended), inject runs;
// then it waits for every answer (a minute at most each).
func (f *migFleet) runLoad(t *testing.T, load []migRequest, barrier int, inject func()) []sseAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answers := make([]sseAnswer, len(load))
	reached := make(chan struct{}, len(load))
	var wg sync.WaitGroup
	for i, r := range load {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			signal := func() { once.Do(func() { reached <- struct{}{} }) }
			defer signal()
			answers[i] = postSSE(ctx, f.c, f.router.url, r, func(n int) {
				if n >= barrier {
					signal()
				}
			})
		}()
	}
	for range load {
		select {
		case <-reached:
		case <-ctx.Done():
			t.Fatalf("the streams did not reach %d tokens", barrier)
		}
	}
	if inject != nil {
		inject()
	}
	wg.Wait()
	return answers
}

// mockFault sets (kind != "") or clears the process-wide fault of p
// (POST/DELETE /mock/fault).
func mockFault(t *testing.T, c *http.Client, p *e2eProc, kind string, after int) {
	t.Helper()
	method, body := http.MethodDelete, ""
	if kind != "" {
		method, body = http.MethodPost, fmt.Sprintf(`{"kind":%q,"after_tokens":%d}`, kind, after)
	}
	req, _ := http.NewRequest(method, p.url+"/mock/fault", strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s /mock/fault: %d", method, resp.StatusCode)
	}
}

// migrationsOf is every switchyard_migrations_total series of m with a
// non-zero value.
func migrationsOf(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "switchyard_migrations_total{") && v != 0 {
			out[k] = v
		}
	}
	return out
}

func migSeries(cause, outcome string) string {
	return `switchyard_migrations_total{cause="` + cause + `",outcome="` + outcome + `"}`
}

// TestServeE2EMigrationFaultMatrix: for each way an engine fails
// mid-answer, 18 concurrent streams (9 chat, 9 completions) through the
// router, one engine of three failing once every stream is under way.
// Every client reads one stream equal to the uninterrupted answer (text,
// token count, one id, one role, one finish_reason, one usage chunk
// counting every token and the original prompt, one [DONE] at the end);
// the router counts one migration per stream the failing engine carried,
// under the fault's cause, outcome migrated, observes a gap for each,
// and keeps nothing once the streams ended.
func TestServeE2EMigrationFaultMatrix(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	load := migLoad(18, 120)
	refs := migReferences(t, routerBin, load)

	type fault struct {
		name, cause string
		speed       string // a's speedup ("": 0.3, about 20 ms a token)
		routerArgs  []string
		mockArgs    []string
		before      func(t *testing.T, f *migFleet) // before the load
		inject      func(t *testing.T, f *migFleet) // once every stream is under way
	}
	a := func(f *migFleet) *e2eProc { return f.mocks[0] }
	faults := []fault{
		{name: "kill9", cause: "reset", inject: func(t *testing.T, f *migFleet) { a(f).kill() }},
		{name: "sigstop", cause: "stall", routerArgs: []string{"--stall-timeout", "1s"},
			before: func(t *testing.T, f *migFleet) {
				// Runs before the engine's stop (cleanups are last in, first out).
				t.Cleanup(func() { _ = syscall.Kill(a(f).cmd.Process.Pid, syscall.SIGCONT) })
			},
			inject: func(t *testing.T, f *migFleet) {
				if err := syscall.Kill(a(f).cmd.Process.Pid, syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			}},
		// The router takes a out after three probes answered 503 (about
		// 3 s), then its streams run for the grace: a is slower, so that
		// none of them ends first.
		{name: "drain", cause: "drain", speed: "0.1", routerArgs: []string{"--worker-drain-grace", "300ms"}, mockArgs: []string{"--drain-timeout", "1m"},
			inject: func(t *testing.T, f *migFleet) {
				if err := a(f).cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "reset", cause: "reset", inject: func(t *testing.T, f *migFleet) { mockFault(t, f.c, a(f), "reset", 0) }},
		{name: "stall", cause: "stall", routerArgs: []string{"--stall-timeout", "1s"},
			inject: func(t *testing.T, f *migFleet) { mockFault(t, f.c, a(f), "stall", 0) }},
		// A close fault frames the answers that start after it by the
		// connection's close: set before the load, it cuts a's streams at
		// their 25th token with a clean end of body.
		{name: "close", cause: "eof", before: func(t *testing.T, f *migFleet) { mockFault(t, f.c, a(f), "close", 25) }},
		{name: "error", cause: "engine_error", inject: func(t *testing.T, f *migFleet) { mockFault(t, f.c, a(f), "error", 0) }},
	}
	for _, fc := range faults {
		t.Run(fc.name, func(t *testing.T) {
			speed := fc.speed
			if speed == "" {
				speed = "0.3"
			}
			f := startMigFleet(t, routerBin, speed, fc.mockArgs, fc.routerArgs...)
			if fc.before != nil {
				fc.before(t, f)
			}
			var inject func()
			if fc.inject != nil {
				inject = func() { fc.inject(t, f) }
			}
			answers := f.runLoad(t, load, 5, inject)
			cut := 0
			for i, ans := range answers {
				if ans.worker == "a" {
					cut++
				}
				if bad := wellFormed(ans, refs[i]); len(bad) > 0 {
					t.Errorf("request %d (%s, first on %q):\n  %s", i, load[i].path, ans.worker, strings.Join(bad, "\n  "))
				}
			}
			if cut == 0 {
				t.Fatalf("no stream started on the failing engine a")
			}
			want := migSeries(fc.cause, "migrated")
			m := waitMetrics(t, f.c, f.router, 10*time.Second, fmt.Sprintf("%s = %d, the only migrations, and nothing kept", want, cut), func(m map[string]float64) bool {
				got := migrationsOf(m)
				return len(got) == 1 && got[want] == float64(cut) && m["switchyard_migration_kept_bytes"] == 0
			})
			if g := m["switchyard_migration_gap_seconds_count"]; g != float64(cut) {
				t.Errorf("switchyard_migration_gap_seconds_count %v, want %d", g, cut)
			}
		})
	}
}

// TestServeE2EMigrationEveryEngineDies: every engine killed mid-answer;
// each client's stream ends with the router's error event and one
// [DONE], after a part of its answer, and the router counts each stream's
// last cut once, not migrated.
func TestServeE2EMigrationEveryEngineDies(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	load := migLoad(6, 400)
	refs := migReferences(t, routerBin, load)
	f := startMigFleet(t, routerBin, "0.3", nil)
	answers := f.runLoad(t, load, 5, func() {
		for _, p := range f.mocks {
			_ = p.cmd.Process.Kill()
		}
		for _, p := range f.mocks {
			<-p.done
		}
	})
	for i, ans := range answers {
		var bad []string
		if ans.status != 200 || ans.readErr != nil {
			bad = append(bad, fmt.Sprintf("status %d, read error %v", ans.status, ans.readErr))
		}
		if ans.tokens < 5 || !strings.HasPrefix(refs[i].text, ans.text) || len(ans.finishes) != 0 {
			bad = append(bad, fmt.Sprintf("%d tokens %q, finish reasons %q: want at least 5, a prefix of the answer, none", ans.tokens, ans.text, ans.finishes))
		}
		if len(ans.errors) != 1 || !strings.Contains(ans.errors[0], `"code":"worker_failed"`) || !strings.Contains(ans.errors[0], "the worker failed mid-answer") {
			bad = append(bad, fmt.Sprintf("error events %q: want the router's one", ans.errors))
		}
		if ans.done != 1 || ans.last != "[DONE]" {
			bad = append(bad, fmt.Sprintf("%d [DONE], last event %q", ans.done, ans.last))
		}
		if len(bad) > 0 {
			t.Errorf("request %d (%s):\n  %s", i, load[i].path, strings.Join(bad, "\n  "))
		}
	}
	// Each stream ends once, not migrated (no_worker, over_limit); one
	// whose continuation started on an engine killed a moment later was
	// also counted migrated, once per such continuation.
	waitMetrics(t, f.c, f.router, 10*time.Second, "one unmigrated cut per stream, nothing kept", func(m map[string]float64) bool {
		n := 0.0
		for k, v := range migrationsOf(m) {
			if !strings.Contains(k, `outcome="migrated"`) {
				n += v
			}
		}
		return n == float64(len(load)) && m["switchyard_migration_kept_bytes"] == 0
	})
}

// TestServeE2EMigrationContextWindow: the only other engine's context
// window (max_model_len 208 tokens: 13 blocks of 16) is too small for
// the continuation of a chat answer cut on the first: the client's
// stream ends with that engine's own 400 message as an event, then
// [DONE], and the migration counts as refused.
func TestServeE2EMigrationContextWindow(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	big := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "0.3", "--engine-block-size", "16")
	small := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "1", "--engine-block-size", "16", "--kv-blocks", "13")
	names := []string{"big", "small"}
	policy := filepath.Join(t.TempDir(), "rr.hcl")
	if err := os.WriteFile(policy, []byte(migPolicy+"\n"+workerBlocks(names, map[string]string{"big": big.url, "small": small.url})), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "both workers ready", allReady(names...))
	req := migRequest{path: "/v1/chat/completions",
		body: `{"model":"mock","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"Tell me a long story."}]}`}
	// Round robin: one of two requests goes to big; small refuses the
	// request itself with its 400.
	var ans sseAnswer
	for try := 0; try < 2 && ans.worker != "big"; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var once sync.Once
		ans = postSSE(ctx, c, router.url, req, func(n int) {
			if n >= 5 {
				once.Do(func() { mockFault(t, c, big, "reset", 0) })
			}
		})
		cancel()
	}
	const msg = "This model's maximum context length is 208 tokens."
	if ans.worker != "big" || ans.status != 200 || ans.readErr != nil {
		t.Fatalf("worker %q, status %d, read error %v, body %s", ans.worker, ans.status, ans.readErr, ans.body)
	}
	if len(ans.errors) != 1 || !strings.Contains(ans.errors[0], msg) || !strings.Contains(ans.errors[0], `"type":"BadRequestError"`) {
		t.Errorf("error events %q: want small's 400, %q", ans.errors, msg)
	}
	if ans.tokens < 5 || ans.done != 1 || ans.last != "[DONE]" || len(ans.finishes) != 0 {
		t.Errorf("%d tokens, %d [DONE], last %q, finish reasons %q", ans.tokens, ans.done, ans.last, ans.finishes)
	}
	waitMetrics(t, c, router, 10*time.Second, "the migration refused", func(m map[string]float64) bool {
		got := migrationsOf(m)
		return len(got) == 1 && got[migSeries("reset", "refused")] == 1 && m["switchyard_migration_kept_bytes"] == 0
	})
}
