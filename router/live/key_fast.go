package live

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/valyala/fastjson"
)

// parsers parse request bodies and answers' usage. fastjson parses in one
// pass, without reflection, into a reused parser: against encoding/json,
// which validates and then decodes (two passes) and copies every raw
// content, it takes the router's per-request parse from about a third of
// its handler time (BenchmarkHandler) to a few percent.
var parsers fastjson.ParserPool

// parseFast is ParseRequest's fast path, for small bodies of plain text
// (plainText) and few values: checkBody, then fastjson's tree of the body.
func parseFast(body []byte, chat bool) (*CompletionRequest, error) {
	if err := checkBody(body); err != nil {
		return nil, err
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		// Not expected: the body is valid JSON nested well under
		// fastjson.MaxDepth.
		return nil, fmt.Errorf("%w: body is not valid JSON: %v", ErrBadRequest, err)
	}
	req, err := readFast(v, chat)
	if err == errDeclined {
		return readStd(body, chat)
	}
	return req, err
}

// errDeclined is readFast's answer for a chat request with tools, or a
// message with a field beside role and content (name, tool_call_id,
// tool_calls, reasoning): parseFast reads those with readStd, whose rules
// for them (see RoutingKey) the fast path does not repeat. They keep a
// field's raw JSON, which fastjson does not give back as it was sent.
var errDeclined = errors.New("declined by the fast path")

