package serve

import (
	"errors"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
)

// bodyFirstStep is the most a request body is held for before its bytes
// arrive: a body is read into a buffer of its declared length when that
// is smaller, else of 4 KiB that doubles each time it fills (up to the
// declared length or MaxBodyBytes), and each growth is held against the
// budgets before the buffer grows. A connection thus holds at most
// max(4 KiB, twice what it sent): what net/http already spends on each
// connection's read and write buffers, not what it promises.
const bodyFirstStep = 4 << 10

// bodyBound names the budget that refused a body's bytes.
type bodyBound int

const (
	boundNone   bodyBound = iota
	boundTotal            // MaxBodyBytesInFlight
	boundClient           // MaxBodyBytesPerClient
)

// bodyBudget counts the request bodies' bytes held, all together and per
// client address, against MaxBodyBytesInFlight and
// MaxBodyBytesPerClient. Safe for concurrent use; no lock is held across
// anything but map arithmetic.
type bodyBudget struct {
	total, perClient int64 // < 0: no bound
	held             atomic.Int64

	mu sync.Mutex
	// byClient holds each client key's bytes held; a key is removed when
	// it holds none, so it has at most one entry per connection reading
	// or holding a body.
	byClient map[netip.Addr]int64
}

func newBodyBudget(total, perClient int64) *bodyBudget {
	return &bodyBudget{total: total, perClient: perClient, byClient: map[netip.Addr]int64{}}
}

// fits reports which bound n more bytes of client would pass now
// (boundNone: neither), holding nothing.
func (b *bodyBudget) fits(client netip.Addr, n int64) bodyBound {
	if b.perClient >= 0 {
		b.mu.Lock()
		over := b.byClient[client]+n > b.perClient
		b.mu.Unlock()
		if over {
			return boundClient
		}
	}
	if b.total >= 0 && b.held.Load()+n > b.total {
		return boundTotal
	}
	return boundNone
}

// reserve counts n more bytes as held for client, or returns the bound
// they would pass (and counts nothing).
func (b *bodyBudget) reserve(client netip.Addr, n int64) bodyBound {
	if b.perClient >= 0 {
		b.mu.Lock()
		if b.byClient[client]+n > b.perClient {
			b.mu.Unlock()
			return boundClient
		}
		b.byClient[client] += n
		b.mu.Unlock()
	}
	for {
		cur := b.held.Load()
		if b.total >= 0 && cur+n > b.total {
			b.releaseClient(client, n)
			return boundTotal
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return boundNone
		}
	}
}

// release counts n bytes of client as held no longer.
func (b *bodyBudget) release(client netip.Addr, n int64) {
	b.held.Add(-n)
	b.releaseClient(client, n)
}

func (b *bodyBudget) releaseClient(client netip.Addr, n int64) {
	if b.perClient < 0 {
		return
	}
	b.mu.Lock()
	if left := b.byClient[client] - n; left > 0 {
		b.byClient[client] = left
	} else {
		delete(b.byClient, client)
	}
	b.mu.Unlock()
}

// bodyHold is one request's bytes held in a bodyBudget. Not safe for
// concurrent use (one handler's).
type bodyHold struct {
	b      *bodyBudget
	client netip.Addr
	n      int64
}

// grow holds n more bytes, or returns the bound that refused them.
func (h *bodyHold) grow(n int64) bodyBound {
	if bound := h.b.reserve(h.client, n); bound != boundNone {
		return bound
	}
	h.n += n
	return boundNone
}

// release holds nothing more. Idempotent.
func (h *bodyHold) release() {
	if h.n > 0 {
		h.b.release(h.client, h.n)
		h.n = 0
	}
}

// clientKey is the client address a request's body is counted under
// (MaxBodyBytesPerClient): its remote IP address, IPv4 (an IPv4-mapped
// IPv6 address counts as IPv4) or, for IPv6, its /64 prefix (one host's
// SLAAC addresses, and the least a site is given, so that one host
// cannot take a share per address). A remote address that is not ip:port
// (a listener other than TCP) counts under the zero netip.Addr, one key
// for all such clients.
func clientKey(remoteAddr string) netip.Addr {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// bodyRefused is readBody's error when a budget would not hold more of a
// body.
type bodyRefused struct{ bound bodyBound }

func (e *bodyRefused) Error() string {
	if e.bound == boundClient {
		return "the request bodies held for this client address reached their bound"
	}
	return "the request bodies held reached their bound"
}

// readBody reads r's body whole, holding its bytes in hold as they
// arrive (bodyFirstStep): a buffer of the declared length when that is
// at most bodyFirstStep, else one that starts there and doubles when
// full, up to the declared length (r.ContentLength, which the caller
// checked is at most maxBody) or maxBody. Its errors: *bodyRefused when a budget
// refused a growth, *http.MaxBytesError past maxBody bytes, the body
// reader's own (a deadline, a malformed chunk, the client gone). Time and
// copying are linear in the body's size.
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64, hold *bodyHold) ([]byte, error) {
	limit := maxBody
	if r.ContentLength >= 0 {
		limit = r.ContentLength
	}
	rd := http.MaxBytesReader(w, r.Body, maxBody)
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= limit {
				// Full: the body must end here (a chunked body over max
				// is MaxBytesReader's error).
				return buf, atEOF(rd)
			}
			next := min(max(2*int64(cap(buf)), bodyFirstStep), limit)
			if bound := hold.grow(next - int64(cap(buf))); bound != boundNone {
				return nil, &bodyRefused{bound: bound}
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// atEOF reads rd until it ends: nil at io.EOF, its error when it has
// more (MaxBytesReader's *http.MaxBytesError) or fails.
func atEOF(rd io.Reader) error {
	var one [1]byte
	for {
		n, err := rd.Read(one[:])
		switch {
		case n > 0:
			// Not expected: net/http's reader ends a body at its
			// Content-Length, MaxBytesReader at its limit.
			return errors.New("the request body is longer than its Content-Length")
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}
