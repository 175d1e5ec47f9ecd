package mockworker

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// testTokenizer loads router/tokenizer's test byte-level BPE with its
// ChatML template.
func testTokenizer(t *testing.T) *tokenizer.File {
	t.Helper()
	b, err := os.ReadFile("../tokenizer/testdata/chatml_config.json")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tokenizer.ParseTokenizerConfig("chatml_config.json", b)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := tokenizer.ParseChatTemplate("chatml", tc.ChatTemplate, tc.BOS, tc.EOS)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadFile("../tokenizer/testdata/bytebpe.json", tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type tokenizeAnswer struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int64 `json:"tokens"`
}

// TestTokenize: /tokenize answers, in vLLM's shape, the ids the tokenizer
// library gives for a prompt and for chat messages; settings it cannot
// follow, another model and no tokenizer are errors.
func TestTokenize(t *testing.T) {
	tok := testTokenizer(t)
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 1000
	_, url := startServer(t, Config{Model: testModel, Sim: cfg, Tokenizer: tok})
	text := "The quick brown fox jumps over the lazy dog. <|im_end|> again"
	msgs := []prefix.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}
	wantText, err := tok.Encode(context.Background(), text)
	if err != nil {
		t.Fatal(err)
	}
	wantChat, err := tok.EncodeChat(context.Background(), msgs, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(wantText) < 10 || len(wantChat) < 10 {
		t.Fatalf("test tokenizer gave %v and %v", wantText, wantChat)
	}
	for _, c := range []struct {
		name string
		body map[string]any
		want []int64
	}{
		{"prompt", map[string]any{"model": testModel, "prompt": text}, wantText},
		{"prompt with add_special_tokens", map[string]any{"prompt": text, "add_special_tokens": true}, wantText},
		{"messages", map[string]any{"model": testModel, "messages": []map[string]string{
			{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}, "add_generation_prompt": true}, wantChat},
	} {
		resp, b := post(t, url+"/tokenize", c.body)
		var got tokenizeAnswer
		if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
		}
		if !slices.Equal(got.Tokens, c.want) || got.Count != len(c.want) || got.MaxModelLen != 16000 {
			t.Errorf("%s: %+v, want tokens %v, max_model_len 16000", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		body   map[string]any
		status int
		msg    string
	}{
		{map[string]any{"prompt": text, "add_special_tokens": false}, 400, "add_special_tokens false"},
		{map[string]any{"messages": []map[string]string{{"role": "user", "content": "x"}}, "add_generation_prompt": false}, 400, "add_generation_prompt false"},
		{map[string]any{"model": "other", "prompt": text}, 404, "does not exist"},
		{map[string]any{"model": testModel}, 400, "prompt or messages is required"},
	} {
		resp, b := post(t, url+"/tokenize", c.body)
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.msg) {
			t.Errorf("%v: %d %s, want %d naming %q", c.body, resp.StatusCode, b, c.status, c.msg)
		}
	}

	// The prompt's length is its token count.
	resp, b := post(t, url+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 2})
	var ans completion
	if err := json.Unmarshal(b, &ans); err != nil || resp.StatusCode != 200 || ans.Usage.PromptTokens != len(wantText) {
		t.Errorf("completion: %d %s, want prompt_tokens %d", resp.StatusCode, b, len(wantText))
	}

	_, plain := startServer(t, Config{Model: testModel})
	if resp, b := post(t, plain+"/tokenize", map[string]any{"prompt": "x"}); resp.StatusCode != 404 || !strings.Contains(string(b), "no tokenizer") {
		t.Errorf("without a tokenizer: %d %s", resp.StatusCode, b)
	}
}

// TestModelsMaxModelLen: /v1/models lists the served model with its
// max_model_len, the KV cache in tokens.
func TestModelsMaxModelLen(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 100
	_, url := startServer(t, Config{Model: testModel, Sim: cfg})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 ||
		list.Data[0].ID != testModel || list.Data[0].MaxModelLen != 1600 {
		t.Fatalf("models: %v %+v", err, list)
	}
}

// TestTokenizedKVEvents: with a tokenizer, a text prompt's BlockStored
// events carry its token ids cut in engine blocks; a chat request's are
// the ids of its rendered template.
func TestTokenizedKVEvents(t *testing.T) {
	tok := testTokenizer(t)
	s, url := startServer(t, Config{Model: testModel, Tokenizer: tok, KVEventsEndpoint: "tcp://127.0.0.1:0"})
	pub, _ := s.KVEventsAddr(0)
	sub := subscribe(t, pub.String())
	for i := 0; ; i++ {
		if i == 600 {
			t.Fatal("no KV event after 600 probes")
		}
		complete(t, url, map[string]any{"prompt": ids(50_000+17*i, 17), "max_tokens": 1})
		if _, ok := sub.next(100 * time.Millisecond); ok {
			break
		}
	}
	text := strings.Repeat("tokens are what the engine caches; ", 8)
	wantIDs, _ := tok.Encode(context.Background(), text)
	msgs := []prefix.ChatMessage{{Role: "user", Content: strings.Repeat("a chat turn to cache ", 6)}}
	chatIDs, _ := tok.EncodeChat(context.Background(), msgs, "")
	complete(t, url, map[string]any{"prompt": text, "max_tokens": 1})
	if resp, b := post(t, url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": msgs[0].Content}}, "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	for _, want := range [][]int64{wantIDs, chatIDs} {
		n := len(want) / 16 * 16
		if n < 32 {
			t.Fatalf("prompt of %d tokens: want at least two blocks", len(want))
		}
		sub.until("the prompt's BlockStored", func(m kvMsg) bool {
			for _, ev := range m.events {
				if ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) >= 16 && slices.Equal(ev.TokenIDs[:16], want[:16]) {
					if len(ev.BlockHashes) != n/16 || !slices.Equal(ev.TokenIDs, want[:n]) || ev.HasParent {
						t.Errorf("stored %+v, want %d blocks of ids %v", ev, n/16, want[:n])
					}
					return true
				}
			}
			return false
		})
	}
}
