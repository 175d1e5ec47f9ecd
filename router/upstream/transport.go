// Package upstream is the HTTP/1.1 client of `router serve`'s hop to the
// engines: an http.RoundTripper that makes each exchange on the calling
// goroutine over a pool of keep-alive connections.
//
// net/http's Transport gives every connection a reader and a writer
// goroutine and hands each request and response between them and the
// caller over channels. On a proxy hop that is two goroutine hand-offs per
// request on top of the two network waits, and on a small machine each
// costs a thread wake-up: measured on the project's 2-core VM, one client
// through a proxy on http.Transport adds about 35 us more at p50 than the
// same proxy on this client (BENCHMARKS.md, "router serve on loopback").
// Here the caller writes the request and reads the response itself; the
// wire format is net/http's own (http.Request.Write and
// http.ReadResponse), so chunked bodies, trailers, Content-Length and
// "Connection: close" behave exactly as with net/http.
//
// Without a reader goroutine an idle connection that the engine closed is
// only seen when it is next used. Two measures keep that from failing
// requests: before a pooled connection is reused it is checked with a
// non-blocking peek (a closed or reset socket, or one with unexpected
// bytes, is dropped; the check go-sql-driver/mysql makes for the same
// reason), and an exchange on a reused connection whose write fails, or
// whose answer's first read fails within 10 ms of the write (the engine's
// close was already in flight), is sent once more on a new connection
// when the request body can be rewound (http.Request.GetBody). A later
// failure is not resent: the engine had the request and may have worked
// on it.
//
// An engine may answer from the request's head alone, before it read the
// body (vLLM's --api-key check answers 401, an unknown path 404, a body
// limit 413), and close the connection with the body still coming; the
// write then fails. The engine's answer is not lost: when a write fails,
// an answer that arrives within earlyAnswerWait is read and returned as
// the exchange's result (its connection closed after it), as net/http's
// Transport, which reads while it writes, returns it too.
//
// Idle connections are closed by time as well as on use: a timer (no
// goroutine while it waits) sweeps the pool while it holds any, closing
// those unused for IdleTimeout, so no idle connection outlives it by more
// than IdleTimeout/8 whether its address is used again or not; and
// CloseIdleConnectionsTo closes at once the pool of an address that left
// the fleet (a worker removed, or moved to another URL). The
// default idle timeout, 4 s, is below the 5 s after which uvicorn closes
// an idle connection (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, uvicorn's
// timeout_keep_alive; SGLang and TensorRT-LLM serve through uvicorn with
// its default), so the router does not reuse a connection the engine is
// about to close.
//
// Only plain http:// URLs take this path; any other scheme (https) goes
// to a standard http.Transport with the same limits.
package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of Transport's fields.
const (
	// DefaultDialTimeout bounds connecting to an engine.
	DefaultDialTimeout = 5 * time.Second
	// DefaultIdleTimeout is how long an unused connection is kept: below
	// the 5 s keep-alive timeout of uvicorn, which vLLM, SGLang and
	// TensorRT-LLM serve through (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so
	// that a connection is not reused as the engine closes it. Engines
	// that close sooner are caught by the reuse check.
	DefaultIdleTimeout = 4 * time.Second
	// DefaultMaxIdlePerHost bounds the pooled connections to one engine.
	DefaultMaxIdlePerHost = 256
	// bufferSize is each connection's read and write buffer, bytes.
	bufferSize = 32 << 10
)

// Transport is an HTTP/1.1 http.RoundTripper for the engines. Its zero
// value is ready to use, with the defaults above. Safe for concurrent use.
// A Response's Body must be read to its end or closed: the end returns the
// connection to the pool, Close before the end closes the connection.
type Transport struct {
	// DialTimeout bounds a connect (DefaultDialTimeout).
	DialTimeout time.Duration
	// IdleTimeout closes connections unused for longer
	// (DefaultIdleTimeout): they are not reused after it, and a sweep
	// closes them within IdleTimeout/8 more.
	IdleTimeout time.Duration
	// MaxIdlePerHost bounds the idle connections kept per host:port
	// (DefaultMaxIdlePerHost).
	MaxIdlePerHost int
	// TLSClientConfig configures the https:// transport (nil: the
	// system's roots).
	TLSClientConfig *tls.Config

	mu      sync.Mutex
	pools   map[string]*pool // by host:port; a pool is here while it has idle or busy connections
	closed  bool
	reaper  *time.Timer // sweeps idle connections (reap)
	reaping bool        // reaper is armed (or its sweep runs)

	fallbackOnce sync.Once
	fallback     *http.Transport

	dials atomic.Int64 // connections opened

	// staleWin overrides staleWindow (tests on slow machines).
	staleWin time.Duration
}

