package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// testdata/bytebpe.json is a byte-level BPE written for these tests (by a
// few lines of Python, GPT-2's bytes_to_unicode): the 256 byte symbols
// have ids 0-255 (the byte's value), 29 merges follow (256 "he", 257 "ll",
// 258 "hell", 259 "hello", 260 "Ġw", 261 "or", 262 "Ġwor", 263 "ld",
// 264 "Ġworld", 265 "us", 266 "use", 267 "user", 268-275 up to
// "assistant", 276-280 up to "system", 281-283 up to "Ġthe", 284 "ĊĊ"),
// then the special tokens 285 <|im_start|>, 286 <|im_end|>,
// 287 <|begin_of_text|>, 288 <|start_header_id|>, 289 <|end_header_id|>,
// 290 <|eot_id|>, 291 <|endoftext|>. testdata/bytebpe-bos.json is the same
// with a Llama-style TemplateProcessing post-processor adding
// <|begin_of_text|> before a sequence.

func loadFile(t testing.TB, name string, tmpl *ChatTemplate) *File {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFile(name, b, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFileEncode(t *testing.T) {
	plain := loadFile(t, "bytebpe.json", nil)
	bos := loadFile(t, "bytebpe-bos.json", nil)
	for _, c := range []struct {
		tok  *File
		text string
		want []int64
	}{
		{plain, "hello world", []int64{259, 264}},
		{plain, "", nil},
		// Bytes without merges keep their byte values; é is C3 A9;
		// "  world" is " " then "Ġworld"; "\n\n" merges to "ĊĊ"; "the" has
		// no merge without its leading space.
		{plain, "héllo  world!\n\nthe system", []int64{104, 195, 169, 257, 111, 32, 264, 33, 284, 116, 256, 32, 280}},
		// Special tokens are cut out first and take the file's ids.
		{plain, "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n", []int64{285, 267, 10, 259, 264, 286, 10, 285, 275, 10}},
		// A "<|" that starts no special token is text.
		{plain, "<|im_end", []int64{60, 124, 105, 109, 95, 101, 110, 100}},
		// The post-processor adds BOS (287) in front.
		{bos, "hello world", []int64{287, 259, 264}},
		{bos, "", []int64{287}},
	} {
		got, err := c.tok.Encode(context.Background(), c.text)
		if err != nil {
			t.Fatalf("Encode(%q): %v", c.text, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestFileLStripRStrip(t *testing.T) {
	b, err := os.ReadFile("testdata/bytebpe.json")
	if err != nil {
		t.Fatal(err)
	}
	// Make <|im_end|> (added_tokens[1]) strip the whitespace on both
	// sides, as some models' tokenizer.json files do for added tokens.
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	im := doc["added_tokens"].([]any)[1].(map[string]any)
	if im["content"] != "<|im_end|>" {
		t.Fatalf("added_tokens[1] is %v", im["content"])
	}
	im["lstrip"], im["rstrip"] = true, true
	if b, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	f, err := NewFile("strip.json", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Encode(context.Background(), "hello  <|im_end|> \n world")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{259, 286, 119, 261, 263}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (hello, <|im_end|>, w, or, ld)", got, want)
	}
}

func TestFileBadInput(t *testing.T) {
	for _, c := range []struct{ name, json string }{
		{"notjson", "{"},
		{"nomodel", `{"added_tokens": []}`},
		{"badvocab", `{"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}}`},
		{"badadded", `{"added_tokens": 3, "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}`},
	} {
		if _, err := NewFile(c.name+".json", []byte(c.json), nil); err == nil {
			t.Errorf("%s: NewFile succeeded, want an error", c.name)
		} else if want := c.name + ".json: not a usable Hugging Face tokenizer.json"; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
			t.Errorf("%s: error %q does not start with %q", c.name, err, want)
		}
	}
}

func TestFileWordLevel(t *testing.T) {
	const wl = `{"added_tokens": [], "normalizer": {"type": "Lowercase"},
	"pre_tokenizer": {"type": "Whitespace"},
	"model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}, "unk_token": "[UNK]"}}`
	f, err := NewFile("wl.json", []byte(wl), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Encode(context.Background(), "The cat SAT on")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 2, 3, 0}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestFileNoChatTemplate(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	_, err := f.EncodeChat(context.Background(), []prefix.ChatMessage{{Role: "user", Content: "hi"}}, "")
	if !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("err = %v, want ErrNoChatTemplate", err)
	}
}

func TestFileConcurrent(t *testing.T) {
	f := loadFile(t, "bytebpe-bos.json", nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				got, err := f.Encode(context.Background(), "hello world")
				if err != nil || !slices.Equal(got, []int64{287, 259, 264}) {
					t.Errorf("Encode = %v, %v", got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestLoadFile(t *testing.T) {
	f, err := LoadFile("testdata/bytebpe.json", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Encode(context.Background(), "hello"); !slices.Equal(got, []int64{259}) {
		t.Errorf("Encode(hello) = %v, want [259]", got)
	}
	if _, err := LoadFile("testdata", nil); !errors.Is(err, inputfile.ErrNotRegular) {
		t.Errorf("LoadFile(dir) = %v, want ErrNotRegular", err)
	}
}

// TestFileEncodesLongRunsInPieces: a run without whitespace, or of
// whitespace only, longer than maxRunBytes is handed to the library in
// pieces of maxRunBytes (its BPE is quadratic in a word's length), so its
// ids are those of the pieces; ordinary text is one piece.
func TestFileEncodesLongRunsInPieces(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	ctx := context.Background()
	enc := func(pieces ...string) []int64 {
		t.Helper()
		var ids []int64
		for _, p := range pieces {
			got, err := f.model(p, false)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, got...)
		}
		return ids
	}
	h := strings.Repeat("hello", 200) // 1,000 bytes: cuts fall inside a "hello"
	sp := strings.Repeat(" ", 600)
	for _, tt := range []struct {
		text   string
		pieces []string
	}{
		{"x " + h, []string{"x " + h[:256], h[256:512], h[512:768], h[768:]}},
		{"a" + sp + "b", []string{"a" + sp[:256], sp[256:512], sp[512:] + "b"}},
		{"hello world, " + h[:200] + " again", []string{"hello world, " + h[:200] + " again"}},
	} {
		want := enc(tt.pieces...)
		got, err := f.Encode(ctx, tt.text)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%.20q…, %d bytes) = %d ids, want the %d of its %d pieces", tt.text, len(tt.text), len(got), len(want), len(tt.pieces))
		}
	}
	if whole := enc("x " + h); slices.Equal(whole, enc("x "+h[:256], h[256:512], h[512:768], h[768:])) {
		t.Fatal("the pieces encode as the whole run: the test cannot tell them apart")
	}
}
