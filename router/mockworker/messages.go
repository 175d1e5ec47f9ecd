package mockworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// The Anthropic Messages API as vLLM serves it. Sources, vllm-project/vllm:
// vllm/entrypoints/anthropic/protocol.py@82df3f49 (AnthropicMessagesRequest
// and the response and event models), anthropic/serving.py@82df3f49
// (_convert_anthropic_to_openai_request, messages_full_converter,
// message_stream_converter) and anthropic/api_router.py@42fa4c09 (errors
// translated to {"type": "error", "error": {"type", "message"}}; the body
// dumped with exclude_none). vLLM answers a Messages request through its
// chat completions, so the id is the chat completion's ("chatcmpl-...").

// messagesRequest is the part of vLLM's AnthropicMessagesRequest the mock
// reads; model, messages and max_tokens are required.
type messagesRequest struct {
	Model     *string           `json:"model"`
	Messages  []anthropicMsg    `json:"messages"`
	MaxTokens *int              `json:"max_tokens"`
	Stream    *bool             `json:"stream"`
	System    json.RawMessage   `json:"system"`
	Metadata  json.RawMessage   `json:"metadata"`
	Tools     []json.RawMessage `json:"tools"`
	// KVTransferParams is vLLM's disaggregated-serving field
	// (AnthropicMessagesRequest.kv_transfer_params, passed to the chat
	// completion it runs), read as on chat: see kvTransferParams.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// anthropicMsg is an AnthropicMessage: role user or assistant, content a
// string or content blocks.
type anthropicMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicBlock is the part of an AnthropicContentBlock the mock reads.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	Content   json.RawMessage `json:"content"`
	Source    json.RawMessage `json:"source"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
}

// anthropicToolCall is the chat completions tool call vLLM builds from a
// tool_use block (_convert_tool_use_block: id, type, function), its
// arguments the input as compact JSON (vLLM writes json.dumps(input),
// which it parses back into an object before the template sees it).
type anthropicToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

// anthropicTools converts Anthropic tools into the chat completions tools
// vLLM's _convert_tools builds: {"type": "function", "function": {"name",
// "description", "parameters": input_schema, "defer_loading"}}, members
// absent or null left out, compact; "" for none.
func anthropicTools(tools []json.RawMessage) string {
	var b bytes.Buffer
	for _, t := range tools {
		var tool struct {
			Name         json.RawMessage `json:"name"`
			Description  json.RawMessage `json:"description"`
			InputSchema  json.RawMessage `json:"input_schema"`
			DeferLoading json.RawMessage `json:"defer_loading"`
		}
		if json.Unmarshal(t, &tool) != nil || len(tool.Name) == 0 || tool.Name[0] != '"' {
			continue
		}
		if b.Len() == 0 {
			b.WriteByte('[')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"function","function":{"name":`)
		b.Write(tool.Name)
		for _, m := range []struct {
			key string
			val json.RawMessage
		}{{"description", tool.Description}, {"parameters", tool.InputSchema}, {"defer_loading", tool.DeferLoading}} {
			if len(m.val) > 0 && !bytes.Equal(m.val, []byte("null")) {
				b.WriteString(`,"` + m.key + `":`)
				b.Write(m.val)
			}
		}
		b.WriteString("}}")
	}
	return closeTools(&b)
}

// closeTools ends a tools array written into b ("[" and its entries,
// nothing for none) and returns it compacted; "" for no entries or
// invalid JSON.
func closeTools(b *bytes.Buffer) string {
	if b.Len() == 0 {
		return ""
	}
	b.WriteByte(']')
	var c bytes.Buffer
	if json.Compact(&c, b.Bytes()) != nil {
		return ""
	}
	return c.String()
}

// anthropicError answers e in the shape vLLM's Anthropic router gives the
// errors of its serving: {"type": "error", "error": {"type", "message"}}
// with the error's status.
func anthropicError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error",
		"error": map[string]any{"type": e.typ, "message": e.msg}})
}

// blockText is the text of a tool_result's content: a string as it is,
// else its text blocks' texts concatenated (vLLM takes Python's str() of
// a list; the mock reads the text).
func blockText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []anthropicBlock
	_ = json.Unmarshal(raw, &blocks)
	var b bytes.Buffer
	for _, bl := range blocks {
		if bl.Text != nil {
			b.WriteString(*bl.Text)
		}
	}
	return b.String()
}

