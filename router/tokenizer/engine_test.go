package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// fakeEngine serves vLLM's /tokenize with a File (as vLLM's serving.py
// does with its Hugging Face tokenizer: a prompt tokenized with or
// without special tokens, add_special_tokens defaulting to true; chat
// messages rendered by the template, then tokenized without them), and,
// when info is set, GET /tokenizer_info with the File's added tokens as
// added_tokens_decoder {"id": "content"} (vLLM's TokenizerInfo turns each
// AddedToken into its content). The engine side of the tests and of the
// benchmarks. It records the bodies it was sent.
type fakeEngine struct {
	*httptest.Server
	info   bool
	mu     sync.Mutex
	bodies []map[string]any
}

func newFakeEngine(t testing.TB, f *File) *fakeEngine {
	fe := &fakeEngine{}
	fe.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenizer_info" && r.Method == http.MethodGet && fe.info {
			added := map[string]string{}
			for _, list := range f.added {
				for _, a := range list {
					added[fmt.Sprint(a.ID)] = a.Content
				}
			}
			json.NewEncoder(w).Encode(map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added})
			return
		}
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Model               string               `json:"model"`
			Prompt              *string              `json:"prompt"`
			Messages            []prefix.ChatMessage `json:"messages"`
			AddSpecialTokens    *bool                `json:"add_special_tokens"`
			AddGenerationPrompt *bool                `json:"add_generation_prompt"`
		}
		var raw map[string]any
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, _ := json.Marshal(raw)
		if err := json.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fe.mu.Lock()
		fe.bodies = append(fe.bodies, raw)
		fe.mu.Unlock()
		var ids []int64
		var err error
		switch {
		case req.Messages != nil:
			if (req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt) || (req.AddSpecialTokens != nil && *req.AddSpecialTokens) {
				http.Error(w, "unsupported chat settings", http.StatusBadRequest)
				return
			}
			ids, err = f.EncodeChat(r.Context(), req.Messages, "")
		case req.Prompt != nil:
			ids, err = f.encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		default:
			http.Error(w, "prompt or messages", http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if ids == nil {
			ids = []int64{}
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 4096})
	}))
	t.Cleanup(fe.Close)
	return fe
}

func (fe *fakeEngine) url(context.Context) (string, error) { return fe.URL, nil }

func (fe *fakeEngine) sent() []map[string]any {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return slices.Clone(fe.bodies)
}

