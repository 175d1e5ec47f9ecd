package serve

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/valyala/fastjson"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// DefaultCharsPerToken is the text-to-token ratio of the routing key when
// a request carries text, not token ids: an approximation (English text
// under common BPE tokenizers averages about 4 characters a token).
const DefaultCharsPerToken = prefix.DefaultCharsPerToken

// completionRequest is the part of an OpenAI completion or chat request
// the router reads; the body is forwarded unchanged.
type completionRequest struct {
	Model   string
	Stream  bool
	routing routingKey
}

// parsers parse request bodies and answers' usage. fastjson parses in one
// pass, without reflection, into a reused parser: against encoding/json,
// which validates and then decodes (two passes) and copies every raw
// content, it takes the router's per-request parse from about a third of
// its handler time (BenchmarkHandler) to a few percent.
var parsers fastjson.ParserPool

// errBadRequest wraps every reason a body is refused with 400.
var errBadRequest = errors.New("invalid request")

// parseRequest decodes body and extracts its routing key; chat selects
// the chat schema (messages) over the completions one (prompt). Errors
// wrap errBadRequest and name the offending field.
func parseRequest(body []byte, chat bool) (*completionRequest, error) {
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", errBadRequest, jsonType(v))
	}
	var req completionRequest
	if m := v.Get("model"); m != nil && m.Type() != fastjson.TypeNull {
		b, err := m.StringBytes()
		if err != nil {
			return nil, typeError("model", m)
		}
		req.Model = string(b)
	}
	if st := v.Get("stream"); st != nil && st.Type() != fastjson.TypeNull {
		if req.Stream, err = st.Bool(); err != nil {
			return nil, typeError("stream", st)
		}
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", errBadRequest)
	}
	if ids := v.Get("prompt_token_ids"); ids != nil && ids.Type() != fastjson.TypeNull {
		if req.routing.ids, err = tokenIDs("prompt_token_ids", ids, nil); err != nil {
			return nil, err
		}
	}
	if chat {
		msgs := v.Get("messages")
		if msgs != nil && msgs.Type() != fastjson.TypeNull && msgs.Type() != fastjson.TypeArray {
			return nil, typeError("messages", msgs)
		}
		if msgs == nil || len(msgs.GetArray()) == 0 {
			return nil, fmt.Errorf("%w: messages must be a non-empty array", errBadRequest)
		}
		if len(req.routing.ids) > 0 {
			return &req, nil
		}
		text, err := renderChat(msgs.GetArray())
		if err != nil {
			return nil, err
		}
		req.routing.text = text
		return &req, nil
	}
	prompt := v.Get("prompt")
	if prompt != nil && prompt.Type() == fastjson.TypeNull {
		prompt = nil
	}
	if prompt == nil && len(req.routing.ids) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", errBadRequest)
	}
	if prompt != nil {
		// A malformed prompt is refused even when prompt_token_ids route.
		key, err := promptKey(prompt)
		if err != nil {
			return nil, err
		}
		if len(req.routing.ids) == 0 {
			req.routing = key
		}
	}
	return &req, nil
}

// renderChat renders chat messages as prefix.RenderChat does ("role:
// content\n" per message; a content-part array contributes its text parts
// joined), in one buffer.
func renderChat(msgs []*fastjson.Value) (string, error) {
	n := 0
	for _, m := range msgs {
		n += len(m.GetStringBytes("role")) + len(m.GetStringBytes("content")) + 3
	}
	buf := make([]byte, 0, n)
	for i, m := range msgs {
		if m.Type() != fastjson.TypeObject {
			return "", typeError(fmt.Sprintf("messages[%d]", i), m)
		}
		if r := m.Get("role"); r != nil && r.Type() != fastjson.TypeNull {
			role, err := r.StringBytes()
			if err != nil {
				return "", typeError(fmt.Sprintf("messages[%d].role", i), r)
			}
			buf = append(buf, role...)
		}
		buf = append(buf, ": "...)
		c := m.Get("content")
		switch {
		case c == nil || c.Type() == fastjson.TypeNull:
		case c.Type() == fastjson.TypeString:
			b, _ := c.StringBytes()
			buf = append(buf, b...)
		case c.Type() == fastjson.TypeArray:
			for j, part := range c.GetArray() {
				if part.Type() != fastjson.TypeObject {
					return "", typeError(fmt.Sprintf("messages[%d].content[%d]", i, j), part)
				}
				if string(part.GetStringBytes("type")) == "text" {
					buf = append(buf, part.GetStringBytes("text")...)
				}
			}
		default:
			return "", fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", errBadRequest, i)
		}
		buf = append(buf, '\n')
	}
	if len(buf) == 0 {
		return "", nil
	}
	// buf is not written again: the string shares it (as strings.Builder
	// does) instead of copying the prompt once more.
	return unsafe.String(&buf[0], len(buf)), nil
}

