package mockworker

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// tokenizeRequest is vLLM's /tokenize body (TokenizeCompletionRequest or,
// with messages, TokenizeChatRequest); other fields are ignored.
type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
}

// handleTokenize serves POST /tokenize in vLLM's shape: {"model",
// "prompt"} (special tokens added) or {"model", "messages", "tools",
// "add_generation_prompt"} (the chat template, generation prompt added;
// messages read as chat completions read them, chatMessages),
// answered {"count", "max_model_len", "tokens", "token_strs": null} with the
// ids generation uses for the same prompt. The settings the Tokenizer
// interface cannot follow (add_special_tokens false for a prompt, true for
// messages; add_generation_prompt false) are a 400, as is a model other
// than Config.Model (404) and a body over 64 MiB (413). Without a
// tokenizer it answers 404.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Tokenizer == nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			msg: "this mock engine has no tokenizer (start it with --tokenizer FILE)"})
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req tokenizeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		writeError(w, badRequest("malformed JSON body: %v", err))
		return
	}
	if _, _, aerr := s.resolveModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	if s.cfg.Engine == EngineSGLang {
		s.sglangTokenize(w, r, &req)
		return
	}
	var (
		ids  []int64
		aerr *apiError
	)
	switch {
	case req.Messages != nil:
		if req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			writeError(w, badRequest("add_generation_prompt false is not supported by this mock engine"))
			return
		}
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
			writeError(w, badRequest("add_special_tokens true with messages is not supported by this mock engine"))
			return
		}
		var msgs []prefix.ChatMessage
		if msgs, aerr = chatMessages(req.Messages); aerr == nil {
			ids, aerr = s.encode(r.Context(), "", msgs, nonEmptyArray(req.Tools))
		}
	case req.Prompt != nil:
		if req.AddSpecialTokens != nil && !*req.AddSpecialTokens {
			writeError(w, badRequest("add_special_tokens false is not supported by this mock engine"))
			return
		}
		var prompt string
		if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
			writeError(w, badRequest("prompt must be a string"))
			return
		}
		ids, aerr = s.encode(r.Context(), prompt, nil, "")
	default:
		aerr = badRequest("prompt or messages is required")
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if ids == nil {
		ids = []int64{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"count": len(ids), "max_model_len": s.maxModelLen(), "tokens": ids, "token_strs": nil,
	})
}

// sglangTokenize answers /tokenize and /v1/tokenize as SGLang's
// OpenAIServingTokenize does (python/sglang/srt/entrypoints/openai/
// serving_tokenize.py@0351c1fa): {"prompt": str or [str],
// "add_special_tokens": true}, answered {"tokens", "count",
// "max_model_len"} (a list of each for a list of prompts). It takes no
// chat messages: a body without a prompt is a 400.
func (s *Server) sglangTokenize(w http.ResponseWriter, r *http.Request, req *tokenizeRequest) {
	if req.Prompt == nil || bytes.Equal(bytes.TrimSpace(req.Prompt), []byte("null")) {
		writeError(w, badRequest("prompt is required (SGLang's /tokenize takes a prompt, not chat messages)"))
		return
	}
	if req.AddSpecialTokens != nil && !*req.AddSpecialTokens {
		writeError(w, badRequest("add_special_tokens false is not supported by this mock engine"))
		return
	}
	var one string
	var many []string
	if err := json.Unmarshal(req.Prompt, &one); err != nil {
		if err := json.Unmarshal(req.Prompt, &many); err != nil {
			writeError(w, badRequest("prompt must be a string or a list of strings"))
			return
		}
	}
	answer := map[string]any{"max_model_len": s.maxModelLen()}
	if many == nil {
		ids, aerr := s.encode(r.Context(), one, nil, "")
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		if ids == nil {
			ids = []int64{}
		}
		answer["tokens"], answer["count"] = ids, len(ids)
	} else {
		tokens, counts := make([][]int64, len(many)), make([]int, len(many))
		for i, p := range many {
			ids, aerr := s.encode(r.Context(), p, nil, "")
			if aerr != nil {
				writeError(w, aerr)
				return
			}
			if ids == nil {
				ids = []int64{}
			}
			tokens[i], counts[i] = ids, len(ids)
		}
		answer["tokens"], answer["count"] = tokens, counts
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer)
}

// decoder is a tokenizer that can also turn ids back into text
// (tokenizer.File).
type decoder interface {
	Decode(ctx context.Context, ids []int64) (string, error)
}

// maxDetokenizeIDs bounds the ids of one /detokenize request.
const maxDetokenizeIDs = 1 << 20

// handleDetokenize serves POST /detokenize as vLLM's does
// (DetokenizeRequest {"model", "tokens"}, answered {"prompt"}): the text
// of the ids, the inverse of /tokenize. Without a tokenizer that decodes
// it answers 404, like /tokenize; ids outside the vocabulary are a 400.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	dec, ok := s.cfg.Tokenizer.(decoder)
	if !ok {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			msg: "this mock engine has no tokenizer that decodes (start it with --tokenizer FILE)"})
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Model  string   `json:"model"`
		Tokens *[]int64 `json:"tokens"`
	}
	if aerr := decodeBody(body, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if _, _, aerr := s.resolveModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.Tokens == nil {
		writeError(w, badRequest("tokens is required"))
		return
	}
	if len(*req.Tokens) > maxDetokenizeIDs {
		writeError(w, badRequest("%d tokens, more than %d", len(*req.Tokens), maxDetokenizeIDs))
		return
	}
	text, err := dec.Decode(r.Context(), *req.Tokens)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"prompt": text})
}
