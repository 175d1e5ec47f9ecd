package mockworker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/sim"
)

const testModel = "test-model"

// startServer runs a mock engine behind a real HTTP server on 127.0.0.1:0.
func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s, err := New(testSpeed(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return s, serveMock(t, s)
}

// testSpeed gives cfg the tests' default Speedup, 50, when it sets none.
func testSpeed(cfg Config) Config {
	if cfg.Speedup == 0 {
		cfg.Speedup = 50
	}
	return cfg
}

// serveMock serves s on 127.0.0.1:0 until the test ends and returns its
// URL; s is closed then too.
func serveMock(t *testing.T, s *Server) string {
	t.Helper()
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return ts.URL
}

// startOnFreeRange runs a mock engine like startServer with mk(p)'s
// configuration, p the first of n consecutive ports free a moment ago
// (freeRange): for the KV-event endpoints whose ranks take the
// configured port + rank, as vLLM's and SGLang's do. Another process can
// take one of those ports between the check and the bind; such a start
// is tried again on another range, up to 20 times.
func startOnFreeRange(t *testing.T, n int, mk func(p int) Config) (s *Server, url string, p int) {
	t.Helper()
	for range 20 {
		p = freeRange(t, n)
		var err error
		if s, err = New(testSpeed(mk(p))); err != nil {
			if strings.Contains(err.Error(), "address already in use") {
				t.Logf("ports %d-%d: %v; another range", p, p+n-1, err)
				continue
			}
			t.Fatal(err)
		}
		return s, serveMock(t, s), p
	}
	t.Fatalf("no %d consecutive ports stayed free for a start in 20 tries", n)
	return nil, "", 0
}

func post(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, url, b)
}

func postRaw(t *testing.T, url string, b []byte) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// longText returns n bytes of text whose 2048-byte blocks all differ.
func longText(seed, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%d-%d ", seed, i)
	}
	return b.String()[:n]
}

type completion struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role, Content string
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func TestCompletionNonStreamed(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	resp, body := post(t, url+"/v1/completions", map[string]any{
		"model": testModel, "prompt": strings.Repeat("abcd", 250), "max_tokens": 5,
	})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "text_completion" || c.Model != testModel || len(c.Choices) != 1 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("response %s", body)
	}
	if u := c.Usage; u.PromptTokens != 250 || u.CompletionTokens != 5 || u.TotalTokens != 255 {
		t.Errorf("usage %+v, want 250 + 5 = 255", u)
	}
	if want := " lorem ipsum dolor sit amet"; c.Choices[0].Text != want {
		t.Errorf("text %q, want %q", c.Choices[0].Text, want)
	}
	if resp.Header.Get("x-mock-cached-tokens") != "0" || resp.Header.Get("x-mock-ttft-seconds") == "" {
		t.Errorf("headers %v", resp.Header)
	}

	// Token ids count one token each; max_tokens defaults to 16; a chat
	// answer is an assistant message.
	resp, body = post(t, url+"/v1/chat/completions", map[string]any{
		"messages":         []map[string]any{{"role": "user", "content": "ignored"}},
		"prompt_token_ids": []int{1, 2, 3, 4, 5, 6, 7},
	})
	c = completion{}
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if c.Object != "chat.completion" || c.Choices[0].Message.Role != "assistant" || c.Usage.PromptTokens != 7 || c.Usage.CompletionTokens != 16 {
		t.Errorf("chat with token ids: %s", body)
	}
	resp, body = post(t, url+"/v1/completions", map[string]any{"prompt": [][]int{{9, 9, 9}}, "max_tokens": 1})
	c = completion{}
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 || c.Usage.PromptTokens != 3 || c.Usage.CompletionTokens != 1 {
		t.Errorf("completion with [[ids]]: %d %s", resp.StatusCode, body)
	}
}

// sseEvents reads an SSE body, returning each data payload and the wall time
// it arrived.
func sseEvents(t *testing.T, r io.Reader) ([]string, []time.Time) {
	t.Helper()
	var (
		data []string
		at   []time.Time
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		data = append(data, d)
		at = append(at, time.Now())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return data, at
}

type sseChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage   *usage  `json:"usage"`
	SimTime float64 `json:"x_mock_sim_seconds"`
}