// readFast reads a parsed request.
func readFast(v *fastjson.Value, chat bool) (*CompletionRequest, error) {
	if v.Type() != fastjson.TypeObject {
		return nil, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", ErrBadRequest, jsonType(v))
	}
	var (
		req CompletionRequest
		err error
	)
	if m := field(v, "model"); m != nil && m.Type() != fastjson.TypeNull {
		b, err := m.StringBytes()
		if err != nil {
			return nil, typeError("model", m)
		}
		req.Model = string(b)
	}
	if st := field(v, "stream"); st != nil && st.Type() != fastjson.TypeNull {
		if req.Stream, err = st.Bool(); err != nil {
			return nil, typeError("stream", st)
		}
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", ErrBadRequest)
	}
	// Chat's max_completion_tokens, when set, wins over max_tokens
	// (MaxTokens): the later name read counts.
	for _, name := range maxTokensFields(chat) {
		if mt := field(v, name); mt != nil && mt.Type() != fastjson.TypeNull {
			if mt.Type() != fastjson.TypeNumber {
				return nil, typeError(name, mt)
			}
			req.MaxTokens = maxTokens(mt.String())
		}
	}
	if cs := field(v, "cache_salt"); cs != nil && cs.Type() != fastjson.TypeNull {
		b, err := cs.StringBytes()
		if err != nil {
			return nil, typeError("cache_salt", cs)
		}
		req.salt = string(b)
	}
	if ids := field(v, "prompt_token_ids"); ids != nil && ids.Type() != fastjson.TypeNull {
		if req.routing.ids, err = tokenIDs("prompt_token_ids", ids, nil); err != nil {
			return nil, err
		}
	}
	if chat {
		msgs := field(v, "messages")
		if msgs != nil && msgs.Type() != fastjson.TypeNull && msgs.Type() != fastjson.TypeArray {
			return nil, typeError("messages", msgs)
		}
		if msgs == nil || len(msgs.GetArray()) == 0 {
			return nil, fmt.Errorf("%w: messages must be a non-empty array", ErrBadRequest)
		}
		if len(req.routing.ids) > 0 {
			return &req, nil
		}
		if t := field(v, "tools"); t != nil && t.Type() != fastjson.TypeNull {
			return nil, errDeclined
		}
		text, spans, err := renderChat(msgs.GetArray())
		if err != nil {
			return nil, err
		}
		req.routing.text, req.routing.chat = text, spans
		return &req, nil
	}
	prompt := field(v, "prompt")
	if prompt != nil && prompt.Type() == fastjson.TypeNull {
		prompt = nil
	}
	if prompt == nil && len(req.routing.ids) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", ErrBadRequest)
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
// content\n" per message; a content-part array contributes the text of
// its "text" parts whose text is a string, joined by "\n" as vLLM joins
// them: see RoutingKey), in one buffer, with each message's span in it.
// A message with a field beside role and content is errDeclined.
func renderChat(msgs []*fastjson.Value) (string, []chatSpan, error) {
	n := 0
	for _, m := range msgs {
		n += len(field(m, "role").GetStringBytes()) + len(field(m, "content").GetStringBytes()) + 3
	}
	buf := make([]byte, 0, n)
	spans := make([]chatSpan, 0, len(msgs))
	for i, m := range msgs {
		o, err := m.Object()
		if err != nil {
			return "", nil, typeError(fmt.Sprintf("messages[%d]", i), m)
		}
		var r, c *fastjson.Value
		declined := false
		o.Visit(func(k []byte, e *fastjson.Value) {
			switch string(k) {
			case "role":
				r = e
			case "content":
				c = e
			case "name", "tool_call_id", "tool_calls", "reasoning":
				declined = declined || e.Type() != fastjson.TypeNull
			}
		})
		if declined {
			return "", nil, errDeclined
		}
		if r != nil && r.Type() != fastjson.TypeNull {
			role, err := r.StringBytes()
			if err != nil {
				return "", nil, typeError(fmt.Sprintf("messages[%d].role", i), r)
			}
			buf = append(buf, role...)
		}
		sp := chatSpan{roleEnd: uint32(len(buf))}
		buf = append(buf, ": "...)
		switch {
		case c == nil || c.Type() == fastjson.TypeNull:
		case c.Type() == fastjson.TypeString:
			b, _ := c.StringBytes()
			buf = append(buf, b...)
		case c.Type() == fastjson.TypeArray:
			texts := 0
			for j, part := range c.GetArray() {
				if part.Type() != fastjson.TypeObject {
					return "", nil, typeError(fmt.Sprintf("messages[%d].content[%d]", i, j), part)
				}
				if t := field(part, "text"); t != nil && t.Type() == fastjson.TypeString && string(field(part, "type").GetStringBytes()) == "text" {
					if texts > 0 {
						buf = append(buf, '\n')
					}
					buf = append(buf, t.GetStringBytes()...)
					texts++
				}
			}
		default:
			return "", nil, fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", ErrBadRequest, i)
		}
		buf = append(buf, '\n')
		sp.end = uint32(len(buf))
		spans = append(spans, sp)
	}
	if len(buf) == 0 {
		return "", spans, nil
	}
	// buf is not written again: the string shares it (as strings.Builder
	// does) instead of copying the prompt once more.
	return unsafe.String(&buf[0], len(buf)), spans, nil
}

// promptKey reads a completions prompt: a string, an array of strings
// (joined by newlines), an array of token ids, or an array of token-id
// arrays (concatenated).
func promptKey(v *fastjson.Value) (RoutingKey, error) {
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		return RoutingKey{text: string(b)}, nil
	case fastjson.TypeArray:
		elems := v.GetArray()
		if len(elems) == 0 {
			return RoutingKey{}, nil
		}
		switch elems[0].Type() {
		case fastjson.TypeString:
			var sb strings.Builder
			for i, e := range elems {
				b, err := e.StringBytes()
				if err != nil {
					return RoutingKey{}, typeError(fmt.Sprintf("prompt[%d]", i), e)
				}
				if i > 0 {
					sb.WriteByte('\n')
				}
				sb.Write(b)
			}
			return RoutingKey{text: sb.String()}, nil
		case fastjson.TypeArray:
			var ids []int64
			for i, e := range elems {
				var err error
				if ids, err = tokenIDs(fmt.Sprintf("prompt[%d]", i), e, ids); err != nil {
					return RoutingKey{}, err
				}
			}
			return RoutingKey{ids: ids}, nil
		default:
			ids, err := tokenIDs("prompt", v, nil)
			return RoutingKey{ids: ids}, err
		}
	}
	return RoutingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", ErrBadRequest)
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
			got := "a JSON " + jsonType(e)
			if e.Type() == fastjson.TypeNumber {
				got = "the number " + e.String()
			}
			return nil, fmt.Errorf("%w: %s[%d] must be an integer token id, not %s", ErrBadRequest, name, i, got)
		}
		dst = append(dst, id)
	}
	return dst, nil
}

// typeError is the 400 for a field of the wrong JSON type.
func typeError(field string, v *fastjson.Value) error {
	return fmt.Errorf("%w: %q must not be a JSON %s", ErrBadRequest, field, jsonType(v))
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

// field returns the value of key in the object v, the last one when the
// key is given twice; nil when v is not an object or has no such key.
func field(v *fastjson.Value, key string) *fastjson.Value {
	o, err := v.Object()
	if err != nil {
		return nil
	}
	var last *fastjson.Value
	o.Visit(func(k []byte, e *fastjson.Value) {
		if string(k) == key {
			last = e
		}
	})
	return last
}
