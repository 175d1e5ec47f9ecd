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
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// echoServer answers every POST with "echo:" + the request body and
// counts the connections it accepted.
func echoServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	return echoServerIdle(t, 0)
}

// echoServerIdle is echoServer closing connections idle for idle (0: the
// net/http default).
func echoServerIdle(t *testing.T, idle time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("X-Path", r.URL.Path)
		_, _ = w.Write(append([]byte("echo:"), b...))
	}))
	srv.Config.IdleTimeout = idle
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func post(t *testing.T, tr http.RoundTripper, ctx context.Context, url, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp, string(b)
}

func TestSequentialRequestsReuseOneConnection(t *testing.T) {
	srv, conns := echoServer(t)
	tr := &Transport{}
	defer tr.Close()
	for i := range 50 {
		want := fmt.Sprintf("request %d %s", i, strings.Repeat("x", i*100))
		resp, got := post(t, tr, context.Background(), srv.URL+"/v1/x", want)
		if resp.StatusCode != 200 || got != "echo:"+want || resp.Header.Get("X-Path") != "/v1/x" {
			t.Fatalf("request %d: %d %q (path %q)", i, resp.StatusCode, got, resp.Header.Get("X-Path"))
		}
	}
	if tr.Dials() != 1 || conns.Load() != 1 {
		t.Fatalf("dials %d, server connections %d; want 1 and 1", tr.Dials(), conns.Load())
	}
	if tr.Idle() != 1 {
		t.Fatalf("idle %d, want 1", tr.Idle())
	}
}

func TestChunkedStreamArrivesChunkByChunk(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: two\n\n")
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("length %d, encoding %v: want a chunked answer", resp.ContentLength, resp.TransferEncoding)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release) // the second chunk is written only now
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	_ = resp.Body.Close()
	if tr.Idle() != 1 {
		t.Fatalf("idle %d after the chunked body's end, want 1 (the connection is reused)", tr.Idle())
	}
	_, got := post(t, tr, context.Background(), srv.URL, "again")
	if got != "data: one\n\ndata: two\n\n" || tr.Dials() != 1 {
		t.Fatalf("second request %q over %d dials, want the same answer over 1", got, tr.Dials())
	}
}

func TestIdleConnectionClosedByTheEngineIsNotUsed(t *testing.T) {
	srv, conns := echoServerIdle(t, 20*time.Millisecond)
	tr := &Transport{}
	defer tr.Close()
	post(t, tr, context.Background(), srv.URL, "a")
	// The server closes the idle connection; the pool only learns of it
	// when it peeks at the socket on reuse.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(30 * time.Millisecond)
		if c := peekIdle(tr); c != nil && !alive(c.nc) {
			break
		}
	}
	resp, got := post(t, tr, context.Background(), srv.URL, "b")
	if resp.StatusCode != 200 || got != "echo:b" {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
	if tr.Dials() != 2 || conns.Load() != 2 {
		t.Fatalf("dials %d, server connections %d; want 2 and 2", tr.Dials(), conns.Load())
	}
}

func peekIdle(tr *Transport) *conn {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, p := range tr.pools {
		if len(p.idle) > 0 {
			return p.idle[len(p.idle)-1]
		}
	}
	return nil
}

// oneShotServer answers the first request on each connection, then reads
// the next request and closes the connection without answering: an
// engine closing a keep-alive connection just as a request arrives.
func oneShotServer(t *testing.T) (addr string, conns *atomic.Int64) {
	t.Helper()
	addr, conns, _ = holdingServer(t, 0)
	return addr, conns
}

// holdingServer is oneShotServer holding the second request for hold
// before it closes the connection (an engine that failed while it had the
// request); requests counts the requests it read.
func holdingServer(t *testing.T, hold time.Duration) (addr string, conns, requests *atomic.Int64) {
	t.Helper()
	requests = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				requests.Add(1)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
				if req, err = http.ReadRequest(br); err == nil {
					_, _ = io.Copy(io.Discard, req.Body)
					requests.Add(1)
					time.Sleep(hold)
				}
			}()
		}
	}()
	return ln.Addr().String(), conns, requests
}

