package apiconv

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// billingHeader starts the text block Claude Code puts in the system
// prompt with a per-request hash; vLLM drops such blocks
// (_convert_system_message) so they do not defeat prefix caching.
const billingHeader = "x-anthropic-billing-header"

// blockTypes are the content block types vLLM's AnthropicContentBlock
// accepts; any other is refused.
var blockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true,
}

// Anthropic reads body, an Anthropic Messages request (POST
// /v1/messages), and builds its chat messages as vLLM's Anthropic front
// end converts them (_convert_anthropic_to_openai_request; see the
// package doc):
//
//   - one system message first, the concatenation (no separator) of
//     "system" (a string, or its text blocks that are not Claude Code's
//     billing header) and of the text of the messages whose role is
//     "system", when there is any;
//   - each other message (role "user" or "assistant"; "ctx" and "msg" read
//     as "user") with content a string is that message; with content a
//     list of blocks, its text blocks (non-empty text) joined by "\n" are
//     its content; image and redacted_thinking blocks add no text; an
//     assistant's thinking blocks, concatenated, are its reasoning, and
//     its tool_use blocks its tool calls, each {"id", "type": "function",
//     "function": {"name", "arguments": the input as compact JSON}}
//     (vLLM writes json.dumps(input), whose spacing differs, and parses it
//     back into an object before the template sees it); a user's
//     tool_result block is a tool message of its own (tool_call_id its
//     tool_use_id), placed before the message, its content the result's
//     text (a string, or its text items joined by "\n"), followed by a
//     user message with no text when the result holds images and a tool
//     message with no text when it holds tool references; an
//     assistant's tool_result is the text "Tool result: " and its content
//     (a list's raw JSON where vLLM prints Python's repr of it). A user
//     message left with no content block (text or image) is dropped, as
//     vLLM drops a user message without content (_convert_messages).
//
// "tools" become chat completions tools as _convert_tools builds them:
// {"type": "function", "function": {"name", "description",
// "parameters": input_schema, "defer_loading"}}, members absent or null
// left out (vLLM's model_dump gives the template None for them).
//
// model (a non-empty string), max_tokens (a positive integer) and
// messages (an array) are required. Errors wrap ErrInvalid and name the
// field. Linear in len(body).
func Anthropic(body []byte) (*Request, error) { return anthropic(body, true) }

// AnthropicPrompt is Anthropic for a request's prompt alone, as a trace
// line carries it: model and max_tokens may be absent (MaxTokens 0), and
// are checked as Anthropic checks them when present.
func AnthropicPrompt(body []byte) (*Request, error) { return anthropic(body, false) }