func TestChatStreamed(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	const n = 8
	b, _ := json.Marshal(map[string]any{
		"model": testModel, "stream": true, "max_tokens": n,
		"stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]any{
			{"role": "system", "content": "be brief"},
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}}},
		},
	})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	data, arrived := sseEvents(t, resp.Body)
	if len(data) != n+2 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("%d events, want %d token chunks, a usage chunk and [DONE]: %q", len(data), n, data)
	}
	var text strings.Builder
	prev := -1.0
	for i, d := range data[:n] {
		var c sseChunk
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("chunk %d: %v: %s", i, err, d)
		}
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %s", i, d)
		}
		ch := c.Choices[0]
		if (i == 0) != (ch.Delta.Role == "assistant") {
			t.Errorf("chunk %d: role %q", i, ch.Delta.Role)
		}
		if last := i == n-1; last != (ch.FinishReason != nil && *ch.FinishReason == "length") {
			t.Errorf("chunk %d: finish_reason %v", i, ch.FinishReason)
		}
		text.WriteString(ch.Delta.Content)
		// One token per simulated step: strictly increasing simulated
		// times, arrival times in order.
		if c.SimTime <= prev {
			t.Errorf("chunk %d: simulated time %v after %v", i, c.SimTime, prev)
		}
		prev = c.SimTime
		if i > 0 && arrived[i].Before(arrived[i-1]) {
			t.Errorf("chunk %d arrived before chunk %d", i, i-1)
		}
	}
	if want := strings.Repeat(" lorem ipsum dolor sit amet consectetur adipiscing elit", 1); text.String() != want {
		t.Errorf("text %q, want %q", text.String(), want)
	}
	var u sseChunk
	if err := json.Unmarshal([]byte(data[n]), &u); err != nil || u.Usage == nil || len(u.Choices) != 0 {
		t.Fatalf("usage chunk %s", data[n])
	}
	// "system: be brief\nuser: hello there\n" is 35 bytes: 9 tokens.
	if u.Usage.PromptTokens != 9 || u.Usage.CompletionTokens != n {
		t.Errorf("usage %+v", *u.Usage)
	}
}

// TestPrefixCacheTTFT: the second of two identical long prompts hits the
// engine's prefix cache and its simulated time to first token is lower.
func TestPrefixCacheTTFT(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	req := map[string]any{"prompt": longText(1, 8192*4), "max_tokens": 2} // 8192 tokens, 16 blocks of 512
	var cached [2]int
	var ttft [2]float64
	for i := range 2 {
		resp, body := post(t, url+"/v1/completions", req)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var err error
		if cached[i], err = strconv.Atoi(resp.Header.Get("x-mock-cached-tokens")); err != nil {
			t.Fatal(err)
		}
		if ttft[i], err = strconv.ParseFloat(resp.Header.Get("x-mock-ttft-seconds"), 64); err != nil {
			t.Fatal(err)
		}
		var c completion
		if err := json.Unmarshal(body, &c); err != nil || c.Usage.PromptTokensDetails.CachedTokens != cached[i] {
			t.Errorf("usage cached tokens %s, header %d", body, cached[i])
		}
	}
	// The hit is capped at (8192−1)/16 whole blocks, so the last block is
	// computed (vLLM).
	if cached[0] != 0 || cached[1] != 8176 {
		t.Errorf("cached tokens %v, want [0 8176]", cached)
	}
	// Simulated: ≈209 ms for an 8k prefill, ≈7 ms for the last block.
	if ttft[0] < 0.2 || ttft[1] > ttft[0]/10 {
		t.Errorf("simulated TTFT %v s then %v s, want ≈0.209 then under a tenth of it", ttft[0], ttft[1])
	}
	// A different prompt does not hit.
	resp, _ := post(t, url+"/v1/completions", map[string]any{"prompt": longText(2, 8192*4), "max_tokens": 1})
	if got := resp.Header.Get("x-mock-cached-tokens"); got != "0" {
		t.Errorf("other prompt: cached %s, want 0", got)
	}
}

