package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// parseStd is parseRequest with encoding/json's token stream: the path
// for large bodies and the authority on bodies the fast path refuses.
//
// It follows parseFast's rules exactly, so that a request routes the same
// whatever its size: keys match exactly (encoding/json's struct decoding
// would match "Role" for "role"); a key given twice counts as its last
// value, and only that value is checked; null is absent; chat messages
// are not read when prompt_token_ids route; a content part's text counts
// only when its type is "text" and it is a string. Its strings are
// encoding/json's (invalid UTF-8 and lone surrogates become U+FFFD);
// parseRequest sends bodies holding either here, so the fast path never
// sees them.
//
// It keeps the last raw value of each key it reads (at most the body
// again) and walks arrays token by token, so what it builds is the
// routing key, not the document: a body of a million tiny JSON values
// costs a small multiple of its size.
func parseStd(body []byte, chat bool) (*completionRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, notJSON(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", errBadRequest, tokenType(tok))
	}
	last := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, notJSON(err)
		}
		switch key, _ := tok.(string); key {
		case "model", "stream", "prompt_token_ids", "messages", "prompt":
			last[key] = raw
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, notJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: body is not valid JSON: data after the top-level object", errBadRequest)
	}

	var req completionRequest
	if raw := present(last["model"]); raw != nil {
		var m string
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, rawTypeError("model", raw)
		}
		req.Model = m
	}
	if raw := present(last["stream"]); raw != nil {
		if err := json.Unmarshal(raw, &req.Stream); err != nil {
			return nil, rawTypeError("stream", raw)
		}
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", errBadRequest)
	}
	if raw := present(last["prompt_token_ids"]); raw != nil {
		if req.routing.ids, err = stdTokenIDs("prompt_token_ids", raw); err != nil {
			return nil, err
		}
	}
	if chat {
		raw := present(last["messages"])
		if raw != nil && raw[0] != '[' {
			return nil, rawTypeError("messages", raw)
		}
		if raw == nil || isEmptyArray(raw) {
			return nil, fmt.Errorf("%w: messages must be a non-empty array", errBadRequest)
		}
		if len(req.routing.ids) > 0 {
			return &req, nil
		}
		text, err := stdMessages(raw)
		if err != nil {
			return nil, err
		}
		req.routing.text = text
		return &req, nil
	}
	prompt := present(last["prompt"])
	if prompt == nil && len(req.routing.ids) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", errBadRequest)
	}
	if prompt != nil {
		// A malformed prompt is refused even when prompt_token_ids route.
		key, err := stdPrompt(prompt)
		if err != nil {
			return nil, err
		}
		if len(req.routing.ids) == 0 {
			req.routing = key
		}
	}
	return &req, nil
}

// present returns raw without surrounding space, or nil when it is absent
// or null.
func present(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	return raw
}

func isEmptyArray(raw json.RawMessage) bool {
	return len(raw) >= 2 && raw[0] == '[' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}

// stdMessages renders a messages array as prefix.RenderChat does, one
// message at a time, on one decoder.
func stdMessages(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '['
		return "", notJSON(err)
	}
	var sb strings.Builder
	for i := 0; dec.More(); i++ {
		name := func() string { return fmt.Sprintf("messages[%d]", i) }
		fields, err := objectFields(dec, name, "role", "content")
		if err != nil {
			return "", err
		}
		if role := present(fields[0]); role != nil {
			var r string
			if err := json.Unmarshal(role, &r); err != nil {
				return "", rawTypeError(name()+".role", role)
			}
			sb.WriteString(r)
		}
		sb.WriteString(": ")
		if err := stdContent(&sb, i, present(fields[1])); err != nil {
			return "", err
		}
		sb.WriteByte('\n')
	}
	return sb.String(), nil
}

// objectFields reads the next value of dec, which must be an object
// (named name() in errors), and returns the last raw value of each of
// keys, in keys' order (nil when absent); other members are skipped.
func objectFields(dec *json.Decoder, name func() string, keys ...string) ([]json.RawMessage, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, notJSON(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, name(), skipValue(dec, tok))
	}
	out := make([]json.RawMessage, len(keys))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		k := slices.Index(keys, tok.(string))
		if k < 0 {
			t, err := dec.Token()
			if err != nil {
				return nil, notJSON(err)
			}
			skipValue(dec, t)
			continue
		}
		if err := dec.Decode(&out[k]); err != nil {
			return nil, notJSON(err)
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, notJSON(err)
	}
	return out, nil
}

// stdContent appends message i's content (raw, nil when absent or null):
// a string, or an array of parts whose "text" parts' text is joined.
func stdContent(sb *strings.Builder, i int, raw json.RawMessage) error {
	switch {
	case raw == nil:
		return nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return notJSON(err)
		}
		sb.WriteString(s)
		return nil
	case raw[0] == '[':
		dec := json.NewDecoder(bytes.NewReader(raw))
		if _, err := dec.Token(); err != nil {
			return notJSON(err)
		}
		for j := 0; dec.More(); j++ {
			fields, err := objectFields(dec, func() string { return fmt.Sprintf("messages[%d].content[%d]", i, j) }, "type", "text")
			if err != nil {
				return err
			}
			var typ, text string
			if json.Unmarshal(fields[0], &typ) == nil && typ == "text" && json.Unmarshal(fields[1], &text) == nil {
				sb.WriteString(text)
			}
		}
		return nil
	}
	return fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", errBadRequest, i)
}

