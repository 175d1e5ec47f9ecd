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
		if strings.Contains(string(b), `vllm:generation_tokens_total{model_name="m1"} 3`) {
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
		{"mock-worker", "--block-size", "20"},
		{"mock-worker", "--kv-blocks", "0"},
		{"mock-worker", "extra"},
	} {
		args = append(args, "--listen", "127.0.0.1:0")
		if code := runContext(ctx, args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut := routerRun(t, "mock-worker", "--listen", "256.0.0.1:1"); code != 1 || errOut == "" {
		t.Errorf("bad listen address: exit %d, stderr %q", code, errOut)
	}
}
