package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"

	hf "github.com/sugarme/tokenizer"
	"github.com/sugarme/tokenizer/pretrained"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// MaxFileSize bounds a tokenizer.json, tokenizer_config.json or chat
// template file the router reads: 64 MiB. The largest common
// tokenizer.json files (Qwen2.5, Llama-3, Gemma) are 7 to 35 MB.
const MaxFileSize = 64 << 20

// File encodes with a Hugging Face tokenizer.json in process, with no
// network call.
//
// The library is github.com/sugarme/tokenizer (v0.3.0), a pure-Go port of
// Hugging Face's tokenizers (no cgo) that reads tokenizer.json with its
// normalizers, pre-tokenizers (ByteLevel, Metaspace, Split, ...), models
// (BPE, WordPiece, WordLevel, Unigram) and post-processors
// (TemplateProcessing adds a Llama BOS). It was chosen because it is the
// only pure-Go module the Go module proxy serves that loads tokenizer.json
// at all: github.com/gomlx/go-huggingface (v0.3.1) and
// github.com/eliben/go-sentencepiece read only SentencePiece .model files,
// github.com/tiktoken-go/tokenizer only OpenAI's tiktoken encodings, and
// github.com/daulet/tokenizers wraps the Rust library through cgo.
//
// Two parts of the library are worked around, not used. Its added-token
// matching loses special tokens (a ChatML "<|im_end|>" came out as bytes
// and "<|im_start|>" vanished) and ignores the ids the file gives them,
// so File takes the file's added_tokens itself: it cuts the text at their
// leftmost-longest occurrences (honouring lstrip and rstrip; single_word
// and normalized matching are not supported), gives them the file's ids,
// and encodes the text between them with the library, as Hugging Face's
// tokenizers does. The post-processor's special tokens (a BOS, an EOS)
// are learned once, by encoding a probe with and without them. And the
// library panics on some malformed files and inputs; File turns those
// panics into errors.
type File struct {
	tk    *hf.Tokenizer
	added map[byte][]addedToken // by first byte, longest first
	// pre and post are the ids the post-processor puts before and after
	// a sequence when special tokens are added.
	pre, post []int64
	tmpl      *ChatTemplate // nil: EncodeChat fails with ErrNoChatTemplate
}

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID      int64  `json:"id"`
	Content string `json:"content"`
	LStrip  bool   `json:"lstrip"`
	RStrip  bool   `json:"rstrip"`
}

// NewFile builds a File from the contents of a tokenizer.json (name is
// used in errors) and an optional chat template for EncodeChat (nil: none).
// Errors name the file and say what is wrong ("tok.json: not a usable
// Hugging Face tokenizer.json: ...").
func NewFile(name string, tokenizerJSON []byte, tmpl *ChatTemplate) (f *File, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: not a usable Hugging Face tokenizer.json: "+format, append([]any{name}, a...)...)
	}
	defer func() {
		if r := recover(); r != nil {
			f, err = nil, bad("%v", r)
		}
	}()
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(tokenizerJSON, &doc); err != nil {
		return nil, bad("%w", err)
	}
	if m := doc["model"]; len(m) == 0 || m[0] != '{' {
		return nil, bad("it has no model object")
	}
	var added []addedToken
	if raw := doc["added_tokens"]; len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &added); err != nil {
			return nil, bad("added_tokens: %w", err)
		}
	}
	doc["added_tokens"] = json.RawMessage("[]")
	stripped, err := json.Marshal(doc)
	if err != nil {
		return nil, bad("%w", err)
	}
	tk, err := pretrained.FromReader(bytes.NewReader(stripped))
	if err != nil {
		return nil, bad("%w", err)
	}
	f = &File{tk: tk, added: make(map[byte][]addedToken), tmpl: tmpl}
	for _, a := range added {
		if a.Content != "" {
			f.added[a.Content[0]] = append(f.added[a.Content[0]], a)
		}
	}
	for _, list := range f.added {
		slices.SortStableFunc(list, func(a, b addedToken) int { return len(b.Content) - len(a.Content) })
	}
	// The post-processor's additions: encode a probe with and without
	// special tokens and take what surrounds it.
	const probe = "a"
	with, err := f.model(probe, true)
	if err != nil {
		return nil, bad("%w", err)
	}
	without, err := f.model(probe, false)
	if err != nil {
		return nil, bad("%w", err)
	}
	i := index(with, without)
	if i < 0 || len(without) == 0 {
		return nil, bad("its post_processor does not keep the encoded text whole (%v around %v)", with, without)
	}
	f.pre, f.post = with[:i], with[i+len(without):]
	return f, nil
}

// LoadFile reads the tokenizer.json at path (a regular file of at most
// MaxFileSize bytes, read with router/inputfile) and builds a File with
// the chat template tmpl (nil: none); see NewFile.
func LoadFile(path string, tmpl *ChatTemplate) (*File, error) {
	b, err := inputfile.ReadFile(path, MaxFileSize)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return NewFile(path, b, tmpl)
}

