package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"go.uber.org/goleak"
)

// Tests of what a client's connection may cost the router (#25): bodies
// held as they arrive (not as declared), per client address; a body that
// does not arrive in time answered 408 and its connection closed; a
// request with both Content-Length and chunked encoding answered and its
// connection closed. Each talks to a real loopback server over raw TCP.

// serving is a Server running Serve on a loopback listener.
type serving struct {
	addr    string
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
	err     error
}

// serveLoopback runs e's Server with Serve on 127.0.0.1 until stop (or
// the test's end).
func serveLoopback(t *testing.T, e *env) *serving {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sv := &serving{addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { sv.done <- e.s.Serve(ctx, ln) }()
	t.Cleanup(func() { sv.stop(t) })
	return sv
}

// stop ends Serve as SIGTERM does and waits for it to return, a minute
// at most (the test fails then); it returns Serve's error.
func (sv *serving) stop(t *testing.T) error {
	t.Helper()
	sv.stopped.Do(func() {
		sv.cancel()
		select {
		case sv.err = <-sv.done:
		case <-time.After(time.Minute):
			sv.err = errors.New("Serve did not return within a minute of its context's end")
			t.Error(sv.err)
		}
	})
	return sv.err
}

// dialFrom opens a TCP connection to addr from the loopback address src
// (any of 127.0.0.0/8 on Linux), closed at the test's end.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Minute}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readUntilClosed reads c until the server closes it, a minute at most,
// and returns what came and how the reading ended: nil or a reset once
// the server closed, a timeout error when it did not.
func readUntilClosed(c net.Conn) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	return string(b), err
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

const postHead = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

// A body that does not arrive within the body timeout (here the request
// timeout, 1 s) is answered 408 body_timeout and its connection closed,
// whether it stalls or trickles, declared or chunked: nothing is left
// reading the rest of it. Counted 408, never 499; Serve then returns at
// once although its drain timeout is an hour, and no goroutine is left.
func TestBodyTimeoutAnswers408AndClosesTheConnection(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after every other cleanup
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{timeout: time.Second, drain: time.Hour}, backend{name: "w1", url: eng.URL})
	sv := serveLoopback(t, e)
	cases := []struct {
		name, req string
		trickle   string // sent every 20 ms until the connection fails
	}{
		{"declared, stalled", postHead + "Content-Length: 100\r\n\r\n{\"model\":", ""},
		{"chunked, stalled", postHead + "Transfer-Encoding: chunked\r\n\r\n9\r\n{\"model\":\r\n", ""},
		{"declared, trickled", postHead + "Content-Length: 100000\r\n\r\n", " "},
		{"chunked, trickled", postHead + "Transfer-Encoding: chunked\r\n\r\n", "1\r\n \r\n"},
	}
	var wg sync.WaitGroup
	for _, tc := range cases {
		c := dialFrom(t, "127.0.0.1", sv.addr)
		wg.Go(func() {
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Errorf("%s: writing the request: %v", tc.name, err)
				return
			}
			stop := make(chan struct{})
			trickled := make(chan struct{})
			go func() {
				defer close(trickled)
				for tc.trickle != "" {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					if _, err := io.WriteString(c, tc.trickle); err != nil {
						return // the server closed the connection
					}
				}
			}()
			got, err := readUntilClosed(c)
			close(stop)
			<-trickled
			if isTimeout(err) {
				t.Errorf("%s: the connection is still open a minute later; read so far: %q", tc.name, got)
				return
			}
			if !strings.HasPrefix(got, "HTTP/1.1 408 ") || !strings.Contains(got, `"body_timeout"`) {
				t.Errorf("%s: answer %q (read ended with %v), want 408 body_timeout", tc.name, got, err)
			}
		})
	}
	wg.Wait()
	if got := e.metric(t, "switchyard_requests_total", "model", "", "code", "408"); got != float64(len(cases)) {
		t.Errorf("requests_total{code=408} = %v, want %d", got, len(cases))
	}
	if got := e.metric(t, "switchyard_requests_total", "model", "", "code", "499"); got != 0 {
		t.Errorf("requests_total{code=499} = %v, want 0", got)
	}
	if err := sv.stop(t); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if n := e.s.InFlight(); n != 0 {
		t.Errorf("%d requests in flight after Serve returned", n)
	}
	if eng.requests.Load() != 0 {
		t.Errorf("the engine got %d requests", eng.requests.Load())
	}
}