// metricValue returns the value of the sample of name labelled
// model_name=model in the server's /metrics.
func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, `model_name="`+testModel+`"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s{model_name=%q} in /metrics:\n%s", name, testModel, b)
	return 0
}

// waitMetric polls until name has value want.
func waitMetric(t *testing.T, url, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := metricValue(t, url, name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDisconnectFreesKV: a client that leaves mid-stream, or before its
// non-streamed answer, aborts its request: nothing stays running and the
// KV cache is free again.
func TestDisconnectFreesKV(t *testing.T) {
	s, url := startServer(t, Config{Model: testModel})
	long := map[string]any{"prompt": longText(3, 16000), "max_tokens": 100_000, "stream": true}

	t.Run("mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b, _ := json.Marshal(long)
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for range 3 { // three chunks
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		if r := metricValue(t, url, "vllm:num_requests_running"); r != 1 {
			t.Fatalf("running %v mid-stream, want 1", r)
		}
		if kv := metricValue(t, url, "vllm:kv_cache_usage_perc"); kv <= 0 || kv > 1 {
			t.Fatalf("kv usage %v mid-stream, want in (0, 1]", kv)
		}
		cancel()
		waitMetric(t, url, "vllm:num_requests_running", 0)
		waitMetric(t, url, "vllm:kv_cache_usage_perc", 0)
	})

	t.Run("non-streamed", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b, _ := json.Marshal(map[string]any{"prompt": "short", "max_tokens": 100_000})
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(b))
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		waitMetric(t, url, "vllm:num_requests_running", 1)
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("request completed, want it cancelled")
		}
		waitMetric(t, url, "vllm:num_requests_running", 0)
		waitMetric(t, url, "vllm:kv_cache_usage_perc", 0)
	})

	// The engine saw both aborts; nothing completed.
	if g := metricValue(t, url, "vllm:request_success_total"); g != 0 {
		t.Errorf("request_success_total %v, want 0", g)
	}
	_ = s
}

// TestWaitingAbort: a request queued behind a full batch whose client
// leaves is dropped from the queue.
func TestWaitingAbort(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.MaxNumSeqs = 1
	_, url := startServer(t, Config{Model: testModel, Sim: cfg})
	first, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	second, cancelSecond := context.WithCancel(context.Background())
	defer cancelSecond()
	done := make(chan struct{}, 2)
	for _, ctx := range []context.Context{first, second} {
		b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 100_000})
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(b))
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			done <- struct{}{}
		}()
		waitMetric(t, url, "vllm:num_requests_running", 1)
	}
	waitMetric(t, url, "vllm:num_requests_waiting", 1)
	cancelSecond()
	<-done
	waitMetric(t, url, "vllm:num_requests_waiting", 0)
	if r := metricValue(t, url, "vllm:num_requests_running"); r != 1 {
		t.Errorf("running %v, want 1", r)
	}
	cancelFirst()
	<-done
	waitMetric(t, url, "vllm:num_requests_running", 0)
}

func TestMetrics(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	for range 2 {
		if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": longText(4, 4000), "max_tokens": 3}); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	for name, want := range map[string]float64{
		"vllm:num_requests_running":       0,
		"vllm:num_requests_waiting":       0,
		"vllm:kv_cache_usage_perc":        0,
		"vllm:prompt_tokens_total":        2000,
		"vllm:generation_tokens_total":    6,
		"vllm:prefix_cache_queries_total": 2000,
		"vllm:prefix_cache_hits_total":    992, // 62 full 64-byte blocks (16 tokens) of 4000 bytes
		"vllm:request_success_total":      2,
		"vllm:num_preemptions_total":      0,
	} {
		if got := metricValue(t, url, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != testModel || list.Data[0].Object != "model" {
		t.Fatalf("models: %v %+v", err, list)
	}
	resp, err = http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/health %d", resp.StatusCode)
	}
}

// TestNoMetrics: with NoMetrics the engine plays SGLang without
// --enable-metrics: /metrics is 404, /health 200, and it still serves.
func TestNoMetrics(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, NoMetrics: true})
	for path, want := range map[string]int{"/metrics": http.StatusNotFound, "/health": http.StatusOK} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2}); resp.StatusCode != 200 {
		t.Errorf("completion: %d %s", resp.StatusCode, body)
	}
}

func TestErrors(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 100 // 1600 tokens
	s, url := startServer(t, Config{Model: testModel, Sim: cfg})
	ids := make([]int, 1600)
	for _, tt := range []struct {
		name, path, body string
		status           int
		msg              string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`, 400, "malformed JSON"},
		{"trailing data", "/v1/completions", `{"prompt": "a"} {}`, 400, "malformed JSON"},
		{"wrong type", "/v1/completions", `{"prompt": "a", "max_tokens": "many"}`, 400, "malformed JSON"},
		{"unknown model", "/v1/completions", `{"model": "other", "prompt": "a"}`, 404, "does not exist"},
		{"no prompt", "/v1/completions", `{"model": "test-model"}`, 400, "prompt is required"},
		{"batch", "/v1/completions", `{"prompt": ["a", "b"]}`, 400, "one"},
		{"no messages", "/v1/chat/completions", `{"messages": []}`, 400, "messages"},
		{"bad content", "/v1/chat/completions", `{"messages": [{"role": "user", "content": 7}]}`, 400, "content"},
		{"zero max_tokens", "/v1/completions", `{"prompt": "a", "max_tokens": 0}`, 400, "max_tokens"},
		{"never fits", "/v1/completions", mustJSON(map[string]any{"prompt": ids, "max_tokens": 2}), 400,
			"This model's maximum context length is 1600 tokens. However, you requested 2 output tokens and your prompt contains 1600 input tokens, for a total of 1602 tokens."},
		{"output over the context", "/v1/completions", mustJSON(map[string]any{"prompt": "a", "max_tokens": 1601}), 400,
			"max_tokens=1601cannot be greater than max_model_len=max_total_tokens=1600."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := postRaw(t, url+tt.path, []byte(tt.body))
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if resp.StatusCode != tt.status || e.Error.Code != tt.status || e.Error.Type == "" ||
				!strings.Contains(e.Error.Message, tt.msg) || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("status %d, body %s; want %d mentioning %q", resp.StatusCode, body, tt.status, tt.msg)
			}
		})
	}
	// vLLM's rule: prompt plus max_tokens at most max_model_len (the KV
	// cache, 1600 tokens): 1598 + 2 fit, 1599 + 2 do not.
	if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": ids[:1598], "max_tokens": 2}); resp.StatusCode != 200 {
		t.Errorf("fitting prompt: %d %s", resp.StatusCode, body)
	}
	if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": ids[:1599], "max_tokens": 2}); resp.StatusCode != 400 ||
		!strings.Contains(string(body), `"param":"input_tokens"`) || !strings.Contains(string(body), `"type":"BadRequestError"`) {
		t.Errorf("one token over: %d %s", resp.StatusCode, body)
	}
	// After Close, requests get 503.
	s.Close()
	if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": "a"}); resp.StatusCode != 503 {
		t.Errorf("after Close: %d %s", resp.StatusCode, body)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestNewValidates(t *testing.T) {
	bad := sim.DefaultConfig()
	bad.BlockSize = 0
	for _, cfg := range []Config{
		{Speedup: -1}, {Sim: bad}, {BlockTokens: 512}, {CharsPerToken: -1}, {DefaultMaxTokens: -2},
		{LoRA: []string{"a", "a"}}, {LoRA: []string{""}}, {Model: "m", LoRA: []string{"m"}}, {LoRA: make([]string, MaxLoRA+1)},
		{KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0"}, {KVEventsAdvertiseHost: "a b"}, {Engine: 7},
		{Engine: EngineSGLang, KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0"},
	} {
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Model() != DefaultModel {
		t.Errorf("model %q", s.Model())
	}
}

func TestCompletionStreamed(t *testing.T) {
	_, url := startServer(t, Config{})
	b, _ := json.Marshal(map[string]any{"model": "anything", "prompt": "hello", "max_tokens": 3, "stream": true})
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := sseEvents(t, resp.Body)
	if len(data) != 4 || data[3] != "[DONE]" {
		t.Fatalf("events %q, want 3 chunks and [DONE]", data)
	}
	for i, d := range data[:3] {
		var c map[string]any
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		ch := c["choices"].([]any)[0].(map[string]any)
		if c["object"] != "text_completion" || c["model"] != "anything" || ch["text"] != token(i) || ch["delta"] != nil || c["usage"] != nil {
			t.Errorf("chunk %d: %s", i, d)
		}
	}
	if !strings.Contains(data[2], `"finish_reason":"length"`) || !strings.Contains(data[0], `"finish_reason":null`) {
		t.Errorf("finish reasons: %q", data[:3])
	}
}

// BenchmarkCompletion measures the mock's own overhead: short non-streamed
// requests at a speedup that makes simulated time negligible.
func BenchmarkCompletion(b *testing.B) {
	s, err := New(Config{Speedup: 1e6})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s)
	defer ts.Close()
	body := []byte(`{"prompt": "hello world", "max_tokens": 4}`)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	http.DefaultClient.CloseIdleConnections()
}
