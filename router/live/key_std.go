package live

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// parseStd is ParseRequest's path for large bodies, bodies dense in JSON
// values, and bodies whose strings fastjson would read otherwise than
// encoding/json: checkBody, then a walk over the body's bytes, which
// checkBody has found to be strict JSON nested at most maxNesting levels.
//
// It follows parseFast's rules exactly, so that a request routes the same
// whatever its size: keys match exactly; a key given twice counts as its
// last value, and only that value is checked; null is absent (cache_salt
// included: a string or null, as vLLM takes it); chat
// messages are not read when prompt_token_ids route; a content part's
// text counts only when its type is "text" and it is a string. Its
// strings are encoding/json's (invalid UTF-8 and lone surrogates become
// U+FFFD); ParseRequest sends bodies holding either here, so the fast path
// never sees them.
//
// It builds the routing key and nothing else: members it does not read
// are skipped, not decoded, so a body of a million tiny JSON values costs
// a walk over its bytes. Each byte is looked at a bounded number of times
// (once per level of the walk, at most five: body, messages, message,
// content, part), so the time is linear in the body's size.
func parseStd(body []byte, chat bool) (*CompletionRequest, error) {
	if err := checkBody(body); err != nil {
		return nil, err
	}
	return readStd(body, chat)
}

// readStd is parseStd on a body checkBody accepted.
func readStd(body []byte, chat bool) (*CompletionRequest, error) {
	body = body[skipSpace(body, 0):]
	if body[0] != '{' {
		return nil, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", ErrBadRequest, rawType(body))
	}
	var model, stream, tokenIDs, messages, prompt, salt, tools, maxTok, maxCompl []byte // the last raw value of each
	members(body, func(key, val []byte) {
		switch string(unquoteKey(key)) {
		case "model":
			model = val
		case "stream":
			stream = val
		case "prompt_token_ids":
			tokenIDs = val
		case "messages":
			messages = val
		case "prompt":
			prompt = val
		case "cache_salt":
			salt = val
		case "tools":
			tools = val
		case "max_tokens":
			maxTok = val
		case "max_completion_tokens":
			maxCompl = val
		}
	})

	var (
		req CompletionRequest
		err error
	)
	if raw := present(model); raw != nil {
		if raw[0] != '"' {
			return nil, rawTypeError("model", raw)
		}
		req.Model = decodeString(raw)
	}
	if raw := present(stream); raw != nil {
		if raw[0] != 't' && raw[0] != 'f' {
			return nil, rawTypeError("stream", raw)
		}
		req.Stream = raw[0] == 't'
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", ErrBadRequest)
	}
	// As parseFast: chat's max_completion_tokens, when set, wins over
	// max_tokens.
	for _, name := range maxTokensFields(chat) {
		raw := present(maxTok)
		if name == "max_completion_tokens" {
			raw = present(maxCompl)
		}
		if raw != nil {
			if rawType(raw) != "number" {
				return nil, rawTypeError(name, raw)
			}
			req.MaxTokens = maxTokens(string(raw))
		}
	}
	if raw := present(salt); raw != nil {
		if raw[0] != '"' {
			return nil, rawTypeError("cache_salt", raw)
		}
		req.salt = decodeString(raw)
	}
	if raw := present(tokenIDs); raw != nil {
		if req.routing.ids, err = stdTokenIDs("prompt_token_ids", raw, nil); err != nil {
			return nil, err
		}
	}
	if chat {
		raw := present(messages)
		if raw != nil && raw[0] != '[' {
			return nil, rawTypeError("messages", raw)
		}
		if raw == nil || raw[skipSpace(raw, 1)] == ']' {
			return nil, fmt.Errorf("%w: messages must be a non-empty array", ErrBadRequest)
		}
		if len(req.routing.ids) > 0 {
			return &req, nil
		}
		key, err := stdMessages(raw, present(tools))
		if err != nil {
			return nil, err
		}
		req.routing = key
		return &req, nil
	}
	raw := present(prompt)
	if raw == nil && len(req.routing.ids) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", ErrBadRequest)
	}
	if raw != nil {
		// A malformed prompt is refused even when prompt_token_ids route.
		key, err := stdPrompt(raw)
		if err != nil {
			return nil, err
		}
		if len(req.routing.ids) == 0 {
			req.routing = key
		}
	}
	return &req, nil
}

