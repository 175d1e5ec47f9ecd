package mockworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
)

// genRequest is the subset of the OpenAI completions and chat completions
// request bodies the mock reads; other fields are ignored.
type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	PromptTokenIDs []int64 `json:"prompt_token_ids"`
	// CacheSalt is vLLM's cache_salt: when set, part of the first
	// block's hash, so the request hits only prompts salted alike.
	CacheSalt *string `json:"cache_salt"`
	// KVTransferParams is vLLM's disaggregated-serving field: see
	// kvTransferParams.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	// RoutedDPRank and DataParallelRank (deprecated) are SGLang's
	// request fields naming a data-parallel rank (see pickSGLang); vLLM
	// ignores them.
	RoutedDPRank     *int `json:"routed_dp_rank"`
	DataParallelRank *int `json:"data_parallel_rank"`
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's chat
	// fields (see checkGenerationPrompt); ReturnTokenIDs asks for the
	// prompt's and the answer's token ids (vLLM's return_token_ids).
	ContinueFinalMessage *bool `json:"continue_final_message"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ReturnTokenIDs       *bool `json:"return_token_ids"`

	// prefill: do_remote_decode, answer one token and the KV's
	// kv_transfer_params, not streamed.
	prefill bool
	// ids are the prompt's token ids, nil for text hashed by bytes.
	ids []int64
	// rendered, when not nil, are the chat messages of the prompt,
	// already converted from another API's input (Responses, Messages),
	// and tools their tools (a JSON array of chat completions tools, ""
	// for none).
	rendered []prefix.ChatMessage
	tools    string
	// lora is the LoRA adapter the model names ("" for the base model),
	// loraID its vLLM adapter id.
	lora   string
	loraID int64
	// start is the first generated word (see FillerWords): the
	// context's end.
	start int
	// text is the prompt's text when it has no ids (nil ids), for the
	// synthetic ids return_token_ids reports.
	text string
}

// kvTransferParams is the part of a request's kv_transfer_params the mock
// reads (vLLM's NixlConnector): do_remote_decode asks a prefill worker to
// compute the prompt's KV and keep it for a decode worker;
// do_remote_prefill tells a decode worker that the prompt's KV comes from
// a prefill worker. The remote_* fields are not read.
type kvTransferParams struct {
	DoRemoteDecode  bool `json:"do_remote_decode"`
	DoRemotePrefill bool `json:"do_remote_prefill"`
}

// kvTransferAnswer is the kv_transfer_params of a prefill answer: where a
// decode worker fetches the prompt's KV, in vLLM's NixlConnector fields.
type kvTransferAnswer struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// maxRemoteBlockIDs bounds the block ids of a prefill answer: a few are
// enough to show the hand-over (nothing fetches them).
const maxRemoteBlockIDs = 16

// chatMessage is the part of a chat message the mock renders: what
// vLLM's _parse_chat_message_content keeps (see chatMessages).
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       json.RawMessage `json:"name"`
	ToolCallID json.RawMessage `json:"tool_call_id"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	Reasoning  json.RawMessage `json:"reasoning"`
}

// jsonString returns raw decoded when it is a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// nonEmptyArray returns raw, as it was sent, when it is a JSON array with
// at least one element, else "": vLLM drops an empty tool_calls
// (_postprocess_messages) and a template tests an empty tools list as
// false.
func nonEmptyArray(raw json.RawMessage) string {
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return ""
	}
	return string(raw)
}

// apiError is an error answered in the OpenAI shape.
type apiError struct {
	status int
	typ    string
	msg    string
	// param is the request field at fault ("" for none: null).
	param string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", msg: fmt.Sprintf(format, args...)}
}

// writeError answers {"error": {"message", "type", "param", "code"}}, code
// being the HTTP status (as vLLM does).
func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	var param any
	if e.param != "" {
		param = e.param
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": e.msg, "type": e.typ, "param": param, "code": e.status,
	}})
}

// prompt is a parsed request's prompt: text or token ids.
type prompt struct {
	text   string
	ids    []int64
	useIDs bool
}

