package mockworker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// openStream starts a streamed request on its own connection (no reuse)
// with the given headers and returns the response.
func openStream(t *testing.T, ctx context.Context, url, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readEvents reads n SSE data payloads from br.
func readEvents(t *testing.T, br *bufio.Reader, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		if d, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

const streamBody = `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": true}`

// TestFaultReset: after N tokens the stream's connection is reset: a Go
// client reading the chunked stream gets an error (not a clean end), and
// a raw socket sees ECONNRESET.
func TestFaultReset(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	resp := openStream(t, context.Background(), url, "/v1/chat/completions", streamBody, map[string]string{FaultHeader: "reset@3"})
	if resp.StatusCode != 200 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("status %d, transfer encoding %v", resp.StatusCode, resp.TransferEncoding)
	}
	br := bufio.NewReader(resp.Body)
	evs := readEvents(t, br, 3)
	if !strings.Contains(evs[2], `"content":" dolor"`) {
		t.Errorf("third event %s", evs[2])
	}
	rest, err := io.ReadAll(br)
	if err == nil || errors.Is(err, io.EOF) || strings.Contains(string(rest), "data:") {
		t.Errorf("after the cut: %q, %v; want an error and no more events", rest, err)
	}

	// The raw connection: the three events, then a reset.
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const raw0 = `{"prompt": "hi", "max_tokens": 9, "stream": true}`
	_, _ = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+FaultHeader+": reset@2\r\n"+
		"Content-Length: "+strconv.Itoa(len(raw0))+"\r\n\r\n"+raw0)
	raw, err := io.ReadAll(conn)
	if !errors.Is(err, syscall.ECONNRESET) || strings.Count(string(raw), `"text":`) != 2 {
		t.Errorf("raw: %v after %q; want ECONNRESET after 2 tokens", err, raw)
	}

	// A whole answer is reset before its first byte.
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt": "hi", "max_tokens": 5}`))
	req.Header.Set(FaultHeader, "reset@2")
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("whole answer under reset@2: %d", resp.StatusCode)
	}
}

// TestFaultClose: an answer under a close fault is framed by the
// connection's close (no chunked encoding, no Content-Length,
// Connection: close), so its cut after N tokens reads as a clean end of
// body: no error, no [DONE], no finish_reason. One that ends before N is
// whole.
func TestFaultClose(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	for _, tt := range []struct {
		fault  string
		events int
		done   bool
	}{{"close@4", 4, false}, {"close@0", 0, false}, {"close@40", 41, true}} {
		resp := openStream(t, context.Background(), url, "/v1/chat/completions", streamBody, map[string]string{FaultHeader: tt.fault})
		if resp.StatusCode != 200 || resp.TransferEncoding != nil || resp.ContentLength != -1 || !resp.Close ||
			resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: status %d, transfer encoding %v, length %d, close %v, headers %v", tt.fault, resp.StatusCode,
				resp.TransferEncoding, resp.ContentLength, resp.Close, resp.Header)
		}
		evs, _ := sseEvents(t, resp.Body) // fails the test on a read error
		if len(evs) != tt.events || tt.done != (len(evs) > 0 && evs[len(evs)-1] == "[DONE]") ||
			!tt.done && strings.Contains(strings.Join(evs, ""), "finish_reason\":\"length") {
			t.Errorf("%s: events %q", tt.fault, evs)
		}
	}
	// A whole answer: the headers, then a clean close before the body.
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt": "hi", "max_tokens": 5}`))
	req.Header.Set(FaultHeader, "close@2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(b) != 0 || !resp.Close {
		t.Errorf("whole answer: %d %q %v", resp.StatusCode, b, err)
	}
}

// TestFaultStall: after N tokens nothing more is sent, though the engine
// finished the request, until the client leaves.
func TestFaultStall(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := openStream(t, ctx, url, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": true}`,
		map[string]string{FaultHeader: "stall@2"})
	br := bufio.NewReader(resp.Body)
	readEvents(t, br, 2)
	// The engine is done with it.
	testkit.Eventually(t, "the stalled request to finish in the engine", func() bool {
		return metricValue(t, url, "vllm:request_success_total") == 1
	})
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(br)
		got <- string(b)
	}()
	cancel()
	if rest := <-got; strings.TrimSpace(rest) != "" {
		t.Errorf("a stalled stream sent %q", rest)
	}
	// A whole answer stalls before its body.
	ctx2, cancel2 := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt": "hi", "max_tokens": 5}`))
	req.Header.Set(FaultHeader, "stall@1")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testkit.Eventually(t, "the stalled whole answer to be produced", func() bool {
		return metricValue(t, url, "vllm:request_success_total") == 2
	})
	cancel2()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("whole answer: %v, want the client's cancellation (no answer)", err)
	}
}

// TestFaultError: after N tokens, vLLM's in-stream error event and
// [DONE], the bytes vLLM sends; a whole answer gets vLLM's 500.
func TestFaultError(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := streamBody
		if path == "/v1/completions" {
			body = `{"prompt": "hi", "max_tokens": 40, "stream": true}`
		}
		resp := openStream(t, context.Background(), url, path, body, map[string]string{FaultHeader: "error@2"})
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		want := StreamErrorEvent + "data: [DONE]\n\n"
		if resp.StatusCode != 200 || !strings.HasSuffix(string(b), want) || strings.Count(string(b), "data: ") != 4 {
			t.Errorf("%s: %d %q", path, resp.StatusCode, b)
		}
	}
	if want := `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"; StreamErrorEvent != want {
		t.Errorf("StreamErrorEvent %q", StreamErrorEvent)
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt": "hi", "max_tokens": 5}`))
	req.Header.Set(FaultHeader, "error@1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(b), `"message":"Internal server error"`) || !strings.Contains(string(b), `"type":"InternalServerError"`) {
		t.Errorf("whole answer: %d %s", resp.StatusCode, b)
	}
}

