package mockworker

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// The OpenAI Responses API as vLLM serves it. Sources, vllm-project/vllm:
// vllm/entrypoints/openai/responses/api_router.py@f6e93254 (routes, SSE
// framing "event: TYPE\ndata: JSON\n\n"), responses/serving.py@4d89a999
// (create_responses, the store, retrieve_responses, cancel_responses,
// _make_not_found_error, responses_stream_generator, usage),
// responses/simple_streaming_events.py@90d7b6b8 (the event sequence of a
// text answer), responses/utils.py@d0ac5791 (construct_input_messages)
// and responses/protocol.py@c0bc5965 (ResponsesRequest,
// ResponsesResponse.from_request, ResponseUsage).

// Bounds of the per-Server response store (vLLM's is unbounded: "this may
// cause a memory leak since we never remove responses from the store").
const (
	// maxStoredResponses bounds the responses kept; the oldest goes first.
	maxStoredResponses = 4096
	// maxStoreBytes bounds the bytes of the responses and conversations
	// kept (each counted by its encoded answer and message text).
	maxStoreBytes = 64 << 20
	// maxResponseIDBytes bounds a request_id (the response's id).
	maxResponseIDBytes = 256
	// maxInputItems bounds the items of a Responses input.
	maxInputItems = 65536
)

// responsesRequest is the part of vLLM's ResponsesRequest the mock reads;
// the raw fields are echoed in the answer as given.
type responsesRequest struct {
	Model                 *string         `json:"model"`
	Input                 json.RawMessage `json:"input"`
	Instructions          *string         `json:"instructions"`
	MaxOutputTokens       *int            `json:"max_output_tokens"`
	PreviousResponseID    *string         `json:"previous_response_id"`
	PreviousInputMessages json.RawMessage `json:"previous_input_messages"`
	Prompt                json.RawMessage `json:"prompt"`
	Store                 *bool           `json:"store"`
	Stream                *bool           `json:"stream"`
	Background            *bool           `json:"background"`
	CacheSalt             *string         `json:"cache_salt"`
	RequestID             *string         `json:"request_id"`
	Temperature           *float64        `json:"temperature"`
	TopP                  *float64        `json:"top_p"`
	Metadata              json.RawMessage `json:"metadata"`
	Text                  json.RawMessage `json:"text"`
	Reasoning             json.RawMessage `json:"reasoning"`
	ToolChoice            json.RawMessage `json:"tool_choice"`
	Tools                 json.RawMessage `json:"tools"`
	User                  *string         `json:"user"`
	MaxToolCalls          *int            `json:"max_tool_calls"`
	ParallelToolCalls     *bool           `json:"parallel_tool_calls"`
	ServiceTier           *string         `json:"service_tier"`
	Truncation            *string         `json:"truncation"`
	// KVTransferParams is vLLM's disaggregated-serving field
	// (ResponsesRequest.kv_transfer_params, vLLM pull request 37424),
	// read as on chat: see kvTransferParams.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// responseUsage is vLLM's ResponseUsage.
type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens        int   `json:"cached_tokens"`
		InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
		CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens         int   `json:"reasoning_tokens"`
		ToolOutputTokens        int   `json:"tool_output_tokens"`
		OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
		ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// outputText is an output_text content part (OpenAI's ResponseOutputText).
type outputText struct {
	Annotations []any  `json:"annotations"`
	Text        string `json:"text"`
	Type        string `json:"type"`
	Logprobs    []any  `json:"logprobs"`
}

// outputMessage is a message output item (OpenAI's ResponseOutputMessage).
type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

// responseBody is vLLM's ResponsesResponse, in its field order.
type responseBody struct {
	ID                 string          `json:"id"`
	CreatedAt          int64           `json:"created_at"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	Object             string          `json:"object"`
	Output             []outputMessage `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	Temperature        float64         `json:"temperature"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopP               float64         `json:"top_p"`
	Background         bool            `json:"background"`
	MaxOutputTokens    int             `json:"max_output_tokens"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Prompt             json.RawMessage `json:"prompt"`
	Reasoning          json.RawMessage `json:"reasoning"`
	ServiceTier        string          `json:"service_tier"`
	Status             string          `json:"status"`
	Text               json.RawMessage `json:"text"`
	TopLogprobs        *int            `json:"top_logprobs"`
	Truncation         string          `json:"truncation"`
	Usage              *responseUsage  `json:"usage"`
	User               *string         `json:"user"`
	InputMessages      any             `json:"input_messages"`
	OutputMessages     any             `json:"output_messages"`
	// KVTransferParams is a prefill's answer (do_remote_decode): where
	// the prompt's KV is, on the finished response only (vLLM's
	// responses_full_generator sets it from the engine's output; the
	// mock leaves it out of other answers, as on chat).
	KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"`
}

// storedResponse is one response of the store: its answer and the
// conversation it continues (vLLM's response_store and msg_store).
type storedResponse struct {
	body json.RawMessage
	// msgs are the request's input messages (the whole conversation
	// before its answer); output is its answer's text.
	msgs   []prefix.ChatMessage
	output string
	size   int
}

// responseStore is the bounded store of the responses a Server answered
// with store true: by id, evicted oldest first past maxStoredResponses or
// maxStoreBytes.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order []string // ids, oldest first
	bytes int
}