// pool is the connections to one host:port.
type pool struct {
	idle []*conn // oldest first
	busy int     // connections taken from the pool (or being dialled) and not back or closed
	gone bool    // the address left (CloseIdleConnectionsTo): out of Transport.pools; busy ones close at their end
}

// conn is one connection of a pool.
type conn struct {
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer // writes to w
	w      connWriter
	key    string
	p      *pool
	idleAt time.Time
	reused bool
}

// errTransportClosed is returned by RoundTrip after CloseIdleConnections
// was called with the transport marked closed (Close).
var errTransportClosed = errors.New("upstream: transport closed")

// RoundTrip sends req and returns the engine's response. The exchange
// runs on the calling goroutine; req's context bounds the connect, the
// request's write, the wait for the response and the response body's
// reads (its end makes them fail and closes the connection). Errors are
// the dial's, the connection's, or the context's.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "http" {
		return t.fallbackTransport().RoundTrip(req)
	}
	key := poolKey(req.URL.Host)
	ctx := req.Context()
	c, err := t.get(ctx, key)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, err := t.exchange(ctx, c, req)
	if err != nil && c.reused && req.GetBody != nil && retryable(err) && ctx.Err() == nil {
		// The engine closed the pooled connection before it read the
		// request: send it once more on a new connection.
		body, berr := req.GetBody()
		if berr != nil {
			return nil, err
		}
		r2 := req.Clone(ctx)
		r2.Body = body
		if c, err = t.dial(ctx, key); err != nil {
			closeBody(r2)
			return nil, err
		}
		return t.exchange(ctx, c, r2)
	}
	return resp, err
}

// exchange writes req on c and reads the response head. On error c is
// closed; on success the response body owns c.
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error, stale bool) (*http.Response, error) {
		stop()
		t.discard(c)
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("upstream %s: %w", c.key, cerr)
		}
		return nil, &exchangeError{key: c.key, err: err, stale: stale}
	}
	werr := req.Write(c.bw)
	if werr == nil {
		werr = c.bw.Flush()
	}
	if werr != nil {
		if c.w.err == nil {
			// Reading the request's body failed, not the connection.
			return fail(werr, false)
		}
		// The connection's own error: http.Request.Write reports a
		// failed write while it copies the body as the body's read
		// error (requestBodyReadError, which does not unwrap).
		// The engine may have answered before it read the whole body
		// (401, 404, 413...) and closed the connection: its answer, not
		// the failed write, is the exchange's result.
		if resp := t.earlyAnswer(ctx, c, req, stop); resp != nil {
			return resp, nil
		}
		return fail(c.w.err, true)
	}
	wrote := time.Now()
	// The first byte alone, so that a connection closed before any answer
	// ends in io.EOF (http.ReadResponse reports io.ErrUnexpectedEOF).
	if _, err := c.br.Peek(1); err != nil {
		// A close that was already on its way when the request went out
		// arrives within a round trip; a later one means the engine held
		// the request (and may have worked on it): not stale.
		win := staleWindow
		if t.staleWin > 0 {
			win = t.staleWin
		}
		return fail(err, time.Since(wrote) < win)
	}
	resp, err := readAnswer(c.br, req)
	if err != nil {
		return fail(err, false)
	}
	reusable := !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols
	return t.own(c, resp, stop, reusable), nil
}

// readAnswer reads the head of req's final answer from br, skipping
// interim ones (100 Continue, 103 Early Hints; 101 Switching Protocols
// is final).
func readAnswer(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		return resp, nil
	}
}

// own hands c to resp: freed now when resp has no body, else at the
// body's end (Close before it closes c). reusable: c may carry another
// request after it.
func (t *Transport) own(c *conn, resp *http.Response, stop func() bool, reusable bool) *http.Response {
	if resp.Body == http.NoBody {
		// Nothing to read: the connection is free now.
		t.finish(c, stop, reusable)
		return resp
	}
	resp.Body = &body{rc: resp.Body, t: t, c: c, stop: stop, reusable: reusable}
	return resp
}