// anthropicMessages converts a Messages request into chat messages as
// vLLM's _convert_anthropic_to_openai_request does: system (a string, or
// its text blocks concatenated) as a system message; each message with its
// role and content, a string, or of its blocks the non-empty text blocks
// (one: its text; more: joined by "\n" as chat rendering joins parts); a
// user message's tool_result blocks become "tool" messages before it
// (tool_call_id the block's tool_use_id; an assistant's, text "Tool
// result: ..."); an assistant's tool_use blocks are its tool calls and
// its thinking blocks, concatenated, its reasoning; a user message with
// no text or image is dropped. Errors are 400s in the OpenAI shape
// (vLLM's request validation).
func anthropicMessages(rq *messagesRequest) ([]prefix.ChatMessage, *apiError) {
	var msgs []prefix.ChatMessage
	if sys := bytes.TrimSpace(rq.System); len(sys) > 0 && !bytes.Equal(sys, []byte("null")) {
		var s string
		if json.Unmarshal(sys, &s) != nil {
			var blocks []anthropicBlock
			if err := json.Unmarshal(sys, &blocks); err != nil {
				return nil, badRequest("system must be a string or a list of content blocks")
			}
			var b bytes.Buffer
			for _, bl := range blocks {
				if bl.Type == "text" && bl.Text != nil {
					b.WriteString(*bl.Text)
				}
			}
			s = b.String()
		}
		if s != "" {
			msgs = append(msgs, prefix.ChatMessage{Role: "system", Content: s})
		}
	}
	for i, m := range rq.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequest("messages[%d].role must be user or assistant", i)
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			msgs = append(msgs, prefix.ChatMessage{Role: m.Role, Content: s})
			continue
		}
		var blocks []anthropicBlock
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, badRequest("messages[%d].content must be a string or a list of content blocks", i)
		}
		var (
			texts     []string
			image     bool
			calls     []anthropicToolCall
			reasoning []string // nil: no thinking block
		)
		for _, bl := range blocks {
			switch bl.Type {
			case "text":
				if bl.Text != nil && *bl.Text != "" {
					texts = append(texts, *bl.Text)
				}
			case "tool_use":
				args := "{}"
				if in := bytes.TrimSpace(bl.Input); len(in) > 0 && !bytes.Equal(in, []byte("null")) {
					var c bytes.Buffer
					if json.Compact(&c, in) == nil {
						args = c.String()
					}
				}
				calls = append(calls, anthropicToolCall{ID: bl.ID, Type: "function", Function: toolFunction{Name: bl.Name, Arguments: args}})
			case "thinking":
				if bl.Thinking != nil {
					reasoning = append(reasoning, *bl.Thinking)
				}
			case "tool_result":
				if m.Role == "user" {
					msgs = append(msgs, prefix.ChatMessage{Role: "tool", Content: blockText(bl.Content), ToolCallID: bl.ToolUseID})
				} else {
					texts = append(texts, "Tool result: "+blockText(bl.Content))
				}
			case "image":
				image = image || (len(bl.Source) > 0 && !bytes.Equal(bl.Source, []byte("null")))
			case "redacted_thinking":
			default:
				return nil, badRequest("messages[%d]: content block type %q is not one of text, image, tool_use, tool_result, thinking, redacted_thinking", i, bl.Type)
			}
		}
		if m.Role == "user" && len(texts) == 0 && !image {
			continue
		}
		var b bytes.Buffer
		for j, t := range texts {
			if j > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(t)
		}
		cm := prefix.ChatMessage{Role: m.Role, Content: b.String()}
		if m.Role == "assistant" {
			if len(calls) > 0 {
				j, err := json.Marshal(calls)
				if err != nil {
					return nil, badRequest("messages[%d]: tool calls: %v", i, err)
				}
				cm.ToolCalls = string(j)
			}
			if reasoning != nil {
				cm.Reasoning, cm.HasReasoning = strings.Join(reasoning, ""), true
			}
		}
		msgs = append(msgs, cm)
	}
	return msgs, nil
}

// handleMessages serves POST /v1/messages: the request converted into chat
// messages (anthropicMessages), generated as a chat completion of
// max_tokens tokens, answered as an Anthropic message (stop_reason
// "max_tokens": the mock always generates max_tokens) or, with stream,
// Anthropic's events. A body that is not a valid request (malformed, no
// model, messages or max_tokens, max_tokens below 1) is a 400 in the
// OpenAI shape, as vLLM's request validation answers it; errors of the
// request's serving (an unknown model: 404; a prompt too long: 400) are
// in the Anthropic shape (anthropicError). kv_transfer_params is read as
// on chat (prepare): a prefill (do_remote_decode) generates one token and
// is answered whole, streamed or not, with the KV's kv_transfer_params
// (vLLM's Messages stream has no place for it: its message_stream_converter
// drops it, as vLLM's chat streams do, and the mock answers a streamed
// chat prefill whole too); a decode (do_remote_prefill) computes no
// prompt.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var rq messagesRequest
	if aerr := decodeBody(body, &rq); aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case rq.Model == nil || *rq.Model == "":
		writeError(w, badRequest("model: Model is required"))
		return
	case rq.Messages == nil:
		writeError(w, badRequest("messages: Field required"))
		return
	case rq.MaxTokens == nil:
		writeError(w, badRequest("max_tokens: Field required"))
		return
	case *rq.MaxTokens <= 0:
		writeError(w, badRequest("max_tokens: max_tokens must be positive"))
		return
	}
	msgs, aerr := anthropicMessages(&rq)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if len(msgs) == 0 {
		anthropicError(w, badRequest("the request has no message to render"))
		return
	}
	req := &genRequest{Model: *rq.Model, MaxTokens: rq.MaxTokens, KVTransferParams: rq.KVTransferParams, rendered: msgs, tools: anthropicTools(rq.Tools)}
	sr, aerr := s.prepare(r.Context(), req, true)
	if aerr != nil {
		anthropicError(w, aerr)
		return
	}
	ew := &anthropicErrorWriter{ResponseWriter: w}
	eng, a, ok := s.begin(ew, r, req, sr)
	if !ok {
		return
	}
	finished := false
	defer func() {
		if !finished && a.id != 0 {
			eng.abort(a.id)
		}
	}()
	g := &generation{s: s, eng: eng, w: ew, a: a, chat: true, sr: sr, created: time.Now().Unix(), model: req.Model,
		id: "chatcmpl-mock-" + strconv.FormatInt(s.seq.Add(1), 10)}
	if req.prefill {
		g.kv = s.kvAnswer(r, sr)
	}
	if rq.Stream != nil && *rq.Stream && !req.prefill {
		finished = anthropicStream(g, r)
	} else {
		finished = anthropicComplete(g, r)
	}
	if !finished && r.Context().Err() != nil {
		panic(http.ErrAbortHandler)
	}
}