func (st *responseStore) get(id string) *storedResponse {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.byID[id]
}

func (st *responseStore) put(id string, r *storedResponse) {
	r.size = len(r.body) + len(r.output)
	for _, m := range r.msgs {
		r.size += len(m.Role) + len(m.Content) + len(m.Name) + len(m.ToolCallID) + len(m.ToolCalls) + len(m.Reasoning)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = make(map[string]*storedResponse)
	}
	if old := st.byID[id]; old != nil {
		st.bytes -= old.size
		st.order = removeID(st.order, id)
	}
	st.byID[id] = r
	st.order = append(st.order, id)
	st.bytes += r.size
	for len(st.order) > 1 && (len(st.order) > maxStoredResponses || st.bytes > maxStoreBytes) {
		oldest := st.order[0]
		st.order = st.order[1:]
		st.bytes -= st.byID[oldest].size
		delete(st.byID, oldest)
	}
}

// removeID removes id from ids (a request_id reused: linear, rare).
func removeID(ids []string, id string) []string {
	for i, x := range ids {
		if x == id {
			return append(ids[:i], ids[i+1:]...)
		}
	}
	return ids
}

// randomID is prefix and 32 random hex digits (vLLM's random_uuid).
func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// responseNotFound is vLLM's _make_not_found_error.
func responseNotFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "response_id",
		msg: fmt.Sprintf("Response with id '%s' not found.", untrusted.Text(id, maxResponseIDBytes))}
}

// responseMessages converts a Responses request into chat messages as
// vLLM's construct_input_messages does: the instructions as a system
// message, then, continuing prev, its conversation and its output as an
// assistant message, then the input (a string: one user message; else its
// items, see inputItems).
func responseMessages(instructions *string, input json.RawMessage, prev *storedResponse) ([]prefix.ChatMessage, *apiError) {
	var msgs []prefix.ChatMessage
	if instructions != nil && *instructions != "" {
		msgs = append(msgs, prefix.ChatMessage{Role: "system", Content: *instructions})
	}
	if prev != nil {
		msgs = append(msgs, prev.msgs...)
		msgs = append(msgs, prefix.ChatMessage{Role: "assistant", Content: prev.output})
	}
	raw := bytes.TrimSpace(input)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input", msg: "input is required"}
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return append(msgs, prefix.ChatMessage{Role: "user", Content: s}), nil
	}
	items, aerr := inputItems(raw)
	if aerr != nil {
		return nil, aerr
	}
	return append(msgs, items...), nil
}

// inputItem is the part of a Responses input item the mock reads.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Output    json.RawMessage `json:"output"`
	CallID    *string         `json:"call_id"`
	Name      *string         `json:"name"`
	Arguments *string         `json:"arguments"`
	Summary   json.RawMessage `json:"summary"`
}