// earlyAnswer reads the answer an engine sent before it read all of req
// on c, once writing req failed: an engine may refuse a request from its
// head alone (vLLM's --api-key check answers 401, an unknown path 404, a
// body limit 413) and close the connection without reading the rest of
// the body, so the write fails (broken pipe, reset) while the engine's
// answer waits in the socket's receive buffer. net/http's Transport reads
// answers concurrently with the write for this reason and returns such an
// answer, not the write's error (net/http/transport.go, persistConn.
// roundTrip and wroteRequest, Go 1.26). The answer's head must arrive
// within earlyAnswerWait of the failure; its body is then bounded by ctx
// like any answer's, and c is closed after it, never reused (the engine
// did not read the whole request). nil when no answer came, ctx ended,
// or the answer is a 408 on a reused connection (an engine announcing
// that it closed the idle connection, not answering req: net/http's
// Transport reads it so too, is408Message): the caller fails the
// exchange with the write's error. On nil, c is left to the caller.
func (t *Transport) earlyAnswer(ctx context.Context, c *conn, req *http.Request, stop func() bool) *http.Response {
	// ctx's end sets a deadline in the past (exchange's AfterFunc); the
	// deadline set here must not undo it: ctx is checked after each.
	if ctx.Err() != nil || c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait)) != nil || ctx.Err() != nil {
		return nil
	}
	resp, err := readAnswer(c.br, req)
	if err != nil || (c.reused && resp.StatusCode == http.StatusRequestTimeout) {
		return nil
	}
	if c.nc.SetReadDeadline(time.Time{}) != nil || ctx.Err() != nil {
		return nil
	}
	return t.own(c, resp, stop, false)
}

// finish ends an exchange on c: back to the pool when c can carry another
// request and the context did not cut it, else closed.
func (t *Transport) finish(c *conn, stop func() bool, reusable bool) {
	if !stop() || !reusable || c.br.Buffered() > 0 {
		t.discard(c)
		return
	}
	t.put(c)
}

// get returns a live pooled connection to key, or a new one.
func (t *Transport) get(ctx context.Context, key string) (*conn, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errTransportClosed
		}
		p := t.pools[key]
		n := 0
		if p != nil {
			n = len(p.idle)
		}
		if n == 0 {
			t.mu.Unlock()
			return t.dial(ctx, key)
		}
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.busy++
		t.mu.Unlock()
		if now.Sub(c.idleAt) >= t.idleTimeout() || !alive(c.nc) {
			t.discard(c)
			continue
		}
		c.reused = true
		return c, nil
	}
}

