package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// propWords are the pieces messages are drawn from: words, punctuation,
// runs of spaces and newlines, multi-byte characters, numbers, and the
// added tokens' texts whole and cut (a client may write them into a
// message: the tokenizer then matches them as added tokens, and the
// cache's cuts must follow).
var propWords = []string{
	"hello", "world", "the", "system", "user", "assistant", "answer", "question", "token", "cache",
	"prefix", "router", "engine", "block", " ", "  ", "\n", "\n\n", "\t", ",", ".", "!", "?",
	"é", "日本語", "naïve", "42", "3.14", "-", "'s", "\"", "<", "|", ">",
	"<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|im_", "<|", "|>", "<|start_header_id|>", "<|endoftext",
}

// propText returns a message of up to n pieces.
func propText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range 1 + r.IntN(n) {
		b.WriteString(propWords[r.IntN(len(propWords))])
		if r.IntN(3) > 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// propRequest is one request of the property test: a conversation so far,
// sent as chat messages or as its ChatML text, or (text set) a text
// prompt.
type propRequest struct {
	msgs []prefix.ChatMessage
	chat bool
	text string
}

// prompt returns the text prompt of a request that is not chat.
func (p propRequest) prompt() string {
	if p.text != "" {
		return p.text
	}
	return chatml(p.msgs)
}

// propTraffic returns the requests of convs random conversations of up to
// 6 turns, interleaved at random, some conversations sharing a system
// prompt (siblings), with exact repeats of earlier requests and edits
// (an earlier prompt's text cut at a random byte and continued) mixed in.
func propTraffic(r *rand.Rand, convs int) []propRequest {
	systems := []string{propText(r, 40), propText(r, 40), propText(r, 8)}
	type conv struct {
		history []prefix.ChatMessage
		turns   int
		chat    bool
	}
	cs := make([]*conv, convs)
	for i := range cs {
		cs[i] = &conv{turns: 1 + r.IntN(6), chat: r.IntN(2) == 0,
			history: []prefix.ChatMessage{{Role: "system", Content: systems[r.IntN(len(systems))]}}}
	}
	var out []propRequest
	for live := len(cs); live > 0; {
		c := cs[r.IntN(len(cs))]
		if c.turns == 0 {
			continue
		}
		if len(c.history) > 1 {
			c.history = append(c.history, prefix.ChatMessage{Role: "assistant", Content: propText(r, 20)})
		}
		c.history = append(c.history, prefix.ChatMessage{Role: "user", Content: propText(r, 12)})
		out = append(out, propRequest{msgs: slices.Clone(c.history), chat: c.chat})
		if r.IntN(5) == 0 {
			out = append(out, out[r.IntN(len(out))]) // an exact repeat
		}
		if c.turns--; c.turns == 0 {
			live--
		}
		if r.IntN(3) == 0 {
			// An edit: an earlier text prompt cut anywhere (inside an
			// added token, just after one) and continued otherwise.
			// At a rune boundary: prompts arrive as valid UTF-8 (JSON
			// strings decode to it).
			prev := out[r.IntN(len(out))]
			text := chatml(prev.msgs)
			k := r.IntN(len(text) + 1)
			for k < len(text) && !utf8.RuneStart(text[k]) {
				k--
			}
			out = append(out, propRequest{text: text[:k] + propText(r, 6)})
		}
	}
	return out
}

// withStrip returns the tokenizer.json named with <|im_end|> given lstrip
// and <|im_start|> rstrip: the added-token options that move the text
// around a cut.
func withStrip(t *testing.T, name string) []byte {
	return editTokenizer(t, name, func(added []any) []any {
		for _, a := range added {
			m := a.(map[string]any)
			switch m["content"] {
			case "<|im_end|>":
				m["lstrip"] = true
			case "<|im_start|>":
				m["rstrip"] = true
			}
		}
		return added
	})
}

// withOverlaps returns the tokenizer.json named with added tokens that
// contain others ("é<|im_end|>é" around <|im_end|>, "<|im_start|>user"
// extending <|im_start|>, "|><|" across two): where a prompt continues
// decides which of them matches, so a cut must leave the longest added
// token's length between itself and where two prompts part.
func withOverlaps(t *testing.T, name string) []byte {
	return editTokenizer(t, name, func(added []any) []any {
		for i, c := range []string{"é<|im_end|>é", "<|im_start|>user", "|><|"} {
			added = append(added, map[string]any{"id": 300 + i, "content": c, "single_word": false, "lstrip": false,
				"rstrip": false, "normalized": false, "special": true})
		}
		return added
	})
}

// editTokenizer returns testdata's tokenizer.json named with its
// added_tokens passed through edit.
func editTokenizer(t *testing.T, name string, edit func([]any) []any) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	doc["added_tokens"] = edit(doc["added_tokens"].([]any))
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEngineCacheProperty: for random multi-turn conversations, sent as
// chat messages and as ChatML text, interleaved, with siblings and
// repeats, every id list the Engine answers (from its cache, spliced, or
// called) equals a fresh tokenization of the whole prompt by the same
// tokenizer (the engine's own answer without a cache), for three
// tokenizers: plain byte-level BPE, one whose post-processor adds a BOS,
// one whose added tokens strip the whitespace around them, and one with
// added tokens that contain or extend others. The cache
// must also have been used: exact repeats answered without a call, and
// text prompts spliced at safe cuts.
func TestEngineCacheProperty(t *testing.T) {
	cfg, err := os.ReadFile("testdata/chatml_config.json")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ParseTokenizerConfig("chatml_config.json", cfg)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ParseChatTemplate("chatml", tc.ChatTemplate, tc.BOS, tc.EOS)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := os.ReadFile("testdata/bytebpe.json")
	bos, _ := os.ReadFile("testdata/bytebpe-bos.json")
	convs := 12
	if testing.Short() {
		convs = 4
	}
	for i, tok := range []struct {
		name string
		json []byte
	}{{"bytebpe", plain}, {"bytebpe-bos", bos}, {"bytebpe-bos-strip", withStrip(t, "bytebpe-bos.json")},
		{"bytebpe-bos-overlaps", withOverlaps(t, "bytebpe-bos.json")}} {
		t.Run(tok.name, func(t *testing.T) {
			f, err := NewFile(tok.name, tok.json, tmpl)
			if err != nil {
				t.Fatal(err)
			}
			fe := newFakeEngine(t, f)
			fe.info = true
			e, err := NewEngine("m", fe.url, EngineOptions{ChunkBytes: 16})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			r := rand.New(rand.NewPCG(26, uint64(i)))
			reqs := propTraffic(r, convs)
			for n, req := range reqs {
				var got, want []int64
				var gerr, werr error
				if req.chat {
					got, gerr = e.EncodeChat(ctx, req.msgs, "")
					want, werr = f.EncodeChat(ctx, req.msgs, "")
				} else {
					got, gerr = e.Encode(ctx, req.prompt())
					want, werr = f.Encode(ctx, req.prompt())
				}
				if gerr != nil || werr != nil {
					t.Fatalf("request %d: engine %v, fresh %v; prompt %q", n, gerr, werr, req.prompt())
				}
				if !slices.Equal(got, want) {
					t.Fatalf("request %d (chat %v, %d messages): cached path %v\nfresh %v\nprompt %q", n, req.chat, len(req.msgs), got, want, req.prompt())
				}
			}
			s := e.Stats()
			t.Logf("%d requests: %+v", len(reqs), s)
			if s.CacheHits == 0 || s.Splices == 0 {
				t.Errorf("stats %+v over %d requests: want exact hits and splices both used", s, len(reqs))
			}
		})
	}
}

// The anchors of a prompt pair its added-token matches with its ids, and
// refuse when they do not pair. Worked by hand on bytebpe-bos.json (BOS
// 287; <|im_start|> 285, <|im_end|> 286): "<|im_start|>user\nhi<|im_end|>"
// is [287 285 ...user... ...hi... 286], matches at bytes 0 and 19.
func TestAnchors(t *testing.T) {
	f := loadFile(t, "bytebpe-bos.json", nil)
	added := map[int64]string{}
	for _, list := range f.added {
		for _, a := range list {
			added[a.ID] = a.Content
		}
	}
	sp := newSpecials(added, []int64{287}, nil)
	text := "<|im_start|>user\nhi<|im_end|>"
	ids, err := f.Encode(context.Background(), text)
	if err != nil {
		t.Fatal(err)
	}
	got := sp.anchors(text, ids)
	want := []anchor{{cut: 0, at: 1}, {cut: 19, at: len(ids) - 1}}
	if !slices.Equal(got, want) || ids[0] != 287 || ids[1] != 285 || ids[len(ids)-1] != 286 {
		t.Fatalf("anchors %v of ids %v, want %v", got, ids, want)
	}
	for _, c := range []struct {
		name string
		ids  []int64
	}{
		{"no BOS", ids[1:]},
		{"an added id the text lacks", append(slices.Clone(ids), 290)},
		{"another added token", append(slices.Clone(ids[:len(ids)-1]), 290)},
	} {
		if a := sp.anchors(text, c.ids); a != nil {
			t.Errorf("%s: anchors %v, want none", c.name, a)
		}
	}
	if l := sp.match("x<|im_start|>", 1); l != 12 {
		t.Errorf("match = %d, want 12", l)
	}
	if l := sp.match("<|im_sta", 0); l != 0 {
		t.Errorf("a cut token matched %d bytes, want 0", l)
	}
	_ = fmt.Sprint(sp)
}
