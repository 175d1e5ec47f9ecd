package apiconv

import (
	"fmt"

	"github.com/tidwall/gjson"
)

// Responses reads body, an OpenAI Responses request (POST /v1/responses),
// and builds its chat messages as vLLM does
// (construct_input_messages; see the package doc):
//
//   - "instructions", when a non-empty string, is a system message first;
//   - "input" a string is one user message;
//   - "input" a list of items: a message item (role and content, a string
//     or parts: input_text, output_text, ...; type "message" or none) is
//     that message, its parts' text joined by "\n"; an assistant message
//     has the text of its first part only, and fills the content of the
//     assistant message before it when that one has none; a
//     function_call item is a tool call {"id": call_id, "function":
//     {"name", "arguments"}, "type": "function"} of the assistant message
//     before it, or of a new assistant message with no content when the
//     message before is not the assistant's; a function_call_output item
//     is a tool message whose content is its output and tool_call_id its
//     call_id; a reasoning item's text (its first content part's, else
//     its first summary part's, else "") is the reasoning of the
//     assistant message before it when that one has none yet, else of a
//     new assistant message with no content.
//
// "tools" become chat completions tools as construct_tool_dicts builds
// them: each tool of type "function" is {"type": "function", "function":
// {its other members}} (Request.Tools); tools of other types (built-in
// tools, MCP, namespaces) are not rendered by the router.
//
// previous_response_id, max_output_tokens, cache_salt (a non-empty
// string), model and stream are read too. The conversation a
// previous_response_id names is held by the engine that answered it, so
// it is not in Messages. Errors wrap ErrInvalid and name the field.
// Linear in len(body).
func Responses(body []byte) (*Request, error) {
	v, err := check(string(body))
	if err != nil {
		return nil, err
	}
	f := fields(v, "model", "stream", "instructions", "input", "previous_response_id", "cache_salt", "max_output_tokens", "tools")
	req := &Request{}
	if err := common(f[0], f[1], req); err != nil {
		return nil, err
	}
	if p := f[4]; present(p) {
		if p.Type != gjson.String {
			return nil, typeError("previous_response_id", p)
		}
		req.PreviousResponseID = p.String()
	}
	if s := f[5]; present(s) {
		if s.Type != gjson.String || s.String() == "" {
			return nil, fieldError("cache_salt", "must be a non-empty string if provided")
		}
		req.CacheSalt = s.String()
	}
	if m := f[6]; present(m) {
		if req.MaxTokens, err = integer("max_output_tokens", m); err != nil {
			return nil, err
		}
	}
	if ins := f[2]; present(ins) {
		if ins.Type != gjson.String {
			return nil, typeError("instructions", ins)
		}
		if s := ins.String(); s != "" {
			req.Messages = append(req.Messages, Message{Role: "system", Content: s})
		}
	}
	in := f[3]
	switch {
	case !present(in):
		return nil, fieldError("input", "is required: a string or an array of input items")
	case in.Type == gjson.String:
		req.Messages = append(req.Messages, Message{Role: "user", Content: in.String()})
	case isArray(in):
		if req.Messages, err = inputItems(in, req.Messages); err != nil {
			return nil, err
		}
	default:
		return nil, fieldError("input", "must be a string or an array of input items, not a JSON %s", typeName(in))
	}
	if t := f[7]; present(t) {
		if !isArray(t) {
			return nil, typeError("tools", t)
		}
		if req.Tools, err = responsesTools(t); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// responsesTools converts a Responses tools array into chat completions
// tools (construct_tool_dicts, convert_tool_responses_to_completions_format):
// the function tools, each {"type": "function", "function": {its members
// but type}}, as a compact JSON array; "" when there is none.
func responsesTools(list gjson.Result) (string, error) {
	var (
		b   []byte
		err error
		i   = -1
	)
	list.ForEach(func(_, tool gjson.Result) bool {
		i++
		if !isObject(tool) {
			err = typeError(fmt.Sprintf("tools[%d]", i), tool)
			return false
		}
		if typ := fields(tool, "type")[0]; typ.Type != gjson.String || typ.String() != "function" {
			return true
		}
		if len(b) == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		b = append(b, `{"type":"function","function":{`...)
		n := 0
		tool.ForEach(func(k, v gjson.Result) bool {
			if k.String() == "type" {
				return true
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, k.Raw...)
			b = append(b, ':')
			b = append(b, v.Raw...)
			n++
			return true
		})
		b = append(b, "}}"...)
		return true
	})
	if err != nil || len(b) == 0 {
		return "", err
	}
	return compact(string(append(b, ']'))), nil
}

// turn is what inputItems knows of the last message it built: whether it
// is the assistant's, whether its content and reasoning are still unset
// (None in vLLM's dict), and its tool calls so far.
type turn struct {
	assistant, noContent, noReasoning bool
	calls                             callList
}

// inputItems appends the messages of a Responses input list to msgs
// (construct_chat_messages_with_tool_call).
func inputItems(in gjson.Result, msgs []Message) ([]Message, error) {
	var (
		last turn
		err  error
		i    = -1
	)
	// next sets the last message's tool calls and starts a new message.
	next := func(m Message, t turn) {
		if n := len(msgs); n > 0 && len(last.calls.b) > 0 {
			msgs[n-1].ToolCalls = last.calls.String()
		}
		msgs = append(msgs, m)
		last = t
	}
	in.ForEach(func(_, item gjson.Result) bool {
		i++
		name := fmt.Sprintf("input[%d]", i)
		if !isObject(item) {
			err = typeError(name, item)
			return false
		}
		f := fields(item, "type", "role", "content", "output", "call_id", "name", "arguments", "summary")
		typ := f[0]
		if present(typ) && typ.Type != gjson.String {
			err = typeError(name+".type", typ)
			return false
		}
		switch typ.String() {
		case "function_call":
			// A tool call of the assistant message before it, else of a
			// new assistant message with no content.
			for _, k := range []int{4, 5, 6} {
				if f[k].Type != gjson.String {
					err = fieldError(name+"."+[]string{"call_id", "name", "arguments"}[k-4], "must be a string")
					return false
				}
			}
			if !last.assistant {
				next(Message{Role: "assistant"}, turn{assistant: true, noContent: true, noReasoning: true})
			}
			err = last.calls.add(toolCall{ID: f[4].String(), Type: "function",
				Function: toolFunction{Name: f[5].String(), Arguments: f[6].String()}})
			return err == nil
		case "reasoning":
			// Its text becomes the message's reasoning, not its content.
			text := reasoningText(f[2], f[7])
			if last.assistant && last.noReasoning {
				last.noReasoning = false
				msgs[len(msgs)-1].Reasoning, msgs[len(msgs)-1].HasReasoning = text, true
				return true
			}
			next(Message{Role: "assistant", Reasoning: text, HasReasoning: true}, turn{assistant: true, noContent: true})
			return true
		case "function_call_output":
			var out string
			if out, err = joinParts(name+".output", f[3]); err != nil {
				return false
			}
			id := ""
			if f[4].Type == gjson.String {
				id = f[4].String()
			}
			next(Message{Role: "tool", Content: out, ToolCallID: id}, turn{})
			return true
		case "", "message":
		default:
			err = fieldError(name+".type", "%q is not an input item the router can render (message, function_call, function_call_output, reasoning)", typ.String())
			return false
		}
		role := f[1]
		if role.Type != gjson.String {
			err = fieldError(name+".role", "must be a string")
			return false
		}
		if role.String() == "assistant" {
			text, e := firstText(name+".content", f[2])
			if e != nil {
				err = e
				return false
			}
			if last.assistant && last.noContent {
				msgs[len(msgs)-1].Content = text
				last.noContent = false
				return true
			}
			next(Message{Role: "assistant", Content: text}, turn{assistant: true, noReasoning: true})
			return true
		}
		var text string
		if text, err = joinParts(name+".content", f[2]); err != nil {
			return false
		}
		next(Message{Role: role.String(), Content: text}, turn{})
		return true
	})
	if n := len(msgs); n > 0 && len(last.calls.b) > 0 {
		msgs[n-1].ToolCalls = last.calls.String()
	}
	return msgs, err
}

// reasoningText is a reasoning item's text as vLLM takes it: its first
// content part's text, else its first summary part's ("" for none; a
// part may be a string).
func reasoningText(content, summary gjson.Result) string {
	for _, list := range []gjson.Result{content, summary} {
		if !isArray(list) {
			continue
		}
		first := list.Get("0")
		if !first.Exists() {
			continue
		}
		if first.Type == gjson.String {
			return first.String()
		}
		return fields(first, "text")[0].String()
	}
	return ""
}

// firstText is an assistant message item's text: its content when a
// string, else its first part's text ("" for none): vLLM takes
// content[0].text of an assistant item.
func firstText(field string, content gjson.Result) (string, error) {
	switch {
	case !present(content):
		return "", nil
	case content.Type == gjson.String:
		return content.String(), nil
	case isArray(content):
		first := content.Get("0")
		if !first.Exists() {
			return "", nil
		}
		if first.Type == gjson.String {
			return first.String(), nil
		}
		if !isObject(first) {
			return "", typeError(field+"[0]", first)
		}
		if t := fields(first, "text")[0]; t.Type == gjson.String {
			return t.String(), nil
		}
		return "", nil
	}
	return "", fieldError(field, "must be a string or an array of content parts, not a JSON %s", typeName(content))
}
