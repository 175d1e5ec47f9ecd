// Package tokenizer turns a model's prompts into the token ids its engine
// computes, so that the router keys prefix blocks by tokens as the engine
// caches them (docs/design.md, "Precise prefix keys").
//
// Three sources, chosen per model (Set, NewSet): the policy file's
// `tokenizer "MODEL"` block (router/config) when the model has one, else
// the engine (a LoRA adapter takes its base model's tokenizer):
//
//   - Engine: the engine's own POST /tokenize, the default, with a cache
//     that answers exact repeats and splices a text prompt from a cached
//     prefix at a safe cut (see Engine), never another prompt's ids.
//   - File: a Hugging Face tokenizer.json, encoded in process, with the
//     model's Jinja chat template for chat requests.
//   - no tokenizer: character blocks (prefix.TextBlocks), for a block
//     with source "chars", a model no engine serves, or a tokenizer that
//     failed. Blocks picks it when given a nil Tokenizer; it is not a
//     Tokenizer because it yields no token ids.
//
// A request that already carries token ids (a completions prompt given as
// an array of ids) needs no tokenizer: the caller hashes the ids with
// prefix.TokenBlocks directly and does not call this package.
package tokenizer

import (
	"context"
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// Tokenizer encodes one model's prompts to token ids (int64, as the
// router's routing keys hold them). Implementations are safe for
// concurrent use; ctx bounds any blocking call (Engine's HTTP request).
type Tokenizer interface {
	// Encode returns the token ids the engine computes for a text prompt
	// (a /v1/completions prompt string), special tokens included as the
	// engine adds them (add_special_tokens=true, vLLM's and SGLang's
	// default: a BOS token for Llama-family tokenizers).
	Encode(ctx context.Context, prompt string) ([]int64, error)
	// EncodeChat returns the token ids the engine computes for a chat
	// request: the messages and tools (a JSON array of chat completions
	// tools, "" for none) rendered by the model's chat template with the
	// generation prompt added (add_generation_prompt=true), then tokenized
	// without adding special tokens again (the template writes them), as
	// vLLM's chat completions do.
	EncodeChat(ctx context.Context, msgs []prefix.ChatMessage, tools string) ([]int64, error)
}

// Errors callers branch on.
var (
	// ErrNoChatTemplate is returned by File.EncodeChat when the tokenizer
	// has no chat template (none configured and none in
	// tokenizer_config.json).
	ErrNoChatTemplate = errors.New("no chat template")
	// ErrEngine is wrapped by Engine's errors about the engine's answer:
	// a non-200 status, an answer too large, or one that is not the
	// /tokenize JSON shape.
	ErrEngine = errors.New("engine tokenize failed")
	// ErrNoEngine is wrapped when the engine chooser has no ready engine
	// serving the model.
	ErrNoEngine = errors.New("no engine to tokenize with")
	// ErrTooLong is returned by Blocks for a prompt longer than its
	// tokenizer takes (MaxPromptBytes).
	ErrTooLong = errors.New("prompt too long to tokenize")
)

// Prompt is a request's prompt as this package encodes it: a text prompt,
// or chat messages and the request's tools (when Messages is non-nil,
// Text is ignored).
type Prompt struct {
	Text     string
	Messages []prefix.ChatMessage
	// Tools is a chat request's tools, a JSON array of chat completions
	// tools ("" for none).
	Tools string
}

// Blocks returns the chained hashes of the prompt's full blocks of
// blockTokens tokens and the ids they were cut from. With a tokenizer, the
// ids are tok's and the hashes are prefix.TokenBlocks(ids, blockTokens).
// With tok == nil (no tokenizer configured for the model) it is the
// character fallback: ids is nil and the hashes are
// prefix.TextBlocks(text, blockTokens, charsPerToken) of the text prompt,
// or of prefix.RenderChatTools(tools, messages), as the router keyed prompts
// before tokenizers existed (serve's --chars-per-token, default
// prefix.DefaultCharsPerToken). Errors are tok's.
func Blocks(ctx context.Context, tok Tokenizer, p Prompt, blockTokens, charsPerToken int) (hashes []uint64, ids []int64, err error) {
	if tok == nil {
		text := p.Text
		if p.Messages != nil {
			text = prefix.RenderChatTools(p.Tools, p.Messages)
		}
		return prefix.TextBlocks(text, blockTokens, charsPerToken), nil, nil
	}
	n := len(p.Text)
	if p.Messages != nil {
		n = len(p.Tools)
		for _, m := range p.Messages {
			n += len(m.Role) + len(m.Content) + len(m.Name) + len(m.ToolCallID) + len(m.ToolCalls) + len(m.Reasoning)
		}
	}
	if limit := MaxPromptBytes(tok); n > limit {
		return nil, nil, fmt.Errorf("%w: %d bytes of text, over %d", ErrTooLong, n, limit)
	}
	if p.Messages != nil {
		ids, err = tok.EncodeChat(ctx, p.Messages, p.Tools)
	} else {
		ids, err = tok.Encode(ctx, p.Text)
	}
	if err != nil {
		return nil, nil, err
	}
	return prefix.TokenBlocks(ids, blockTokens), ids, nil
}

// Bounds of the prompt text Blocks tokenizes, by source: the in-process
// tokenizer.json costs this process 3 to 5 us per byte (sugarme/tokenizer,
// BENCHMARKS.md), so 256 KiB (about 64k tokens) is at most about a second
// of CPU; the engine's /tokenize runs Hugging Face's Rust tokenizer on the
// engine, and 4 MiB (about a million tokens) is beyond any model's
// context. A longer prompt is keyed by character blocks.
const (
	MaxFilePromptBytes   = 256 << 10
	MaxEnginePromptBytes = 4 << 20
)

// MaxPromptBytes is the longest prompt text, in bytes (chat: the
// messages' strings and the tools), that Blocks gives tok:
// MaxFilePromptBytes for a File, MaxEnginePromptBytes otherwise.
func MaxPromptBytes(tok Tokenizer) int {
	if _, ok := tok.(*File); ok {
		return MaxFilePromptBytes
	}
	return MaxEnginePromptBytes
}
