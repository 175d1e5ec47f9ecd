package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

type stdMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// stdPart is one element of a chat message's content array.
type stdPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// parseStd is parseRequest with encoding/json: the path for large bodies
// and the authority on bodies the fast path refuses. It reads what
// parseFast reads, with the same rules (null is absent; a key given twice
// counts as its last value; a malformed prompt is refused even when
// prompt_token_ids route); its error messages are encoding/json's.
//
// It walks the body as a token stream and renders chat messages one at a
// time, so what it keeps is the routing key, not the document: a body of
// a million tiny messages or array elements costs about what its text
// does.
func parseStd(body []byte, chat bool) (*completionRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	invalid := func(err error) error {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, te.Field, te.Value)
		}
		return fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, invalid(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", errBadRequest, tokenType(tok))
	}
	var (
		req      completionRequest
		prompt   json.RawMessage
		rendered *string // the last messages array, rendered; nil: none
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalid(err)
		}
		key, _ := tok.(string)
		switch {
		case key == "model":
			var m *string
			if err := dec.Decode(&m); err != nil {
				return nil, fieldError("model", err)
			}
			req.Model = ""
			if m != nil {
				req.Model = *m
			}
		case key == "stream":
			var st *bool
			if err := dec.Decode(&st); err != nil {
				return nil, fieldError("stream", err)
			}
			req.Stream = st != nil && *st
		case key == "prompt_token_ids":
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, invalid(err)
			}
			var ids []int64
			if err := tokenArray("prompt_token_ids", raw, &ids); err != nil {
				return nil, err
			}
			req.routing.ids = ids
		case key == "prompt" && !chat:
			prompt = nil
			if err := dec.Decode(&prompt); err != nil {
				return nil, invalid(err)
			}
		case key == "messages" && chat:
			text, err := stdMessages(dec)
			if err != nil {
				return nil, err
			}
			rendered = text
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, invalid(err)
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, invalid(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: body is not valid JSON: data after the top-level object", errBadRequest)
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", errBadRequest)
	}
	if chat {
		if rendered == nil || *rendered == "" {
			return nil, fmt.Errorf("%w: messages must be a non-empty array", errBadRequest)
		}
		if len(req.routing.ids) == 0 {
			req.routing.text = *rendered
		}
		return &req, nil
	}
	prompt = bytes.TrimSpace(prompt)
	if bytes.Equal(prompt, []byte("null")) {
		prompt = nil
	}
	if len(prompt) == 0 && len(req.routing.ids) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", errBadRequest)
	}
	if len(prompt) > 0 {
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

// stdMessages reads a messages value from dec (an array, or null) and
// renders it as prefix.RenderChat does, one message at a time. An empty
// or null array renders as "", which the caller refuses.
func stdMessages(dec *json.Decoder) (*string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
	}
	empty := ""
	if tok == nil {
		return &empty, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, "messages", tokenType(tok))
	}
	var sb strings.Builder
	for i := 0; dec.More(); i++ {
		var m *stdMessage
		if err := dec.Decode(&m); err != nil {
			return nil, fieldError(fmt.Sprintf("messages[%d]", i), err)
		}
		if m == nil {
			return nil, fmt.Errorf("%w: %q must not be a JSON null", errBadRequest, fmt.Sprintf("messages[%d]", i))
		}
		text, err := stdContent(i, m.Content)
		if err != nil {
			return nil, err
		}
		sb.WriteString(m.Role)
		sb.WriteString(": ")
		sb.WriteString(text)
		sb.WriteByte('\n')
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
	}
	out := sb.String()
	return &out, nil
}

// fieldError is the 400 for a field whose value failed to decode.
func fieldError(field string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			field += "." + te.Field
		}
		return fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, field, te.Value)
	}
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

// stdContent renders message i's content: a string, null, or an array of
// parts whose "text" parts are joined.
func stdContent(i int, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%w: messages[%d].content: %v", errBadRequest, i, err)
		}
		return s, nil
	case '[':
		var parts []*stdPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", fmt.Errorf("%w: messages[%d].content: %v", errBadRequest, i, err)
		}
		var sb strings.Builder
		for j, p := range parts {
			if p == nil {
				return "", fmt.Errorf("%w: %q must not be a JSON null", errBadRequest, fmt.Sprintf("messages[%d].content[%d]", i, j))
			}
			if p.Type == "text" {
				sb.WriteString(p.Text)
			}
		}
		return sb.String(), nil
	}
	return "", fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", errBadRequest, i)
}

// stdPrompt reads a completions prompt: a string, an array of strings
// (joined by newlines), an array of token ids, or an array of token-id
// arrays (concatenated).
func stdPrompt(raw json.RawMessage) (routingKey, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		return routingKey{text: s}, nil
	case '[':
		// The first element's kind decides the shape; the array is then
		// decoded once, into that shape.
		rest := bytes.TrimLeft(raw[1:], " \t\r\n")
		if len(rest) == 0 || rest[0] == ']' {
			return routingKey{}, nil
		}
		switch rest[0] {
		case '"':
			var ss []*string
			if err := json.Unmarshal(raw, &ss); err != nil {
				return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
			}
			var sb strings.Builder
			for j, p := range ss {
				if p == nil {
					return routingKey{}, fmt.Errorf("%w: %q must not be a JSON null", errBadRequest, fmt.Sprintf("prompt[%d]", j))
				}
				if j > 0 {
					sb.WriteByte('\n')
				}
				sb.WriteString(*p)
			}
			return routingKey{text: sb.String()}, nil
		case '[':
			var batches [][]int64
			if err := tokenArray("prompt", raw, &batches); err != nil {
				return routingKey{}, err
			}
			var ids []int64
			for _, b := range batches {
				ids = append(ids, b...)
			}
			return routingKey{ids: ids}, nil
		default:
			var ids []int64
			if err := tokenArray("prompt", raw, &ids); err != nil {
				return routingKey{}, err
			}
			return routingKey{ids: ids}, nil
		}
	}
	return routingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", errBadRequest)
}

// tokenArray decodes raw, an array (or array of arrays) of token ids named
// name, into dst (*[]int64 or *[][]int64). encoding/json would read a null
// element as 0 (or an empty batch); the fast path refuses it, and so does
// this. An array of integers holds no strings, so "null" in its text is a
// null element.
func tokenArray(name string, raw json.RawMessage, dst any) error {
	if bytes.Contains(raw, []byte("null")) && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return fmt.Errorf("%w: %s must hold integer token ids, not JSON nulls", errBadRequest, name)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fieldError(name, err)
	}
	return nil
}
