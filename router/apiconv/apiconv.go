// Package apiconv reads the generation schemas that are not chat
// completions, OpenAI's Responses (POST /v1/responses) and Anthropic's
// Messages (POST /v1/messages), into the chat messages vLLM builds from
// them before it applies the model's chat template: the messages the
// router keys a request by (router/live) and a trace line's prompt is
// rendered from (router/trace), so both read a body the same way.
//
// Each message is its role, its text content, and what vLLM puts beside the text that its chat template
// renders: an assistant message's tool_calls (as the JSON array vLLM
// builds) and reasoning, a tool message's tool_call_id. Images add no
// text. The request's tools are converted into the chat completions
// tools vLLM gives the template (Request.Tools).
//
// The conversions follow vLLM at these commits:
//   - Responses: vllm/entrypoints/openai/responses/utils.py,
//     construct_input_messages and _construct_message_from_response_item
//     (commit 01ca842df5b1ddd7f91aa376294040d126a453f2), with the request
//     model of vllm/entrypoints/openai/responses/protocol.py
//     (ResponsesRequest, commit 010a69cea9ac46d2953fa673c3b814f922d1b194).
//   - Messages: vllm/entrypoints/anthropic/serving.py,
//     _convert_anthropic_to_openai_request (_convert_system_message,
//     _convert_messages, _convert_block, _convert_user_tool_result;
//     commit 0001948bc76939369ca855c90b36d81256477e85), with the request
//     model of vllm/entrypoints/anthropic/protocol.py
//     (AnthropicMessagesRequest, commit 00589e563e771f2de7abeb48bd0814873e891411).
//   - A content-part array's text is its text parts (text, input_text,
//     output_text, refusal, thinking) joined by "\n", as
//     vllm/entrypoints/chat_utils.py joins them for a template that takes
//     string content (_parse_chat_message_content_parts; commit
//     001eadcf295d90aa0664963cd6a9d93f38a2f3da).
//
// Every function here takes time linear in the body and refuses a body
// nested deeper than MaxNesting before any recursive reader sees it.
package apiconv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/tidwall/gjson"
)

// Message is one chat message: its role ("system", "user", "assistant",
// "tool", "developer", ...), its text content, and the fields vLLM puts
// beside them (router/prefix's ChatMessage has the same fields; this
// package sits below it). A string field that is "" is absent.
type Message struct {
	Role, Content string
	// Name is the message's "name" (not set by these conversions; there
	// for the chat messages the fields mirror).
	Name string
	// ToolCallID is a tool message's tool_call_id.
	ToolCallID string
	// ToolCalls is an assistant message's tool calls, the JSON array
	// vLLM builds ("" for none).
	ToolCalls string
	// Reasoning is an assistant message's reasoning, present when
	// HasReasoning ("" included).
	Reasoning    string
	HasReasoning bool
}

// Request is what the router reads of a Responses or Messages request.
type Request struct {
	// Model is the request's "model" ("" when absent or null).
	Model string
	// Stream is the request's "stream" (false when absent or null).
	Stream bool
	// PreviousResponseID is a Responses request's previous_response_id
	// ("" for none, and for Messages).
	PreviousResponseID string
	// CacheSalt is a Responses request's cache_salt ("" for none; vLLM
	// refuses an empty one), vLLM's prefix-cache salt.
	CacheSalt string
	// MaxTokens is the most tokens the request may generate: Messages'
	// max_tokens (required, positive), Responses' max_output_tokens (0
	// when absent).
	MaxTokens int64
	// Messages are the chat messages vLLM builds from the request, in
	// order (see the package doc).
	Messages []Message
	// Tools are the request's tools as the chat completions tools vLLM
	// gives the chat template: a JSON array of {"type": "function",
	// "function": {"name", ...}}; "" for none.
	Tools string
}

// ErrInvalid wraps every error of Responses and Messages: the body is not
// a request of the schema. The message names the offending field.
var ErrInvalid = errors.New("invalid request")

// MaxNesting bounds how deeply a body nests JSON arrays and objects (the
// top-level object is level 1): 128, as router/live bounds request
// bodies (serde_json's default recursion limit).
const MaxNesting = 128

func fieldError(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// typeName names r's JSON type as encoding/json's errors do.
func typeName(r gjson.Result) string {
	switch r.Type {
	case gjson.String:
		return "string"
	case gjson.Number:
		return "number"
	case gjson.True, gjson.False:
		return "bool"
	case gjson.JSON:
		if strings.HasPrefix(r.Raw, "[") {
			return "array"
		}
		return "object"
	}
	return "null"
}

func typeError(field string, r gjson.Result) error {
	return fmt.Errorf("%w: %q must not be a JSON %s", ErrInvalid, field, typeName(r))
}

func isObject(r gjson.Result) bool { return r.Type == gjson.JSON && strings.HasPrefix(r.Raw, "{") }
func isArray(r gjson.Result) bool  { return r.Type == gjson.JSON && strings.HasPrefix(r.Raw, "[") }
func present(r gjson.Result) bool  { return r.Exists() && r.Type != gjson.Null }

// fields reads the members of the object obj named in names, each its
// last value when a key is given twice (as encoding/json and Python's
// json read it); a key's escapes are decoded first. One pass over obj.
func fields(obj gjson.Result, names ...string) []gjson.Result {
	out := make([]gjson.Result, len(names))
	obj.ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		for i, n := range names {
			if key == n {
				out[i] = v
			}
		}
		return true
	})
	return out
}

