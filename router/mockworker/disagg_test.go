package mockworker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// prefillAnswer is a prefill answer's body as the tests read it.
type prefillAnswer struct {
	completion
	KV *kvTransferAnswer `json:"kv_transfer_params"`
}

var prefillParams = map[string]any{
	"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
	"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
}

// TestPrefillRequest: do_remote_decode makes a prefill: one token, not
// streamed whatever the request asked, the prompt computed (its simulated
// TTFT is an 8k prefill's), and kv_transfer_params naming this engine,
// block ids unique across answers and the address the request came in on.
func TestPrefillRequest(t *testing.T) {
	_, base := startServer(t, Config{Model: testModel, EngineID: "prefill-engine-1"})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	var firstIDs []int64
	for i := range 2 {
		resp, body := post(t, base+"/v1/completions", map[string]any{
			"model": testModel, "prompt": longText(i, 8192*4), "max_tokens": 50, "stream": true,
			"kv_transfer_params": prefillParams,
		})
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("status %d, content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var a prefillAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		if a.Usage.PromptTokens != 8192 || a.Usage.CompletionTokens != 1 || len(a.Choices) != 1 || a.Choices[0].Text != " lorem" {
			t.Errorf("answer %s, want one token for an 8192-token prompt", body)
		}
		kv := a.KV
		if kv == nil {
			t.Fatalf("no kv_transfer_params: %s", body)
		}
		// 8192 tokens are 512 engine blocks; 16 ids are listed.
		want := make([]int64, 16)
		for j := range want {
			want[j] = int64(16*i + j)
		}
		if !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != "prefill-engine-1" ||
			!slices.Equal(kv.RemoteBlockIDs, want) || kv.RemoteHost != "127.0.0.1" || kv.RemotePort != port || kv.TPSize != 1 {
			t.Errorf("request %d: kv_transfer_params %+v, want engine prefill-engine-1, blocks %v, 127.0.0.1:%d", i, *kv, want, port)
		}
		if i == 0 {
			firstIDs = kv.RemoteBlockIDs
		}
		ttft, err := strconv.ParseFloat(resp.Header.Get("x-mock-ttft-seconds"), 64)
		if err != nil || ttft < 0.2 {
			t.Errorf("simulated TTFT %q, want an 8k prefill's (>= 0.2 s)", resp.Header.Get("x-mock-ttft-seconds"))
		}
	}
	if len(firstIDs) != 16 {
		t.Errorf("first answer's block ids %v", firstIDs)
	}
	if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != 2*8192 {
		t.Errorf("prompt tokens %v, want both prompts computed (%d)", got, 2*8192)
	}
}

