package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// ChatTemplate is a model's compiled Jinja chat template (the
// `chat_template` of its tokenizer_config.json, or a template file) and
// the special tokens templates refer to as bos_token and eos_token.
//
// Rendering uses github.com/ardanlabs/jinja (v1.8.0): a pure-Go Jinja
// engine written for LLM chat templates (raise_exception, strftime_now,
// namespace, tojson, the string methods templates call), with no
// dependencies, whose compiled templates are safe to render concurrently.
// github.com/nikolalohinski/gonja/v2 was the other candidate; it is a
// general Jinja port that brings a logging and test stack with it.
// Later ardanlabs/jinja versions need Go 1.27.
//
// The variables a template sees: messages, tools, add_generation_prompt
// (true), bos_token, eos_token; documents is undefined. Each message is a
// dict of role and content and, when set, tool_calls, reasoning and
// reasoning_content, tool_call_id and name, in that order, as vLLM's
// parse_chat_messages builds it (vllm/entrypoints/chat_utils.py,
// _parse_chat_message_content and _postprocess_messages; commit
// 001eadcf295d90aa0664963cd6a9d93f38a2f3da): each tool call's
// function.arguments, when a string, is parsed into its JSON value ({}
// when it is not an object or array of valid JSON), and an empty
// tool_calls is left out. tools is the list of chat completions tools as
// pydantic's model_dump gives them to the template (vLLM's chat serving
// and /tokenize: [tool.model_dump() for tool in request.tools]), each
// {"type", "function": {"name", "description", "parameters", ...}} with
// description and parameters None when absent; None when the request has
// no tools (Hugging Face's apply_chat_template passes tools=None).
type ChatTemplate struct {
	tmpl     *jinja.Template
	bos, eos string
}

// ParseChatTemplate compiles a Jinja chat template. bos and eos are the
// model's BOS and EOS token strings ("" when unknown). name is used in
// errors.
func ParseChatTemplate(name, src, bos, eos string) (*ChatTemplate, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("%s: invalid chat template: %w", name, err)
	}
	return &ChatTemplate{tmpl: t, bos: bos, eos: eos}, nil
}

// Render renders msgs and tools (a JSON array of chat completions
// tools, "" for none) with the generation prompt added: the text the
// engine tokenizes for a chat request. A tool call or tools list that is
// not valid JSON of the expected shape is an error. Linear in the size of
// msgs and tools; tools is parsed once.
func (t *ChatTemplate) Render(msgs []prefix.ChatMessage, tools string) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		d := jinja.NewDict()
		dict := d.AsDict()
		dict.Set("role", jinja.NewString(m.Role))
		dict.Set("content", jinja.NewString(m.Content))
		if m.ToolCalls != "" {
			calls, err := toolCallsValue(m.ToolCalls)
			if err != nil {
				return "", fmt.Errorf("tokenizer: messages[%d].tool_calls: %w", i, err)
			}
			if len(calls.AsList().Items) > 0 {
				dict.Set("tool_calls", calls)
			}
		}
		if m.HasReasoning {
			dict.Set("reasoning", jinja.NewString(m.Reasoning))
			dict.Set("reasoning_content", jinja.NewString(m.Reasoning))
		}
		if m.ToolCallID != "" {
			dict.Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Name != "" {
			dict.Set("name", jinja.NewString(m.Name))
		}
		list[i] = d
	}
	toolsValue := jinja.None()
	if tools != "" {
		var err error
		if toolsValue, err = toolDicts(tools); err != nil {
			return "", fmt.Errorf("tokenizer: tools: %w", err)
		}
	}
	out, err := t.tmpl.RenderValues(map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"tools":                 toolsValue,
		"add_generation_prompt": jinja.NewBool(true),
		"bos_token":             jinja.NewString(t.bos),
		"eos_token":             jinja.NewString(t.eos),
	})
	if err != nil {
		return "", fmt.Errorf("tokenizer: rendering the chat template: %w", err)
	}
	return out, nil
}

// toolCallsValue parses a message's tool_calls, a JSON array of objects,
// with each call's function.arguments as _postprocess_messages leaves it:
// a string parsed as JSON (an object or array kept, anything else {}),
// an object or array kept, anything else {}.
func toolCallsValue(raw string) (jinja.Value, error) {
	v, err := jsonValue(raw)
	if err != nil {
		return v, err
	}
	if !v.IsList() {
		return v, errors.New("not a JSON array")
	}
	for _, call := range v.AsList().Items {
		if !call.IsDict() {
			return v, errors.New("a tool call is not a JSON object")
		}
		fn, ok := call.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return v, errors.New("a tool call has no function object")
		}
		f := fn.AsDict()
		args, _ := f.Get("arguments")
		switch {
		case args.IsString():
			parsed, err := jsonValue(args.AsString())
			if err != nil || (!parsed.IsDict() && !parsed.IsList()) {
				parsed = jinja.NewDict()
			}
			f.Set("arguments", parsed)
		case args.IsDict() || args.IsList():
		default:
			f.Set("arguments", jinja.NewDict())
		}
	}
	return v, nil
}

