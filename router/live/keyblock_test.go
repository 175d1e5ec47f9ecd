package live

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/shared"
)

// fakeEngines is an Engines of fixed block sizes and parents.
type fakeEngines struct {
	sizes   map[string]int
	parents map[string]string
}

func (f fakeEngines) BlockSize(model string) (int, bool) { n, ok := f.sizes[model]; return n, ok }
func (f fakeEngines) Parent(model string) string         { return f.parents[model] }

// syncBuffer is an io.Writer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fileRouter returns a Router built from a policy file with the given
// router block ("" for none) and its Runtime over workers serving m
// (engine blocks of 16) and n (32), with engines e (nil: the fleet's).
func fileRouter(t *testing.T, routerBlock string, e Engines) (*router.Router, *Runtime, *syncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.hcl")
	if err := os.WriteFile(path, []byte(routerBlock), 0o644); err != nil {
		t.Fatal(err)
	}
	b, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	r, err := router.New(router.Options{Bundle: b.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for i, w := range []struct {
		model string
		e     int64
	}{{"m", 16}, {"n", 32}, {"n", 64}} {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, Name: w.model + string(rune('0'+i)),
			Models: []string{w.model}, EngineBlockSize: w.e}); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	s, err := New(Options{Router: r, Workers: newWorkerSet(), Engines: e,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return r, s, &logs
}

// A model's key block size is its engines' unless router.block_size is
// set (set to 512 too): then the override, warned about once per model
// whose engines report another size, with both sizes.
func TestKeyBlockSize(t *testing.T) {
	// The fleet's engine sizes: m's 16; n's smallest of 32 and 64; a
	// model no worker serves the default.
	r, s, _ := fileRouter(t, "", nil)
	if r.BlockSizeOverride() != 0 || r.BlockSize() != 512 {
		t.Fatalf("router without block_size: override %d, default %d", r.BlockSizeOverride(), r.BlockSize())
	}
	for model, want := range map[string]int{"m": 16, "n": 32, "x": 512} {
		if got := s.keyBlockSize(model, ""); got != want {
			t.Errorf("fleet: keyBlockSize(%s) = %d, want %d", model, got, want)
		}
	}
	// Engines given: an adapter without a size of its own takes its base
	// model's.
	_, s, _ = fileRouter(t, "", fakeEngines{sizes: map[string]int{"m": 16}, parents: map[string]string{"m-lora": "m"}})
	if got := s.keyBlockSize("m-lora", "m"); got != 16 {
		t.Errorf("adapter: keyBlockSize = %d, want its base model's 16", got)
	}
	for _, block := range []string{"router {\n  block_size = 64\n}\n", "router {\n  block_size = 512\n}\n"} {
		r, s, logs := fileRouter(t, block, nil)
		o := r.BlockSizeOverride()
		for range 3 {
			for _, model := range []string{"m", "n", "x"} {
				if got := s.keyBlockSize(model, ""); got != o {
					t.Errorf("block_size %d: keyBlockSize(%s) = %d, want the override", o, model, got)
				}
			}
		}
		got := logs.String()
		for _, want := range []string{"model=m router_block_size=" + itoa(o) + " engine_block_size=16", "model=n router_block_size=" + itoa(o) + " engine_block_size=32"} {
			if strings.Count(got, want) != 1 {
				t.Errorf("block_size %d: the warning %q appears %d times, want once:\n%s", o, want, strings.Count(got, want), got)
			}
		}
		if strings.Contains(got, "model=x") {
			t.Errorf("warned about a model no engine reports a size for:\n%s", got)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// A request's approximate hashes are seeded by its LoRA adapter and its
// cache_salt: no block of a salted prompt is the unsalted one's, another
// salt's or an adapter's, a salted repeat's are equal, and an unsalted
// base-model prompt's are prefix's as they were. Its precise key carries
// the adapter and the salt.
func TestSaltAndAdapterKeys(t *testing.T) {
	_, s, _ := fileRouter(t, "", fakeEngines{sizes: map[string]int{"m": 16, "m-lora": 16}, parents: map[string]string{"m-lora": "m"}})
	ids := make([]int64, 100)
	for i := range ids {
		ids[i] = int64(i)
	}
	body := func(model, salt string) []byte {
		b := map[string]any{"model": model, "prompt": ids}
		if salt != "" {
			b["cache_salt"] = salt
		}
		out, _ := json.Marshal(b)
		return out
	}
	key := func(model, salt string) *Request {
		t.Helper()
		req, err := ParseRequest(body(model, salt), APICompletions)
		if err != nil {
			t.Fatal(err)
		}
		ex := &Request{Model: model}
		s.Key(context.Background(), ex, req.Key())
		return ex
	}
	plain, s1, s1again, s2, lora := key("m", ""), key("m", "s1"), key("m", "s1"), key("m", "s2"), key("m-lora", "")
	if want := prefix.TokenBlocks(ids, 16); !slices.Equal(plain.Hashes, want) || len(want) != 6 || plain.BlockSize != 16 {
		t.Fatalf("unsalted hashes %v at %d, want prefix.TokenBlocks at 16 (6 blocks)", plain.Hashes, plain.BlockSize)
	}
	if !slices.Equal(s1.Hashes, s1again.Hashes) {
		t.Error("a salted repeat hashes otherwise")
	}
	all := [][]uint64{plain.Hashes, s1.Hashes, s2.Hashes, lora.Hashes}
	for i := range all {
		for j := range i {
			for k := range all[i] {
				if slices.Contains(all[j], all[i][k]) {
					t.Errorf("keys %d and %d share block hash %x", i, j, all[i][k])
				}
			}
		}
	}
	for _, c := range []struct {
		ex         *Request
		lora, salt string
	}{{plain, "", ""}, {s1, "", "s1"}, {lora, "m-lora", ""}} {
		k, ok := c.ex.PromptKey().(*prefix.Key)
		if !ok || !slices.Equal(k.IDs, ids) || k.LoRA != c.lora || k.Salt != c.salt {
			t.Errorf("promptKey = %+v, want the ids with LoRA %q and Salt %q", c.ex.PromptKey(), c.lora, c.salt)
		}
	}
}

// A salted repeat is not served by an unsalted prefix, nor the reverse:
// by hand, a 100-token prompt at 16 tokens a block has 6 blocks; sent
// unsalted, its unsalted repeat has 100 - 96 = 4 tokens uncached, a
// salted one all 100; sent salted too, that salt's repeat has 4, another
// salt's 100.
func TestSaltedRepeatNotCached(t *testing.T) {
	r, s, _ := fileRouter(t, "", nil)
	ids := make([]int64, 100)
	for i := range ids {
		ids[i] = int64(i)
	}
	request := func(salt string) *shared.Request {
		t.Helper()
		b := map[string]any{"model": "m", "prompt": ids}
		if salt != "" {
			b["cache_salt"] = salt
		}
		raw, _ := json.Marshal(b)
		req, err := ParseRequest(raw, APICompletions)
		if err != nil {
			t.Fatal(err)
		}
		ex := &Request{Model: "m"}
		s.Key(context.Background(), ex, req.Key())
		return &shared.Request{Model: "m", Role: shared.RoleAggregated, PromptTokens: ex.Tokens, BlockSize: ex.BlockSize, BlockHashes: ex.Hashes}
	}
	send := func(salt string) {
		t.Helper()
		d, err := r.Place(context.Background(), request(salt), router.Placement{})
		if err != nil {
			t.Fatal(err)
		}
		d.Booking.Release()
	}
	uncached := func(step, salt string, want int64) {
		t.Helper()
		if got := r.UncachedTokens(request(salt)); got != want {
			t.Errorf("%s: salt %q: %d tokens uncached, want %d", step, salt, got, want)
		}
	}
	send("")
	uncached("after the unsalted prompt", "", 4)
	uncached("after the unsalted prompt", "s1", 100)
	send("s1")
	uncached("after the salted prompt", "s1", 4)
	uncached("after the salted prompt", "s2", 100)
	uncached("after the salted prompt", "", 4)
}

// The router's token count of a request is the engine's prompt_tokens:
// with the default tokenizer (the engine's /tokenize: no tokenizer block)
// a chat and a completions prompt are counted by the mock engine's own
// tokenizer, and the engine's answer to the same body says as many
// prompt tokens. The character estimate would say otherwise.
func TestTokenCountIsTheEngines(t *testing.T) {
	file := chatmlTokenizer(t)
	m, err := mockworker.New(mockworker.Config{Speedup: 1000, BlockTokens: 16, Tokenizer: file})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m)
	t.Cleanup(func() { hs.Close(); m.Close() })
	e := newEnv(t, envOptions{}, backend{name: "a", url: hs.URL})
	set, err := tokenizer.NewSet(nil, func(string) tokenizer.EngineURL {
		return func(context.Context) (string, error) { return hs.URL, nil }
	}, tokenizer.EngineOptions{}, tokenizer.Defaults{Served: func(model string) bool { return model == "m" }})
	if err != nil {
		t.Fatal(err)
	}
	e.rt.SetTokenizers(set)
	long := strings.Repeat("the quick brown fox jumps over the lazy dog; ", 8)
	for _, c := range []struct {
		chat bool
		body string
	}{
		{true, chatBody("m", false, long)},
		{false, `{"model":"m","prompt":"` + long + `","max_tokens":2}`},
	} {
		p, err := e.rt.Place(context.Background(), schema(c.chat), http.Header{}, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		e.rt.Finish(&p, http.StatusOK, admission.Completed(int64(p.PromptTokens)))
		path := "/v1/completions"
		if c.chat {
			path = "/v1/chat/completions"
		}
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ans struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(raw, &ans); err != nil || ans.Usage.PromptTokens == 0 {
			t.Fatalf("engine answer %s: %v", raw, err)
		}
		estimate := prefix.EstimateTokens(long, DefaultCharsPerToken)
		if p.PromptTokens != ans.Usage.PromptTokens || p.PromptTokens == estimate {
			t.Errorf("chat %v: the router counts %d prompt tokens, the engine %d (the character estimate %d)", c.chat, p.PromptTokens, ans.Usage.PromptTokens, estimate)
		}
	}
}

// chatmlTokenizer is router/tokenizer's test byte-level BPE with the
// ChatML template: the mock engine's tokenizer.
func chatmlTokenizer(t *testing.T) tokenizer.Tokenizer {
	t.Helper()
	set, err := tokenizer.FromConfig([]config.Tokenizer{{Model: "m", Source: config.TokenizerSourceFile,
		Path: "../tokenizer/testdata/bytebpe-bos.json", Config: "../tokenizer/testdata/chatml_config.json"}}, nil, tokenizer.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return set.For("m")
}