// parsePrompt reads the completions "prompt": a string, a one-element array
// of strings, token ids, or a one-element array of token-id arrays.
func parsePrompt(raw json.RawMessage) (prompt, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return prompt{}, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return prompt{text: s}, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return prompt{ids: ids, useIDs: true}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return prompt{}, badRequest("prompt: %d prompts in one request; the mock engine serves one", len(ss))
		}
		return prompt{text: ss[0]}, nil
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return prompt{}, badRequest("prompt: %d prompts in one request; the mock engine serves one", len(idss))
		}
		return prompt{ids: idss[0], useIDs: true}, nil
	}
	return prompt{}, badRequest("prompt must be a string, an array of token ids, or a one-element array of either")
}

// chatMessages reads messages for rendering; content is a string, null,
// or an array of parts whose text parts ("text", and the Responses API's
// "input_text" and "output_text", all text in vLLM's MM_PARSER_MAP) are
// joined by "\n", as vLLM joins them for a chat template that takes
// string content (vllm/entrypoints/chat_utils.py,
// _parse_chat_message_content_parts). Beside the content it keeps what
// _parse_chat_message_content passes the template (chat_utils.py at
// 001eadcf): a string "name" of any message; an assistant's "tool_calls"
// (a non-empty array, as sent) and string "reasoning"; a tool message's
// string "tool_call_id".
func chatMessages(msgs []chatMessage) ([]prefix.ChatMessage, *apiError) {
	out := make([]prefix.ChatMessage, len(msgs))
	for i, m := range msgs {
		out[i].Role = m.Role
		out[i].Name, _ = jsonString(m.Name)
		switch m.Role {
		case "assistant":
			out[i].ToolCalls = nonEmptyArray(m.ToolCalls)
			out[i].Reasoning, out[i].HasReasoning = jsonString(m.Reasoning)
		case "tool":
			out[i].ToolCallID, _ = jsonString(m.ToolCallID)
		}
		raw := bytes.TrimSpace(m.Content)
		if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
			continue
		}
		if json.Unmarshal(raw, &out[i].Content) == nil {
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return nil, badRequest("messages[%d].content must be a string or an array of content parts", i)
		}
		var b strings.Builder
		for _, p := range parts {
			if isTextPart(p.Type) {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(p.Text)
			}
		}
		out[i].Content = b.String()
	}
	return out, nil
}

// isTextPart reports whether a content part of type typ is text to vLLM.
func isTextPart(typ string) bool {
	return typ == "text" || typ == "input_text" || typ == "output_text"
}

// encode tokenizes a text prompt (chat messages and tools when msgs is
// non-nil) with the configured tokenizer: special tokens added to a text
// prompt, the chat template with its generation prompt for messages, as
// vLLM's completions and chat completions do. A text prompt's trailing
// filler words are the mock's own tokens (FillerTokenID), one each.
func (s *Server) encode(ctx context.Context, text string, msgs []prefix.ChatMessage, tools string) ([]int64, *apiError) {
	var (
		ids []int64
		err error
	)
	var filler []int64
	if msgs != nil {
		ids, err = s.cfg.Tokenizer.EncodeChat(ctx, msgs, tools)
	} else {
		// Generated words are one token each (FillerTokenID): a prompt
		// ending with them (a continuation) counts them so.
		text, filler = splitFillerSuffix(text)
		ids, err = s.cfg.Tokenizer.Encode(ctx, text)
	}
	if err != nil {
		return nil, badRequest("tokenizing the prompt: %v", err)
	}
	return append(ids, filler...), nil
}

// parse decodes and validates a request body into the simulated request.
func (s *Server) parse(ctx context.Context, body []byte, chat bool) (*genRequest, sim.Request, *apiError) {
	var req genRequest
	if aerr := decodeBody(body, &req); aerr != nil {
		return nil, sim.Request{}, aerr
	}
	r, aerr := s.prepare(ctx, &req, chat)
	if aerr != nil {
		return nil, sim.Request{}, aerr
	}
	return &req, r, nil
}

// decodeBody decodes one JSON object from body into v; a second value
// after it is an error, as is malformed JSON (400 in the OpenAI shape).
func decodeBody(body []byte, v any) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return badRequest("malformed JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("malformed JSON body: data after the JSON object")
	}
	return nil
}