// anthropicErrorWriter turns the OpenAI-shaped errors writeError writes
// into Anthropic-shaped ones: an error written before any answer is
// re-encoded by anthropicError.
type anthropicErrorWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (w *anthropicErrorWriter) WriteHeader(code int) {
	if code >= 400 && w.status == 0 {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *anthropicErrorWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		return w.ResponseWriter.Write(p)
	}
	w.buf.Write(p)
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(w.buf.Bytes(), &e) == nil {
		anthropicError(w.ResponseWriter, &apiError{status: w.status, typ: e.Error.Type, msg: e.Error.Message})
		w.buf.Reset()
	}
	return len(p), nil
}

// Unwrap lets http.ResponseController flush the underlying writer.
func (w *anthropicErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// anthropicUsage is vLLM's AnthropicUsage without the unset cache fields.
type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// anthropicComplete answers a Messages request not streamed, as vLLM's
// messages_full_converter (dumped with exclude_none): {"id", "type":
// "message", "role": "assistant", "content": [{"type": "text", "text"}],
// "model", "stop_reason": "max_tokens", "usage": {"input_tokens",
// "output_tokens"}}, and a prefill's "kv_transfer_params" (vLLM's
// AnthropicMessagesResponse.kv_transfer_params, set from the chat
// completion's: vllm/entrypoints/anthropic/serving.py@0001948b).
func anthropicComplete(g *generation, r *http.Request) bool {
	p, ok := g.waitAll(r)
	if !ok {
		return false
	}
	setDoneHeaders(g.w.Header(), p)
	_ = json.NewEncoder(g.w).Encode(struct {
		ID               string            `json:"id"`
		Type             string            `json:"type"`
		Role             string            `json:"role"`
		Content          []map[string]any  `json:"content"`
		Model            string            `json:"model"`
		StopReason       string            `json:"stop_reason"`
		Usage            anthropicUsage    `json:"usage"`
		KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"`
	}{g.id, "message", "assistant", []map[string]any{{"type": "text", "text": text(g.sr.OutputLength)}}, g.model,
		"max_tokens", anthropicUsage{g.sr.InputLength, g.sr.OutputLength}, g.kv})
	return true
}

// anthropicStream answers a Messages request streamed, as vLLM's
// message_stream_converter does, each event "event: TYPE\ndata: JSON\n\n"
// (dumped with exclude_unset): message_start (the message's id, content
// [], model, stop_reason and stop_sequence null, usage input_tokens and
// output_tokens 0; vLLM sets no type or role there), content_block_start
// (index 0, {"type": "text", "text": ""}), one content_block_delta
// (text_delta) per token, content_block_stop, message_delta (stop_reason
// "max_tokens", usage input_tokens and output_tokens), message_stop, then
// "data: [DONE]" as vLLM ends it. No ping.
func anthropicStream(g *generation, r *http.Request) bool {
	var buf bytes.Buffer
	event := func(typ string, v any) {
		enc, _ := json.Marshal(v)
		fmt.Fprintf(&buf, "event: %s\ndata: %s\n\n", typ, enc)
	}
	head := func(progress) {
		event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": g.id, "content": []any{}, "model": g.model, "stop_reason": nil, "stop_sequence": nil,
			"usage": anthropicUsage{InputTokens: g.sr.InputLength}}})
		event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
	}
	tok := func(i int, _ time.Duration) {
		event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": token(i)}})
	}
	tail := func(progress) {
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "max_tokens"},
			"usage": anthropicUsage{g.sr.InputLength, g.sr.OutputLength}})
		event("message_stop", map[string]any{"type": "message_stop"})
		buf.WriteString("data: [DONE]\n\n")
	}
	return g.streamTokens(r, &buf, head, tok, tail)
}
