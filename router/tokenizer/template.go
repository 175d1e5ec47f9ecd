package tokenizer

import (
	"encoding/json"
	"fmt"

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
// The variables a template sees: messages (a list of {role, content}),
// add_generation_prompt (true), bos_token, eos_token; tools and
// documents are undefined.
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

// Render renders msgs with the generation prompt added: the text the
// engine tokenizes for a chat request.
func (t *ChatTemplate) Render(msgs []prefix.ChatMessage) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	out, err := t.tmpl.Render(map[string]any{
		"messages":              list,
		"add_generation_prompt": true,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	})
	if err != nil {
		return "", fmt.Errorf("tokenizer: rendering the chat template: %w", err)
	}
	return out, nil
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