// put returns c to its pool, closing the oldest idle connections beyond
// MaxIdlePerHost and those idle too long, and arms the sweep. c is closed
// instead when the transport is closed or c's address left.
func (t *Transport) put(c *conn) {
	c.idleAt = time.Now()
	c.reused = false
	var drop []*conn
	t.mu.Lock()
	p := c.p
	p.busy--
	if t.closed || p.gone {
		t.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	list := append(p.idle, c)
	cut := 0
	for cut < len(list) && (c.idleAt.Sub(list[cut].idleAt) >= t.idleTimeout() || len(list)-cut > t.maxIdle()) {
		drop = append(drop, list[cut])
		list[cut] = nil
		cut++
	}
	p.idle = list[cut:]
	t.armLocked()
	t.mu.Unlock()
	for _, d := range drop {
		_ = d.nc.Close()
	}
}

// discard closes c, a connection taken from its pool (or dialled for
// it), and forgets the pool when it has nothing left. It returns the
// socket's close error.
func (t *Transport) discard(c *conn) error {
	err := c.nc.Close()
	t.mu.Lock()
	c.p.busy--
	t.dropEmptyLocked(c.key, c.p)
	t.mu.Unlock()
	return err
}

// dropEmptyLocked takes p, key's pool, out of t.pools when it has no
// connection left. t.mu is held.
func (t *Transport) dropEmptyLocked(key string, p *pool) {
	if p.busy == 0 && len(p.idle) == 0 && !p.gone && t.pools[key] == p {
		delete(t.pools, key)
	}
}

// dial opens a new connection to key, counted busy in key's pool.
func (t *Transport) dial(ctx context.Context, key string) (*conn, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errTransportClosed
	}
	p := t.pools[key]
	if p == nil {
		if t.pools == nil {
			t.pools = map[string]*pool{}
		}
		p = &pool{}
		t.pools[key] = p
	}
	p.busy++
	t.mu.Unlock()
	d := net.Dialer{Timeout: t.dialTimeout(), KeepAlive: 30 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", key)
	if err != nil {
		t.mu.Lock()
		p.busy--
		t.dropEmptyLocked(key, p)
		t.mu.Unlock()
		return nil, fmt.Errorf("upstream: %w", err)
	}
	t.dials.Add(1)
	c := &conn{nc: nc, key: key, p: p, br: bufio.NewReaderSize(nc, bufferSize), w: connWriter{nc: nc}}
	c.bw = bufio.NewWriterSize(&c.w, bufferSize)
	return c, nil
}

// connWriter writes to a connection and keeps its first write error, so
// that a failed exchange tells the connection's failure from its request
// body's.
type connWriter struct {
	nc  net.Conn
	err error
}

func (w *connWriter) Write(p []byte) (int, error) {
	n, err := w.nc.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// armLocked arms the sweep of idle connections unless it is armed: it
// fires when the newest idle connection (the only one when the sweep was
// not armed: an armed sweep re-arms itself while any is left) expires.
// t.mu is held.
func (t *Transport) armLocked() {
	if t.reaping || t.closed {
		return
	}
	t.reaping = true
	if t.reaper == nil {
		t.reaper = time.AfterFunc(t.idleTimeout(), t.reap)
		return
	}
	t.reaper.Reset(t.idleTimeout())
}

// reap closes the idle connections unused for IdleTimeout and forgets the
// pools left empty; while idle connections remain it fires again when
// the oldest expires, at least IdleTimeout/8 later (so a sweep, which
// costs a look at each address, runs at most 8 times per IdleTimeout).
func (t *Transport) reap() {
	now := time.Now()
	idle := t.idleTimeout()
	var drop []*conn
	var next time.Time
	t.mu.Lock()
	for key, p := range t.pools {
		cut := 0
		for cut < len(p.idle) && now.Sub(p.idle[cut].idleAt) >= idle {
			drop = append(drop, p.idle[cut])
			p.idle[cut] = nil
			cut++
		}
		p.idle = p.idle[cut:]
		if len(p.idle) == 0 {
			t.dropEmptyLocked(key, p)
			continue
		}
		if at := p.idle[0].idleAt.Add(idle); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	t.reaping = false
	if !next.IsZero() && !t.closed {
		t.reaping = true
		t.reaper.Reset(max(next.Sub(now), idle/8))
	}
	t.mu.Unlock()
	for _, c := range drop {
		_ = c.nc.Close()
	}
}

// Dials is how many connections the transport has opened.
func (t *Transport) Dials() int64 { return t.dials.Load() }

// Idle is how many idle connections the pool holds.
func (t *Transport) Idle() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.pools {
		n += len(p.idle)
	}
	return n
}

// IdleTo is how many idle connections the pool holds to engineURL's
// address (as CloseIdleConnectionsTo reads it).
func (t *Transport) IdleTo(engineURL string) int {
	key, ok := hostPort(engineURL)
	if !ok {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pools[key]; p != nil {
		return len(p.idle)
	}
	return 0
}

// CloseIdleConnections closes the pooled connections; connections in use
// are not affected and return to the pool when their exchange ends.
func (t *Transport) CloseIdleConnections() {
	var drop []*conn
	t.mu.Lock()
	for key, p := range t.pools {
		drop = append(drop, p.idle...)
		p.idle = nil
		t.dropEmptyLocked(key, p)
	}
	if t.reaper != nil {
		t.reaper.Stop()
	}
	t.reaping = false
	t.mu.Unlock()
	for _, c := range drop {
		_ = c.nc.Close()
	}
	if t.fallback != nil {
		t.fallback.CloseIdleConnections()
	}
}

// CloseIdleConnectionsTo forgets the address of engineURL (an http:// URL;
// its host and port, 80 by default, name the address; the path does not
// count), for an engine that left the fleet: its idle connections are
// closed now, those in use when their exchange ends. A later request to
// the address opens a new pool. An https:// engine's connections are left
// to the idle timeout (net/http's Transport closes no single address's);
// another scheme or a URL that does not parse is ignored.
func (t *Transport) CloseIdleConnectionsTo(engineURL string) {
	key, ok := hostPort(engineURL)
	if !ok {
		return
	}
	t.mu.Lock()
	p := t.pools[key]
	if p == nil {
		t.mu.Unlock()
		return
	}
	delete(t.pools, key)
	p.gone = true
	drop := p.idle
	p.idle = nil
	t.mu.Unlock()
	for _, c := range drop {
		_ = c.nc.Close()
	}
}

// hostPort is the pool key of an http:// URL: its host:port, port 80 when
// it names none; false for another scheme or a URL that does not parse.
func hostPort(engineURL string) (string, bool) {
	u, err := url.Parse(engineURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return "", false
	}
	return poolKey(u.Host), true
}

// poolKey is the pool key of a request's URL.Host: host:port, port 80
// when it names none.
func poolKey(host string) string {
	if _, _, err := net.SplitHostPort(host); err != nil {
		return net.JoinHostPort(host, "80")
	}
	return host
}

// Close closes the pooled connections and makes later RoundTrips fail;
// connections in use close when their exchange ends.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.CloseIdleConnections()
}

func (t *Transport) fallbackTransport() *http.Transport {
	t.fallbackOnce.Do(func() {
		t.fallback = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: t.dialTimeout(), KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: t.maxIdle(),
			IdleConnTimeout:     t.idleTimeout(),
			DisableCompression:  true,
			ForceAttemptHTTP2:   true,
			TLSClientConfig:     t.TLSClientConfig,
		}
	})
	return t.fallback
}

func (t *Transport) dialTimeout() time.Duration {
	if t.DialTimeout > 0 {
		return t.DialTimeout
	}
	return DefaultDialTimeout
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleTimeout > 0 {
		return t.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (t *Transport) maxIdle() int {
	if t.MaxIdlePerHost > 0 {
		return t.MaxIdlePerHost
	}
	return DefaultMaxIdlePerHost
}

// body is a response body that returns its connection to the pool at its
// end.
type body struct {
	rc       io.ReadCloser
	t        *Transport
	c        *conn
	stop     func() bool
	reusable bool
	done     bool
	mu       sync.Mutex // Close may race a Read from another goroutine
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.mu.Lock()
		if !b.done {
			b.done = true
			if err == io.EOF {
				b.t.finish(b.c, b.stop, b.reusable)
			} else {
				b.stop()
				b.t.discard(b.c)
			}
		}
		b.mu.Unlock()
	}
	return n, err
}

// Close before the body's end closes the connection (the rest of the
// answer is not read).
func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil
	}
	b.done = true
	b.stop()
	return b.t.discard(b.c)
}