// toolDicts parses the request's tools, a JSON array of chat completions
// tools, into what ChatCompletionToolsParam.model_dump gives: per tool
// "type" ("function" when absent) and "function" first, then its other
// members; per function "name", "description" and "parameters" (None when
// absent) first, then its other members (pydantic dumps declared fields
// in order, then the extra ones, OpenAIBaseModel allowing extras).
func toolDicts(raw string) (jinja.Value, error) {
	v, err := jsonValue(raw)
	if err != nil {
		return v, err
	}
	if !v.IsList() {
		return v, errors.New("not a JSON array")
	}
	items := v.AsList().Items
	for i, tool := range items {
		if !tool.IsDict() {
			return v, errors.New("a tool is not a JSON object")
		}
		fn, ok := tool.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return v, errors.New("a tool has no function object")
		}
		if name, _ := fn.AsDict().Get("name"); !name.IsString() {
			return v, errors.New("a tool's function has no name")
		}
		tool.AsDict().Set("function", declaredFirst(fn.AsDict(),
			map[string]jinja.Value{"description": jinja.None(), "parameters": jinja.None()}, "name", "description", "parameters"))
		items[i] = declaredFirst(tool.AsDict(), map[string]jinja.Value{"type": jinja.NewString("function")}, "type", "function")
	}
	return v, nil
}

// declaredFirst returns d with the keys in order first (d's value, else
// the default in defs), then d's other keys in their order.
func declaredFirst(d *jinja.Dict, defs map[string]jinja.Value, order ...string) jinja.Value {
	out := jinja.NewDict()
	o := out.AsDict()
	for _, k := range order {
		v, ok := d.Get(k)
		if !ok {
			v = defs[k]
		}
		o.Set(k, v)
	}
	for _, k := range d.Keys {
		if !o.Has(k) {
			v, _ := d.Get(k)
			o.Set(k, v)
		}
	}
	return out
}

// jsonValue parses one JSON value into a template value: objects as
// dicts in their key order (a key given twice keeps its first place and
// its last value, as Python's json.loads does), integers as ints (as
// json.loads keeps them), other numbers as floats. Linear in len(raw).
func jsonValue(raw string) (jinja.Value, error) {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return v, err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return d, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return v, err
				}
				d.AsDict().Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		}
	case json.Number:
		return jinja.FromGoValue(x), nil
	}
	return jinja.FromGoValue(tok), nil
}

// TokenizerConfig is what the router reads from a model's
// tokenizer_config.json: its chat template and special tokens.
type TokenizerConfig struct {
	// ChatTemplate is the `chat_template`: the string, or, when the file
	// lists named templates, the one named "default" (the first when none
	// is). "" when the file has none.
	ChatTemplate string
	// BOS and EOS are `bos_token` and `eos_token`, given either as a
	// string or as an added-token object {"content": ...}; "" when absent.
	BOS, EOS string
}

// ParseTokenizerConfig reads a tokenizer_config.json. name is used in
// errors.
func ParseTokenizerConfig(name string, data []byte) (TokenizerConfig, error) {
	var raw struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return TokenizerConfig{}, fmt.Errorf("%s: not a tokenizer_config.json: %w", name, err)
	}
	var c TokenizerConfig
	var err error
	if c.BOS, err = tokenString(raw.BOS); err != nil {
		return c, fmt.Errorf("%s: bos_token: %w", name, err)
	}
	if c.EOS, err = tokenString(raw.EOS); err != nil {
		return c, fmt.Errorf("%s: eos_token: %w", name, err)
	}
	if len(raw.ChatTemplate) == 0 || string(raw.ChatTemplate) == "null" {
		return c, nil
	}
	if err := json.Unmarshal(raw.ChatTemplate, &c.ChatTemplate); err == nil {
		return c, nil
	}
	var named []struct{ Name, Template string }
	if err := json.Unmarshal(raw.ChatTemplate, &named); err != nil {
		return c, fmt.Errorf("%s: chat_template is neither a string nor a list of {name, template}", name)
	}
	for i, n := range named {
		if i == 0 || n.Name == "default" {
			c.ChatTemplate = n.Template
		}
		if n.Name == "default" {
			break
		}
	}
	return c, nil
}

// tokenString decodes a special token given as a string or as an
// added-token object.
func tokenString(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("neither a string nor {\"content\": ...}")
	}
	return obj.Content, nil
}