// prepare validates a decoded generation request and makes its simulated
// request: the model (LoRA), the cache salt, the prompt (req.rendered when
// set, else token ids, chat messages or the completions prompt), the
// output length and the disaggregation parameters.
func (s *Server) prepare(ctx context.Context, req *genRequest, chat bool) (sim.Request, *apiError) {
	var aerr *apiError
	if req.lora, req.loraID, aerr = s.resolveModel(req.Model); aerr != nil {
		return sim.Request{}, aerr
	}
	salt := ""
	if req.CacheSalt != nil {
		// vLLM's check_cache_salt_support.
		if *req.CacheSalt == "" {
			return sim.Request{}, badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		if len(*req.CacheSalt) > maxCacheSaltBytes {
			return sim.Request{}, badRequest("cache_salt of %d bytes, over %d", len(*req.CacheSalt), maxCacheSaltBytes)
		}
		salt = *req.CacheSalt
	}
	var p prompt
	req.start = 0
	switch {
	case req.rendered != nil:
		if p, aerr = s.chatPrompt(ctx, req.rendered, req.tools); aerr != nil {
			return sim.Request{}, aerr
		}
	case req.PromptTokenIDs != nil:
		p = prompt{ids: req.PromptTokenIDs, useIDs: true}
		if n := len(p.ids); n > 0 {
			req.start = nextWord(fillerIndex(p.ids[n-1]))
		}
	case chat:
		if len(req.Messages) == 0 {
			return sim.Request{}, badRequest("messages is required and must not be empty")
		}
		cont, aerr := checkGenerationPrompt(req)
		if aerr != nil {
			return sim.Request{}, aerr
		}
		msgs, err := chatMessages(req.Messages)
		if err != nil {
			return sim.Request{}, err
		}
		if cont {
			req.start = nextWord(fillerSuffix(msgs[len(msgs)-1].Content))
			p, aerr = s.continuedChatPrompt(ctx, msgs, nonEmptyArray(req.Tools))
		} else {
			p, aerr = s.chatPrompt(ctx, msgs, nonEmptyArray(req.Tools))
		}
		if aerr != nil {
			return sim.Request{}, aerr
		}
	default:
		if p, aerr = parsePrompt(req.Prompt); aerr != nil {
			return sim.Request{}, aerr
		}
		if p.useIDs {
			if n := len(p.ids); n > 0 {
				req.start = nextWord(fillerIndex(p.ids[n-1]))
			}
		} else {
			req.start = nextWord(fillerSuffix(p.text))
		}
		if p, aerr = s.textPrompt(ctx, p); aerr != nil {
			return sim.Request{}, aerr
		}
	}
	out := s.cfg.DefaultMaxTokens
	// asked is the output vLLM checks against the context (0 for a chat
	// request that set none: vLLM fills the rest of the context), param
	// its field.
	asked, param := out, "max_tokens"
	if chat {
		asked = 0
	}
	if req.MaxTokens != nil {
		out, asked = *req.MaxTokens, *req.MaxTokens
	}
	if chat && req.MaxCompletionTokens != nil {
		out, asked, param = *req.MaxCompletionTokens, *req.MaxCompletionTokens, "max_completion_tokens"
	}
	if out < 1 {
		return sim.Request{}, badRequest("max_tokens must be at least 1, got %d", out)
	}
	r := sim.Request{OutputLength: out}
	if kv := bytes.TrimSpace(req.KVTransferParams); len(kv) > 0 && !bytes.Equal(kv, []byte("null")) {
		var p kvTransferParams
		if err := json.Unmarshal(kv, &p); err != nil {
			return sim.Request{}, badRequest("kv_transfer_params must be an object with boolean do_remote_decode and do_remote_prefill: %v", err)
		}
		switch {
		case p.DoRemoteDecode && p.DoRemotePrefill:
			return sim.Request{}, badRequest("kv_transfer_params: do_remote_decode and do_remote_prefill are both true")
		case p.DoRemoteDecode:
			// A prefill: one token, answered whole with the KV's address.
			req.prefill, req.Stream, r.OutputLength = true, false, 1
		case p.DoRemotePrefill:
			// A decode: the prompt's KV arrived from a prefill worker.
			r.KVTransferred = true
		}
	}
	ids, aerr := s.promptBlocks(p, req.lora, salt, &r)
	if aerr != nil {
		return sim.Request{}, aerr
	}
	if aerr := contextError(r.InputLength, asked, s.maxModelLen(), param); aerr != nil {
		return sim.Request{}, aerr
	}
	req.ids, req.text = ids, p.text
	return r, nil
}

// resolveModel is the LoRA adapter a request's model names ("" and 0 for
// the base model), or a 404 for a model this engine does not serve.
func (s *Server) resolveModel(model string) (string, int64, *apiError) {
	if id, ok := s.lora[model]; ok {
		return model, id, nil
	}
	if s.cfg.Model != "" && model != "" && model != s.cfg.Model {
		return "", 0, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			msg: fmt.Sprintf("The model `%s` does not exist; this engine serves `%s`.", untrusted.Text(model, 256), s.cfg.Model)}
	}
	return "", 0, nil
}