// An engine that had the request and then closed the connection may have
// worked on it: the request is not sent again, the error is returned.
func TestRequestTheEngineHeldIsNotResent(t *testing.T) {
	addr, _, requests := holdingServer(t, 100*time.Millisecond)
	tr := &Transport{}
	defer tr.Close()
	post(t, tr, context.Background(), "http://"+addr+"/", "first")
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader("second"))
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("want an error: the engine closed the connection after holding the request")
	}
	if got := requests.Load(); got != 2 || tr.Dials() != 1 {
		t.Fatalf("the engine read %d requests over %d dials; want 2 over 1 (no resend)", got, tr.Dials())
	}
}

func TestReusedConnectionClosedMidRequestIsRetriedOnce(t *testing.T) {
	addr, conns := oneShotServer(t)
	// The close follows the request at once; a wide window keeps a slow
	// machine from making it look held.
	tr := &Transport{staleWin: 5 * time.Second}
	defer tr.Close()
	for _, body := range []string{"first", "second", "third"} {
		resp, got := post(t, tr, context.Background(), "http://"+addr+"/", body)
		if resp.StatusCode != 200 || got != body {
			t.Fatalf("%q: %d %q", body, resp.StatusCode, got)
		}
	}
	// Each later request went out on the pooled connection, lost it, and
	// was sent again on a new one.
	if tr.Dials() != 3 || conns.Load() != 3 {
		t.Fatalf("dials %d, server connections %d; want 3 and 3", tr.Dials(), conns.Load())
	}
}

// onceReader is a body that cannot be rewound (no GetBody).
type onceReader struct{ io.Reader }

func TestRequestWithoutRewindableBodyIsNotRetried(t *testing.T) {
	addr, _ := oneShotServer(t)
	tr := &Transport{}
	defer tr.Close()
	post(t, tr, context.Background(), "http://"+addr+"/", "first")
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", onceReader{strings.NewReader("second")})
	req.ContentLength = 6
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("want an error: the body cannot be sent twice")
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("error %v, want one wrapping io.EOF", err)
	}
	if tr.Dials() != 1 {
		t.Fatalf("dials %d, want 1 (no retry)", tr.Dials())
	}
}

func TestConnectionCloseAnswerIsNotPooled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bye")
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	for range 3 {
		if _, got := post(t, tr, context.Background(), srv.URL, "x"); got != "bye" {
			t.Fatalf("got %q", got)
		}
	}
	if tr.Dials() != 3 || tr.Idle() != 0 {
		t.Fatalf("dials %d idle %d, want 3 and 0", tr.Dials(), tr.Idle())
	}
}

func TestCancelMidBodyEndsTheReadAndDropsTheConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // net/http sees the client leave only after the body
		_, _ = io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "data: one\n\n" {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the read ended without an error after the cancel")
		}
	case <-time.After(time.Minute):
		t.Fatal("the read did not end after the context was cancelled")
	}
	_ = resp.Body.Close()
	if tr.Idle() != 0 {
		t.Fatalf("idle %d, want 0: a cut connection is not reused", tr.Idle())
	}
}

func TestCancelBeforeTheAnswerReturnsTheContextError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want context.DeadlineExceeded", err)
	}
}

func TestBodyClosedBeforeItsEndClosesTheConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("z"), 100<<10))
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if tr.Idle() != 0 {
		t.Fatalf("idle %d, want 0", tr.Idle())
	}
	if _, got := post(t, tr, context.Background(), srv.URL, "{}"); len(got) != 100<<10 {
		t.Fatalf("second answer %d bytes, want %d", len(got), 100<<10)
	}
	if tr.Dials() != 2 {
		t.Fatalf("dials %d, want 2", tr.Dials())
	}
}

func TestEmptyBodyFreesTheConnectionAtOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNoContent || resp.Body != http.NoBody || tr.Idle() != 1 {
		t.Fatalf("status %d, body %T, idle %d: want 204, NoBody, 1", resp.StatusCode, resp.Body, tr.Idle())
	}
}

func TestConcurrentRequests(t *testing.T) {
	srv, conns := echoServer(t)
	tr := &Transport{MaxIdlePerHost: 4}
	defer tr.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				want := fmt.Sprintf("g%d-%d", g, i)
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(want))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil || string(b) != "echo:"+want {
					errs <- fmt.Errorf("%s: got %q, %v", want, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := tr.Idle(); n > 4 {
		t.Fatalf("idle %d, want at most MaxIdlePerHost 4", n)
	}
	if d := tr.Dials(); d < 1 || d != conns.Load() {
		t.Fatalf("dials %d, server connections %d", d, conns.Load())
	}
}

func TestRefusedConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	tr := &Transport{}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader("{}"))
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("error %v, want connection refused", err)
	}
}

func TestClosedTransportFails(t *testing.T) {
	srv, _ := echoServer(t)
	tr := &Transport{}
	post(t, tr, context.Background(), srv.URL, "x")
	tr.Close()
	if tr.Idle() != 0 {
		t.Fatalf("idle %d after Close", tr.Idle())
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	if _, err := tr.RoundTrip(req); !errors.Is(err, errTransportClosed) {
		t.Fatalf("error %v, want errTransportClosed", err)
	}
}

func TestHTTPSGoesToTheStandardTransport(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "tls")
	}))
	defer srv.Close()
	tr := &Transport{TLSClientConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig}
	defer tr.Close()
	if _, got := post(t, tr, context.Background(), srv.URL, "x"); got != "tls" {
		t.Fatalf("got %q", got)
	}
	if tr.Dials() != 0 {
		t.Fatalf("dials %d: https must not use the plain pool", tr.Dials())
	}
}