// index returns the first index of sub in s, or -1.
func index(s, sub []int64) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if slices.Equal(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

// Encode returns the ids of prompt with the tokenizer's special tokens
// added by its post-processor (as the engine's add_special_tokens=true
// does). ctx is not used: encoding does not block.
func (f *File) Encode(_ context.Context, prompt string) ([]int64, error) {
	return f.encode(prompt, true)
}

// EncodeChat renders msgs and tools with the chat template (generation
// prompt added; see ChatTemplate.Render) and encodes the result without
// adding special tokens, as vLLM does for chat requests (the template
// writes BOS itself). Without a template it fails with ErrNoChatTemplate.
func (f *File) EncodeChat(_ context.Context, msgs []prefix.ChatMessage, tools string) ([]int64, error) {
	if f.tmpl == nil {
		return nil, ErrNoChatTemplate
	}
	text, err := f.tmpl.Render(msgs, tools)
	if err != nil {
		return nil, err
	}
	return f.encode(text, false)
}

// encode cuts text at the added tokens and encodes the pieces between.
// Cost: linear in len(text) times the added tokens sharing a first byte.
func (f *File) encode(text string, addSpecial bool) ([]int64, error) {
	var ids []int64
	if addSpecial {
		ids = append(ids, f.pre...)
	}
	start := 0 // start of the text not yet encoded
	for i := 0; i < len(text); i++ {
		a, ok := f.addedAt(text, i)
		if !ok {
			continue
		}
		end := i
		if a.LStrip {
			end = len(strings.TrimRightFunc(text[start:i], unicode.IsSpace)) + start
		}
		piece, err := f.modelRuns(text[start:end])
		if err != nil {
			return nil, err
		}
		ids = append(append(ids, piece...), a.ID)
		i += len(a.Content)
		if a.RStrip {
			i = len(text) - len(strings.TrimLeftFunc(text[i:], unicode.IsSpace))
		}
		start = i
		i-- // the loop's i++
	}
	piece, err := f.modelRuns(text[start:])
	if err != nil {
		return nil, err
	}
	ids = append(ids, piece...)
	if addSpecial {
		ids = append(ids, f.post...)
	}
	return ids, nil
}

// maxRunBytes bounds the runs of text handed to the library in one
// piece: its BPE (sugarme/tokenizer's Word.Add) rebuilds a word's symbols
// for every character, quadratic in a word's length (10,000 bytes without
// a space took 2.6 s, 80,000 in a chat message minutes), so a run without
// whitespace, or of whitespace only, longer than this is encoded in pieces
// of this many bytes. Ordinary words are far shorter; a prompt with such a
// run may be keyed unlike the engine from its first cut on, so its later
// blocks miss (never hit falsely).
const maxRunBytes = 256

// modelRuns encodes text without special tokens, cutting every run of
// whitespace or of non-whitespace at maxRunBytes (at a rune boundary).
// Cost: linear in len(text).
func (f *File) modelRuns(text string) ([]int64, error) {
	var ids []int64
	start, run, space := 0, 0, false // run: where the current run began
	for i, r := range text {
		if s := unicode.IsSpace(r); s != space {
			run, space = i, s
		} else if i-run >= maxRunBytes {
			piece, err := f.model(text[start:i], false)
			if err != nil {
				return nil, err
			}
			ids = append(ids, piece...)
			start, run = i, i
		}
	}
	piece, err := f.model(text[start:], false)
	if err != nil {
		return nil, err
	}
	return append(ids, piece...), nil
}

// addedAt returns the longest added token at text[i:].
func (f *File) addedAt(text string, i int) (addedToken, bool) {
	for _, a := range f.added[text[i]] {
		if strings.HasPrefix(text[i:], a.Content) {
			return a, true
		}
	}
	return addedToken{}, false
}

// model encodes text with the library (no added tokens: File cuts them
// out first).
func (f *File) model(text string, addSpecial bool) (ids []int64, err error) {
	if text == "" && !addSpecial {
		return nil, nil
	}
	defer func() {
		if r := recover(); r != nil {
			ids, err = nil, fmt.Errorf("tokenizer: encoding failed: %v", r)
		}
	}()
	enc, err := f.tk.EncodeSingle(text, addSpecial)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: encoding failed: %w", err)
	}
	ids = make([]int64, len(enc.Ids))
	for i, id := range enc.Ids {
		ids[i] = int64(id)
	}
	return ids, nil
}

// Decode returns the text of ids, special tokens included (vLLM's
// /detokenize decodes with skip_special_tokens false); an id outside the
// vocabulary is an error. Decoding recovers from the library's panics.
func (f *File) Decode(_ context.Context, ids []int64) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			text, err = "", fmt.Errorf("decoding %d token ids: %v", len(ids), r)
		}
	}()
	n := int64(f.tk.GetVocabSize(true))
	in := make([]int, len(ids))
	for i, id := range ids {
		if id < 0 || id >= n {
			return "", fmt.Errorf("token id %d is outside the vocabulary of %d", id, n)
		}
		in[i] = int(id)
	}
	return f.tk.Decode(in, false), nil
}