// The walk: functions over valid JSON (checkBody's), each value given as
// its raw bytes without surrounding space.

// members calls f with the raw key (quoted) and value of each member of
// the JSON object obj, in order.
func members(obj []byte, f func(key, val []byte)) {
	for i := skipSpace(obj, 1); obj[i] != '}'; {
		end := stringEnd(obj, i)
		v := skipSpace(obj, skipSpace(obj, end)+1) // past the colon
		vend := valueEnd(obj, v)
		f(obj[i:end], obj[v:vend])
		if i = skipSpace(obj, vend); obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
}

// elements calls f with the index and raw value of each element of the
// JSON array arr, in order, until f returns an error, which it returns.
func elements(arr []byte, f func(i int, val []byte) error) error {
	for n, i := 0, skipSpace(arr, 1); arr[i] != ']'; n++ {
		end := valueEnd(arr, i)
		if err := f(n, arr[i:end]); err != nil {
			return err
		}
		if i = skipSpace(arr, end); arr[i] == ',' {
			i = skipSpace(arr, i+1)
		}
	}
	return nil
}

// valueEnd returns the index just past the JSON value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '[', '{':
		for depth := 0; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '[', '{':
				depth++
			case ']', '}':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for ; i < len(b); i++ { // a number, true, false or null
		switch b[i] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}

// skipSpace returns the index of the first byte of b at or after i that
// is not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// present returns raw, or nil when it is absent or null.
func present(raw []byte) []byte {
	if len(raw) == 0 || raw[0] == 'n' {
		return nil
	}
	return raw
}

// decodeString returns the JSON string raw (quoted) as encoding/json
// decodes it: escapes resolved, invalid UTF-8 and lone surrogates turned
// into U+FFFD. A string without either is its bytes.
func decodeString(raw []byte) string {
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s)
	}
	var out string
	_ = json.Unmarshal(raw, &out) // cannot fail: raw is a valid JSON string
	return out
}

// appendString appends the JSON string raw (quoted), decoded as
// decodeString does, to dst.
func appendString(dst, raw []byte) []byte {
	if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return append(dst, s...)
	}
	return append(dst, decodeString(raw)...)
}

// unquoteKey returns the object key raw (quoted) decoded, without a copy
// when it has no escape.
func unquoteKey(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	return []byte(decodeString(raw))
}

// stdMessages renders a messages array and the request's tools (raw,
// nil when absent or null) as prefix.RenderChatTools does, with each
// message's span in the text (see RoutingKey for the fields read beside
// role and content). The text is at most raw's and tools' size plus the
// lines' labels, which it is given at once.
func stdMessages(raw, tools []byte) (RoutingKey, error) {
	n := 0
	_ = elements(raw, func(int, []byte) error { n++; return nil })
	size := len(raw)
	if len(tools) > 0 {
		size += len(tools) + len(prefix.ToolsLabel) + 1
	}
	b := newChatBuilder(n, size)
	if tools != nil && tools[0] == '[' && tools[skipSpace(tools, 1)] != ']' {
		b.tools(string(tools))
	}
	err := elements(raw, func(i int, m []byte) error {
		if m[0] != '{' {
			return rawTypeError(fmt.Sprintf("messages[%d]", i), m)
		}
		var role, content, name, toolCallID, toolCalls, reasoning []byte
		extra := false
		members(m, func(key, val []byte) {
			switch string(unquoteKey(key)) {
			case "role":
				role = val
			case "content":
				content = val
			case "name":
				name, extra = val, true
			case "tool_call_id":
				toolCallID, extra = val, true
			case "tool_calls":
				toolCalls, extra = val, true
			case "reasoning":
				reasoning, extra = val, true
			}
		})
		start := len(b.buf)
		if role = present(role); role != nil {
			if role[0] != '"' {
				return rawTypeError(fmt.Sprintf("messages[%d].role", i), role)
			}
			b.buf = appendString(b.buf, role)
		}
		b.role()
		var err error
		if b.buf, err = stdContent(b.buf, i, present(content)); err != nil {
			return err
		}
		if !extra {
			b.end(i, nil)
			return nil
		}
		var f msgFields
		if name != nil && name[0] == '"' {
			f.name = decodeString(name)
		}
		switch string(b.buf[start:b.cur.roleEnd]) {
		case "assistant":
			if toolCalls != nil && toolCalls[0] == '[' && toolCalls[skipSpace(toolCalls, 1)] != ']' {
				f.toolCalls = string(toolCalls)
			}
			if reasoning != nil && reasoning[0] == '"' {
				f.reasoning, f.hasReasoning = decodeString(reasoning), true
			}
		case "tool":
			if toolCallID != nil && toolCallID[0] == '"' {
				f.toolCallID = decodeString(toolCallID)
			}
		}
		b.end(i, &f)
		return nil
	})
	return b.key(), err
}

