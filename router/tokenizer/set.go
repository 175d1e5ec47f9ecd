package tokenizer

import (
	"errors"
	"fmt"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/inputfile"
)

// Set holds the tokenizer of each model that has a `tokenizer` block.
// Its methods are safe for concurrent use (it is not modified after
// FromConfig).
type Set struct {
	byModel map[string]Tokenizer
}

// For returns model's tokenizer, or nil when the model has none (or s is
// nil): the caller then keys the prompt by characters, which Blocks does
// when given a nil Tokenizer.
func (s *Set) For(model string) Tokenizer {
	if s == nil {
		return nil
	}
	return s.byModel[model]
}

// FromConfig builds the tokenizers of a policy file's tokenizer blocks
// (config.PolicyFile.Tokenizers). Source "file" reads the block's
// tokenizer.json, tokenizer_config.json and chat template files now
// (regular files of at most MaxFileSize bytes, via router/inputfile);
// source "engine" makes an Engine with opts whose calls go to
// engine(model), which returns the base URL of a ready engine serving the
// model when called (engine may be nil when no block has source
// "engine"). Errors name the block's attribute as file:line:col and the
// model, for example `p.hcl:3:3: tokenizer "llama": path: tok.json: file
// too large: over the 64 MiB limit`; all blocks' errors are joined.
func FromConfig(blocks []config.Tokenizer, engine func(model string) EngineURL, opts EngineOptions) (*Set, error) {
	s := &Set{byModel: make(map[string]Tokenizer, len(blocks))}
	var errs []error
	for _, b := range blocks {
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