func chatmlFile(t testing.TB) *File {
	t.Helper()
	b, err := os.ReadFile("testdata/chatml_config.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseTokenizerConfig("chatml_config.json", b)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ParseChatTemplate("chatml", cfg.ChatTemplate, cfg.BOS, cfg.EOS)
	if err != nil {
		t.Fatal(err)
	}
	return loadFile(t, "bytebpe-bos.json", tmpl)
}

func TestEngineMatchesFile(t *testing.T) {
	f := chatmlFile(t)
	fe := newFakeEngine(t, f)
	e, err := NewEngine("m", fe.url, EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := e.Encode(ctx, "hello world")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{287, 259, 264}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	msgs := []prefix.ChatMessage{{Role: "user", Content: "hello world"}}
	got, err = e.EncodeChat(ctx, msgs, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{285, 267, 10, 259, 264, 286, 10, 285, 275, 10}; !slices.Equal(got, want) {
		t.Errorf("EncodeChat = %v, want %v", got, want)
	}
	sent := fe.sent()
	if len(sent) != 2 {
		t.Fatalf("engine got %d calls, want 2", len(sent))
	}
	if p := sent[0]; p["model"] != "m" || p["prompt"] != "hello world" || p["add_special_tokens"] != true {
		t.Errorf("prompt body = %v", p)
	}
	c := sent[1]
	if c["model"] != "m" || c["add_generation_prompt"] != true || c["add_special_tokens"] != false || c["prompt"] != nil {
		t.Errorf("chat body = %v", c)
	}
	if m, _ := json.Marshal(c["messages"]); string(m) != `[{"content":"hello world","role":"user"}]` {
		t.Errorf("chat messages = %s", m)
	}
}

// An exact repeat is answered from the cache; any other prompt is
// tokenized, never answered with a cached prompt's ids: without the
// model's special tokens (no /tokenizer_info, vLLM's default) a prompt
// that extends a cached one costs a whole call. (The cache this replaced
// answered base+"x" with base's ids.)
func TestEngineExactCache(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	fe := newFakeEngine(t, f)
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := func(prompt string, wantCalls, wantHits int64) {
		t.Helper()
		want, _ := f.Encode(ctx, prompt)
		got, err := e.Encode(ctx, prompt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%d bytes) = %v, want %v", len(prompt), got, want)
		}
		if s := e.Stats(); s.Calls != wantCalls || s.CacheHits != wantHits || s.Splices != 0 {
			t.Errorf("after %d bytes: stats %+v, want %d calls, %d hits, no splice", len(prompt), s, wantCalls, wantHits)
		}
	}
	base := strings.Repeat("hello world ", 10) // 120 bytes
	step(base, 1, 0)
	step(base, 1, 1)     // the same prompt: from the cache
	step(base+"x", 2, 1) // a longer one: a call
	step("hello", 3, 1)
	step("hello", 3, 2) // short prompts are cached too
	other := strings.Repeat("hello world ", 9) + "hello there!"
	step(other, 4, 2)
	step(base+"x", 4, 3)
	if got := len(fe.sent()); got != 4 {
		t.Errorf("engine got %d calls, want 4", got)
	}
	// Chat: the same messages hit; one more message is a call.
	fc := chatmlFile(t)
	fec := newFakeEngine(t, fc)
	ec, _ := NewEngine("m", fec.url, EngineOptions{ChunkBytes: 8})
	turn1 := []prefix.ChatMessage{{Role: "system", Content: strings.Repeat("hello world ", 20)}, {Role: "user", Content: "hello"}}
	turn2 := append(slices.Clone(turn1), prefix.ChatMessage{Role: "assistant", Content: "hi"}, prefix.ChatMessage{Role: "user", Content: "the"})
	for i, msgs := range [][]prefix.ChatMessage{turn1, turn2, turn1, turn2} {
		want, _ := fc.EncodeChat(ctx, msgs, "")
		got, err := ec.EncodeChat(ctx, msgs, "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("chat request %d = %v, want %v", i, got, want)
		}
	}
	if s := ec.Stats(); s.Calls != 2 || s.CacheHits != 2 {
		t.Errorf("chat stats %+v, want 2 calls and 2 hits", s)
	}
}

// chatml renders msgs as the ChatML template does, generation prompt
// added: a client's own rendering, sent as a completions prompt.
func chatml(msgs []prefix.ChatMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

// A text prompt that extends a cached one is answered with the cached
// ids up to a safe cut and one call for the rest, which starts with the
// added token at the cut: the result is the engine's own tokenization.
// Worked by hand: turn 1 is 108 bytes and turn 2 begins with all of
// them; the longest added token is "<|start_header_id|>" (19 bytes), so
// the cut is the last added token of turn 1 starting at or before
// 108 - 19 - 1 = 88: its generation prompt's "<|im_start|>" at byte 86
// (the others are at 0, 35, 47 and 75).
func TestEngineSplice(t *testing.T) {
	f := loadFile(t, "bytebpe-bos.json", nil)
	fe := newFakeEngine(t, f)
	fe.info = true
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sys := prefix.ChatMessage{Role: "system", Content: "the system answer"}
	turn1 := chatml([]prefix.ChatMessage{sys, {Role: "user", Content: "hello world"}})
	turn2 := chatml([]prefix.ChatMessage{sys, {Role: "user", Content: "hello world"}, {Role: "assistant", Content: "hello"}, {Role: "user", Content: "the token"}})
	for _, p := range []string{turn1, turn2} {
		want, _ := f.Encode(ctx, p)
		got, err := e.Encode(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, want %v", p, got, want)
		}
	}
	// The learning (two probes of "a") and turn 1 are calls; turn 2 is a
	// splice and its call.
	if s := e.Stats(); s.Calls != 4 || s.Splices != 1 || s.CacheHits != 0 {
		t.Errorf("stats %+v, want 4 calls (2 probes, turn 1, turn 2's rest) and 1 splice", s)
	}
	if sp := e.sp.Load(); sp == nil || sp.maxLen != len("<|start_header_id|>") || !slices.Equal(sp.pre, []int64{287}) || len(sp.post) != 0 {
		t.Fatalf("specials %v; want 7 added tokens, longest 19 bytes, pre [287] (BOS), no post", sp)
	}
	cut := strings.LastIndex(turn1, "<|im_start|>")
	if shared := len(turn1); cut+19+1 > shared || cut < 16 {
		t.Fatalf("test setup: cut %d, shared %d", cut, shared)
	}
	sent := fe.sent()
	last := sent[len(sent)-1]
	if last["prompt"] != turn2[cut:] || last["add_special_tokens"] != false {
		t.Errorf("splice call %v; want the prompt from byte %d (%q), without special tokens", last, cut, turn2[cut:])
	}
	// Turn 2 again: an exact repeat.
	if _, err := e.Encode(ctx, turn2); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.CacheHits != 1 || s.Calls != 4 {
		t.Errorf("repeat: stats %+v, want 1 hit and no more calls", s)
	}
}

// No cut is taken within the longest added token's length of where the
// prompts part: a (50 bytes) ends "the system<|im_end|>\n" and b parts
// from it at byte 47, inside that "<|im_end|>" (at 39, within 19 + 1
// bytes of the parting); the only earlier token, at byte 0, is under a
// chunk: a whole call.
func TestEngineNoCutNearTheParting(t *testing.T) {
	f := loadFile(t, "bytebpe-bos.json", nil)
	fe := newFakeEngine(t, f)
	fe.info = true
	e, _ := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16})
	ctx := context.Background()
	a := "<|im_start|>user\nhello world the system<|im_end|>\n"
	b := a[:len(a)-3] + "x<|im_end|>\n" // parts 3 bytes before a's end
	for _, p := range []string{a, b} {
		want, _ := f.Encode(ctx, p)
		got, err := e.Encode(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, want %v", p, got, want)
		}
	}
	if s := e.Stats(); s.Splices != 0 || s.Calls != 4 {
		t.Errorf("stats %+v, want no splice: 2 probes and 2 whole calls", s)
	}
}

func TestEngineErrors(t *testing.T) {
	ctx := context.Background()
	serve := func(h http.HandlerFunc) EngineURL {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		return func(context.Context) (string, error) { return s.URL, nil }
	}
	for _, c := range []struct {
		name    string
		url     EngineURL
		opts    EngineOptions
		want    error
		message string
	}{
		{"status", serve(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error": "chat template missing"}`, http.StatusBadRequest)
		}), EngineOptions{}, ErrEngine, "status 400: {\"error\": \"chat template missing\"}"},
		{"large", serve(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"tokens": [%s1]}`, strings.Repeat("1,", 100))
		}), EngineOptions{MaxAnswerBytes: 64}, ErrEngine, "over 64 bytes"},
		{"shape", serve(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"ids": [1, 2]}`)
		}), EngineOptions{}, ErrEngine, "not {\"tokens\""},
		{"count", serve(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"tokens": [1, 2], "count": 3}`)
		}), EngineOptions{}, ErrEngine, "count 3 but 2 tokens"},
		{"noengine", func(context.Context) (string, error) { return "", errors.New("no ready worker serves m") },
			EngineOptions{}, ErrNoEngine, "no ready worker serves m"},
	} {
		e, err := NewEngine("m", c.url, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Encode(ctx, "hello")
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: err = %v, want %v containing %q", c.name, err, c.want, c.message)
		}
		if s := e.Stats(); s.Calls != 0 {
			t.Errorf("%s: a failed call counted: %+v", c.name, s)
		}
	}
}

func TestEngineContextDeadline(t *testing.T) {
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(release) })
	e, err := NewEngine("m", func(context.Context) (string, error) { return s.URL, nil }, EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.Encode(ctx, "hello"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
}

// TestEngineCacheBoundedInBytes: the cache holds at most CacheBytes (its
// inputs, 8 bytes per id, entryOverhead each), evicting the least
// recently used; an entry larger than the whole bound is not kept.
func TestEngineCacheBoundedInBytes(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	fe := newFakeEngine(t, f)
	ctx := context.Background()
	a, b := strings.Repeat("hello world ", 10), strings.Repeat("the system ", 10)
	idsA, _ := f.Encode(ctx, a)
	idsB, _ := f.Encode(ctx, b)
	cost := func(p string, ids []int64) int64 { return int64(1+len(p)) + 8*int64(len(ids)) + entryOverhead }
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16, CacheBytes: cost(a, idsA) + cost(b, idsB) - 1})
	if err != nil {
		t.Fatal(err)
	}
	step := func(prompt string, wantCalls, wantHits int64) {
		t.Helper()
		if _, err := e.Encode(ctx, prompt); err != nil {
			t.Fatal(err)
		}
		if s := e.Stats(); s.Calls != wantCalls || s.CacheHits != wantHits {
			t.Fatalf("after %.12q: stats %+v, want %d calls and %d hits", prompt, s, wantCalls, wantHits)
		}
	}
	step(a, 1, 0)
	step(a, 1, 1) // cached
	step(b, 2, 1) // cached, and a evicted: both would pass the bound
	step(b, 2, 2)
	step(a, 3, 2) // a call again
	big := strings.Repeat(a, 3)
	step(big, 4, 2)
	step(big, 5, 2) // larger than the bound: never cached
	step(a, 5, 3)   // and it evicted nothing
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.bytes != cost(a, idsA) || e.exact.Len() != 1 {
		t.Errorf("cache holds %d bytes in %d entries, want a's %d in 1", e.bytes, e.exact.Len(), cost(a, idsA))
	}
}

// An engine that answers a form of /tokenize 404 is not called for that
// form again until the backoff passed: ErrUnsupported at once meanwhile.
func TestEngineUnsupportedBackoff(t *testing.T) {
	var calls atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(s.Close)
	e, err := NewEngine("m", func(context.Context) (string, error) { return s.URL, nil }, EngineOptions{UnsupportedBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.Encode(ctx, "hello"); !errors.Is(err, ErrEngine) || !strings.Contains(err.Error(), "status 404") {
		t.Fatalf("first call: %v, want the engine's 404", err)
	}
	n := calls.Load() // the 404, and the learning's /tokenizer_info
	for range 3 {
		if _, err := e.Encode(ctx, "hello again"); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("during the backoff: %v, want ErrUnsupported", err)
		}
	}
	if calls.Load() != n {
		t.Errorf("%d calls during the backoff, want none", calls.Load()-n)
	}
	// The chat form is its own: still called.
	if _, err := e.EncodeChat(ctx, []prefix.ChatMessage{{Role: "user", Content: "x"}}, ""); !errors.Is(err, ErrEngine) {
		t.Fatalf("chat: %v, want the engine's 404", err)
	}
	e.textOff.Store(time.Now().Add(-time.Second).UnixNano()) // the backoff passed
	if _, err := e.Encode(ctx, "hello"); !errors.Is(err, ErrEngine) {
		t.Fatalf("after the backoff: %v, want a call (the engine's 404)", err)
	}
}

// A chat request's tools and each message's name, tool_call_id,
// tool_calls and reasoning reach /tokenize as vLLM's TokenizeChatRequest
// takes them (tool_calls and tools as their JSON, absent fields left
// out), and are part of the cache key: the same messages with other tools
// are asked again.
func TestEngineChatSendsToolsAndFields(t *testing.T) {
	fe := newFakeEngine(t, chatmlFile(t))
	e, err := NewEngine("m", fe.url, EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	calls := `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`
	tools := `[{"type":"function","function":{"name":"f"}}]`
	msgs := []prefix.ChatMessage{
		{Role: "user", Content: "hi", Name: "ann"},
		{Role: "assistant", ToolCalls: calls, Reasoning: "", HasReasoning: true},
		{Role: "tool", Content: "1", ToolCallID: "c1"},
	}
	for range 2 {
		if _, err := e.EncodeChat(ctx, msgs, tools); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.EncodeChat(ctx, msgs, ""); err != nil {
		t.Fatal(err)
	}
	sent := fe.sent()
	if len(sent) != 2 || e.Stats().CacheHits != 1 {
		t.Fatalf("%d calls, %d cache hits; want 2 calls (the repeat cached, other tools asked)", len(sent), e.Stats().CacheHits)
	}
	got, _ := json.Marshal(map[string]any{"messages": sent[0]["messages"], "tools": sent[0]["tools"]})
	want := `{"messages":[{"content":"hi","name":"ann","role":"user"},` +
		`{"content":"","reasoning":"","role":"assistant","tool_calls":[{"function":{"arguments":"{\"a\":1}","name":"f"},"id":"c1","type":"function"}]},` +
		`{"content":"1","role":"tool","tool_call_id":"c1"}],"tools":[{"function":{"name":"f"},"type":"function"}]}`
	if string(got) != want {
		t.Fatalf("sent\n%s\nwant\n%s", got, want)
	}
	if _, ok := sent[1]["tools"]; ok {
		t.Fatalf("a request without tools sent tools: %v", sent[1])
	}
}
