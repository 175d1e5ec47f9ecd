package serve

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// ShutdownIdleGrace is how long, on shutdown, a client connection that
// was just answered is kept open for its client's next request (1 s).
// That answer may have told the client to keep the connection; a request
// it then writes is answered (with Connection: close) rather than cut by
// a close under it, as net/http's Shutdown would. HTTP/1.1 keeps one
// race no server can close: a client that sends on a connection idle for
// longer than this at the very instant it closes sees that connection
// reset. One second is ten times and more what a client that sends
// continuously takes between an answer and its next request, even on a
// busy machine; it is spent only while a client holds a connection that
// was answered within it.
const ShutdownIdleGrace = time.Second

// connTracker follows the API's client connections (http.Server's
// ConnState hook): which are running a request and since when the others
// are idle. Safe for concurrent use; its lock guards map operations only.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]connPhase
}

// connPhase is one connection's state: running a request (active), or
// idle (or new, no request yet) since since.
type connPhase struct {
	active bool
	since  time.Time
}

func newConnTracker() *connTracker { return &connTracker{conns: map[net.Conn]connPhase{}} }

// hook is the http.Server's ConnState.
func (t *connTracker) hook(c net.Conn, st http.ConnState) {
	var p connPhase
	switch st {
	case http.StateActive:
		p.active = true
	case http.StateNew, http.StateIdle:
		p.since = time.Now()
	}
	t.mu.Lock()
	switch st {
	case http.StateActive, http.StateNew, http.StateIdle:
		t.conns[c] = p
	default: // closed or hijacked
		delete(t.conns, c)
	}
	t.mu.Unlock()
}

// counts returns how many connections are open and how many of them run
// a request.
func (t *connTracker) counts() (open, active int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.conns {
		if p.active {
			active++
		}
	}
	return len(t.conns), active
}

// quiet reports whether, at now, no connection runs a request and each
// other has been idle for at least grace.
func (t *connTracker) quiet(now time.Time, grace time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.conns {
		if p.active || now.Sub(p.since) < grace {
			return false
		}
	}
	return true
}

// waitQuiet waits until quiet(grace) holds or deadline passes, looking
// every 10 ms (each look is linear in the open connections).
func (t *connTracker) waitQuiet(grace time.Duration, deadline time.Time) {
	for {
		now := time.Now()
		if t.quiet(now, grace) || !now.Before(deadline) {
			return
		}
		time.Sleep(min(10*time.Millisecond, deadline.Sub(now)))
	}
}

// closeIdle closes the connections that run no request (idle, or new
// with no request yet); net/http's goroutine of each then ends. A
// connection that turns active meanwhile may be closed too: the race
// ShutdownIdleGrace narrows.
func (t *connTracker) closeIdle() {
	t.mu.Lock()
	var idle []net.Conn
	for c, p := range t.conns {
		if !p.active {
			idle = append(idle, c)
		}
	}
	t.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}
