package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/mockworker"
)

// serveStderr is a bytes.Buffer safe for the command's stderr.
type serveStderr struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *serveStderr) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *serveStderr) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `router serve` in process with args (plus a listen
// address and a 5s drain) and returns its base URL, its stderr and stop,
// which ends it and fails the test unless it exits 0 within a minute.
func startServe(t *testing.T, args ...string) (base string, stderr *serveStderr, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	stderr = &serveStderr{}
	exit := make(chan int, 1)
	go func() {
		exit <- runContext(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--drain-timeout", "5s"}, args...), pw, stderr)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("no listening line: %v; stderr:\n%s", err, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Error("serve did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	return strings.TrimSpace(strings.TrimPrefix(line, "router serve listening on ")), stderr, stop
}

func startMockWorker(t *testing.T, model string) string {
	t.Helper()
	mw, err := mockworker.New(mockworker.Config{Model: model, Speedup: 50})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mw)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		mw.Close()
	})
	return hs.URL
}

// TestServeEndToEnd runs `router serve` with a round-robin policy over two
// mock workers, one from the policy file and one from --workers-file:
// readiness, the per-worker split, streaming, /v1/models, /metrics, and
// exit 0 on shutdown.
func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	a, b := startMockWorker(t, "mock"), startMockWorker(t, "mock")
	policy := filepath.Join(dir, "rr.hcl")
	src, err := os.ReadFile("../../examples/policies/round-robin.hcl")
	if err != nil {
		t.Fatal(err)
	}
	src = append(src, fmt.Sprintf("\nworker \"a\" {\n  url = %q\n  models = [\"mock\"]\n  total_kv_blocks = 1000\n}\n", a)...)
	if err := os.WriteFile(policy, src, 0o644); err != nil {
		t.Fatal(err)
	}
	workersFile := filepath.Join(dir, "workers.hcl")
	if err := os.WriteFile(workersFile, fmt.Appendf(nil, "worker \"b\" {\n  url = %q\n  models = [\"mock\"]\n  total_kv_blocks = 1000\n}\n", b), 0o644); err != nil {
		t.Fatal(err)
	}
	base, stderr, stop := startServe(t, "--policy", policy, "--workers-file", workersFile)

	deadline := time.Now().Add(time.Minute)
	for {
		// Ready once one worker joined; wait for both (their first scrapes).
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			m, _ := http.Get(base + "/metrics")
			var text []byte
			if m != nil {
				text, _ = io.ReadAll(m.Body)
				_ = m.Body.Close()
			}
			if resp.StatusCode == http.StatusOK && strings.Contains(string(text), `switchyard_worker_ready{worker="a"} 1`) &&
				strings.Contains(string(text), `switchyard_worker_ready{worker="b"} 1`) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after a minute; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	split := map[string]int{}
	for i := range 8 {
		body := fmt.Sprintf(`{"model":"mock","stream":%v,"max_tokens":4,"messages":[{"role":"user","content":"hello %d"}]}`, i%2 == 0, i)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
		if i%2 == 0 && !strings.Contains(string(got), "data: [DONE]") {
			t.Errorf("streamed answer lacks [DONE]: %s", got)
		}
		split[resp.Header.Get("X-Switchyard-Worker")]++
	}
	if split["a"] != 4 || split["b"] != 4 {
		t.Errorf("round-robin split %v, want 4 each", split)
	}
	for path, want := range map[string]string{
		"/v1/models": `"id":"mock"`,
		"/metrics":   `switchyard_requests_total{code="200",model="mock"} 8`,
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.Contains(string(got), want) {
			t.Errorf("%s lacks %s:\n%s", path, want, got)
		}
	}
	// Emptying the workers file removes b without a restart; a stays.
	if err := os.WriteFile(workersFile, []byte("# no workers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		m, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(m.Body)
		_ = m.Body.Close()
		if !strings.Contains(string(text), `worker="b"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still a member a minute after the workers file emptied; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 2 {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"mock","prompt":"x","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if w := resp.Header.Get("X-Switchyard-Worker"); resp.StatusCode != http.StatusOK || w != "a" {
			t.Errorf("after b left: status %d worker %q, want 200 from a", resp.StatusCode, w)
		}
	}
	stop()
}

func TestServeFlagErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve"}, &stdout, &stderr); code != 2 {
		t.Errorf("serve without --policy: exit %d, want 2", code)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.hcl")
	if err := os.WriteFile(bad, []byte("router {\n  block_size = \"x\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := run([]string{"serve", "--policy", bad, "--listen", "127.0.0.1:0"}, &stdout, &stderr); code != 1 {
		t.Errorf("unloadable policy: exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "bad.hcl:2") {
		t.Errorf("stderr lacks the diagnostic's position:\n%s", stderr.String())
	}
}

// TestServeReloadReplacesTheClassifierAndWarnsOfTheQueue: a reload that
// removes the request_classifier block stops classification (the
// startup classifier is not kept as a fallback), and one that changes the
// queue block says the running queue keeps its settings.
func TestServeReloadReplacesTheClassifierAndWarnsOfTheQueue(t *testing.T) {
	dir := t.TempDir()
	a := startMockWorker(t, "mock")
	worker := fmt.Sprintf("\nworker \"a\" {\n  url = %q\n  models = [\"mock\"]\n  total_kv_blocks = 1000\n}\n", a)
	policy := filepath.Join(dir, "p.hcl")
	write := func(src string) {
		t.Helper()
		tmp := policy + ".tmp"
		if err := os.WriteFile(tmp, []byte(src+worker), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, policy); err != nil {
			t.Fatal(err)
		}
	}
	write("request_classifier {\n  type = \"header-priority\"\n}\n\nqueue {\n  class \"interactive\" {}\n}\n")
	base, stderr, stop := startServe(t, "--policy", policy, "--watch")
	send := func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"mock","prompt":"x","max_tokens":2}`))
		req.Header.Set("X-Priority", "high") // not an integer: header-priority refuses it
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(time.Minute)
	for code := send(); code != http.StatusBadRequest; code = send() {
		if time.Now().After(deadline) {
			t.Fatalf("with header-priority: %d, want 400; stderr:\n%s", code, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // the worker's first scrape
	}
	write("queue {\n  class \"interactive\" {}\n  class \"batch\" {}\n}\n")
	deadline = time.Now().Add(time.Minute)
	for code := send(); code != http.StatusOK; code = send() {
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the classifier was removed: %d, want 200; stderr:\n%s", code, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "the queue block changed") {
		t.Errorf("no warning that the queue block change needs a restart; stderr:\n%s", stderr.String())
	}
	stop()
}

// TestServeBodyPerClientFlag: --max-body-bytes-per-client bounds the
// request bodies one client address holds: at 1KiB a body of 2 KiB is
// answered 503 overloaded before the request reaches selection; at 0 (no
// bound per address) the same body reaches it (no worker lists its
// model: 404).
func TestServeBodyPerClientFlag(t *testing.T) {
	policy := writeFile(t, "bs16.hcl", "router {\n  block_size = 16\n}\n")
	body := fmt.Sprintf(`{"model":"mock","messages":[{"role":"user","content":%q}]}`, strings.Repeat("x", 2048))
	for _, tc := range []struct {
		flag   string
		status int
		code   string
	}{{"1KiB", http.StatusServiceUnavailable, "overloaded"}, {"0", http.StatusNotFound, "model_not_found"}} {
		base, _, stop := startServe(t, "--policy", policy, "--max-body-bytes-per-client", tc.flag)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), `"code":"`+tc.code+`"`) {
			t.Errorf("--max-body-bytes-per-client %s: %d %s, want %d %s", tc.flag, resp.StatusCode, b, tc.status, tc.code)
		}
		stop()
	}
}

// TestByteSizeFlag: the values a size flag takes, and how it prints them.
func TestByteSizeFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		out  string
	}{
		{"0", 0, "0"}, {"1048576", 1 << 20, "1MiB"}, {"1000", 1000, "1000"}, {"4KiB", 4 << 10, "4KiB"},
		{"256MiB", 256 << 20, "256MiB"}, {"1536MiB", 1536 << 20, "1536MiB"}, {"1024GiB", 1 << 40, "1024GiB"},
	} {
		var b byteSize
		if err := b.Set(tc.in); err != nil || int64(b) != tc.want || b.String() != tc.out {
			t.Errorf("Set(%q): %d %q %v, want %d %q", tc.in, int64(b), b.String(), err, tc.want, tc.out)
		}
	}
	for _, in := range []string{"", "-1", "1025GiB", "1TiB", "1.5GiB", "1 MiB", "1mib", "MiB", "0x10"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--policy", "x", "--max-body-bytes-per-client", "2TiB"}, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--max-body-bytes-per-client 2TiB: want a size in bytes") {
		t.Errorf("--max-body-bytes-per-client 2TiB: exit %d, stderr %q; want 2 and the flag's range", code, stderr.String())
	}
}

