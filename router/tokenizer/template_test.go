package tokenizer

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// The goldens below are the renderings the model publishers document for
// add_generation_prompt=true; each was also checked by rendering the same
// template with Python's jinja2 3.1.6, the engine-side renderer vLLM and
// transformers use.

// TestChatMLGolden renders the ChatML template of Hugging Face's chat
// templating guide ("Templates for chat models", the section "What are
// generation prompts?"), stored as tokenizer_config.json's chat_template
// in testdata/chatml_config.json, for the guide's three messages. The
// golden is the guide's output for add_generation_prompt=True.
func TestChatMLGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/chatml_config.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseTokenizerConfig("chatml_config.json", b)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EOS != "<|im_end|>" || cfg.BOS != "" {
		t.Errorf("BOS, EOS = %q, %q; want \"\", \"<|im_end|>\"", cfg.BOS, cfg.EOS)
	}
	tmpl, err := ParseChatTemplate("chatml_config.json", cfg.ChatTemplate, cfg.BOS, cfg.EOS)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []prefix.ChatMessage{
		{Role: "user", Content: "Hi there!"},
		{Role: "assistant", Content: "Nice to meet you!"},
		{Role: "user", Content: "Can I ask a question?"},
	}
	const golden = "<|im_start|>user\nHi there!<|im_end|>\n" +
		"<|im_start|>assistant\nNice to meet you!<|im_end|>\n" +
		"<|im_start|>user\nCan I ask a question?<|im_end|>\n" +
		"<|im_start|>assistant\n"
	got, err := tmpl.Render(msgs, "")
	if err != nil {
		t.Fatal(err)
	}
	if got != golden {
		t.Errorf("rendered\n%q\nwant\n%q", got, golden)
	}

	// EncodeChat tokenizes the rendering without adding special tokens
	// again: the same ids as the golden text encoded by the same file.
	f := loadFile(t, "bytebpe-bos.json", tmpl)
	ids, err := f.EncodeChat(context.Background(), []prefix.ChatMessage{{Role: "user", Content: "hello world"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{285, 267, 10, 259, 264, 286, 10, 285, 275, 10}; !slices.Equal(ids, want) {
		t.Errorf("EncodeChat = %v, want %v (no BOS: the template writes none)", ids, want)
	}
}

// TestLlama3Golden renders the chat template of Meta-Llama-3-8B-Instruct
// (its tokenizer_config.json chat_template, in testdata/llama3.jinja) with
// bos_token "<|begin_of_text|>". The golden is the prompt format of Meta's
// Llama 3 model card ("Meta Llama 3 prompt format": a system prompt, a
// user message, then the assistant header awaiting the answer).
func TestLlama3Golden(t *testing.T) {
	src, err := os.ReadFile("testdata/llama3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ParseChatTemplate("llama3.jinja", string(src), "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []prefix.ChatMessage{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: " hello world\n"}, // the template trims content
	}
	const golden = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
		"You are a helpful assistant.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nhello world<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	got, err := tmpl.Render(msgs, "")
	if err != nil {
		t.Fatal(err)
	}
	if got != golden {
		t.Errorf("rendered\n%q\nwant\n%q", got, golden)
	}
	f := loadFile(t, "bytebpe-bos.json", tmpl)
	ids, err := f.EncodeChat(context.Background(), msgs[1:], "")
	if err != nil {
		t.Fatal(err)
	}
	// <|begin_of_text|> once (from the template, not the post-processor),
	// <|start_header_id|> user <|end_header_id|> ĊĊ hello Ġworld <|eot_id|>
	// <|start_header_id|> assistant <|end_header_id|> ĊĊ.
	if want := []int64{287, 288, 267, 289, 284, 259, 264, 290, 288, 275, 289, 284}; !slices.Equal(ids, want) {
		t.Errorf("EncodeChat = %v, want %v", ids, want)
	}
}

func TestParseTokenizerConfig(t *testing.T) {
	c, err := ParseTokenizerConfig("c.json", []byte(`{"bos_token": "<s>", "chat_template": [
		{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.ChatTemplate != "D" || c.BOS != "<s>" || c.EOS != "" {
		t.Errorf("got %+v, want the default template D and BOS <s>", c)
	}
	for _, bad := range []string{`[`, `{"chat_template": 3}`, `{"bos_token": 3}`} {
		if _, err := ParseTokenizerConfig("c.json", []byte(bad)); err == nil {
			t.Errorf("ParseTokenizerConfig(%s) succeeded, want an error", bad)
		}
	}
	if _, err := ParseChatTemplate("t.jinja", "{% for %}", "", ""); err == nil {
		t.Error("ParseChatTemplate of a broken template succeeded")
	}
}

// The template sees tool calls and tools as vLLM gives them: arguments
// parsed from their JSON string ({} when that is not an object or array
// of valid JSON, or not a string), an empty tool_calls left out, tools
// in model_dump's order with None for a missing description and
// parameters, and tools None for a request without them.
func TestRenderToolsAsVLLMGivesThem(t *testing.T) {
	src := `{% for m in messages %}{{ m.role }}:{% if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}{% endif %}` +
		`{% if m.reasoning_content is defined %}[{{ m.reasoning_content }}]{% endif %}|{% endfor %}` +
		`{% if tools is none %}no tools{% else %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}`
	tmpl, err := ParseChatTemplate("t", src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	calls := `[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": [true, null]}"}},` +
		`{"id":"b","type":"function","function":{"name":"f","arguments":"not json"}},` +
		`{"id":"c","type":"function","function":{"name":"f","arguments":"5"}},` +
		`{"id":"d","type":"function","function":{"name":"f","arguments":7}}]`
	msgs := []prefix.ChatMessage{
		{Role: "assistant", ToolCalls: calls, HasReasoning: true, Reasoning: "r"},
		{Role: "assistant", ToolCalls: `[]`},
	}
	tools := `[{"function":{"strict":true,"name":"f","extra":1},"x":2,"type":"function"}]`
	got, err := tmpl.Render(msgs, tools)
	if err != nil {
		t.Fatal(err)
	}
	want := `assistant:{"z": 1, "a": [true, null]};{};{};{};[r]|assistant:|` +
		`{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "strict": true, "extra": 1}, "x": 2}`
	if got != want {
		t.Fatalf("Render =\n%s\nwant\n%s", got, want)
	}
	if got, err := tmpl.Render(msgs[1:], ""); err != nil || got != "assistant:|no tools" {
		t.Fatalf("without tools: %q %v", got, err)
	}
	if _, err := tmpl.Render([]prefix.ChatMessage{{Role: "assistant", ToolCalls: `[{"id":"a"}]`}}, ""); err == nil {
		t.Fatal("a tool call without a function object rendered")
	}
}
