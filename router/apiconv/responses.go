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
//     function_call item is an assistant message with no content (its
//     call joins the assistant message before it, when there is one); a
//     function_call_output item is a tool message whose content is its
//     output; a reasoning item is an assistant message with no content
//     (joined to the assistant message before it when that one has no
//     reasoning yet).
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
	f := fields(v, "model", "stream", "instructions", "input", "previous_response_id", "cache_salt", "max_output_tokens")
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
	return req, nil
}

// turn is what inputItems knows of the last message it built: whether it
// is the assistant's, and whether its content and reasoning are still
// unset (None in vLLM's dict), for the items that join it.
type turn struct {
	assistant, noContent, noReasoning bool
}

// inputItems appends the messages of a Responses input list to msgs
// (construct_chat_messages_with_tool_call).
func inputItems(in gjson.Result, msgs []Message) ([]Message, error) {
	var (
		last turn
		err  error
		i    = -1
	)
	in.ForEach(func(_, item gjson.Result) bool {
		i++
		name := fmt.Sprintf("input[%d]", i)
		if !isObject(item) {
			err = typeError(name, item)
			return false
		}
		f := fields(item, "type", "role", "content", "output")
		typ := f[0]
		if present(typ) && typ.Type != gjson.String {
			err = typeError(name+".type", typ)
			return false
		}
		switch typ.String() {
		case "function_call":
			// An assistant message with tool_calls and no content; the
			// call joins the assistant message before it.
			if last.assistant {
				return true
			}
			msgs = append(msgs, Message{Role: "assistant"})
			last = turn{assistant: true, noContent: true, noReasoning: true}
			return true
		case "reasoning":
			// Its text becomes the message's reasoning, not its content.
			if last.assistant && last.noReasoning {
				last.noReasoning = false
				return true
			}
			msgs = append(msgs, Message{Role: "assistant"})
			last = turn{assistant: true, noContent: true}
			return true
		case "function_call_output":
			var out string
			if out, err = joinParts(name+".output", f[3]); err != nil {
				return false
			}
			msgs = append(msgs, Message{Role: "tool", Content: out})
			last = turn{}
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
			msgs = append(msgs, Message{Role: "assistant", Content: text})
			last = turn{assistant: true, noReasoning: true}
			return true
		}
		var text string
		if text, err = joinParts(name+".content", f[2]); err != nil {
			return false
		}
		msgs = append(msgs, Message{Role: role.String(), Content: text})
		last = turn{}
		return true
	})
	return msgs, err
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