func anthropic(body []byte, request bool) (*Request, error) {
	v, err := check(string(body))
	if err != nil {
		return nil, err
	}
	f := fields(v, "model", "stream", "system", "messages", "max_tokens", "tools")
	req := &Request{}
	if err := common(f[0], f[1], req); err != nil {
		return nil, err
	}
	if req.Model == "" && (request || present(f[0])) {
		return nil, fieldError("model", "is required")
	}
	if present(f[4]) || request {
		if !present(f[4]) {
			return nil, fieldError("max_tokens", "is required")
		}
		if req.MaxTokens, err = integer("max_tokens", f[4]); err != nil {
			return nil, err
		}
		if req.MaxTokens <= 0 {
			return nil, fieldError("max_tokens", "must be positive")
		}
	}
	msgs := f[3]
	if !isArray(msgs) {
		if !present(msgs) {
			return nil, fieldError("messages", "is required")
		}
		return nil, typeError("messages", msgs)
	}

	// The system message: "system", then the system-role messages.
	var (
		system strings.Builder
		parts  int
	)
	if s := f[2]; present(s) {
		switch {
		case s.Type == gjson.String:
			if s.String() != "" {
				system.WriteString(s.String())
				parts++
			}
		case isArray(s):
			if parts, err = systemBlocks("system", s, &system, parts); err != nil {
				return nil, err
			}
		default:
			return nil, fieldError("system", "must be a string or an array of text blocks, not a JSON %s", typeName(s))
		}
	}
	type message struct {
		index   int
		role    string
		content gjson.Result
	}
	var list []message
	i := -1
	msgs.ForEach(func(_, m gjson.Result) bool {
		i++
		name := fmt.Sprintf("messages[%d]", i)
		if !isObject(m) {
			err = typeError(name, m)
			return false
		}
		mf := fields(m, "role", "content")
		role := mf[0].String()
		if mf[0].Type != gjson.String {
			err = fieldError(name+".role", "must be one of user, assistant, system")
			return false
		}
		switch role {
		case "ctx", "msg": // Claude Code's roles (protocol.py, normalize_role)
			role = "user"
		case "user", "assistant", "system":
		default:
			err = fieldError(name+".role", "must be one of user, assistant, system, not %q", role)
			return false
		}
		c := mf[1]
		if c.Type != gjson.String && !isArray(c) {
			err = fieldError(name+".content", "must be a string or an array of content blocks")
			return false
		}
		if role == "system" {
			if c.Type == gjson.String {
				system.WriteString(c.String())
				parts++
			} else if parts, err = systemBlocks(name+".content", c, &system, parts); err != nil {
				return false
			}
			return true
		}
		list = append(list, message{index: i, role: role, content: c})
		return true
	})
	if err != nil {
		return nil, err
	}
	if parts > 0 {
		req.Messages = append(req.Messages, Message{Role: "system", Content: system.String()})
	}
	for _, m := range list {
		if m.content.Type == gjson.String {
			req.Messages = append(req.Messages, Message{Role: m.role, Content: m.content.String()})
			continue
		}
		if req.Messages, err = blocks(fmt.Sprintf("messages[%d].content", m.index), m.role, m.content, req.Messages); err != nil {
			return nil, err
		}
	}
	if t := f[5]; present(t) {
		if !isArray(t) {
			return nil, typeError("tools", t)
		}
		if req.Tools, err = anthropicTools(t); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// anthropicTools converts Anthropic tools into chat completions tools
// (_convert_tools) as a compact JSON array; "" for an empty list.
func anthropicTools(list gjson.Result) (string, error) {
	var (
		b   []byte
		err error
		i   = -1
	)
	list.ForEach(func(_, tool gjson.Result) bool {
		i++
		name := fmt.Sprintf("tools[%d]", i)
		if !isObject(tool) {
			err = typeError(name, tool)
			return false
		}
		f := fields(tool, "name", "description", "input_schema", "defer_loading")
		if f[0].Type != gjson.String {
			err = fieldError(name+".name", "is required: a string")
			return false
		}
		if len(b) == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		b = append(b, `{"type":"function","function":{"name":`...)
		b = append(b, f[0].Raw...)
		for k, key := range []string{"description", "parameters", "defer_loading"} {
			if v := f[k+1]; present(v) {
				b = append(b, `,"`+key+`":`...)
				b = append(b, v.Raw...)
			}
		}
		b = append(b, "}}"...)
		return true
	})
	if err != nil || len(b) == 0 {
		return "", err
	}
	return compact(string(append(b, ']'))), nil
}

// systemBlocks appends the text of a system block list to b and returns
// parts plus the blocks it took.
func systemBlocks(field string, list gjson.Result, b *strings.Builder, parts int) (int, error) {
	var err error
	k := -1
	list.ForEach(func(_, blk gjson.Result) bool {
		k++
		typ, text, e := block(fmt.Sprintf("%s[%d]", field, k), blk)
		if e != nil {
			err = e
			return false
		}
		if typ == "text" && text != "" && !strings.HasPrefix(text, billingHeader) {
			b.WriteString(text)
			parts++
		}
		return true
	})
	return parts, err
}

// block checks a content block's type (and a text block's text) and
// returns them.
func block(field string, blk gjson.Result) (typ, text string, err error) {
	if !isObject(blk) {
		return "", "", typeError(field, blk)
	}
	f := fields(blk, "type", "text")
	if f[0].Type != gjson.String || !blockTypes[f[0].String()] {
		return "", "", fieldError(field+".type", "must be one of text, image, tool_use, tool_result, tool_reference, thinking, redacted_thinking")
	}
	if present(f[1]) && f[1].Type != gjson.String {
		return "", "", typeError(field+".text", f[1])
	}
	return f[0].String(), f[1].String(), nil
}

// blocks appends the messages of one message's block list
// (_convert_message_content): the tool messages of a user's tool_result
// blocks first, then the message itself.
func blocks(field, role string, list gjson.Result, msgs []Message) ([]Message, error) {
	var (
		text, reasoning  strings.Builder
		texts            int
		content, thought bool
		calls            callList
		err              error
		k                = -1
	)
	list.ForEach(func(_, blk gjson.Result) bool {
		k++
		name := fmt.Sprintf("%s[%d]", field, k)
		typ, t, e := block(name, blk)
		if e != nil {
			err = e
			return false
		}
		switch typ {
		case "text":
			if t != "" {
				if texts > 0 {
					text.WriteByte('\n')
				}
				text.WriteString(t)
				texts++
				content = true
			}
		case "image":
			if present(fields(blk, "source")[0]) {
				content = true // an image part: no text
			}
		case "thinking":
			if th := fields(blk, "thinking")[0]; present(th) {
				thought = true
				reasoning.WriteString(th.String())
			}
		case "tool_use":
			f := fields(blk, "id", "name", "input")
			args := "{}"
			if in := f[2]; present(in) && in.Raw != "{}" {
				args = compact(in.Raw)
			}
			err = calls.add(callTypeFirst{ID: f[0].String(), Type: "function",
				Function: toolFunction{Name: f[1].String(), Arguments: args}})
			return err == nil
		case "tool_result":
			rf := fields(blk, "content", "tool_use_id")
			c := rf[0]
			if role == "user" {
				msgs, err = toolResult(name+".content", rf[1].String(), c, msgs)
				return err == nil
			}
			var s string
			switch {
			case !present(c):
			case c.Type == gjson.String:
				s = c.String()
			default:
				s = c.Raw
			}
			if texts > 0 {
				text.WriteByte('\n')
			}
			text.WriteString("Tool result: " + s)
			texts++
			content = true
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if !content && role == "user" {
		return msgs, nil
	}
	m := Message{Role: role, Content: text.String()}
	if role == "assistant" {
		// vLLM passes tool_calls and reasoning for the assistant's
		// messages only (chat_utils.py, _parse_chat_message_content).
		m.ToolCalls = calls.String()
		m.Reasoning, m.HasReasoning = reasoning.String(), thought
	}
	return append(msgs, m), nil
}

// toolResult appends the messages of a user's tool_result block
// (_convert_user_tool_result): a tool message with its text, a user
// message for its images, a tool message for its tool references.
func toolResult(field, id string, c gjson.Result, msgs []Message) ([]Message, error) {
	var (
		text       strings.Builder
		texts      int
		images     bool
		references bool
	)
	switch {
	case !present(c):
	case c.Type == gjson.String:
		text.WriteString(c.String())
	case isArray(c):
		k := -1
		var err error
		c.ForEach(func(_, item gjson.Result) bool {
			k++
			if !isObject(item) {
				err = typeError(fmt.Sprintf("%s[%d]", field, k), item)
				return false
			}
			f := fields(item, "type", "text", "source", "tool_name", "name")
			switch f[0].String() {
			case "text":
				if texts > 0 {
					text.WriteByte('\n')
				}
				if f[1].Type == gjson.String {
					text.WriteString(f[1].String())
				}
				texts++
			case "image":
				images = true
			case "tool_reference":
				if f[3].String() != "" || f[4].String() != "" {
					references = true
				}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	default:
		return nil, fieldError(field, "must be a string or an array of content items, not a JSON %s", typeName(c))
	}
	msgs = append(msgs, Message{Role: "tool", Content: text.String(), ToolCallID: id})
	if images {
		msgs = append(msgs, Message{Role: "user"})
	}
	if references {
		msgs = append(msgs, Message{Role: "tool", ToolCallID: id})
	}
	return msgs, nil
}
