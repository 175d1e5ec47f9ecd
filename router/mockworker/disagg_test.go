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