// TestFaultExit: the exit hook runs after N tokens with status 1 (the
// process test is cmd/router's), and the client's stream is cut.
func TestFaultExit(t *testing.T) {
	codes := make(chan int, 1)
	_, url := startServer(t, Config{Model: testModel, Exit: func(c int) { codes <- c }})
	resp := openStream(t, context.Background(), url, "/v1/chat/completions", streamBody, map[string]string{FaultHeader: "exit@5"})
	br := bufio.NewReader(resp.Body)
	readEvents(t, br, 5)
	if _, err := io.ReadAll(br); err == nil {
		t.Error("the stream ended cleanly")
	}
	if c := <-codes; c != 1 {
		t.Errorf("exit status %d", c)
	}
}

// TestProcessFault: POST /mock/fault cuts every stream in flight at its
// next token and every one to come; DELETE clears it. Bad faults are 400.
func TestProcessFault(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, Speedup: 5})
	const n = 3
	var brs []*bufio.Reader
	for range n {
		resp := openStream(t, context.Background(), url, "/v1/chat/completions",
			`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "stream": true}`, nil)
		br := bufio.NewReader(resp.Body)
		readEvents(t, br, 1)
		brs = append(brs, br)
	}
	resp, body := post(t, url+"/mock/fault", map[string]any{"kind": "reset", "after_tokens": 0})
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"kind":"reset","after_tokens":0}` {
		t.Fatalf("POST /mock/fault: %d %s", resp.StatusCode, body)
	}
	var wg sync.WaitGroup
	for i, br := range brs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rest, err := io.ReadAll(br)
			if err == nil || strings.Contains(string(rest), "[DONE]") {
				t.Errorf("stream %d: %v after %d bytes, want a cut", i, err, len(rest))
			}
		}()
	}
	wg.Wait()
	// One that starts after it is cut before its first byte.
	if late, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody)); err == nil {
		late.Body.Close()
		t.Errorf("a stream started after the fault was answered %d", late.StatusCode)
	}
	if r, err := http.Get(url + "/mock/fault"); err != nil || r.StatusCode != 200 {
		t.Fatalf("GET /mock/fault: %v %v", r, err)
	} else if b, _ := io.ReadAll(r.Body); r.Body.Close() != nil || strings.TrimSpace(string(b)) != `{"kind":"reset","after_tokens":0}` {
		t.Errorf("GET /mock/fault: %s", b)
	}
	req, _ := http.NewRequest(http.MethodDelete, url+"/mock/fault", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.Body.Close() != nil || resp.StatusCode != 204 {
		t.Fatalf("DELETE: %v %v", resp, err)
	}
	ok := openStream(t, context.Background(), url, "/v1/completions", `{"prompt": "hi", "max_tokens": 3, "stream": true}`, nil)
	if evs, _ := sseEvents(t, ok.Body); len(evs) != 4 || evs[3] != "[DONE]" {
		t.Errorf("after DELETE: %q", evs)
	}
	for _, bad := range []map[string]any{{"kind": "melt", "after_tokens": 1}, {"kind": "reset", "after_tokens": -1}} {
		if resp, body := post(t, url+"/mock/fault", bad); resp.StatusCode != 400 {
			t.Errorf("%v: %d %s", bad, resp.StatusCode, body)
		}
	}
	req, _ = http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt": "hi"}`))
	req.Header.Set(FaultHeader, "reset")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.Body.Close() != nil || resp.StatusCode != 400 {
		t.Errorf("header without @N: %v %v", resp, err)
	}
}

// TestDrain: draining, /health and new requests get 503 while the
// request in flight runs to its end; Drained closes after it.
func TestDrain(t *testing.T) {
	// Slow enough (about a second of wall time) to be in flight through
	// the checks.
	s, url := startServer(t, Config{Model: testModel, Speedup: 2})
	resp := openStream(t, context.Background(), url, "/v1/completions", `{"prompt": "hi", "max_tokens": 150, "stream": true}`, nil)
	br := bufio.NewReader(resp.Body)
	readEvents(t, br, 1)
	s.Drain()
	if r, err := http.Get(url + "/health"); err != nil || r.StatusCode != 503 {
		t.Fatalf("/health while draining: %v %v", r, err)
	}
	if r, body := post(t, url+"/v1/completions", map[string]any{"prompt": "hi"}); r.StatusCode != 503 {
		t.Errorf("new request while draining: %d %s", r.StatusCode, body)
	}
	select {
	case <-s.Drained():
		t.Fatal("drained with a request in flight")
	default:
	}
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), `"text":`) != 149 {
		t.Errorf("the request in flight: %v, %q", err, rest)
	}
	resp.Body.Close()
	if err := s.WaitDrained(context.Background()); err != nil {
		t.Fatal(err)
	}
}