// handleModels serves GET /v1/models as vLLM's
// OpenAIServingModels.show_available_models does (ModelCard,
// vllm/entrypoints/openai/engine/protocol.py@d7e52523): the base model
// (root the model, parent null, max_model_len), then each LoRA adapter
// (id its name, root its path, parent the base model, max_model_len
// null), each with one ModelPermission. SGLang's cards
// (http_server.py@0025436e available_models) have the same fields.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	owner := "vllm"
	if s.cfg.Engine == EngineSGLang {
		owner = "sglang"
	}
	data := []any{map[string]any{
		"id": s.model, "object": "model", "created": s.created, "owned_by": owner,
		"root": s.model, "parent": nil, "max_model_len": s.maxModelLen(), "permission": []any{s.permission()},
	}}
	for _, name := range s.cfg.LoRA {
		data = append(data, map[string]any{
			"id": name, "object": "model", "created": s.created, "owned_by": owner,
			"root": loraPath(name), "parent": s.model, "max_model_len": nil, "permission": []any{s.permission()},
		})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// permission is vLLM's default ModelPermission.
func (s *Server) permission() map[string]any {
	return map[string]any{
		"id": randomID("modelperm-"), "object": "model_permission", "created": s.created,
		"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
		"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
		"organization": "*", "group": nil, "is_blocking": false,
	}
}

// loraPath is the path an adapter is listed with (vLLM: the path it was
// loaded from).
func loraPath(name string) string { return "/mock/lora/" + name }

// token is the i-th word of an answer starting at word 0 (a new turn:
// /v1/responses, /v1/messages).
func token(i int) string { return FillerWords[i%len(FillerWords)] }

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 6, 64) }

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// readBody reads r's body, at most maxBodyBytes; on an error it answers
// (413 over the bound, else 400) and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
				msg: fmt.Sprintf("request body over %d bytes", mbe.Limit)})
			return nil, false
		}
		writeError(w, badRequest("reading the request body: %v", err))
		return nil, false
	}
	return body, true
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	req, sr, perr := s.parse(r.Context(), body, chat)
	if perr != nil {
		writeError(w, perr)
		return
	}
	fault, perr := requestFault(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	eng, a, ok := s.begin(w, r, req, sr)
	if !ok {
		return
	}
	finished := false
	defer func() {
		if !finished && a.id != 0 {
			eng.abort(a.id) // client gone, write failed or shutdown
		}
	}()
	g := generation{s: s, eng: eng, w: w, a: a, chat: chat, sr: sr, created: time.Now().Unix(), start: req.start, fault: fault}
	defer func() {
		if g.conn != nil {
			g.conn.close() // an answer framed by the connection's close
		}
	}()
	if req.ReturnTokenIDs != nil && *req.ReturnTokenIDs {
		g.promptIDs = req.ids
		if g.promptIDs == nil {
			g.promptIDs = syntheticIDs(req.text, s.cfg.CharsPerToken)
		}
	}
	if req.prefill {
		g.kv = s.kvAnswer(r, sr)
	}
	if req.Model != "" {
		g.model = req.Model
	} else {
		g.model = s.model
	}
	if chat {
		g.id = "chatcmpl-mock-" + strconv.FormatInt(s.seq.Add(1), 10)
	} else {
		g.id = "cmpl-mock-" + strconv.FormatInt(s.seq.Add(1), 10)
	}
	if req.Stream {
		finished = g.stream(r, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	} else {
		finished = g.complete(r)
	}
	if !finished && r.Context().Err() != nil {
		// The client is gone (or half-closed): cut the connection rather
		// than let net/http send an empty 200 or end a stream cleanly. The
		// deferred abort still releases the simulated request.
		panic(http.ErrAbortHandler)
	}
}

// begin picks the rank serving req (see pickEngine) and submits its
// simulated request sr there, answering the error itself (false) when the
// request cannot run: a rank out of range, a prompt that never fits the KV
// cache (400), a closed engine (503). A decode request of one token
// (its KV and token transferred) is done at once. The caller aborts the
// returned request (eng.abort(a.id), when a.id is not 0) unless it
// finished.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, req *genRequest, sr sim.Request) (*engine, *active, bool) {
	eng, perr := s.pickEngine(r, req)
	if perr != nil {
		writeError(w, perr)
		return nil, nil, false
	}
	a := &active{prompt: sr.InputLength, output: sr.OutputLength, transferred: sr.KVTransferred, ids: req.ids,
		lora: req.lora, loraID: req.loraID, notify: make(chan struct{}, 1)}
	if req.CacheSalt != nil {
		a.salt = *req.CacheSalt
	}
	w.Header().Set("x-mock-dp-rank", strconv.Itoa(eng.rank))
	if sr.KVTransferred && sr.OutputLength == 1 {
		// The one token was sampled by the prefill worker: nothing to
		// compute here (the engine takes transferred requests of 2 tokens
		// or more).
		now := eng.simNow()
		a.submitAt, a.times, a.done = now, []time.Duration{now}, true
	} else if err := eng.submitPicked(a, sr); err != nil {
		writeError(w, s.submitError(err, sr))
		return nil, nil, false
	}
	return eng, a, true
}