// responsesToolCall is a chat completions tool call as vLLM builds it
// from a function_call item: ChatCompletionMessageToolCallParam(id=,
// function=, type=), in that key order.
type responsesToolCall struct {
	ID       string       `json:"id"`
	Function toolFunction `json:"function"`
	Type     string       `json:"type"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// inputItems converts a Responses input array into chat messages as
// vLLM's construct_chat_messages_with_tool_call and
// _construct_message_from_response_item do
// (vllm/entrypoints/openai/responses/utils.py@01ca842d): a function_call
// is a tool call of the assistant message before it, or of a new
// assistant message without content; a reasoning item's text (its first
// content part's, else its first summary part's) the reasoning of the
// assistant message before it when that has none, else of a new
// assistant message; an assistant message item (its first part's text)
// fills the content of the assistant message before it when that has
// none; a function_call_output a "tool" message of its output and
// call_id; any other item with a role (a message) that role and its
// content (a string, or text parts joined by "\n", as chatMessages reads
// them).
func inputItems(raw json.RawMessage) ([]prefix.ChatMessage, *apiError) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
			msg: "input must be a string or an array of input items"}
	}
	if len(items) > maxInputItems {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
			msg: fmt.Sprintf("input has %d items, more than %d", len(items), maxInputItems)}
	}
	out := make([]prefix.ChatMessage, 0, len(items))
	// Of the last message: whether its content and reasoning are unset
	// (None in vLLM's dict), and its tool calls.
	var (
		noContent, noReasoning bool
		calls                  []responsesToolCall
	)
	lastAssistant := func() bool { return len(out) > 0 && out[len(out)-1].Role == "assistant" }
	flush := func() *apiError {
		if len(calls) == 0 {
			return nil
		}
		b, err := json.Marshal(calls)
		if err != nil {
			return badRequest("tool calls: %v", err)
		}
		out[len(out)-1].ToolCalls = string(b)
		calls = nil
		return nil
	}
	add := func(m prefix.ChatMessage, content, reasoning bool) *apiError {
		if aerr := flush(); aerr != nil {
			return aerr
		}
		out = append(out, m)
		noContent, noReasoning = !content, !reasoning
		return nil
	}
	for i, rawItem := range items {
		var it inputItem
		if err := json.Unmarshal(rawItem, &it); err != nil {
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
				msg: fmt.Sprintf("input[%d] must be an object", i)}
		}
		var aerr *apiError
		switch it.Type {
		case "function_call":
			if it.CallID == nil || it.Name == nil || it.Arguments == nil {
				return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
					msg: fmt.Sprintf("input[%d]: a function_call needs call_id, name and arguments", i)}
			}
			if !lastAssistant() {
				aerr = add(prefix.ChatMessage{Role: "assistant"}, false, false)
			}
			calls = append(calls, responsesToolCall{ID: *it.CallID, Type: "function",
				Function: toolFunction{Name: *it.Name, Arguments: *it.Arguments}})
		case "reasoning":
			text := firstPartText(it.Content)
			if text == "" {
				text = firstPartText(it.Summary)
			}
			if lastAssistant() && noReasoning {
				out[len(out)-1].Reasoning, out[len(out)-1].HasReasoning = text, true
				noReasoning = false
				continue
			}
			aerr = add(prefix.ChatMessage{Role: "assistant", Reasoning: text, HasReasoning: true}, false, true)
		case "function_call_output":
			var s string
			_ = json.Unmarshal(it.Output, &s)
			m := prefix.ChatMessage{Role: "tool", Content: s}
			if it.CallID != nil {
				m.ToolCallID = *it.CallID
			}
			aerr = add(m, true, true)
		default:
			if it.Role == "" {
				return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
					msg: fmt.Sprintf("input[%d] has no role and is not a function_call, function_call_output or reasoning item", i)}
			}
			if it.Role == "assistant" {
				text := firstPartText(it.Content)
				if lastAssistant() && noContent {
					out[len(out)-1].Content = text
					noContent = false
					continue
				}
				aerr = add(prefix.ChatMessage{Role: "assistant", Content: text}, true, false)
				break
			}
			m, e := chatMessages([]chatMessage{{Role: it.Role, Content: it.Content}})
			if e != nil {
				e.msg = fmt.Sprintf("input[%d]: %s", i, e.msg)
				return nil, e
			}
			aerr = add(m[0], true, true)
		}
		if aerr != nil {
			return nil, aerr
		}
	}
	if aerr := flush(); aerr != nil {
		return nil, aerr
	}
	return out, nil
}

// firstPartText is the text of a content list's first part (a string, or
// a part's "text"), or the content itself when a string; "" for none.
func firstPartText(raw json.RawMessage) string {
	if s, ok := jsonString(raw); ok {
		return s
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil || len(parts) == 0 {
		return ""
	}
	if s, ok := jsonString(parts[0]); ok {
		return s
	}
	var p struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(parts[0], &p)
	return p.Text
}

// responsesTools converts a Responses tools array into the chat
// completions tools vLLM's construct_tool_dicts gives the template
// (responses/utils.py@01ca842d, convert_tool_responses_to_completions_format):
// each tool of type "function" as {"type": "function", "function": {its
// other members, in order}}, compact; "" for none.
func responsesTools(raw json.RawMessage) string {
	var tools []json.RawMessage
	if json.Unmarshal(raw, &tools) != nil {
		return ""
	}
	var b bytes.Buffer
	for _, t := range tools {
		keys, vals, ok := objectMembers(t)
		if !ok {
			continue
		}
		typ := ""
		for k, key := range keys {
			if key == "type" {
				typ, _ = jsonString(vals[k])
			}
		}
		if typ != "function" {
			continue
		}
		if b.Len() == 0 {
			b.WriteByte('[')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"function","function":{`)
		n := 0
		for k, key := range keys {
			if key == "type" {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			kb, _ := json.Marshal(key)
			b.Write(kb)
			b.WriteByte(':')
			b.Write(vals[k])
			n++
		}
		b.WriteString("}}")
	}
	return closeTools(&b)
}