// BenchmarkRoundTrip compares one sequential 2 KiB POST and its answer
// over loopback on this Transport and on net/http's (same process).
func BenchmarkRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"id":"x","choices":[{"text":"hello"}]}`))
	}))
	defer srv.Close()
	payload := bytes.Repeat([]byte("a"), 2048)
	run := func(b *testing.B, tr http.RoundTripper) {
		buf := make([]byte, 4096)
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			_ = resp.Body.Close()
		}
	}
	b.Run("upstream", func(b *testing.B) {
		tr := &Transport{}
		defer tr.Close()
		run(b, tr)
	})
	b.Run("net-http", func(b *testing.B) {
		tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
		defer tr.CloseIdleConnections()
		run(b, tr)
	})
}

// countingServer answers "ok" (GET /hold first waits for release) and
// counts the connections it accepted and those closed.
func countingServer(t *testing.T, release <-chan struct{}) (srv *httptest.Server, opened, closed *atomic.Int64) {
	t.Helper()
	opened, closed = new(atomic.Int64), new(atomic.Int64)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hold" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, opened, closed
}

// fill sends n requests to url at once and reads their answers: the pool
// then holds up to n idle connections to it.
func fill(t *testing.T, tr *Transport, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		})
	}
	wg.Wait()
}

func (t *Transport) poolCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pools)
}

// Idle connections nobody uses again are closed by time, without a
// request to their address, and the address is forgotten; a later request
// opens a new connection. (Before, they were closed only when a request
// to the same address came.)
func TestIdleConnectionsAreClosedByTime(t *testing.T) {
	srv, opened, closed := countingServer(t, nil)
	tr := &Transport{IdleTimeout: 200 * time.Millisecond}
	defer tr.Close()
	fill(t, tr, srv.URL, 8)
	if n := tr.Idle(); n < 1 || int64(n) != tr.Dials() {
		t.Fatalf("idle %d, dials %d after the requests; want them equal, at least 1", n, tr.Dials())
	}
	testkit.Eventually(t, "every idle connection closed", func() bool {
		return tr.Idle() == 0 && closed.Load() == opened.Load()
	})
	if n := tr.poolCount(); n != 0 {
		t.Fatalf("%d addresses kept after their connections closed, want 0", n)
	}
	dials := tr.Dials()
	if resp, got := post(t, tr, context.Background(), srv.URL, "again"); resp.StatusCode != 200 || got != "ok" {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
	if tr.Dials() != dials+1 {
		t.Fatalf("dials %d, want %d: a new connection", tr.Dials(), dials+1)
	}
}

// A connection idle for IdleTimeout is not reused, even before the sweep
// closed it.
func TestExpiredConnectionIsNotReused(t *testing.T) {
	srv, _, _ := countingServer(t, nil)
	tr := &Transport{IdleTimeout: time.Minute}
	defer tr.Close()
	post(t, tr, context.Background(), srv.URL, "a")
	c := peekIdle(tr)
	if c == nil {
		t.Fatal("no idle connection")
	}
	tr.mu.Lock()
	c.idleAt = c.idleAt.Add(-time.Minute) // as if unused for a minute
	tr.mu.Unlock()
	post(t, tr, context.Background(), srv.URL, "b")
	if tr.Dials() != 2 {
		t.Fatalf("dials %d, want 2: the expired connection is not reused", tr.Dials())
	}
}

// CloseIdleConnectionsTo closes the idle connections to one address at
// once, and the one in use when its exchange ends; the other addresses'
// stay pooled, and a later request to the address works.
func TestCloseIdleConnectionsToClosesOneAddress(t *testing.T) {
	release := make(chan struct{})
	a, aOpened, aClosed := countingServer(t, release)
	b, _, bClosed := countingServer(t, nil)
	tr := &Transport{IdleTimeout: time.Minute}
	defer tr.Close()
	fill(t, tr, a.URL, 4)
	fill(t, tr, b.URL, 4)
	idleA, idleB := tr.IdleTo(a.URL+"/v1/chat/completions"), tr.IdleTo(b.URL)
	if idleA < 1 || idleB < 1 {
		t.Fatalf("idle to a %d, to b %d; want some to each", idleA, idleB)
	}
	// A request in flight to a, on a connection of its own.
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, a.URL+"/hold", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		held <- err
	}()
	testkit.Eventually(t, "the held request in flight", func() bool { return tr.IdleTo(a.URL) == idleA-1 })
	tr.CloseIdleConnectionsTo(a.URL)
	if tr.IdleTo(a.URL) != 0 || tr.IdleTo(b.URL) != idleB {
		t.Fatalf("after CloseIdleConnectionsTo(a): idle to a %d (want 0), to b %d (want %d)", tr.IdleTo(a.URL), tr.IdleTo(b.URL), idleB)
	}
	testkit.Eventually(t, "a's idle connections closed", func() bool { return aClosed.Load() == int64(idleA-1) })
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	testkit.Eventually(t, "the in-flight connection closed at its end", func() bool { return aClosed.Load() == aOpened.Load() })
	if tr.IdleTo(a.URL) != 0 || bClosed.Load() != 0 {
		t.Fatalf("idle to a %d, b's connections closed %d; want 0 and 0", tr.IdleTo(a.URL), bClosed.Load())
	}
	if resp, got := post(t, tr, context.Background(), a.URL, "back"); resp.StatusCode != 200 || got != "ok" {
		t.Fatalf("a request to a afterwards: %d %q", resp.StatusCode, got)
	}
	if tr.IdleTo(a.URL) != 1 {
		t.Fatalf("idle to a %d after a new request, want 1 (a new pool)", tr.IdleTo(a.URL))
	}
	// Neither https nor garbage are a pool's address.
	tr.CloseIdleConnectionsTo("https://" + strings.TrimPrefix(b.URL, "http://"))
	tr.CloseIdleConnectionsTo("::not a url")
	if tr.IdleTo(b.URL) != idleB {
		t.Fatalf("idle to b %d, want %d", tr.IdleTo(b.URL), idleB)
	}
}