// submitError is the answer to a request the engine refused.
func (s *Server) submitError(err error, sr sim.Request) *apiError {
	switch {
	case errors.Is(err, sim.ErrRequestTooLarge):
		return badRequest("prompt of %d tokens plus max_tokens %d does not fit the KV cache of %d tokens (%d blocks of %d)",
			sr.InputLength, sr.OutputLength, s.cfg.Sim.TotalKVBlocks*s.cfg.Sim.BlockSize, s.cfg.Sim.TotalKVBlocks, s.cfg.Sim.BlockSize)
	case errors.Is(err, errClosed):
		return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()}
	default:
		return badRequest("%v", err)
	}
}

// chunk is a streamed response chunk, in the OpenAI chunk format plus the
// simulated time its token was produced.
//
// With return_token_ids, fields sit where vLLM's protocol puts them
// (vllm/entrypoints/openai/chat_completion/protocol.py and
// completion/protocol.py@002032ee): a chat chunk carries the prompt's ids
// as the chunk's own prompt_token_ids (ChatCompletionStreamResponse), in
// its first chunk only; a completions chunk carries them in its choice
// (CompletionResponseStreamChoice), first chunk only; both carry the
// chunk's generated ids as the choice's token_ids.
type chunk struct {
	ID             string   `json:"id"`
	Object         string   `json:"object"`
	Created        int64    `json:"created"`
	Model          string   `json:"model"`
	Choices        []choice `json:"choices"`
	Usage          *usage   `json:"usage,omitempty"`
	PromptTokenIDs []int64  `json:"prompt_token_ids,omitempty"`
	SimSeconds     *float64 `json:"x_mock_sim_seconds,omitempty"`
}

