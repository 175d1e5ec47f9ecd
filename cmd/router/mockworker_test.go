package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a command writing while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMockWorkerCommand runs `router mock-worker` in-process on
// 127.0.0.1:0, talks to it, and stops it as SIGTERM would (cancelling the
// command's context): it exits 0.
func TestMockWorkerCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	codec := make(chan int, 1)
	go func() {
		codec <- runContext(ctx, []string{"mock-worker", "--listen", "127.0.0.1:0", "--model", "m1", "--speedup", "100"}, &stdout, &stderr)
	}()
	re := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+) \(model m1\)`)
	var url string
	for deadline := time.Now().Add(time.Minute); url == ""; {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-codec:
			t.Fatalf("exited %d before listening: %s%s", code, stdout.String(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening line: %q", stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}

	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model": "m1", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || c.Usage.CompletionTokens != 3 {
		t.Fatalf("chat: %d %v %+v", resp.StatusCode, err, c)
	}
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model": "m2", "prompt": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("other model: %d, want 404", resp.StatusCode)
	}
	// The engine counts the last token as the answer goes out, so the
	// counter may trail the answer by a moment (as vLLM's may): poll.
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err = http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `vllm:generation_tokens_total{engine="0",model_name="m1"} 3`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}

	cancel()
	select {
	case code := <-codec:
		if code != 0 {
			t.Errorf("exit %d, stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("mock-worker did not stop")
	}
}

func TestMockWorkerCommandUsage(t *testing.T) {
	// A cancelled context: a case that wrongly starts serving stops at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"mock-worker", "--speedup", "0"},
		{"mock-worker", "--speedup", "-1"},
		{"mock-worker", "--engine-block-size", "0"},
		{"mock-worker", "--block-size", "0"},
		{"mock-worker", "--block-size", "16", "--engine-block-size", "32"},
		{"mock-worker", "--engine", "trtllm"},
		{"mock-worker", "--metric-names", "dots"},
		{"mock-worker", "--kv-events-replay-format", "three-frame"},
		{"mock-worker", "--kv-event-sources", "object"},
		{"mock-worker", "--kv-events-snapshot-endpoint", "tcp://127.0.0.1:0"},
		{"mock-worker", "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-snapshot-unavailable"},
		{"mock-worker", "--engine", "sglang", "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-snapshot-endpoint", "tcp://127.0.0.1:0"},
		{"mock-worker", "--lora", "a,a"},
		{"mock-worker", "--kv-events-advertise-host", "a host"},
		{"mock-worker", "--kv-blocks", "0"},
		{"mock-worker", "--kv-events-buffer-steps", "0"},
		{"mock-worker", "--kv-events-buffer-steps", "1000001"},
		{"mock-worker", "extra"},
		{"mock-worker", "--data-parallel-size", "0"},
		{"mock-worker", "--data-parallel-size", "65"},
		{"mock-worker", "--kv-events-encoding", "json"},
		{"mock-worker", "--kv-events-endpoint", "127.0.0.1:5557"},
		{"mock-worker", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0"},
		{"mock-worker", "--chat-template", "t.jinja"},
		{"mock-worker", "--tokenizer", "testdata/no-such-tokenizer.json"},
	} {
		args = append(args, "--listen", "127.0.0.1:0")
		if code := runContext(ctx, args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut := routerRun(t, "mock-worker", "--listen", "256.0.0.1:1"); code != 1 || errOut == "" {
		t.Errorf("bad listen address: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := routerRun(t, "mock-worker", "--listen", "127.0.0.1:0", "--kv-events-endpoint", "tcp://256.0.0.1:1"); code != 1 || !strings.Contains(errOut, "KV events endpoint") {
		t.Errorf("bad KV events address: exit %d, stderr %q", code, errOut)
	}
}

// TestMockWorkerCommandEngines starts `router mock-worker` with two
// data-parallel ranks publishing KV events on port 0 (every rank's
// endpoints a free port of their own, replay too; rank R on PORT+R for a
// fixed port is rankEndpoint's, tested in router/mockworker) and a
// tokenizer: it prints each rank's endpoints, answers /tokenize, honours
// X-data-parallel-rank, and labels its metrics by engine.
func TestMockWorkerCommandEngines(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	codec := make(chan int, 1)
	go func() {
		codec <- runContext(ctx, []string{"mock-worker", "--listen", "127.0.0.1:0", "--model", "m1", "--speedup", "100",
			"--data-parallel-size", "2", "--kv-events-encoding", "map",
			"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
			"--tokenizer", "../../router/tokenizer/testdata/bytebpe.json",
			"--tokenizer-config", "../../router/tokenizer/testdata/chatml_config.json"}, &stdout, &stderr)
	}()
	re := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+) \(model m1\)\n` +
		`mock-worker rank 0 KV events on tcp://127\.0\.0\.1:(\d+) replay on tcp://127\.0\.0\.1:(\d+)\n` +
		`mock-worker rank 1 KV events on tcp://127\.0\.0\.1:(\d+) replay on tcp://127\.0\.0\.1:(\d+)\n`)
	var m []string
	for deadline := time.Now().Add(time.Minute); m == nil; time.Sleep(5 * time.Millisecond) {
		m = re.FindStringSubmatch(stdout.String())
		select {
		case code := <-codec:
			t.Fatalf("exited %d before listening: %s%s", code, stdout.String(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening lines: %q", stdout.String())
		}
	}
	seen := map[string]bool{}
	for _, p := range m[2:] {
		if p == "0" || seen[p] {
			t.Errorf("an endpoint on port %s: port 0 or another endpoint's: %q", p, stdout.String())
		}
		seen[p] = true
	}
	url := m[1]

	resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(`{"model": "m1", "messages": [{"role": "user", "content": "hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var tk struct {
		Count  int     `json:"count"`
		Tokens []int64 `json:"tokens"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tk)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || tk.Count == 0 || tk.Count != len(tk.Tokens) {
		t.Fatalf("/tokenize: %d %v %+v", resp.StatusCode, err, tk)
	}

	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(`{"model": "m1", "prompt": "hello", "max_tokens": 2}`))
	req.Header.Set("X-data-parallel-rank", "1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-mock-dp-rank") != "1" {
		t.Fatalf("pinned request: %d, rank %q", resp.StatusCode, resp.Header.Get("x-mock-dp-rank"))
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		metrics, err := scrape(http.DefaultClient, url)
		if err != nil {
			t.Fatal(err)
		}
		if metrics[`vllm:request_success_total{engine="1",finished_reason="length",model_name="m1"}`] == 1 &&
			metrics[`vllm:request_success_total{engine="0",finished_reason="length",model_name="m1"}`] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics: %v", metrics)
		}
	}
	cancel()
	select {
	case code := <-codec:
		if code != 0 {
			t.Errorf("exit %d, stderr %q", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("mock-worker did not stop")
	}
}