// check refuses a body that is not one JSON object nested at most
// MaxNesting levels.
func check(body string) (gjson.Result, error) {
	if depth(body) > MaxNesting {
		return gjson.Result{}, fmt.Errorf("%w: body is nested too deeply: JSON arrays and objects may nest at most %d levels", ErrInvalid, MaxNesting)
	}
	if !gjson.Valid(body) {
		return gjson.Result{}, fmt.Errorf("%w: body is not valid JSON", ErrInvalid)
	}
	v := gjson.Parse(body)
	if !isObject(v) {
		return gjson.Result{}, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", ErrInvalid, typeName(v))
	}
	return v, nil
}

// TooDeep reports whether body nests JSON arrays and objects deeper than
// MaxNesting, which a recursive reader (gjson's validator) must not be
// given. Linear in len(body); it stops at the first level too deep.
func TooDeep(body []byte) bool { return depth(string(body)) > MaxNesting }

// depth returns how deeply s nests arrays and objects, stopping once past
// MaxNesting; strings are skipped whole. Linear in len(s).
func depth(s string) int {
	d, deepest := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[', '{':
			if d++; d > deepest {
				if deepest = d; deepest > MaxNesting {
					return deepest
				}
			}
		case ']', '}':
			d--
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		}
	}
	return deepest
}

// common reads model and stream.
func common(model, stream gjson.Result, req *Request) error {
	if present(model) {
		if model.Type != gjson.String {
			return typeError("model", model)
		}
		req.Model = model.String()
	}
	if present(stream) {
		if stream.Type != gjson.True && stream.Type != gjson.False {
			return typeError("stream", stream)
		}
		req.Stream = stream.Bool()
	}
	return nil
}

// integer reads a JSON number that is an integer (5 or 5.0, as pydantic's
// int accepts it).
func integer(field string, r gjson.Result) (int64, error) {
	if r.Type != gjson.Number {
		return 0, typeError(field, r)
	}
	f := r.Float()
	if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fieldError(field, "must be an integer, not %s", r.Raw)
	}
	return int64(f), nil
}

// textPart returns the text of a content part that vLLM renders as text
// (chat_utils.py: text, input_text, output_text, refusal, thinking), and
// whether it is one.
func textPart(part gjson.Result) (string, bool) {
	if !isObject(part) {
		if part.Type == gjson.String { // a bare string part is text
			return part.String(), true
		}
		return "", false
	}
	f := fields(part, "type", "text", "refusal", "thinking")
	var v gjson.Result
	switch f[0].String() {
	case "text", "input_text", "output_text":
		v = f[1]
	case "refusal":
		v = f[2]
	case "thinking":
		v = f[3]
	default:
		return "", false
	}
	if v.Type != gjson.String {
		return "", false // vLLM skips a text part without text
	}
	return v.String(), true
}

// joinParts returns the text of a content value: a string as it is, an
// array of parts its text parts joined by "\n" (other parts, images, are
// not text); field names the value in errors.
func joinParts(field string, content gjson.Result) (string, error) {
	switch {
	case !present(content):
		return "", nil
	case content.Type == gjson.String:
		return content.String(), nil
	case isArray(content):
		var b strings.Builder
		n := 0
		i := 0
		var err error
		content.ForEach(func(_, part gjson.Result) bool {
			if !isObject(part) && part.Type != gjson.String {
				err = typeError(fmt.Sprintf("%s[%d]", field, i), part)
				return false
			}
			if t, ok := textPart(part); ok {
				if n > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(t)
				n++
			}
			i++
			return true
		})
		return b.String(), err
	}
	return "", fieldError(field, "must be a string or an array of content parts, not a JSON %s", typeName(content))
}

// toolCall is one chat completions tool call as vLLM builds it from a
// Responses function_call item (ChatCompletionMessageToolCallParam with
// id, function, type: that key order) and from an Anthropic tool_use
// block (id, type, function: callTypeFirst).
type toolCall struct {
	ID       string       `json:"id"`
	Function toolFunction `json:"function"`
	Type     string       `json:"type"`
}

type callTypeFirst struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// callList builds a message's tool_calls JSON array: each call appended
// once, the array closed by String. Linear in the calls' size.
type callList struct{ b []byte }

func (c *callList) add(call any) error {
	j, err := json.Marshal(call)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(c.b) == 0 {
		c.b = append(c.b, '[')
	} else {
		c.b = append(c.b, ',')
	}
	c.b = append(c.b, j...)
	return nil
}

func (c *callList) String() string {
	if len(c.b) == 0 {
		return ""
	}
	return string(c.b) + "]"
}

// compact returns raw JSON without insignificant space (escapes kept).
func compact(raw string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(raw)) != nil {
		return raw
	}
	return b.String()
}