// stdContent appends message i's content (raw, nil when absent or null)
// to dst: a string, or an array of parts whose "text" parts' text (a
// string) is joined by "\n" (see RoutingKey).
func stdContent(dst []byte, i int, raw []byte) ([]byte, error) {
	switch {
	case raw == nil:
		return dst, nil
	case raw[0] == '"':
		return appendString(dst, raw), nil
	case raw[0] == '[':
		texts := 0
		err := elements(raw, func(j int, part []byte) error {
			if part[0] != '{' {
				return rawTypeError(fmt.Sprintf("messages[%d].content[%d]", i, j), part)
			}
			var typ, text []byte
			members(part, func(key, val []byte) {
				switch string(unquoteKey(key)) {
				case "type":
					typ = val
				case "text":
					text = val
				}
			})
			if typ != nil && typ[0] == '"' && decodeString(typ) == "text" && text != nil && text[0] == '"' {
				if texts > 0 {
					dst = append(dst, '\n')
				}
				dst = appendString(dst, text)
				texts++
			}
			return nil
		})
		return dst, err
	}
	return dst, fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", ErrBadRequest, i)
}

// bytesString returns b as a string sharing its bytes: b is not written
// again.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// stdPrompt reads a completions prompt (raw, present): a string, an array
// of strings (joined by newlines), an array of token ids, or an array of
// token-id arrays (concatenated); the first element decides which.
func stdPrompt(raw []byte) (RoutingKey, error) {
	switch raw[0] {
	case '"':
		return RoutingKey{text: decodeString(raw)}, nil
	case '[':
		switch raw[skipSpace(raw, 1)] {
		case ']':
			return RoutingKey{}, nil
		case '"':
			buf := make([]byte, 0, len(raw))
			err := elements(raw, func(i int, e []byte) error {
				if e[0] != '"' {
					return rawTypeError(fmt.Sprintf("prompt[%d]", i), e)
				}
				if i > 0 {
					buf = append(buf, '\n')
				}
				buf = appendString(buf, e)
				return nil
			})
			return RoutingKey{text: bytesString(buf)}, err
		case '[':
			var ids []int64
			err := elements(raw, func(i int, e []byte) error {
				var err error
				ids, err = stdTokenIDs(fmt.Sprintf("prompt[%d]", i), e, ids)
				return err
			})
			return RoutingKey{ids: ids}, err
		default:
			ids, err := stdTokenIDs("prompt", raw, nil)
			return RoutingKey{ids: ids}, err
		}
	}
	return RoutingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", ErrBadRequest)
}

// stdTokenIDs appends the integers of the JSON array raw (the field name)
// to dst.
func stdTokenIDs(name string, raw []byte, dst []int64) ([]int64, error) {
	if raw[0] != '[' {
		return nil, rawTypeError(name, raw)
	}
	err := elements(raw, func(i int, e []byte) error {
		if c := e[0]; c != '-' && (c < '0' || c > '9') {
			return fmt.Errorf("%w: %s[%d] must be an integer token id, not a JSON %s", ErrBadRequest, name, i, rawType(e))
		}
		id, err := strconv.ParseInt(string(e), 10, 64)
		if err != nil {
			return fmt.Errorf("%w: %s[%d] must be an integer token id, not the number %s", ErrBadRequest, name, i, e)
		}
		dst = append(dst, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dst, nil
}

// rawTypeError is the 400 for field whose raw value has the wrong type.
func rawTypeError(field string, raw []byte) error {
	return fmt.Errorf("%w: %q must not be a JSON %s", ErrBadRequest, field, rawType(raw))
}

// rawType names the JSON type of the raw value as encoding/json's errors
// do.
func rawType(raw []byte) string {
	switch c := raw[0]; {
	case c == '"':
		return "string"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == 't' || c == 'f':
		return "bool"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	}
	return "null"
}
