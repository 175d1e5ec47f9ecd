package tokenizer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/inputfile"
)

// Set holds the tokenizer of each model: a model's `tokenizer` block's,
// else, with Defaults, its engines' /tokenize (an Engine made on first use),
// a LoRA adapter taking its base model's. Its methods are safe for
// concurrent use.
type Set struct {
	// byModel are the blocks' tokenizers (nil for source "chars").
	byModel map[string]Tokenizer
	engine  func(model string) EngineURL
	opts    EngineOptions
	def     Defaults

	mu       sync.Mutex
	defaults map[string]*Engine // the models' default tokenizers, made on first use
}

// Defaults give a Set's models without a tokenizer block their engines'
// /tokenize (router/live's daemon sets them; tests may leave them zero:
// no default, such models keyed by characters).
type Defaults struct {
	// Served reports whether an engine serves model: only those get a
	// default tokenizer (model names come from clients). nil: none.
	Served func(model string) bool
	// Parent returns the base model of model when it is a LoRA adapter
	// (vLLM's /v1/models parent), else "": an adapter takes its base
	// model's tokenizer (its block's, or its default, shared with the
	// base model and its other adapters, cache included). nil: no
	// adapters.
	Parent func(model string) string
}

// MaxDefaultTokenizers bounds the default tokenizers a Set makes (one per
// base model engines serve): 256, more base models than a fleet serves;
// past it a model without a block is keyed by characters. Each holds a
// cache of at most EngineOptions.CacheBytes.
const MaxDefaultTokenizers = 256

// For returns model's tokenizer, or nil when it has none (or s is nil):
// the caller then keys the prompt by characters, which Blocks does when
// given a nil Tokenizer. In order: model's block; a LoRA adapter's base
// model's block; the default (model's engines' /tokenize, the base
// model's for an adapter) when Defaults serve it. A block with source
// "chars" is nil.
func (s *Set) For(model string) Tokenizer {
	if s == nil {
		return nil
	}
	if t, ok := s.byModel[model]; ok {
		return t
	}
	if s.def.Parent != nil {
		if base := s.def.Parent(model); base != "" && base != model {
			if t, ok := s.byModel[base]; ok {
				return t
			}
			model = base
		}
	}
	if s.engine == nil || s.def.Served == nil || !s.def.Served(model) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.defaults[model]; ok {
		return e
	}
	if len(s.defaults) >= MaxDefaultTokenizers {
		return nil
	}
	e, err := NewEngine(model, s.engine(model), s.opts)
	if err != nil {
		return nil
	}
	s.defaults[model] = e
	return e
}

// FromConfig is NewSet without Defaults: only the models with a block
// have a tokenizer.
func FromConfig(blocks []config.Tokenizer, engine func(model string) EngineURL, opts EngineOptions) (*Set, error) {
	return NewSet(blocks, engine, opts, Defaults{})
}

// NewSet builds the tokenizers of a policy file's tokenizer blocks
// (config.PolicyFile.Tokenizers), with def giving the other models served
// their engines' /tokenize. Source "file" reads the block's
// tokenizer.json, tokenizer_config.json and chat template files now
// (regular files of at most MaxFileSize bytes, via router/inputfile);
// source "engine", and the defaults, make an Engine with opts whose calls
// go to engine(model), which returns the base URL of a ready engine
// serving the model when called (engine may be nil when no block has
// source "engine": then there are no defaults either); source "chars" is
// no tokenizer. Errors name the block's attribute as file:line:col and
// the model, for example `p.hcl:3:3: tokenizer "llama": path: tok.json:
// file too large: over the 64 MiB limit`; all blocks' errors are joined.
func NewSet(blocks []config.Tokenizer, engine func(model string) EngineURL, opts EngineOptions, def Defaults) (*Set, error) {
	s := &Set{byModel: make(map[string]Tokenizer, len(blocks)), engine: engine, opts: opts, def: def, defaults: make(map[string]*Engine)}
	var errs []error
	for _, b := range blocks {
		if b.Source == config.TokenizerSourceChars {
			s.byModel[b.Model] = nil
			continue
		}
		tok, err := build(b, engine, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.byModel[b.Model] = tok
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

func build(b config.Tokenizer, engine func(model string) EngineURL, opts EngineOptions) (Tokenizer, error) {
	fail := func(attr string, err error) error {
		r, ok := b.AttrRanges[attr]
		if !ok {
			r = b.Range
		}
		return fmt.Errorf("%s: tokenizer %q: %s: %w", rangePos(r), b.Model, attr, err)
	}
	if b.Source == config.TokenizerSourceEngine {
		if engine == nil {
			return nil, fail("source", errors.New("no engine chooser was given"))
		}
		e, err := NewEngine(b.Model, engine(b.Model), opts)
		if err != nil {
			return nil, fail("source", err)
		}
		return e, nil
	}
	var tc TokenizerConfig
	if b.Config != "" {
		data, err := inputfile.ReadFile(b.Config, MaxFileSize)
		if err != nil {
			return nil, fail("config", err)
		}
		if tc, err = ParseTokenizerConfig(b.Config, data); err != nil {
			return nil, fail("config", err)
		}
	}
	src, srcName, srcAttr := tc.ChatTemplate, b.Config, "config"
	if b.ChatTemplate != "" {
		data, err := inputfile.ReadFile(b.ChatTemplate, MaxFileSize)
		if err != nil {
			return nil, fail("chat_template", err)
		}
		src, srcName, srcAttr = string(data), b.ChatTemplate, "chat_template"
	}
	var tmpl *ChatTemplate
	if src != "" {
		var err error
		if tmpl, err = ParseChatTemplate(srcName, src, tc.BOS, tc.EOS); err != nil {
			return nil, fail(srcAttr, err)
		}
	}
	f, err := LoadFile(b.Path, tmpl)
	if err != nil {
		return nil, fail("path", err)
	}
	return f, nil
}

// rangePos is a range's start as file:line:col.
func rangePos(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}