// promptKey reads a completions prompt: a string, an array of strings
// (joined by newlines), an array of token ids, or an array of token-id
// arrays (concatenated).
func promptKey(v *fastjson.Value) (routingKey, error) {
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		return routingKey{text: string(b)}, nil
	case fastjson.TypeArray:
		elems := v.GetArray()
		if len(elems) == 0 {
			return routingKey{}, nil
		}
		switch elems[0].Type() {
		case fastjson.TypeString:
			var sb strings.Builder
			for i, e := range elems {
				b, err := e.StringBytes()
				if err != nil {
					return routingKey{}, typeError(fmt.Sprintf("prompt[%d]", i), e)
				}
				if i > 0 {
					sb.WriteByte('\n')
				}
				sb.Write(b)
			}
			return routingKey{text: sb.String()}, nil
		case fastjson.TypeArray:
			var ids []int64
			for i, e := range elems {
				var err error
				if ids, err = tokenIDs(fmt.Sprintf("prompt[%d]", i), e, ids); err != nil {
					return routingKey{}, err
				}
			}
			return routingKey{ids: ids}, nil
		default:
			ids, err := tokenIDs("prompt", v, nil)
			return routingKey{ids: ids}, err
		}
	}
	return routingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", errBadRequest)
}

// tokenIDs appends the integers of the JSON array v (the field name) to
// dst.
func tokenIDs(name string, v *fastjson.Value, dst []int64) ([]int64, error) {
	arr, err := v.Array()
	if err != nil {
		return nil, typeError(name, v)
	}
	dst = slices.Grow(dst, len(arr))
	for i, e := range arr {
		id, err := e.Int64()
		if err != nil {
			return nil, fmt.Errorf("%w: %s[%d] must be an integer token id, not a JSON %s", errBadRequest, name, i, jsonType(e))
		}
		dst = append(dst, id)
	}
	return dst, nil
}

// typeError is the 400 for a field of the wrong JSON type.
func typeError(field string, v *fastjson.Value) error {
	return fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, field, jsonType(v))
}

// jsonType names v's JSON type as encoding/json's errors do.
func jsonType(v *fastjson.Value) string {
	switch v.Type() {
	case fastjson.TypeString:
		return "string"
	case fastjson.TypeNumber:
		return "number"
	case fastjson.TypeObject:
		return "object"
	case fastjson.TypeArray:
		return "array"
	case fastjson.TypeTrue, fastjson.TypeFalse:
		return "bool"
	}
	return "null"
}

// routingKey is what a request is routed by: its prompt as token ids or
// as text.
type routingKey struct {
	ids  []int64
	text string
}

// key returns the routing key parseRequest extracted: token ids when the
// request carries them, else the prompt text (the rendered messages for
// chat).
func (req *completionRequest) key() routingKey { return req.routing }

// hash returns the key's prompt length in tokens (estimated for text) and
// the chained hashes of its full blocks of blockSize tokens (prefix
// TokenBlocks and TextBlocks, which the mock engine shares).
func (k routingKey) hash(blockSize, charsPerToken int) (tokens int, hashes []uint64) {
	if k.ids != nil {
		return len(k.ids), prefix.TokenBlocks(k.ids, blockSize)
	}
	return prefix.EstimateTokens(k.text, charsPerToken), prefix.TextBlocks(k.text, blockSize, charsPerToken)
}
