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
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// fakeEngine serves vLLM's /tokenize with a File: the engine side of the
// tests and of the benchmark. It records the bodies it was sent.
type fakeEngine struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
}

func newFakeEngine(t testing.TB, f *File) *fakeEngine {
	fe := &fakeEngine{}
	fe.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Model    string               `json:"model"`
			Prompt   *string              `json:"prompt"`
			Messages []prefix.ChatMessage `json:"messages"`
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
		if req.Messages != nil {
			ids, err = f.EncodeChat(r.Context(), req.Messages)
		} else {
			ids, err = f.Encode(r.Context(), *req.Prompt)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
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
	got, err = e.EncodeChat(ctx, msgs)
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

func TestEnginePrefixCache(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	fe := newFakeEngine(t, f)
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16, MinCoverage: 0.75})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := strings.Repeat("hello world ", 10) // 120 bytes
	want, _ := f.Encode(ctx, base)
	step := func(prompt string, wantCalls, wantHits int64, wantIDs []int64) {
		t.Helper()
		got, err := e.Encode(ctx, prompt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, wantIDs) {
			t.Errorf("Encode(%d bytes) = %v, want %v", len(prompt), got, wantIDs)
		}
		if s := e.Stats(); s.Calls != wantCalls || s.CacheHits != wantHits {
			t.Errorf("after %d bytes: stats %+v, want %d calls and %d hits", len(prompt), s, wantCalls, wantHits)
		}
	}
	step(base, 1, 0, want)     // a call
	step(base, 1, 1, want)     // the same prompt: from the cache
	step(base+"x", 1, 2, want) // a short tail: the earlier ids, without the tail's
	full := base + strings.Repeat("the system ", 10)
	wantFull, _ := f.Encode(ctx, full)
	step(full, 2, 2, wantFull) // 120 of 230 bytes covered, under 75%: a call
	step("hello", 3, 2, []int64{259})
	step("hello", 4, 2, []int64{259}) // under one chunk: never cached
	// A different prompt with the same first chunks but another tail
	// after them is not answered with the first's ids.
	other := strings.Repeat("hello world ", 9) + "hello there!"
	wantOther, _ := f.Encode(ctx, other)
	step(other, 5, 2, wantOther)
	if s := e.Stats(); s.Tokens != int64(len(want)+len(wantFull)+2+len(wantOther)) {
		t.Errorf("Tokens = %d", s.Tokens)
	}
}

func TestEngineChatCache(t *testing.T) {
	f := chatmlFile(t)
	fe := newFakeEngine(t, f)
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := strings.Repeat("hello world ", 20)
	turn1 := []prefix.ChatMessage{{Role: "system", Content: long}, {Role: "user", Content: "hello"}}
	ids1, err := e.EncodeChat(ctx, turn1)
	if err != nil {
		t.Fatal(err)
	}
	// The next turn adds a short answer and question: covered over 80%,
	// answered with turn 1's ids, which are a prefix of turn 2's true ids.
	turn2 := append(slices.Clone(turn1), prefix.ChatMessage{Role: "assistant", Content: "hi"}, prefix.ChatMessage{Role: "user", Content: "the"})
	ids2, err := e.EncodeChat(ctx, turn2)
	if err != nil {
		t.Fatal(err)
	}
	true2, _ := f.EncodeChat(ctx, turn2)
	if !slices.Equal(ids2, ids1) || !slices.Equal(true2[:len(ids1)], ids1) {
		t.Errorf("turn 2 = %v, want turn 1's %v, a prefix of the exact %v", ids2, ids1, true2)
	}
	if s := e.Stats(); s.Calls != 1 || s.CacheHits != 1 {
		t.Errorf("stats %+v, want 1 call and 1 hit", s)
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

// TestEnginePrefixCacheBoundedInTokens: the prefix cache holds at most
// CacheTokens ids in all, whatever the entry count allows, evicting the
// least recently used; an answer larger than the whole bound is not kept.
func TestEnginePrefixCacheBoundedInTokens(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	fe := newFakeEngine(t, f)
	ctx := context.Background()
	a, b := strings.Repeat("hello world ", 10), strings.Repeat("the system ", 10)
	idsA, _ := f.Encode(ctx, a)
	idsB, _ := f.Encode(ctx, b)
	e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16, CacheTokens: len(idsA) + len(idsB) - 1})
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
}
