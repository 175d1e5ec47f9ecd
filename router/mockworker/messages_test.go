package mockworker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestMessages: /v1/messages answers vLLM's Anthropic message (not
// streamed) and event sequence (streamed), input_tokens the /tokenize of
// the chat messages vLLM converts system and messages into.
func TestMessages(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	req := map[string]any{"model": testModel, "max_tokens": 5,
		"system": []any{map[string]any{"type": "text", "text": "be "}, map[string]any{"type": "text", "text": "brief"}},
		"messages": []any{
			map[string]any{"role": "user", "content": "hello"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "hi"}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "a"},
				map[string]any{"type": "text", "text": "b"}}},
		}}
	want := tokenizeMessages(t, url, []map[string]any{{"role": "system", "content": "be brief"},
		{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "a\nb"}})
	resp, body := post(t, url+"/v1/messages", req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		Model      string `json:"model"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage map[string]int `json:"usage"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "chatcmpl-") || m.Type != "message" || m.Role != "assistant" || m.Model != testModel ||
		m.StopReason != "max_tokens" || len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != text(5) ||
		len(m.Usage) != 2 || m.Usage["input_tokens"] != want || m.Usage["output_tokens"] != 5 {
		t.Fatalf("answer %s, want input_tokens %d", body, want)
	}
	if strings.Contains(string(body), "stop_sequence") {
		t.Fatalf("null fields not dropped: %s", body)
	}

	req["stream"] = true
	b, _ := json.Marshal(req)
	sresp, err := http.Post(url+"/v1/messages", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	evs := namedEvents(t, sresp.Body)
	wantTypes := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
		"message_stop", ""}
	if len(evs) != len(wantTypes) {
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	var got strings.Builder
	for i, ev := range evs {
		if ev.typ != wantTypes[i] {
			t.Fatalf("event %d is %q, want %q", i, ev.typ, wantTypes[i])
		}
		if ev.typ == "" {
			if ev.data != "[DONE]" {
				t.Fatalf("last data %q", ev.data)
			}
			continue
		}
		var d struct {
			Type    string `json:"type"`
			Index   *int   `json:"index"`
			Message *struct {
				ID    string         `json:"id"`
				Usage map[string]int `json:"usage"`
			} `json:"message"`
			Delta struct {
				Type       string `json:"type"`
				Text       string `json:"text"`
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			Usage map[string]int `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil || d.Type != ev.typ {
			t.Fatalf("event %d: %v %s", i, err, ev.data)
		}
		switch d.Type {
		case "message_start":
			if d.Message == nil || !strings.HasPrefix(d.Message.ID, "chatcmpl-") || d.Message.Usage["input_tokens"] != want ||
				d.Message.Usage["output_tokens"] != 0 {
				t.Fatalf("message_start %s", ev.data)
			}
		case "content_block_delta":
			if d.Index == nil || *d.Index != 0 || d.Delta.Type != "text_delta" {
				t.Fatalf("delta %s", ev.data)
			}
			got.WriteString(d.Delta.Text)
		case "message_delta":
			if d.Delta.StopReason != "max_tokens" || d.Usage["input_tokens"] != want || d.Usage["output_tokens"] != 5 {
				t.Fatalf("message_delta %s", ev.data)
			}
		}
	}
	if got.String() != text(5) {
		t.Fatalf("streamed %q", got.String())
	}
}

// TestMessagesErrors: invalid bodies are 400s in the OpenAI shape (vLLM's
// request validation); an unknown model is a 404 in the Anthropic shape.
func TestMessagesErrors(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	for _, bad := range []string{
		`{"model": "test-model", "messages": [{"role": "user", "content": "x"}]}`,
		`{"model": "test-model", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}`,
		`{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}`,
		`{"model": "test-model", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}`,
		`{"model": "test-model", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}`,
		`[1, 2]`,
	} {
		resp, body := postRaw(t, url+"/v1/messages", []byte(bad))
		var e struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Code != 400 {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, body)
		}
	}
	resp, body := post(t, url+"/v1/messages", map[string]any{"model": "other", "max_tokens": 5,
		"messages": []any{map[string]any{"role": "user", "content": "x"}}})
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusNotFound || json.Unmarshal(body, &e) != nil || e.Type != "error" ||
		e.Error.Type != "NotFoundError" || e.Error.Message == "" {
		t.Fatalf("other model: %d %s", resp.StatusCode, body)
	}
	// SGLang serves no /v1/messages: FastAPI's 404.
	surl := tokenizerServer(t, EngineSGLang)
	resp, body = post(t, surl+"/v1/messages", map[string]any{"model": testModel})
	if resp.StatusCode != http.StatusNotFound || string(body) != `{"detail":"Not Found"}` {
		t.Fatalf("SGLang /v1/messages: %d %s", resp.StatusCode, body)
	}
}

// TestUtilityEndpoints: /version and /ping as vLLM serves them, model
// cards with a permission, FastAPI's 404 for other paths.
func TestUtilityEndpoints(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, LoRA: []string{"ad"}, Version: "9.9.9"})
	get := func(path string) (int, string) {
		t.Helper()
		r, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		return r.StatusCode, strings.TrimSpace(b.String())
	}
	if code, body := get("/version"); code != 200 || body != `{"version":"9.9.9"}` {
		t.Fatalf("/version: %d %s", code, body)
	}
	if code, _ := get("/ping"); code != 200 {
		t.Fatalf("GET /ping: %d", code)
	}
	if resp, _ := post(t, url+"/ping", map[string]any{}); resp.StatusCode != 200 {
		t.Fatalf("POST /ping: %d", resp.StatusCode)
	}
	if code, body := get("/v1/nothing"); code != 404 || body != `{"detail":"Not Found"}` {
		t.Fatalf("unknown path: %d %s", code, body)
	}
	_, body := get("/v1/models")
	var list struct {
		Data []struct {
			ID          string  `json:"id"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
			Permission  []struct {
				Object string `json:"object"`
			} `json:"permission"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 2 || list.Data[0].Parent != nil || list.Data[0].MaxModelLen == nil ||
		list.Data[1].Parent == nil || *list.Data[1].Parent != testModel || list.Data[1].MaxModelLen != nil ||
		len(list.Data[0].Permission) != 1 || list.Data[0].Permission[0].Object != "model_permission" {
		t.Fatalf("models %s", body)
	}
}