// exchangeError is a failed exchange on one connection. stale is set when
// the failure shows the engine had closed the connection before it read
// the request: the write failed, or the answer's first read failed within
// staleWindow of the write.
type exchangeError struct {
	key   string
	err   error
	stale bool
}

// staleWindow bounds how soon after the request's write a failed first
// read still counts as the engine having closed the idle connection
// before it read the request (its close was already in flight). Later
// failures are the engine's failure with the request in hand: not resent
// here, since the engine may have worked on it (net/http's Transport
// likewise resends a POST only when nothing was written).
const staleWindow = 10 * time.Millisecond

// earlyAnswerWait bounds the wait for an engine's answer once writing the
// request to it failed (earlyAnswer). An answer the engine sent before it
// closed the connection is already in the socket's receive buffer when
// the write fails (TCP delivers it before the close), so the wait only
// matters for a connection still open; the bound keeps such a failure
// from waiting for an answer that is not coming.
const earlyAnswerWait = time.Second

func (e *exchangeError) Error() string { return "upstream " + e.key + ": " + e.err.Error() }
func (e *exchangeError) Unwrap() error { return e.err }

// retryable reports whether err is a pooled connection the engine had
// already closed: a stale exchangeError ending in EOF (no byte came), a
// reset or a broken pipe.
func retryable(err error) bool {
	var ee *exchangeError
	if !errors.As(err, &ee) || !ee.stale {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// aLongTimeAgo is a deadline in the past: it fails blocked reads and
// writes at once.
var aLongTimeAgo = time.Unix(1, 0)