// TestServePassThroughFlagAndVersion: `router serve` reports its version
// on GET /version, and passes an unknown /v1/ path through to an engine
// serving the body's model unless --pass-through=false, when it is 404.
func TestServePassThroughFlagAndVersion(t *testing.T) {
	mw := startMockWorker(t, "mock")
	policy := writeFile(t, "w.hcl", fmt.Sprintf("worker \"a\" {\n  url = %q\n  models = [\"mock\"]\n}\n", mw))
	for _, tc := range []struct {
		flag   string
		status int
	}{{"--pass-through=true", http.StatusOK}, {"--pass-through=false", http.StatusNotFound}} {
		base, stderr, stop := startServe(t, "--policy", policy, tc.flag)
		resp, err := http.Get(base + "/version")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != fmt.Sprintf("{\"version\":%q}\n", routerVersion()) {
			t.Errorf("/version = %d %s, want %q", resp.StatusCode, b, routerVersion())
		}
		// An unknown path: passed through, it reaches the mock (whose own
		// answer comes back with X-Switchyard-Worker); with the flag off,
		// the router answers 404 not_found itself.
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err = http.Post(base+"/v1/nonstandard", "application/json", strings.NewReader(`{"model":"mock","input":"x"}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break // 503: the worker is not ready yet
			}
			time.Sleep(20 * time.Millisecond)
		}
		routed := resp.Header.Get("X-Switchyard-Worker") == "a"
		if want := tc.status == http.StatusOK; routed != want {
			t.Errorf("%s: POST /v1/nonstandard = %d %s (worker %q); passed through: %v, want %v\n%s", tc.flag, resp.StatusCode, b,
				resp.Header.Get("X-Switchyard-Worker"), routed, want, stderr.String())
		}
		if tc.status == http.StatusNotFound && (resp.StatusCode != 404 || !strings.Contains(string(b), `"code":"not_found"`)) {
			t.Errorf("%s: %d %s, want the router's 404 not_found", tc.flag, resp.StatusCode, b)
		}
		stop()
	}
}
