package apiconv

import (
	"errors"
	"strings"
	"testing"
)

// A body of many items is read whole, each item one message, in order;
// a key given twice reads as its last value.
func TestManyItems(t *testing.T) {
	const n = 20000
	var b strings.Builder
	b.WriteString(`{"model":"x","model":"m","input":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"u"},{"type":"function_call_output","call_id":"c","output":"o"}`)
	}
	b.WriteString(`]}`)
	req, err := Responses([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "m" || len(req.Messages) != 2*n || req.Messages[2*n-1] != (Message{Role: "tool", Content: "o", ToolCallID: "c"}) || req.Messages[0] != (Message{Role: "user", Content: "u"}) {
		t.Fatalf("model %q, %d messages, last %+v", req.Model, len(req.Messages), req.Messages[len(req.Messages)-1])
	}
}

// Many function_call items in a row are one assistant message's tool
// calls, its tool_calls array built once (linear in the items).
func TestManyCalls(t *testing.T) {
	const n = 20000
	var b strings.Builder
	b.WriteString(`{"model":"m","tools":[{"type":"web_search"},{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"input":[{"role":"user","content":"u"}`)
	for range n {
		b.WriteString(`,{"type":"function_call","call_id":"c","name":"f","arguments":"{\"a\": 1}"}`)
	}
	b.WriteString(`]}`)
	req, err := Responses([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	call := `{"id":"c","function":{"name":"f","arguments":"{\"a\": 1}"},"type":"function"}`
	want := "[" + strings.Repeat(call+",", n-1) + call + "]"
	if len(req.Messages) != 2 || req.Messages[1].Role != "assistant" || req.Messages[1].ToolCalls != want {
		t.Fatalf("%d messages; the assistant's tool_calls %.200q", len(req.Messages), req.Messages[len(req.Messages)-1].ToolCalls)
	}
	if wantTools := `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]`; req.Tools != wantTools {
		t.Fatalf("tools %s, want %s", req.Tools, wantTools)
	}
}

// Anthropic requires model and max_tokens; AnthropicPrompt, for a trace
// line's prompt, does not, but checks them when given.
func TestAnthropicPrompt(t *testing.T) {
	body := []byte(`{"system":"s","messages":[{"role":"user","content":"hi"}]}`)
	if _, err := Anthropic(body); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "model") {
		t.Fatalf("Anthropic without a model: %v", err)
	}
	req, err := AnthropicPrompt(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Messages) != 2 || req.Messages[0] != (Message{Role: "system", Content: "s"}) || req.MaxTokens != 0 {
		t.Fatalf("%+v", req)
	}
	if _, err := AnthropicPrompt([]byte(`{"max_tokens":-1,"messages":[]}`)); err == nil || !strings.Contains(err.Error(), "max_tokens") {
		t.Fatalf("a negative max_tokens: %v", err)
	}
	if !TooDeep([]byte(strings.Repeat("[", MaxNesting+1))) || TooDeep([]byte(strings.Repeat("[", MaxNesting))) {
		t.Fatal("TooDeep misjudges the limit")
	}
	if _, err := Responses([]byte(strings.Repeat(`{"a":`, MaxNesting+1))); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
		t.Fatalf("a deep body: %v", err)
	}
}
