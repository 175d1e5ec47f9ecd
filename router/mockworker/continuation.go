package mockworker

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// The generated text and vLLM's continuation protocol.
//
// The engine generates filler words, one per token: word j of
// FillerWords has the stable token id FillerTokenID+j (with or without
// Config.Tokenizer: the ids are the mock's own, above any real
// vocabulary). The words cycle, and the first generated word follows the
// context's end: a context ending with filler word j makes the answer
// start with word j+1, any other context with word 0. The context's end
// is
//
//   - completions, a text prompt: the filler word the text ends with;
//   - completions, a token-id prompt (or "prompt_token_ids"): the last id,
//     when it is a filler word's;
//   - chat with continue_final_message: the final message's content, which
//     is continued (no new assistant turn);
//   - chat starting a new assistant turn (the default), /v1/responses and
//     /v1/messages: none, word 0.
//
// So a request continued after k generated tokens — the original prompt
// plus the text (or token ids) generated so far, max_tokens reduced by k
// — generates exactly the rest of the uninterrupted answer, token for
// token and byte for byte: what a router migrating a cut stream sends
// (vLLM accepts both forms: token ids as the completions prompt, and
// continue_final_message on chat). A continuation after 0 tokens is the
// original request.

// FillerWords are the generated words, one per token, in order.
var FillerWords = [...]string{" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit"}

// FillerTokenID is the token id of FillerWords[0]; word j has id
// FillerTokenID+j. It is above any real vocabulary (2^20), so a prompt's
// own ids never read as generated words.
const FillerTokenID int64 = 1 << 20

// fillerIndex returns j when id is FillerWords[j]'s token id, else -1.
func fillerIndex(id int64) int {
	if id >= FillerTokenID && id < FillerTokenID+int64(len(FillerWords)) {
		return int(id - FillerTokenID)
	}
	return -1
}

// fillerSuffix returns the index of the filler word text ends with, or
// -1. No word is a suffix of another, so at most one matches.
func fillerSuffix(text string) int {
	for j, w := range FillerWords {
		if strings.HasSuffix(text, w) {
			return j
		}
	}
	return -1
}

// nextWord is the first word generated after a context ending with
// filler word j (-1: none).
func nextWord(j int) int { return (j + 1) % len(FillerWords) }

// wordAt is the word of the i-th generated token of an answer starting
// at word start.
func wordAt(start, i int) int { return (start + i) % len(FillerWords) }

// textFrom is the text of n generated tokens starting at word start.
func textFrom(start, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(FillerWords[wordAt(start, i)])
	}
	return b.String()
}

// idsFrom is the token ids of n generated tokens starting at word start.
func idsFrom(start, n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = FillerTokenID + int64(wordAt(start, i))
	}
	return ids
}

// splitFillerSuffix cuts text into the rest and its longest suffix of
// whole filler words, returned as their token ids. Linear in len(text).
func splitFillerSuffix(text string) (string, []int64) {
	var rev []int64
	for {
		j := fillerSuffix(text)
		if j < 0 {
			break
		}
		text = text[:len(text)-len(FillerWords[j])]
		rev = append(rev, FillerTokenID+int64(j))
	}
	for i, k := 0, len(rev)-1; i < k; i, k = i+1, k-1 {
		rev[i], rev[k] = rev[k], rev[i]
	}
	return text, rev
}

// syntheticIDs are the token ids reported (return_token_ids) for a text
// prompt without Config.Tokenizer: one per CharsPerToken bytes, as many
// as the prompt counts, each a hash of its bytes below FillerTokenID. A
// continuation sending them back with the generated ids counts the same
// prompt tokens plus the generated ones.
func syntheticIDs(text string, charsPerToken int) []int64 {
	n := max(1, prefix.EstimateTokens(text, charsPerToken))
	ids := make([]int64, n)
	for i := range ids {
		lo := min(i*charsPerToken, len(text))
		hi := min(lo+charsPerToken, len(text))
		h := fnv.New32a()
		_, _ = h.Write([]byte(text[lo:hi]))
		ids[i] = int64(h.Sum32()) % FillerTokenID
	}
	return ids
}

// continuedChatPrompt is the prompt of a chat request continuing its
// final message (continue_final_message): without a tokenizer the
// rendered text as for any chat request; with one, the ids of the
// messages before it with the generation prompt (the final message's
// header) followed by the final message's content, its trailing filler
// words as their ids and the rest encoded.
func (s *Server) continuedChatPrompt(ctx context.Context, msgs []prefix.ChatMessage, tools string) (prompt, *apiError) {
	if s.cfg.Tokenizer == nil {
		return prompt{text: prefix.RenderChatTools(tools, msgs)}, nil
	}
	last := msgs[len(msgs)-1]
	ids, aerr := s.encode(ctx, "", msgs[:len(msgs)-1], tools)
	if aerr != nil {
		return prompt{}, aerr
	}
	rest, filler := splitFillerSuffix(last.Content)
	if rest != "" {
		more, aerr := s.encode(ctx, rest, nil, "")
		if aerr != nil {
			return prompt{}, aerr
		}
		ids = append(ids, more...)
	}
	return prompt{ids: append(ids, filler...), useIDs: true}, nil
}

// checkGenerationPrompt applies vLLM's rules for continue_final_message
// and add_generation_prompt on chat: both true is vLLM's 400
// (ChatCompletionRequest.check_generation_prompt,
// vllm/entrypoints/openai/chat_completion/protocol.py@002032ee, which
// reads the raw body: add_generation_prompt defaults to true but only an
// explicit true conflicts); continuing needs a final assistant message
// (vLLM 0.29's frontend, chat_completions/convert.rs
// prepare_chat_request). It reports whether the final message is
// continued. add_generation_prompt false without continuing is not
// modelled (a 400).
func checkGenerationPrompt(req *genRequest) (bool, *apiError) {
	cont := req.ContinueFinalMessage != nil && *req.ContinueFinalMessage
	agp := req.AddGenerationPrompt
	switch {
	case cont && agp != nil && *agp:
		return false, vllmBadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "")
	case cont && (len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "assistant"):
		return false, vllmBadRequest("continue_final_message requires a final assistant message", "messages")
	case !cont && agp != nil && !*agp:
		return false, badRequest("add_generation_prompt false without continue_final_message is not supported by this mock engine")
	}
	return cont, nil
}

// vllmBadRequest is a 400 as vLLM answers a VLLMValidationError
// (create_error_response: type "BadRequestError", param the parameter,
// the message with " (parameter=P, value=V)" appended by the error's
// __str__ when it has them; vllm/exceptions.py).
func vllmBadRequest(msg, param string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", msg: msg, param: param}
}

// contextError is vLLM's refusal of a prompt of n tokens whose requested
// output m (the request's max_tokens or max_completion_tokens, named
// param; 0 for a chat request that set none) does not fit the model's
// context of l tokens (max_model_len): TokenizeParams.__post_init__ for
// m > l, else _token_len_check for n+m > l (vllm/renderers/params.py at
// 017638d7 and main as of v0.25.1, the message's wording there; param
// "input_tokens"). nil when it fits.
func contextError(n, m, l int, param string) *apiError {
	switch {
	case m > l:
		// vLLM's wording, its missing space and "max_total_tokens=" included.
		return vllmBadRequest(fmt.Sprintf("%s=%dcannot be greater than max_model_len=max_total_tokens=%d. Please request fewer output tokens. (parameter=%s, value=%d)",
			param, m, l, param, m), param)
	case n+m > l:
		return vllmBadRequest(fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)",
			l, m, n, n+m, n), "input_tokens")
	}
	return nil
}