// objectMembers returns the keys and raw values of the JSON object raw,
// in order; false when raw is not an object.
func objectMembers(raw json.RawMessage) (keys []string, vals []json.RawMessage, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, false
		}
		keys, vals = append(keys, t.(string)), append(vals, v)
	}
	return keys, vals, true
}

// handleResponses serves POST /v1/responses: the request's instructions,
// the stored conversation of previous_response_id and its input become
// chat messages (responseMessages), generated like a chat completion, and
// answered as a ResponsesResponse or, with stream, as Responses events.
// With store (the default) the answer is kept for previous_response_id,
// GET /v1/responses/{id} and POST /v1/responses/{id}/cancel, as vLLM does
// with VLLM_ENABLE_RESPONSES_API_STORE=1. kv_transfer_params is read as
// on chat (prepare): a prefill (do_remote_decode) generates one token and
// its finished response carries the KV's kv_transfer_params (the answer,
// or, streamed, response.completed's response: vLLM's
// responses_stream_generator ends with responses_full_generator's
// response, which carries it; vllm/entrypoints/openai/responses/
// serving.py@0001948b); a decode (do_remote_prefill) computes no prompt.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var rq responsesRequest
	if aerr := decodeBody(body, &rq); aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := validateResponses(&rq); aerr != nil {
		writeError(w, aerr)
		return
	}
	var prev *storedResponse
	if rq.PreviousResponseID != nil {
		if prev = s.responses.get(*rq.PreviousResponseID); prev == nil {
			writeError(w, responseNotFound(*rq.PreviousResponseID))
			return
		}
	}
	msgs, aerr := responseMessages(rq.Instructions, rq.Input, prev)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	req := &genRequest{MaxTokens: rq.MaxOutputTokens, CacheSalt: rq.CacheSalt, KVTransferParams: rq.KVTransferParams, rendered: msgs, tools: responsesTools(rq.Tools)}
	if rq.Model != nil {
		req.Model = *rq.Model
	}
	sr, aerr := s.prepare(r.Context(), req, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	eng, a, ok := s.begin(w, r, req, sr)
	if !ok {
		return
	}
	finished := false
	defer func() {
		if !finished && a.id != 0 {
			eng.abort(a.id)
		}
	}()
	g := generation{s: s, eng: eng, w: w, a: a, chat: true, sr: sr, created: time.Now().Unix(), model: s.model}
	if req.Model != "" {
		g.model = req.Model
	}
	if req.prefill {
		g.kv = s.kvAnswer(r, sr)
	}
	rs := &responseRun{g: &g, rq: &rq, msgs: msgs, itemID: randomID("msg_")}
	if rq.RequestID != nil {
		rs.id = *rq.RequestID
	} else {
		rs.id = randomID("resp_")
	}
	if rq.Stream != nil && *rq.Stream {
		finished = rs.stream(r)
	} else {
		finished = rs.complete(r)
	}
	if !finished && r.Context().Err() != nil {
		panic(http.ErrAbortHandler)
	}
}

