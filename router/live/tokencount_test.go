package live

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// TestPromptTokensMatchTheEngines: the router's token count of each
// request equals the engine's usage.prompt_tokens, through the HTTP API,
// against a real mock engine given by URL only (its models, LoRA
// adapter and block size discovered; the default tokenizer, its own
// /tokenize): a completions prompt, chat requests rendered by the engine's
// ChatML template (streamed and not; a message of two text parts), and
// requests for the LoRA adapter, each counted exact in
// switchyard_prompt_token_match_total. A stream whose client did not ask
// for its usage is not counted, and a model whose engine has no tokenizer
// (no /tokenize: keyed by characters) is counted unknown. The engines'
// own counts are read from their answers.
func TestPromptTokensMatchTheEngines(t *testing.T) {
	engine := func(model string, lora []string, tokenizer bool) string {
		t.Helper()
		cfg := mockworker.Config{Speedup: 1000, BlockTokens: 16, Model: model, LoRA: lora}
		if tokenizer {
			cfg.Tokenizer = chatmlTokenizer(t)
		}
		m, err := mockworker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		return hs.URL
	}
	a, b := engine("m", []string{"m-sql"}, true), engine("plain", nil, false)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf("policy \"rr\" {\n  picker \"rr\" {\n    type = \"round-robin\"\n  }\n}\n"+
		"worker_selection {\n  aggregated = \"rr\"\n}\nworker \"a\" {\n  url = %q\n}\nworker \"b\" {\n  url = %q\n}\n", a, b))
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, Registry: reg})
	rd.waitWorkers(t, "a", "b")
	waitModels(t, rd, "m", "m-sql", "plain")

	long := strings.Repeat("the quick brown fox jumps over the lazy dog; ", 6)
	chat := func(model string, stream bool, content string) string {
		return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":2,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"be brief"},{"role":"user","content":%s}]}`,
			model, stream, content)
	}
	text, _ := json.Marshal(long)
	parts := fmt.Sprintf(`[{"type":"text","text":%s},{"type":"text","text":"and then?"}]`, text)
	requests := []struct {
		path, body string
		exact      string // the model label counted exact; "" when not
	}{
		{"/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":%s}`, text), "m"},
		{"/v1/chat/completions", chat("m", false, string(text)), "m"},
		{"/v1/chat/completions", chat("m", true, string(text)), "m"},
		{"/v1/chat/completions", chat("m", false, parts), "m"},
		{"/v1/chat/completions", chat("m-sql", false, string(text)), "m-sql"},
		{"/v1/completions", fmt.Sprintf(`{"model":"m-sql","stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"prompt":%s}`, text), "m-sql"},
		// No usage asked for: not counted.
		{"/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":%s}]}`, text), ""},
		// No tokenizer: unknown.
		{"/v1/chat/completions", chat("plain", false, string(text)), ""},
	}
	engineTokens := map[string]int{}
	for i, r := range requests {
		resp, err := post(t, context.Background(), rd.base+r.path, r.body)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, raw)
		}
		if r.exact != "" {
			n := answerPromptTokens(t, raw)
			if n <= 0 {
				t.Fatalf("request %d: no usage.prompt_tokens in %s", i, raw)
			}
			engineTokens[r.exact] += n
		}
	}
	// Counted once the handler is done with the answer, which can be
	// after the client read its end.
	met := rd.d.rt.met
	testkit.Eventually(t, "the awaited condition", func() bool {
		return testutil.ToFloat64(met.requests.WithLabelValues("m", "200")) == 5 &&
			testutil.ToFloat64(met.requests.WithLabelValues("m-sql", "200")) == 2 &&
			testutil.ToFloat64(met.requests.WithLabelValues("plain", "200")) == 1
	})
	vec := met.promptMatch
	for model, want := range map[string]float64{"m": 4, "m-sql": 2} {
		if got := testutil.ToFloat64(vec.WithLabelValues(model, "exact")); got != want {
			t.Errorf("%s: %v answers counted exact, want %v; logs:\n%s", model, got, want, rd.logs)
		}
		for _, r := range []string{"over", "under", "unknown"} {
			if got := testutil.ToFloat64(vec.WithLabelValues(model, r)); got != 0 {
				t.Errorf("%s: %v answers counted %s, want 0; logs:\n%s", model, got, r, rd.logs)
			}
		}
	}
	if got := testutil.ToFloat64(vec.WithLabelValues("plain", "unknown")); got != 1 {
		t.Errorf("plain: %v answers counted unknown, want 1", got)
	}
	// The engines' usage, summed by the router's token counters, is what
	// their answers said.
	for model, n := range engineTokens {
		if got := testutil.ToFloat64(met.promptTokens.WithLabelValues(model)); got < float64(n) {
			t.Errorf("%s: switchyard_prompt_tokens_total %v, want at least the answers' %d", model, got, n)
		}
	}
	if strings.Contains(rd.logs.String(), "differs from the engine's prompt_tokens") {
		t.Errorf("a mismatch was logged:\n%s", rd.logs)
	}
}

// answerPromptTokens reads usage.prompt_tokens from an answer: a JSON
// body, or the last SSE event that has a usage.
func answerPromptTokens(t *testing.T, raw []byte) int {
	t.Helper()
	var n int
	read := func(b []byte) {
		var v struct {
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(b, &v) == nil && v.Usage != nil {
			n = v.Usage.PromptTokens
		}
	}
	if !strings.HasPrefix(string(raw), "data:") {
		read(raw)
		return n
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			read([]byte(data))
		}
	}
	return n
}

// waitModels waits until the daemon's router serves every model.
func waitModels(t *testing.T, rd *runningDaemon, models ...string) {
	t.Helper()
	testkit.Eventually(t, "the awaited condition", func() bool {
		for _, m := range models {
			if len(rd.d.r.Workers(m, "aggregated")) == 0 {
				return false
			}
		}
		return true
	})
}

// A count that differs from the engine's is counted over or under and
// logged at warn, with both counts, at most once per 10 s per model: a
// fake engine that always reports 100 prompt tokens, sent prompts given
// as 90 and 110 token ids, then a prompt keyed by characters (unknown, not
// logged).
func TestPromptTokensMismatchLogged(t *testing.T) {
	f := newFakeVLLM(t, "")
	var logs syncBuffer
	e := newEnv(t, envOptions{logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})},
		backend{name: "a", url: f.srv.URL})
	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(i + 1)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	for i, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_token_ids":` + ids(90) + `}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_token_ids":` + ids(90) + `}`,
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"prompt_token_ids":` + ids(110) + `}`,
		`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
	} {
		resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", body, "X-Request-Id", fmt.Sprintf("req-%d\xff", i))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	e.settle(t)
	for r, want := range map[string]float64{"exact": 0, "under": 2, "over": 1, "unknown": 1} {
		if got := testutil.ToFloat64(e.rt.met.promptMatch.WithLabelValues("m", r)); got != want {
			t.Errorf("%s: %v, want %v", r, got, want)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "differs from the engine's prompt_tokens"); n != 1 {
		t.Fatalf("%d mismatch lines, want 1 (one per 10 s per model):\n%s", n, out)
	}
	for _, want := range []string{"router_tokens=90", "engine_prompt_tokens=100", "model=m", `request_id=req-0\xff`} {
		if !strings.Contains(out, want) {
			t.Errorf("the mismatch line lacks %s:\n%s", want, out)
		}
	}
	// The next line of the model carries the two held back.
	l := e.rt.tokenLogs
	if ok, _ := l.allow("m"); ok {
		t.Errorf("a second line for m within 10 s was allowed")
	}
	if ok, suppressed := l.allow("n"); !ok || suppressed != 0 {
		t.Errorf("model n: allowed %v (suppressed %d), want its own first line", ok, suppressed)
	}
}
