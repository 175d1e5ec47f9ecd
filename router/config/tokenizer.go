package config

import (
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// blockTokenizer is the tokenizer block's name.
const blockTokenizer = "tokenizer"

// Values of a tokenizer block's source.
const (
	// TokenizerSourceEngine tokenizes with the engine's own POST /tokenize
	// (vLLM; SGLang for text prompts only).
	TokenizerSourceEngine = "engine"
	// TokenizerSourceFile tokenizes in the router with a Hugging Face
	// tokenizer.json.
	TokenizerSourceFile = "file"
	// TokenizerSourceChars tokenizes nothing: the model's text prompts
	// are keyed by character blocks (the way to turn off the default
	// engine source for one model).
	TokenizerSourceChars = "chars"
)

// Tokenizer is one top-level `tokenizer "MODEL"` block: how the router
// turns that model's prompts into the token ids its engines compute, for
// token-accurate prefix keys (router/tokenizer builds it: NewSet). A
// model without a block takes its engines' /tokenize (a LoRA adapter, its
// base model's tokenizer); the block overrides that.
//
//	tokenizer "llama-3-8b" {
//	  source        = "file"                   # or "engine", or "chars"
//	  path          = "llama3/tokenizer.json"  # file only; required
//	  config        = "llama3/tokenizer_config.json"  # file only: chat_template, bos_token, eos_token
//	  chat_template = "llama3/chat.jinja"      # file only; overrides config's chat_template
//	}
//
// Relative paths are relative to the policy file's directory. The files
// are read when the tokenizer is built, not by the loader; errors then
// name the attribute's file:line:col (AttrRanges).
type Tokenizer struct {
	// Model is the block label: the model name requests carry.
	Model string
	// Source is TokenizerSourceEngine, TokenizerSourceFile or
	// TokenizerSourceChars.
	Source string
	// Path is the tokenizer.json (source "file"), resolved; "" otherwise.
	Path string
	// Config is the tokenizer_config.json, resolved; "" when not given.
	Config string
	// ChatTemplate is the Jinja chat template file, resolved; "" when not
	// given (the config's chat_template is used, if any).
	ChatTemplate string
	// Range is the block's definition (`tokenizer "MODEL"`).
	Range hcl.Range
	// AttrRanges holds the range of each attribute given, by name.
	AttrRanges map[string]hcl.Range
}

var tokenizerSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "source", Required: true},
		{Name: "path"},
		{Name: "config"},
		{Name: "chat_template"},
	},
}

// tokenizerBlock decodes one tokenizer block into PolicyFile.Tokenizers; a
// block with an error is left out.
func (l *loader) tokenizerBlock(blk *hcl.Block) {
	model := blk.Labels[0]
	ok := true
	if strings.TrimSpace(model) == "" {
		l.errorf(blk.LabelRanges[0], "Invalid tokenizer model", "A tokenizer block's label is the model name requests carry, such as \"llama-3-8b\"; it must not be empty.")
		ok = false
	}
	if first, dup := l.tokenizerAt[model]; dup {
		l.errorf(blk.LabelRanges[0], "Duplicate tokenizer",
			"Model %q already has a tokenizer block at %s; remove one of them.", model, pos(first))
		ok = false
	}
	t := Tokenizer{Model: model, Range: blk.DefRange, AttrRanges: make(map[string]hcl.Range)}
	errorsBefore := len(l.diags.Errs())
	content, diags := blk.Body.Content(tokenizerSchema)
	l.diags = append(l.diags, diags...)
	for n, attr := range content.Attributes {
		t.AttrRanges[n] = attr.Range
	}
	if attr, found := content.Attributes["source"]; found {
		if s, good := l.stringAttr(attr); good {
			switch s {
			case TokenizerSourceEngine, TokenizerSourceFile, TokenizerSourceChars:
				t.Source = s
			default:
				l.attrErrorf(attr, "Invalid tokenizer source",
					"source must be %q (the engine's own /tokenize), %q (a Hugging Face tokenizer.json named by path) or %q (no tokenizer: character blocks), got %q.",
					TokenizerSourceEngine, TokenizerSourceFile, TokenizerSourceChars, s)
			}
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"path", &t.Path}, {"config", &t.Config}, {"chat_template", &t.ChatTemplate}} {
		attr, found := content.Attributes[f.name]
		if !found {
			continue
		}
		switch t.Source {
		case TokenizerSourceEngine:
			l.attrErrorf(attr, "Unexpected "+f.name,
				"With source = %q the engine tokenizes and renders its own chat template; %s is for source = %q. Remove it.",
				TokenizerSourceEngine, f.name, TokenizerSourceFile)
			continue
		case TokenizerSourceChars:
			l.attrErrorf(attr, "Unexpected "+f.name,
				"With source = %q nothing is tokenized; %s is for source = %q. Remove it.",
				TokenizerSourceChars, f.name, TokenizerSourceFile)
			continue
		}
		if s, good := l.stringAttr(attr); good {
			if strings.TrimSpace(s) == "" || strings.ContainsRune(s, 0) {
				l.attrErrorf(attr, "Invalid "+f.name, "%s must name a file, such as \"tokenizer.json\".", f.name)
				continue
			}
			*f.dst = l.relPath(s)
		}
	}
	if t.Source == TokenizerSourceFile && t.Path == "" && content.Attributes["path"] == nil {
		l.errorf(blk.DefRange, "Missing tokenizer path",
			"A tokenizer with source = %q needs path, the model's tokenizer.json, such as path = \"tokenizer.json\".", TokenizerSourceFile)
	}
	if ok && len(l.diags.Errs()) == errorsBefore {
		l.file.Tokenizers = append(l.file.Tokenizers, t)
		l.tokenizerAt[model] = t.Range
	}
}

// relPath resolves a path written in the file against the file's
// directory; absolute paths are kept.
func (l *loader) relPath(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(l.filename), p)
}