// validateResponses checks what vLLM's ResponsesRequest validators and
// _validate_create_responses_input check, and the mock's own bounds.
func validateResponses(rq *responsesRequest) *apiError {
	bad := func(param, format string, args ...any) *apiError {
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(bytes.TrimSpace(rq.Prompt)) > 0 && !bytes.Equal(bytes.TrimSpace(rq.Prompt), []byte("null")):
		return bad("prompt", "prompt template is not supported")
	case rq.Background != nil && *rq.Background && rq.Store != nil && !*rq.Store:
		return bad("background", "background can only be used when `store` is true")
	case rq.Background != nil && *rq.Background:
		return bad("background", "background mode is not supported by this mock engine")
	case len(bytes.TrimSpace(rq.PreviousInputMessages)) > 0 && !bytes.Equal(bytes.TrimSpace(rq.PreviousInputMessages), []byte("null")) &&
		rq.PreviousResponseID != nil:
		return bad("previous_response_id", "Only one of `previous_input_messages` and `previous_response_id` can be set.")
	case rq.RequestID != nil && (*rq.RequestID == "" || len(*rq.RequestID) > maxResponseIDBytes):
		return bad("request_id", "request_id must be 1 to %d bytes", maxResponseIDBytes)
	}
	return nil
}

// responseRun is one Responses request being answered.
type responseRun struct {
	g      *generation
	rq     *responsesRequest
	msgs   []prefix.ChatMessage
	id     string
	itemID string
}

// orNull is raw, or JSON null when raw is empty.
func orNull(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// body is the ResponsesResponse of the run in status status with output
// and usage (nil while in progress), as vLLM's from_request fills it:
// temperature and top_p 1.0 unless set, max_output_tokens the tokens the
// engine generates, incomplete_details {"reason": "max_output_tokens"}
// when incomplete.
func (rs *responseRun) body(status string, output []outputMessage, usage *responseUsage) *responseBody {
	rq := rs.rq
	b := &responseBody{ID: rs.id, CreatedAt: rs.g.created, Instructions: rq.Instructions, Metadata: orNull(rq.Metadata),
		Model: rs.g.model, Object: "response", Output: output, ParallelToolCalls: true, Temperature: 1, TopP: 1,
		ToolChoice: json.RawMessage(`"auto"`), Tools: json.RawMessage("[]"), MaxOutputTokens: rs.g.sr.OutputLength,
		MaxToolCalls: rq.MaxToolCalls, PreviousResponseID: rq.PreviousResponseID, Prompt: json.RawMessage("null"),
		Reasoning: orNull(rq.Reasoning), ServiceTier: "auto", Status: status, Text: orNull(rq.Text),
		Truncation: "disabled", Usage: usage, User: rq.User}
	if b.Output == nil {
		b.Output = []outputMessage{}
	}
	if rq.Temperature != nil {
		b.Temperature = *rq.Temperature
	}
	if rq.TopP != nil {
		b.TopP = *rq.TopP
	}
	if rq.ParallelToolCalls != nil {
		b.ParallelToolCalls = *rq.ParallelToolCalls
	}
	if len(bytes.TrimSpace(rq.ToolChoice)) > 0 {
		b.ToolChoice = rq.ToolChoice
	}
	if t := bytes.TrimSpace(rq.Tools); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		b.Tools = rq.Tools
	}
	if rq.ServiceTier != nil {
		b.ServiceTier = *rq.ServiceTier
	}
	if rq.Truncation != nil {
		b.Truncation = *rq.Truncation
	}
	if status == "incomplete" {
		b.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
	}
	return b
}

// finalStatus is the status of a finished run: the mock always generates
// exactly its output length, so a request that set max_output_tokens hit
// it ("incomplete", vLLM's status for finish_reason "length"); one that
// did not ended on its own ("completed").
func (rs *responseRun) finalStatus() string {
	if rs.rq.MaxOutputTokens != nil {
		return "incomplete"
	}
	return "completed"
}

// usage is the run's ResponseUsage: input_tokens the prompt's tokens (the
// engine's /tokenize of the converted messages), cached_tokens those
// served from the prefix cache; one turn.
func (rs *responseRun) usage(cached int) *responseUsage {
	in, out := rs.g.sr.InputLength, rs.g.sr.OutputLength
	u := &responseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
	u.InputTokensDetails.CachedTokens = cached
	u.InputTokensDetails.InputTokensPerTurn = []int{in}
	u.InputTokensDetails.CachedTokensPerTurn = []int{cached}
	u.OutputTokensDetails.OutputTokensPerTurn = []int{out}
	u.OutputTokensDetails.ToolOutputTokensPerTurn = []int{0}
	return u
}

