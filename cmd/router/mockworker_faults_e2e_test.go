package main

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// mockStream starts a streamed chat request of maxTokens tokens on p,
// with header hdr ("" for none), and returns its body reader after its
// first event.
func mockStream(t *testing.T, p *e2eProc, maxTokens int, hdr string) (*bufio.Reader, *http.Response) {
	t.Helper()
	body := `{"model": "mock", "messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": ` + strconv.Itoa(maxTokens) + `}`
	req, err := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if hdr != "" {
		req.Header.Set(mockworker.FaultHeader, hdr)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event: %q %v", line, err)
	}
	return br, resp
}

// exitStatus waits (a minute at most) for p to exit and returns its
// status.
func exitStatus(t *testing.T, p *e2eProc) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("the mock worker did not exit")
	}
	return p.cmd.ProcessState.ExitCode()
}

// TestMockWorkerProcessExitFault: X-Mock-Fault exit@N ends the
// `router mock-worker` process after N tokens, with status 1; its
// client's stream is cut.
func TestMockWorkerProcessExitFault(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	p := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "20")
	br, _ := mockStream(t, p, 50, "exit@3")
	rest, err := io.ReadAll(br)
	if err == nil || strings.Count(string(rest), "data: {") != 2 || strings.Contains(string(rest), "[DONE]") {
		t.Errorf("after exit@3: %v, %q", err, rest)
	}
	if s := exitStatus(t, p); s != 1 {
		t.Errorf("exit status %d, want 1", s)
	}
}

// TestMockWorkerProcessDrain: on SIGTERM the process drains as vLLM with
// --shutdown-timeout: /health and new requests get 503 at once while the
// stream in flight runs to its end, then it exits 0.
func TestMockWorkerProcessDrain(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	p := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "2")
	br, _ := mockStream(t, p, 400, "")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c := e2eClient(t)
	testkit.Eventually(t, "/health to answer 503", func() bool {
		resp, err := c.Get(p.url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, err := c.Post(p.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("new request while draining: %d", resp.StatusCode)
	}
	rest, err := io.ReadAll(br)
	if err != nil || strings.Count(string(rest), "data: {") != 399 || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the stream in flight: %v, %d events", err, strings.Count(string(rest), "data: {"))
	}
	if s := exitStatus(t, p); s != 0 {
		t.Errorf("exit status %d, want 0", s)
	}
}

// TestMockWorkerProcessDrainTimeout: POST /mock/drain drains too; a
// stream still running when --drain-timeout passes ends with vLLM's
// error event and [DONE], and the process exits 0.
func TestMockWorkerProcessDrainTimeout(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	p := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "1",
		"--drain-timeout", "300ms")
	br, _ := mockStream(t, p, 100000, "")
	resp, err := e2eClient(t).Post(p.url+"/mock/drain", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /mock/drain: %d", resp.StatusCode)
	}
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), mockworker.StreamErrorEvent+"data: [DONE]\n\n") {
		t.Errorf("the stream cut at the timeout: %v, ends %q", err, rest[max(0, len(rest)-200):])
	}
	if s := exitStatus(t, p); s != 0 {
		t.Errorf("exit status %d, want 0", s)
	}
}