// choice is one choice of a chunk: Text for completions, Delta for chat.
type choice struct {
	Index          int     `json:"index"`
	Text           *string `json:"text,omitempty"`
	Delta          *delta  `json:"delta,omitempty"`
	Logprobs       any     `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	PromptTokenIDs []int64 `json:"prompt_token_ids,omitempty"`
	TokenIDs       []int64 `json:"token_ids,omitempty"`
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

var finishLength = "length"

// generation is one request being answered.
type generation struct {
	s       *Server
	eng     *engine // the rank serving it
	w       http.ResponseWriter
	a       *active
	sr      sim.Request
	chat    bool
	id      string
	model   string
	created int64
	// kv is a prefill answer's kv_transfer_params; nil otherwise.
	kv *kvTransferAnswer
	// start is the first generated word (FillerWords).
	start int
	// promptIDs, when not nil, are the prompt's token ids to report
	// with the answer's (return_token_ids).
	promptIDs []int64
	// fault is the request's own fault (FaultHeader); nil for none.
	fault *Fault
	// conn, when not nil, is the taken-over connection an answer framed
	// by its close is written on (g.w is conn); gone is closed when its
	// client leaves.
	conn *closeWriter
	gone <-chan struct{}
}

// kvAnswer is the kv_transfer_params of a prefill request's answer: this
// engine's id, the ids of the engine blocks holding the prompt (at most
// maxRemoteBlockIDs, unique across the server's answers), and the address
// the request came in on.
func (s *Server) kvAnswer(r *http.Request, sr sim.Request) *kvTransferAnswer {
	n := min((sr.InputLength+s.cfg.Sim.BlockSize-1)/s.cfg.Sim.BlockSize, maxRemoteBlockIDs)
	first := s.blocks.Add(int64(n)) - int64(n)
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = first + int64(i)
	}
	host, port := listenAddr(r)
	return &kvTransferAnswer{DoRemotePrefill: true, RemoteEngineID: s.engineID, RemoteBlockIDs: ids,
		RemoteHost: host, RemotePort: port, TPSize: 1}
}

// listenAddr is the host and port the request came in on: the
// connection's local address, else the Host header's; port 0 when unknown.
func listenAddr(r *http.Request) (string, int) {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		return a.IP.String(), a.Port
	}
	host, p, err := net.SplitHostPort(r.Host)
	if err != nil {
		return r.Host, 0
	}
	port, _ := strconv.Atoi(p)
	return host, port
}

func (g *generation) usage(cached int) usage {
	u := usage{PromptTokens: g.sr.InputLength, CompletionTokens: g.sr.OutputLength,
		TotalTokens: g.sr.InputLength + g.sr.OutputLength}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

// wait blocks until there is news for the request; false if the client
// left or the engine stopped.
func (g *generation) wait(r *http.Request) bool {
	select {
	case <-g.a.notify:
		return true
	case <-r.Context().Done():
		return false
	case <-g.gone:
		return false
	case <-g.eng.done:
		return false
	}
}

// waitAll waits until all the request's tokens are produced and returns
// its progress; false when the client left or the engine stopped (then,
// with the client still there, it answers 503).
func (g *generation) waitAll(r *http.Request) (progress, bool) {
	for {
		if p := g.a.since(0); p.done {
			return p, true
		}
		if !g.wait(r) {
			if p := g.a.since(0); p.done {
				return p, true
			}
			if r.Context().Err() == nil {
				writeError(g.w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errClosed.Error()})
			}
			return progress{}, false
		}
	}
}

// text is the generated text of n tokens, the filler words.
func text(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(token(i))
	}
	return b.String()
}

// setDoneHeaders sets the x-mock headers of a non-streamed answer.
func setDoneHeaders(h http.Header, p progress) {
	h.Set("Content-Type", "application/json")
	h.Set("x-mock-cached-tokens", strconv.Itoa(p.cached))
	h.Set("x-mock-ttft-seconds", seconds(p.times[0]-p.submitAt))
	h.Set("x-mock-latency-seconds", seconds(p.times[len(p.times)-1]-p.submitAt))
}

// streamTokens answers a streamed request as events written to buf: head
// once, with the first token (after the headers are set and sent: use it
// for the opening events), tok for each token (its index), tail once all
// are produced; each batch is written and flushed. It reports whether
// the request finished in the engine.
func (g *generation) streamTokens(r *http.Request, buf *bytes.Buffer, head func(p progress), tok func(i int, at time.Duration), tail func(p progress)) bool {
	rc := http.NewResponseController(g.w)
	sent := 0
	for {
		p := g.a.since(sent)
		buf.Reset()
		if sent == 0 && len(p.times) > 0 {
			h := g.w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("x-mock-cached-tokens", strconv.Itoa(p.cached))
			h.Set("x-mock-ttft-seconds", seconds(p.times[0]-p.submitAt))
			g.w.WriteHeader(http.StatusOK)
			head(p)
		}
		for _, at := range p.times {
			tok(sent, at)
			sent++
		}
		if p.done {
			tail(p)
		}
		if buf.Len() > 0 {
			if _, err := g.w.Write(buf.Bytes()); err != nil {
				return p.done
			}
			if err := rc.Flush(); err != nil {
				return p.done
			}
		}
		if p.done {
			return true
		}
		if !g.wait(r) {
			if sent == 0 && r.Context().Err() == nil {
				writeError(g.w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errClosed.Error()})
			}
			return false
		}
	}
}

// complete answers a non-streamed request once all tokens are produced.
// It reports whether the request finished in the engine.
func (g *generation) complete(r *http.Request) bool {
	if g.closeFraming() {
		g.frameByClose(r)
	}
	var p progress
	for {
		p = g.a.since(0)
		if f := g.faultNow(len(p.times)); f != nil {
			g.fire(r, f, nil, false, false)
			return false
		}
		if p.done {
			break
		}
		if !g.wait(r) {
			if p = g.a.since(0); p.done {
				break
			}
			if r.Context().Err() == nil {
				writeError(g.w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errClosed.Error()})
			}
			return false
		}
	}
	out := textFrom(g.start, g.sr.OutputLength)
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length"}
	object := "text_completion"
	if g.chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": out}
	} else {
		choice["text"] = out
	}
	setDoneHeaders(g.w.Header(), p)
	answer := map[string]any{
		"id": g.id, "object": object, "created": g.created, "model": g.model,
		"choices": []any{choice}, "usage": g.usage(p.cached),
	}
	if g.promptIDs != nil {
		// vLLM: the answer's ids in the choice; the prompt's at the top
		// of a chat answer (ChatCompletionResponse), in the choice of a
		// completions one (CompletionResponseChoice).
		choice["token_ids"] = idsFrom(g.start, g.sr.OutputLength)
		if g.chat {
			answer["prompt_token_ids"] = g.promptIDs
		} else {
			choice["prompt_token_ids"] = g.promptIDs
		}
	}
	if g.kv != nil {
		answer["kv_transfer_params"] = g.kv
	}
	_ = json.NewEncoder(g.w).Encode(answer)
	return true
}

// stream answers a streamed request: headers with the first token, one SSE
// chunk per token, an optional usage chunk, then [DONE]. It reports whether
// the request finished in the engine.
func (g *generation) stream(r *http.Request, includeUsage bool) bool {
	rc := http.NewResponseController(g.w)
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	ck := chunk{ID: g.id, Object: object, Created: g.created, Model: g.model, Choices: make([]choice, 0, 1)}
	sent := 0
	for {
		p := g.a.since(sent)
		buf.Reset()
		for _, at := range p.times {
			if f := g.faultNow(sent); f != nil {
				g.fire(r, f, buf.Bytes(), true, sent > 0)
				return false
			}
			if sent == 0 {
				if g.closeFraming() {
					g.frameByClose(r)
					rc = http.NewResponseController(g.w)
				}
				g.streamHeaders(p)
			}
			c := choice{}
			if sent == g.sr.OutputLength-1 {
				c.FinishReason = &finishLength
			}
			word := wordAt(g.start, sent)
			tok := FillerWords[word]
			if g.chat {
				c.Delta = &delta{Content: tok}
				if sent == 0 {
					c.Delta.Role = "assistant"
				}
			} else {
				c.Text = &tok
			}
			ck.PromptTokenIDs = nil
			if g.promptIDs != nil {
				c.TokenIDs = []int64{FillerTokenID + int64(word)}
				if sent == 0 && g.chat {
					ck.PromptTokenIDs = g.promptIDs
				} else if sent == 0 {
					c.PromptTokenIDs = g.promptIDs
				}
			}
			sim := at.Seconds()
			ck.Choices, ck.SimSeconds = append(ck.Choices[:0], c), &sim
			buf.WriteString("data: ")
			_ = enc.Encode(&ck)
			buf.WriteString("\n")
			sent++
		}
		if p.done {
			if includeUsage {
				u := g.usage(p.cached)
				ck.Choices, ck.SimSeconds, ck.Usage, ck.PromptTokenIDs = ck.Choices[:0], nil, &u, nil
				buf.WriteString("data: ")
				_ = enc.Encode(&ck)
				buf.WriteString("\n")
			}
			buf.WriteString("data: [DONE]\n\n")
		}
		if buf.Len() > 0 {
			if _, err := g.w.Write(buf.Bytes()); err != nil {
				return p.done
			}
			if err := rc.Flush(); err != nil {
				return p.done
			}
		}
		if p.done {
			return true
		}
		if !g.wait(r) {
			if sent == 0 && r.Context().Err() == nil {
				writeError(g.w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errClosed.Error()})
			}
			return false
		}
	}
}