// stdPrompt reads a completions prompt (raw, present): a string, an array
// of strings (joined by newlines), an array of token ids, or an array of
// token-id arrays (concatenated); the first element decides which.
func stdPrompt(raw json.RawMessage) (routingKey, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return routingKey{}, notJSON(err)
		}
		return routingKey{text: s}, nil
	case '[':
		rest := bytes.TrimLeft(raw[1:], " \t\r\n")
		switch {
		case len(rest) == 0 || rest[0] == ']':
			return routingKey{}, nil
		case rest[0] == '"':
			dec := json.NewDecoder(bytes.NewReader(raw))
			_, _ = dec.Token() // '['
			var sb strings.Builder
			for i := 0; dec.More(); i++ {
				tok, err := dec.Token()
				if err != nil {
					return routingKey{}, notJSON(err)
				}
				s, ok := tok.(string)
				if !ok {
					return routingKey{}, fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, fmt.Sprintf("prompt[%d]", i), skipValue(dec, tok))
				}
				if i > 0 {
					sb.WriteByte('\n')
				}
				sb.WriteString(s)
			}
			return routingKey{text: sb.String()}, nil
		default:
			ids, err := stdTokenIDs("prompt", raw)
			return routingKey{ids: ids}, err
		}
	}
	return routingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", errBadRequest)
}

// stdTokenIDs reads the token-id array raw (field name), or for "prompt"
// an array of token-id arrays when its first element is an array. A flat
// array is decoded in one call (an array of integers holds no strings, so
// "null" in its text is a null element, which encoding/json would read as
// 0); a nested one token by token, keeping only the ids.
func stdTokenIDs(name string, raw json.RawMessage) ([]int64, error) {
	if raw[0] != '[' {
		return nil, rawTypeError(name, raw)
	}
	rest := bytes.TrimLeft(raw[1:], " \t\r\n")
	if name != "prompt" || len(rest) == 0 || rest[0] != '[' {
		var ids []int64
		if !bytes.Contains(raw, []byte("null")) && json.Unmarshal(raw, &ids) == nil {
			return ids, nil
		}
		// Name the first element that is not an integer id.
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		_, _ = dec.Token() // '['
		for i := 0; dec.More(); i++ {
			if _, err := tokenID(dec, fmt.Sprintf("%s[%d]", name, i)); err != nil {
				return nil, err
			}
		}
		return nil, fmt.Errorf("%w: %s must be an array of integer token ids", errBadRequest, name)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	_, _ = dec.Token() // '['
	var ids []int64
	for i := 0; dec.More(); i++ {
		elem := fmt.Sprintf("%s[%d]", name, i)
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return nil, fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, elem, skipValue(dec, tok))
		}
		for j := 0; dec.More(); j++ {
			id, err := tokenID(dec, fmt.Sprintf("%s[%d]", elem, j))
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		if _, err := dec.Token(); err != nil { // ']'
			return nil, notJSON(err)
		}
	}
	return ids, nil
}

// tokenID reads the next value of dec as the integer token id name.
func tokenID(dec *json.Decoder, name string) (int64, error) {
	tok, err := dec.Token()
	if err != nil {
		return 0, notJSON(err)
	}
	if n, ok := tok.(json.Number); ok {
		if id, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return id, nil
		}
		return 0, fmt.Errorf("%w: %s must be an integer token id, not the number %s", errBadRequest, name, n)
	}
	return 0, fmt.Errorf("%w: %s must be an integer token id, not a JSON %s", errBadRequest, name, skipValue(dec, tok))
}

// skipValue names the JSON type of the value tok starts and, for an
// object or array, reads the rest of it from dec.
func skipValue(dec *json.Decoder, tok json.Token) string {
	typ := tokenType(tok)
	if d, ok := tok.(json.Delim); ok && (d == '[' || d == '{') {
		for depth := 1; depth > 0; {
			t, err := dec.Token()
			if err != nil {
				break
			}
			if d, ok := t.(json.Delim); ok {
				if d == '[' || d == '{' {
					depth++
				} else {
					depth--
				}
			}
		}
	}
	return typ
}

// rawTypeError is the 400 for field whose raw value has the wrong type.
func rawTypeError(field string, raw json.RawMessage) error {
	typ := "null"
	switch c := raw[0]; {
	case c == '"':
		typ = "string"
	case c == '{':
		typ = "object"
	case c == '[':
		typ = "array"
	case c == 't' || c == 'f':
		typ = "bool"
	case c == '-' || (c >= '0' && c <= '9'):
		typ = "number"
	}
	return fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, field, typ)
}

// notJSON is the 400 for a body encoding/json cannot read.
func notJSON(err error) error {
	return fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
}

// tokenType names the JSON type a json.Decoder token starts.
func tokenType(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "array"
		}
		return "object"
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}
