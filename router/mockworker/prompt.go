package mockworker

import (
	"context"

	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
)

// chatPrompt is the prompt of chat messages and tools (a JSON array, ""
// for none): with Config.Tokenizer the ids of the messages and tools
// rendered by its chat template with the generation prompt (vLLM's chat
// completions), else the text prefix.RenderChatTools renders.
func (s *Server) chatPrompt(ctx context.Context, msgs []prefix.ChatMessage, tools string) (prompt, *apiError) {
	if s.cfg.Tokenizer == nil {
		return prompt{text: prefix.RenderChatTools(tools, msgs)}, nil
	}
	ids, aerr := s.encode(ctx, "", msgs, tools)
	if aerr != nil {
		return prompt{}, aerr
	}
	return prompt{ids: ids, useIDs: true}, nil
}

// textPrompt tokenizes a text prompt with Config.Tokenizer (special
// tokens added, as vLLM's completions do); token ids and text without a
// tokenizer are returned as they are.
func (s *Server) textPrompt(ctx context.Context, p prompt) (prompt, *apiError) {
	if p.useIDs || s.cfg.Tokenizer == nil {
		return p, nil
	}
	ids, aerr := s.encode(ctx, p.text, nil, "")
	if aerr != nil {
		return prompt{}, aerr
	}
	return prompt{ids: ids, useIDs: true}, nil
}

// promptLen is the number of tokens p counts: its ids, else
// ceil(bytes/CharsPerToken) (at least 1).
func (s *Server) promptLen(p prompt) int {
	if p.useIDs {
		return len(p.ids)
	}
	return max(1, prefix.EstimateTokens(p.text, s.cfg.CharsPerToken))
}

// promptBlocks sets r's input length, block size and prefix hashes from
// p (token ids, or text hashed by bytes) for a request of LoRA adapter
// lora ("" for the base model) and cache salt salt, and returns p's ids
// (nil for text). A prompt of no tokens is a 400.
func (s *Server) promptBlocks(p prompt, lora, salt string, r *sim.Request) ([]int64, *apiError) {
	bs := s.cfg.Sim.BlockSize
	r.PrefixBlockTokens = bs
	var err error
	if p.useIDs {
		if len(p.ids) == 0 {
			return nil, badRequest("the prompt has no tokens")
		}
		r.InputLength = len(p.ids)
		r.PrefixHashes, err = s.hasher.tokenBlocks(p.ids, bs, lora, salt)
	} else {
		r.InputLength = s.promptLen(p)
		r.PrefixHashes, err = s.hasher.textBlocks(p.text, bs, s.cfg.CharsPerToken, lora, salt)
	}
	if err != nil {
		return nil, badRequest("%v", err)
	}
	if p.useIDs {
		return p.ids, nil
	}
	return nil, nil
}