// final is the finished response and its text.
func (rs *responseRun) final(cached int) (*responseBody, string) {
	out := text(rs.g.sr.OutputLength)
	msg := outputMessage{ID: rs.itemID, Content: []outputText{{Annotations: []any{}, Text: out, Type: "output_text"}},
		Role: "assistant", Status: "completed", Type: "message"}
	b := rs.body(rs.finalStatus(), []outputMessage{msg}, rs.usage(cached))
	b.KVTransferParams = rs.g.kv
	return b, out
}

// keep stores the finished response when the request asked it (store
// defaults to true).
func (rs *responseRun) keep(b *responseBody, out string) {
	if rs.rq.Store != nil && !*rs.rq.Store {
		return
	}
	enc, err := json.Marshal(b)
	if err != nil {
		return
	}
	rs.g.s.responses.put(rs.id, &storedResponse{body: enc, msgs: rs.msgs, output: out})
}

// complete answers the run not streamed.
func (rs *responseRun) complete(r *http.Request) bool {
	p, ok := rs.g.waitAll(r)
	if !ok {
		return false
	}
	b, out := rs.final(p.cached)
	rs.keep(b, out)
	setDoneHeaders(rs.g.w.Header(), p)
	_ = json.NewEncoder(rs.g.w).Encode(b)
	return true
}

// stream answers the run as vLLM's responses_stream_generator and
// process_simple_stream do: response.created and response.in_progress
// (the response in_progress, no output, usage null),
// response.output_item.added (the message, in_progress),
// response.content_part.added, one response.output_text.delta per token,
// response.output_text.done, response.content_part.done,
// response.output_item.done, response.completed (the whole response with
// its usage); sequence_number counts from 0, content_index and
// output_index are 0. No [DONE] follows.
func (rs *responseRun) stream(r *http.Request) bool {
	var buf bytes.Buffer
	seq := 0
	event := func(typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		buf.WriteString("event: ")
		buf.WriteString(typ)
		buf.WriteString("\ndata: ")
		enc, _ := json.Marshal(fields)
		buf.Write(enc)
		buf.WriteString("\n\n")
	}
	head := func(progress) {
		initial := rs.body("in_progress", nil, nil)
		event("response.created", map[string]any{"response": initial})
		event("response.in_progress", map[string]any{"response": initial})
		event("response.output_item.added", map[string]any{"output_index": 0,
			"item": outputMessage{ID: rs.itemID, Content: []outputText{}, Role: "assistant", Status: "in_progress", Type: "message"}})
		event("response.content_part.added", map[string]any{"output_index": 0, "item_id": rs.itemID, "content_index": 0,
			"part": outputText{Annotations: []any{}, Type: "output_text", Logprobs: []any{}}})
	}
	tok := func(i int, _ time.Duration) {
		event("response.output_text.delta", map[string]any{"content_index": 0, "output_index": 0, "item_id": rs.itemID,
			"delta": token(i), "logprobs": []any{}})
	}
	tail := func(p progress) {
		b, out := rs.final(p.cached)
		part := outputText{Annotations: []any{}, Text: out, Type: "output_text"}
		event("response.output_text.done", map[string]any{"item_id": rs.itemID, "output_index": 0, "content_index": 0,
			"text": out, "logprobs": []any{}})
		event("response.content_part.done", map[string]any{"item_id": rs.itemID, "output_index": 0, "content_index": 0,
			"part": part})
		event("response.output_item.done", map[string]any{"output_index": 0, "item": b.Output[0]})
		rs.keep(b, out)
		event("response.completed", map[string]any{"response": b})
	}
	return rs.g.streamTokens(r, &buf, head, tok, tail)
}

// handleGetResponse serves GET /v1/responses/{id} as vLLM's
// retrieve_responses does: the stored response, or 404
// (responseNotFound). stream=true is not supported (there is no background
// mode): 400.
func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if v := r.URL.Query().Get("stream"); strings.EqualFold(v, "true") {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "stream",
			msg: "streaming a stored response needs background mode, which this mock engine does not support"})
		return
	}
	st := s.responses.get(id)
	if st == nil {
		writeError(w, responseNotFound(id))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(append([]byte(nil), st.body...), '\n'))
}

// handleCancelResponse serves POST /v1/responses/{id}/cancel as vLLM's
// cancel_responses does: 404 for an unknown id; every stored response is
// finished (no background mode), so 400 "Cannot cancel a synchronous
// response." with param response_id.
func (s *Server) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.responses.get(id) == nil {
		writeError(w, responseNotFound(id))
		return
	}
	writeError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "response_id",
		msg: "Cannot cancel a synchronous response."})
}
