package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// bigBody is larger than loopback's socket buffers (a few MiB each way):
// an engine that does not read it makes the write block, then fail when
// the engine closes.
var bigBody = bytes.Repeat([]byte("a"), 32<<20)

// earlyServer is an engine that answers every request from its head
// alone, before it reads the body, and closes the connection at once with
// the body unread (the close resets it): vLLM's --api-key check, FastAPI's
// unknown path, a body limit. status 0 closes without answering. conns
// counts the connections it accepted.
func earlyServer(t *testing.T, status int, contentType, answer string) (addr string, conns *atomic.Int64) {
	t.Helper()
	return rawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		if status != 0 {
			fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\nX-Engine: early\r\n\r\n%s",
				status, http.StatusText(status), contentType, len(answer), answer)
		}
	})
}

// rawServer runs serve on each connection it accepts (n counts from 1),
// then closes the connection.
func rawServer(t *testing.T, serve func(n int64, c net.Conn, br *bufio.Reader)) (addr string, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			wg.Go(func() {
				defer c.Close()
				serve(n, c, bufio.NewReader(c))
			})
		}
	})
	return ln.Addr().String(), conns
}

// An engine's answer sent before it read the body, on a connection it
// then closed, is the exchange's result: its status, headers and body,
// not the failed write's error; the request is not sent again and the
// connection is not pooled.
func TestEarlyAnswerIsReturnedNotTheWriteError(t *testing.T) {
	cases := []struct {
		name, contentType, answer string
		status                    int
	}{
		// vLLM's AuthenticationMiddleware answers from the request's
		// scope, before the body (vllm/entrypoints/openai/server_utils.py,
		// commit 029329a8eded26d05ef8d4a302a6c9f318817dd8).
		{"vLLM api-key", "application/json", `{"error":"Unauthorized"}`, http.StatusUnauthorized},
		// FastAPI's (Starlette's) answer to a path it does not route.
		{"FastAPI unknown path", "application/json", `{"detail":"Not Found"}`, http.StatusNotFound},
		// A body limit in front of the engine (nginx's
		// client_max_body_size checks Content-Length).
		{"body limit", "text/html", "<html><body>413 Request Entity Too Large</body></html>", http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, conns := earlyServer(t, tc.status, tc.contentType, tc.answer)
			tr := &Transport{}
			defer tr.Close()
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(bigBody))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip: %v; want the engine's %d", err, tc.status)
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			if resp.StatusCode != tc.status || string(got) != tc.answer ||
				resp.Header.Get("Content-Type") != tc.contentType || resp.Header.Get("X-Engine") != "early" {
				t.Fatalf("answer %d %q (Content-Type %q, X-Engine %q); want %d %q (%q, early)",
					resp.StatusCode, got, resp.Header.Get("Content-Type"), resp.Header.Get("X-Engine"), tc.status, tc.answer, tc.contentType)
			}
			if tr.Dials() != 1 || conns.Load() != 1 || tr.Idle() != 0 {
				t.Fatalf("dials %d, engine connections %d, idle %d; want 1, 1, 0 (not resent, not pooled)", tr.Dials(), conns.Load(), tr.Idle())
			}
		})
	}
}

// Go's net/http server, answering 413 without reading the body, reads
// 256 KiB of it, half-closes, waits and closes (net/http/server.go,
// closeWriteAndWait): its answer is returned too.
func TestEarlyAnswerOfGoServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/tokenize", bytes.NewReader(bigBody))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v; want the engine's 413", err)
	}
	got, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || string(got) != "too large\n" {
		t.Fatalf("answer %d %q, %v; want 413 %q", resp.StatusCode, got, err, "too large\n")
	}
	if tr.Idle() != 0 || tr.Dials() != 1 {
		t.Fatalf("idle %d, dials %d; want 0 and 1", tr.Idle(), tr.Dials())
	}
}

// An engine that closes without answering still fails the exchange with
// the write's error (not a response, not a hang).
func TestWriteFailureWithoutAnswerIsAnError(t *testing.T) {
	addr, conns := earlyServer(t, 0, "", "")
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader(bigBody))
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("answer %d, want an error: the engine answered nothing", resp.StatusCode)
	}
	var ee *exchangeError
	if !errors.As(err, &ee) || !ee.stale {
		t.Fatalf("error %v (%T), want the failed write's exchangeError", err, err)
	}
	if conns.Load() != 1 || tr.Idle() != 0 {
		t.Fatalf("engine connections %d, idle %d; want 1 and 0 (a fresh connection is not resent)", conns.Load(), tr.Idle())
	}
}

// A 408 that arrives when the write on a reused connection fails is the
// engine closing the idle connection, not an answer to the request
// (net/http's Transport reads it so, is408Message): the request is sent
// once more on a new connection.
func TestEarly408OnReusedConnectionIsResent(t *testing.T) {
	addr, conns := rawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if n == 1 && i == 1 {
				// The first connection's second request: closed as idle.
				_, _ = io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				return
			}
			size, err := io.Copy(io.Discard, req.Body)
			if err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(size)), size)
		}
	})
	tr := &Transport{}
	defer tr.Close()
	if resp, got := post(t, tr, context.Background(), "http://"+addr+"/", "first"); resp.StatusCode != 200 || got != "5" {
		t.Fatalf("first: %d %q", resp.StatusCode, got)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader(bigBody))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v (dials %d conns %d)", err, tr.Dials(), conns.Load())
	}
	got, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := fmt.Sprint(len(bigBody)); err != nil || resp.StatusCode != 200 || string(got) != want {
		t.Fatalf("second: %d %q, %v; want 200 %q (the body, sent again whole)", resp.StatusCode, got, err, want)
	}
	if tr.Dials() != 2 || conns.Load() != 2 {
		t.Fatalf("dials %d, engine connections %d; want 2 and 2", tr.Dials(), conns.Load())
	}
}

// A request whose write fails while its context ends gets the context's
// error, whatever the engine sent.
func TestEarlyAnswerAfterCancelIsTheContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr, _ := rawServer(t, func(_ int64, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		cancel() // the client leaves before the engine answers
		_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
	})
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/", bytes.NewReader(bigBody))
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("answer %d, want context.Canceled", resp.StatusCode)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %v, want context.Canceled naming %s", err, addr)
	}
}

// failingBody yields some bytes, then fails.
type failingBody struct{ n int }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("the body broke")
	}
	k := min(len(p), b.n)
	b.n -= k
	return k, nil
}

// A request whose own body fails to read is the request's failure, not
// the connection's: no answer is waited for, and it is not a closed
// connection (stale) to resend on.
func TestBodyReadFailureIsNotTheConnections(t *testing.T) {
	srv, _ := echoServer(t)
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, &failingBody{n: 100 << 10})
	req.ContentLength = 200 << 10
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("answer %d, want the body's error", resp.StatusCode)
	}
	var ee *exchangeError
	if !errors.As(err, &ee) || ee.stale || !strings.Contains(err.Error(), "the body broke") {
		t.Fatalf("error %v, want a non-stale exchangeError with the body's error", err)
	}
	if tr.Idle() != 0 || tr.Dials() != 1 {
		t.Fatalf("idle %d, dials %d; want 0 and 1", tr.Idle(), tr.Dials())
	}
}