// TestDecodeRequest: do_remote_prefill makes a decode of transferred KV:
// every max_tokens token is answered, streamed, with no prefill computed
// (a short simulated TTFT for an 8k prompt, no prompt tokens counted) and
// nothing published to the prefix cache; max_tokens 1 is answered at once.
func TestDecodeRequest(t *testing.T) {
	_, base := startServer(t, Config{Model: testModel})
	prompt := longText(7, 8192*4)
	kv := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "p",
		"remote_block_ids": []int{1, 2}, "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1}
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 8, "stream": true, "kv_transfer_params": kv})
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := sseEvents(t, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(data) != 9 || data[8] != "[DONE]" {
		t.Fatalf("status %d, %d events, want 8 tokens and [DONE]: %q", resp.StatusCode, len(data), data)
	}
	var text strings.Builder
	for _, d := range data[:8] {
		var c sseChunk
		if err := json.Unmarshal([]byte(d), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("chunk %s", d)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if want := " lorem ipsum dolor sit amet consectetur adipiscing elit"; text.String() != want {
		t.Errorf("text %q, want %q", text.String(), want)
	}
	ttft, err := strconv.ParseFloat(resp.Header.Get("x-mock-ttft-seconds"), 64)
	if err != nil || ttft > 0.05 || resp.Header.Get("x-mock-cached-tokens") != "0" {
		t.Errorf("simulated TTFT %q, cached %q: want one decode step (no 8k prefill, about 0.2 s) and 0 cached",
			resp.Header.Get("x-mock-ttft-seconds"), resp.Header.Get("x-mock-cached-tokens"))
	}
	if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != 0 {
		t.Errorf("prompt tokens %v after a decode of transferred KV, want 0", got)
	}
	// The transferred KV was not published: the same prompt, as an
	// ordinary request, hits nothing.
	resp, body := post(t, base+"/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-mock-cached-tokens") != "0" {
		t.Errorf("ordinary request after the decode: status %d, cached %q, want 0: %s", resp.StatusCode, resp.Header.Get("x-mock-cached-tokens"), body)
	}
	// One token: sampled by the prefill worker already.
	resp, body = post(t, base+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 1,
		"messages": []map[string]any{{"role": "user", "content": "hi"}}, "kv_transfer_params": kv})
	var c completion
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != http.StatusOK || c.Usage.CompletionTokens != 1 || c.Choices[0].Message.Content != " lorem" {
		t.Errorf("decode of max_tokens 1: status %d: %s", resp.StatusCode, body)
	}
	// No kv_transfer_params in an ordinary answer.
	if bytes.Contains(body, []byte("kv_transfer_params")) {
		t.Errorf("a decode answer carries kv_transfer_params: %s", body)
	}
}

// TestKVTransferParamsErrors: both directions at once, or parameters that
// are not an object, are a 400; null is an ordinary request.
func TestKVTransferParamsErrors(t *testing.T) {
	_, base := startServer(t, Config{Model: testModel})
	for _, tc := range []struct {
		kv     any
		status int
	}{
		{map[string]any{"do_remote_decode": true, "do_remote_prefill": true}, http.StatusBadRequest},
		{"prefill please", http.StatusBadRequest},
		{nil, http.StatusOK},
		{map[string]any{}, http.StatusOK},
	} {
		resp, body := post(t, base+"/v1/completions", map[string]any{"model": testModel, "prompt": "x", "max_tokens": 2, "kv_transfer_params": tc.kv})
		if resp.StatusCode != tc.status {
			t.Errorf("kv_transfer_params %v: status %d, want %d: %s", tc.kv, resp.StatusCode, tc.status, body)
		}
		if tc.status == http.StatusOK && bytes.Contains(body, []byte("kv_transfer_params")) {
			t.Errorf("kv_transfer_params %v: an ordinary answer carries kv_transfer_params: %s", tc.kv, body)
		}
	}
}

// decodeParams are a decode request's kv_transfer_params (a prefill
// answer's, as the NixlConnector fills them).
var decodeParams = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "p",
	"remote_block_ids": []int{1, 2}, "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1}

// checkKV checks a prefill answer's kv_transfer_params: naming engineID,
// at least one block, and the address of base.
func checkKV(t *testing.T, what string, kv *kvTransferAnswer, engineID, base string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	if kv == nil {
		t.Fatalf("%s: no kv_transfer_params", what)
	}
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != engineID || len(kv.RemoteBlockIDs) == 0 ||
		kv.RemoteHost != "127.0.0.1" || kv.RemotePort != port || kv.TPSize != 1 {
		t.Errorf("%s: kv_transfer_params %+v, want engine %s at 127.0.0.1:%d", what, *kv, engineID, port)
	}
}

// TestResponsesPrefillDecode: /v1/responses takes kv_transfer_params as
// vLLM's ResponsesRequest does (vLLM pull request 37424). A prefill
// (do_remote_decode) computes the prompt and generates one token, its
// response carrying the KV's kv_transfer_params: the answer's, or,
// streamed, response.completed's response (the events before it carry
// none). A decode (do_remote_prefill), streamed or not, answers every
// token as Responses events or a ResponsesResponse without
// kv_transfer_params, and computes no prompt token.
func TestResponsesPrefillDecode(t *testing.T) {
	_, base := startServer(t, Config{Model: testModel, EngineID: "prefill-r"})
	input := longText(3, 4096)
	var prompt float64
	for _, stream := range []bool{false, true} {
		what := "prefill stream " + strconv.FormatBool(stream)
		resp, body := post(t, base+"/v1/responses", map[string]any{"model": testModel, "input": input,
			"max_output_tokens": 1, "stream": stream, "kv_transfer_params": prefillParams})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", what, resp.StatusCode, body)
		}
		var a struct {
			responseAnswer
			KV *kvTransferAnswer `json:"kv_transfer_params"`
		}
		if !stream {
			if err := json.Unmarshal(body, &a); err != nil {
				t.Fatalf("%s: %v: %s", what, err, body)
			}
		} else {
			evs := namedEvents(t, bytes.NewReader(body))
			if len(evs) != 9 || evs[len(evs)-1].typ != "response.completed" {
				t.Fatalf("%s: events %v, want 9 ending with response.completed", what, evs)
			}
			for _, ev := range evs[:len(evs)-1] {
				if strings.Contains(ev.data, "kv_transfer_params") {
					t.Errorf("%s: event %s carries kv_transfer_params: %s", what, ev.typ, ev.data)
				}
			}
			var done struct {
				Response json.RawMessage `json:"response"`
			}
			if err := json.Unmarshal([]byte(evs[len(evs)-1].data), &done); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(done.Response, &a); err != nil {
				t.Fatalf("%s: %v: %s", what, err, done.Response)
			}
		}
		if a.Object != "response" || a.Usage == nil || a.Usage.OutputTokens != 1 || a.Usage.InputTokens < 100 ||
			len(a.Output) != 1 || len(a.Output[0].Content) != 1 || a.Output[0].Content[0].Text != " lorem" {
			t.Errorf("%s: answer %+v, want one token of a long prompt", what, a.responseAnswer)
		}
		checkKV(t, what, a.KV, "prefill-r", base)
		prompt += float64(a.Usage.InputTokens)
		if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != prompt {
			t.Errorf("%s: prompt tokens %v, want %v: the prompt computed", what, got, prompt)
		}
	}

	for _, stream := range []bool{false, true} {
		what := "decode stream " + strconv.FormatBool(stream)
		resp, body := post(t, base+"/v1/responses", map[string]any{"model": testModel, "input": longText(4, 4096),
			"max_output_tokens": 4, "stream": stream, "kv_transfer_params": decodeParams})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", what, resp.StatusCode, body)
		}
		if bytes.Contains(body, []byte("kv_transfer_params")) {
			t.Errorf("%s: a decode answer carries kv_transfer_params: %s", what, body)
		}
		var a responseAnswer
		if stream {
			evs := namedEvents(t, bytes.NewReader(body))
			var text strings.Builder
			for _, ev := range evs {
				if ev.typ == "response.output_text.delta" {
					var d struct{ Delta string }
					_ = json.Unmarshal([]byte(ev.data), &d)
					text.WriteString(d.Delta)
				}
			}
			if text.String() != " lorem ipsum dolor sit" || len(evs) != 12 || evs[len(evs)-1].typ != "response.completed" {
				t.Fatalf("%s: %d events, text %q: %v", what, len(evs), text.String(), evs)
			}
			var done struct {
				Response responseAnswer `json:"response"`
			}
			_ = json.Unmarshal([]byte(evs[len(evs)-1].data), &done)
			a = done.Response
		} else if err := json.Unmarshal(body, &a); err != nil {
			t.Fatal(err)
		}
		if a.Object != "response" || a.Usage == nil || a.Usage.OutputTokens != 4 || len(a.Output) != 1 ||
			a.Output[0].Content[0].Text != " lorem ipsum dolor sit" {
			t.Errorf("%s: answer %+v, want the 4 tokens", what, a)
		}
		if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != prompt {
			t.Errorf("%s: prompt tokens %v, want %v: a decode of transferred KV computes none", what, got, prompt)
		}
	}

	resp, body := post(t, base+"/v1/responses", map[string]any{"model": testModel, "input": "x",
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": true}})
	var e struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" ||
		!strings.Contains(e.Error.Message, "kv_transfer_params") {
		t.Errorf("both directions: status %d: %s, want a 400 in OpenAI's shape", resp.StatusCode, body)
	}
}

// TestMessagesPrefillDecode: /v1/messages takes kv_transfer_params as
// vLLM's AnthropicMessagesRequest does. A prefill (do_remote_decode),
// streamed or not, computes the prompt and is answered whole: an
// Anthropic message of one token carrying the KV's kv_transfer_params
// (AnthropicMessagesResponse.kv_transfer_params). A decode
// (do_remote_prefill), streamed or not, answers every token as
// Anthropic's events or message, without kv_transfer_params, and
// computes no prompt token. Bad parameters are a 400 in Anthropic's
// shape.
func TestMessagesPrefillDecode(t *testing.T) {
	_, base := startServer(t, Config{Model: testModel, EngineID: "prefill-m"})
	msgs := []any{map[string]any{"role": "user", "content": longText(5, 4096)}}
	type message struct {
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
		KV *kvTransferAnswer `json:"kv_transfer_params"`
	}
	var prompt float64
	for _, stream := range []bool{false, true} {
		what := "prefill stream " + strconv.FormatBool(stream)
		resp, body := post(t, base+"/v1/messages", map[string]any{"model": testModel, "messages": msgs,
			"max_tokens": 1, "stream": stream, "kv_transfer_params": prefillParams})
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: status %d, content type %q: %s", what, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var m message
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%s: %v: %s", what, err, body)
		}
		if m.Type != "message" || m.Role != "assistant" || m.StopReason != "max_tokens" || len(m.Content) != 1 ||
			m.Content[0].Text != " lorem" || m.Usage.OutputTokens != 1 || m.Usage.InputTokens < 100 {
			t.Errorf("%s: answer %s, want one token of a long prompt", what, body)
		}
		checkKV(t, what, m.KV, "prefill-m", base)
		prompt += float64(m.Usage.InputTokens)
		if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != prompt {
			t.Errorf("%s: prompt tokens %v, want %v: the prompt computed", what, got, prompt)
		}
	}

	dmsgs := []any{map[string]any{"role": "user", "content": longText(6, 4096)}}
	for _, stream := range []bool{false, true} {
		what := "decode stream " + strconv.FormatBool(stream)
		resp, body := post(t, base+"/v1/messages", map[string]any{"model": testModel, "messages": dmsgs,
			"max_tokens": 4, "stream": stream, "kv_transfer_params": decodeParams})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", what, resp.StatusCode, body)
		}
		if bytes.Contains(body, []byte("kv_transfer_params")) {
			t.Errorf("%s: a decode answer carries kv_transfer_params: %s", what, body)
		}
		if stream {
			evs := namedEvents(t, bytes.NewReader(body))
			var text strings.Builder
			for _, ev := range evs {
				if ev.typ == "content_block_delta" {
					var d struct {
						Delta struct{ Text string } `json:"delta"`
					}
					_ = json.Unmarshal([]byte(ev.data), &d)
					text.WriteString(d.Delta.Text)
				}
			}
			if text.String() != " lorem ipsum dolor sit" || len(evs) != 10 || evs[0].typ != "message_start" || evs[8].typ != "message_stop" || evs[9].data != "[DONE]" {
				t.Errorf("%s: %d events, text %q: %v", what, len(evs), text.String(), evs)
			}
		} else {
			var m message
			if err := json.Unmarshal(body, &m); err != nil || m.Type != "message" || len(m.Content) != 1 ||
				m.Content[0].Text != " lorem ipsum dolor sit" || m.Usage.OutputTokens != 4 {
				t.Errorf("%s: answer %s, want the 4 tokens", what, body)
			}
		}
		if got := metricValue(t, base, "vllm:prompt_tokens_total"); got != prompt {
			t.Errorf("%s: prompt tokens %v, want %v: a decode of transferred KV computes none", what, got, prompt)
		}
	}

	resp, body := post(t, base+"/v1/messages", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 2,
		"kv_transfer_params": "prefill please"})
	var e struct {
		Type  string                         `json:"type"`
		Error struct{ Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Type != "error" ||
		!strings.Contains(e.Error.Message, "kv_transfer_params") {
		t.Errorf("kv_transfer_params a string: status %d: %s, want a 400 in Anthropic's shape", resp.StatusCode, body)
	}
}