// A declared Content-Length is not held before its bytes arrive: eight
// connections that each declare a 1 MiB body and send one byte hold a few
// KiB between them, and an honest request is served beside them although
// their promises alone would fill the 4 MiB budget.
func TestPromisedBodiesHoldOnlyWhatArrived(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{maxBody: 1 << 20, bodiesInFlight: 4 << 20}, backend{name: "w1", url: eng.URL})
	const promisers = 8
	for range promisers {
		c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(e.url, "http://"))
		if _, err := io.WriteString(c, postHead+"Content-Length: 1048576\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "the awaited condition", func() bool { return e.s.InFlight() == promisers })
	testkit.Eventually(t, "the awaited condition", func() bool { return e.s.bodyBytesHeld() > 0 })
	if held := e.s.bodyBytesHeld(); held > promisers*bodyFirstStep {
		t.Errorf("%d connections that sent one byte each hold %d bytes, want at most %d", promisers, held, promisers*bodyFirstStep)
	}
	resp, err := post(t, context.Background(), e.url+"/v1/chat/completions", chatBody("m", false, strings.Repeat("x", 2000)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an honest request beside %d promised bodies: %d %s, want 200", promisers, resp.StatusCode, b)
	}
}

// One client address holds at most MaxBodyBytesPerClient of request
// bodies: with 2 MiB per address, two bodies of 1 MiB arriving from
// 127.0.0.2 fill its share, a third body from it is answered 503
// overloaded, and so is an honest request from it, while 127.0.0.3 is
// served; once one of the first two leaves, 127.0.0.2 is served again.
func TestBodiesPerClientAddressAreBounded(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{maxBody: 1 << 20, bodiesInFlight: 8 << 20, perClient: 2 << 20}, backend{name: "w1", url: eng.URL})
	sv := serveLoopback(t, e)
	const mib = 1 << 20
	// All of a 1 MiB body but its last byte: held until that byte, which
	// never comes.
	almost := postHead + fmt.Sprintf("Content-Length: %d\r\n\r\n", mib) + strings.Repeat(" ", mib-1)
	var held []net.Conn
	for i := range 2 {
		c := dialFrom(t, "127.0.0.2", sv.addr)
		if _, err := io.WriteString(c, almost); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		testkit.Eventually(t, "the awaited condition", func() bool { return e.s.bodyBytesHeld() == int64(i+1)*mib })
	}
	third := dialFrom(t, "127.0.0.2", sv.addr)
	go func() { _, _ = io.WriteString(third, almost) }() // refused before it is read
	got, err := readUntilClosed(third)
	if !strings.HasPrefix(got, "HTTP/1.1 503 ") || !strings.Contains(got, `"overloaded"`) {
		t.Errorf("a third 1 MiB body from 127.0.0.2: %q (%v), want 503 overloaded", got, err)
	}

	honest := chatBody("m", false, "hello")
	ask := func(src string) string {
		t.Helper()
		c := dialFrom(t, src, sv.addr)
		if _, err := io.WriteString(c, postHead+fmt.Sprintf("Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(honest), honest)); err != nil {
			t.Fatal(err)
		}
		got, err := readUntilClosed(c)
		if isTimeout(err) {
			t.Fatalf("from %s: no answer in a minute; read %q", src, got)
		}
		return got
	}
	if got := ask("127.0.0.3"); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Errorf("an honest request from 127.0.0.3: %q, want 200", got)
	}
	if got := ask("127.0.0.2"); !strings.HasPrefix(got, "HTTP/1.1 503 ") || !strings.Contains(got, `"overloaded"`) {
		t.Errorf("an honest request from 127.0.0.2 while its share is held: %q, want 503 overloaded", got)
	}
	_ = held[0].Close()
	testkit.Eventually(t, "the awaited condition", func() bool { return e.s.bodyBytesHeld() == mib })
	if got := ask("127.0.0.2"); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Errorf("an honest request from 127.0.0.2 once one body left: %q, want 200", got)
	}
}

// RFC 9112 section 6.3: a request with both Content-Length and chunked
// Transfer-Encoding is read by its chunks and answered, and its
// connection is closed after the answer: what follows it on the wire (a
// request smuggled in, for a front end that read it by its
// Content-Length) is never read as a request.
func TestContentLengthAndChunkedClosesTheConnection(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	body := chatBody("m", false, "hello")
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(e.url, "http://"))
	req := postHead + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
		fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body) +
		"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"choices"`) {
		t.Errorf("answer %d %s, want 200 with the engine's answer", resp.StatusCode, answer)
	}
	rest, err := io.ReadAll(br)
	if isTimeout(err) || len(rest) > 0 {
		t.Errorf("after the answer: %q (%v), want the connection closed with nothing more", rest, err)
	}
	if n := eng.requests.Load(); n != 1 {
		t.Errorf("the engine got %d requests, want 1", n)
	}
}

// The client address a body is counted under: the IPv4 address, an
// IPv4-mapped IPv6 one as IPv4, an IPv6 one by its /64 (zone dropped),
// and one key for anything that is not ip:port.
func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.2:5555":              "127.0.0.2",
		"[::ffff:10.1.2.3]:80":        "10.1.2.3",
		"[2001:db8:1:2:a:b:c:d]:443":  "2001:db8:1:2::",
		"[2001:db8:1:2:ffff::1]:1":    "2001:db8:1:2::",
		"[fe80::1%eth0]:8080":         "fe80::",
		"@":                           "invalid IP",
		"not an address":              "invalid IP",
		"[2001:db8:1:3::1]:443":       "2001:db8:1:3::",
		"192.168.0.1:0":               "192.168.0.1",
		"[::1]:8080":                  "::",
		"[2001:db8:ffff:ffff::]:8080": "2001:db8:ffff:ffff::",
	} {
		if got := clientKey(in).String(); got != want {
			t.Errorf("clientKey(%q) = %s, want %s", in, got, want)
		}
	}
}

// A header block past MaxHeaderBytes is answered 431 and its connection
// closed; one just under it is served.
func TestHeaderBlockIsBounded(t *testing.T) {
	eng := newEngine(t, 1, 0)
	e := newEnv(t, envOptions{}, backend{name: "w1", url: eng.URL})
	sv := serveLoopback(t, e)
	body := chatBody("m", false, "hello")
	send := func(pad int) (int, string) {
		t.Helper()
		c := dialFrom(t, "127.0.0.1", sv.addr)
		req := postHead + "X-Pad: " + strings.Repeat("p", pad) + "\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, b := send(MaxHeaderBytes / 2); code != http.StatusOK {
		t.Errorf("headers of %d bytes: %d %s, want 200", MaxHeaderBytes/2, code, b)
	}
	// net/http allows 4 KiB of slack over MaxHeaderBytes (its bufio
	// reader's size): go well past it.
	if code, b := send(MaxHeaderBytes + 8<<10); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: %d %s, want 431", MaxHeaderBytes+8<<10, code, b)
	}
	if n := eng.requests.Load(); n != 1 {
		t.Errorf("the engine got %d requests, want 1", n)
	}
}
