package serve

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/migrate"
)

// drainWatch holds the non-streamed generation attempts waiting for
// their engine's answer, so that those whose worker left the fleet
// (drained, removed, not ready: fleet.Worker.Left) can be cut once the
// drain grace has passed and placed again elsewhere (a hung engine would
// otherwise hold them for the whole request timeout). A stream's attempt
// watches its own worker (newAttempt); a non-streamed request is far
// shorter and more frequent, so it costs no context, goroutine or
// allocation of its own: it is linked into one of the watch's shards (a
// mutex and a list) while it waits, and one sweeper goroutine, running
// only while some attempt is linked, looks at them every sweep interval.
type drainWatch struct {
	grace    time.Duration
	interval time.Duration
	shards   [16]watchShard
	next     atomic.Uint32 // round-robin shard choice
	linked   atomic.Int64

	mu      sync.Mutex // guards running
	running bool
}

type watchShard struct {
	mu   sync.Mutex
	head *exchange
}

// watchLink is what an exchange carries for the watch.
type watchLink struct {
	next, prev *exchange
	shard      int8 // -1: not linked
	worker     *fleet.Worker
	leftSeen   time.Time // when a sweep first saw its worker gone
	// drained is set, under its shard's lock, when a sweep cut the
	// attempt: its context (ex.ctx) was cancelled for that, not by the
	// client or the timeout.
	drained atomic.Bool
	// cancel cancels ex.ctx; deadline is the request's.
	cancel   context.CancelFunc
	deadline time.Time
}

func newDrainWatch(grace time.Duration) *drainWatch {
	return &drainWatch{grace: grace, interval: min(max(grace/4, 10*time.Millisecond), 250*time.Millisecond)}
}

// link adds ex, waiting for worker w's answer, to the watch.
func (dw *drainWatch) link(ex *exchange, w *fleet.Worker) {
	i := int(dw.next.Add(1) % uint32(len(dw.shards)))
	sh := &dw.shards[i]
	sh.mu.Lock()
	ex.watch.shard, ex.watch.worker, ex.watch.leftSeen = int8(i), w, time.Time{}
	ex.watch.prev, ex.watch.next = nil, sh.head
	if sh.head != nil {
		sh.head.watch.prev = ex
	}
	sh.head = ex
	sh.mu.Unlock()
	if dw.linked.Add(1) == 1 {
		dw.start()
	}
}

// unlink takes ex out of the watch; after it returns no sweep cuts it.
func (dw *drainWatch) unlink(ex *exchange) {
	i := ex.watch.shard
	if i < 0 {
		return
	}
	sh := &dw.shards[i]
	sh.mu.Lock()
	if p := ex.watch.prev; p != nil {
		p.watch.next = ex.watch.next
	} else {
		sh.head = ex.watch.next
	}
	if n := ex.watch.next; n != nil {
		n.watch.prev = ex.watch.prev
	}
	ex.watch.next, ex.watch.prev, ex.watch.shard, ex.watch.worker = nil, nil, -1, nil
	sh.mu.Unlock()
	dw.linked.Add(-1)
}

// start runs the sweeper unless it runs.
func (dw *drainWatch) start() {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if !dw.running {
		dw.running = true
		go dw.sweeper()
	}
}

// sweeper sweeps every interval while attempts are linked, and returns
// once none is.
func (dw *drainWatch) sweeper() {
	t := time.NewTicker(dw.interval)
	defer t.Stop()
	for range t.C {
		dw.sweep(time.Now())
		dw.mu.Lock()
		if dw.linked.Load() == 0 {
			dw.running = false
			dw.mu.Unlock()
			return
		}
		dw.mu.Unlock()
	}
}

// sweep cuts the linked attempts whose worker has left the fleet for the
// grace (from when a sweep first saw it gone): each is marked drained and
// its context cancelled. Cancelling does not block.
func (dw *drainWatch) sweep(now time.Time) {
	for i := range dw.shards {
		sh := &dw.shards[i]
		sh.mu.Lock()
		for ex := sh.head; ex != nil; ex = ex.watch.next {
			l := &ex.watch
			if l.drained.Load() || !left(l.worker) {
				continue
			}
			if l.leftSeen.IsZero() {
				l.leftSeen = now
			}
			if now.Sub(l.leftSeen) >= dw.grace {
				l.drained.Store(true)
				l.cancel()
			}
		}
		sh.mu.Unlock()
	}
}

// left reports whether w has left the fleet.
func left(w *fleet.Worker) bool {
	select {
	case <-w.Left(): // a nil channel (a Worker the fleet did not make) never is
		return true
	default:
		return false
	}
}

// passThroughWatched is passThrough for a non-streamed generation
// request on worker w, linked into the drain watch while it waits for
// the engine's answer: when a sweep cuts it (w left the fleet and the
// grace passed), nothing has reached the client and the engine had not
// answered, so the request is placed again elsewhere (the hop's retry,
// with a new context: renew). An answer whose headers arrive as the
// sweep cuts it may lose its body to the cancelled context (the client
// then gets the timeout's answer); the window is the instant between the
// engine's headers and the unlink.
func (s *Server) passThroughWatched(ex *exchange, h *admission.Handle, w *fleet.Worker) (int, bool, string) {
	if s.dw == nil {
		return s.passThrough(ex, h, w, ex.body)
	}
	s.dw.link(ex, w)
	resp, code, retry, why := s.send(ex.ctx, ex, h, w, ex.body)
	s.dw.unlink(ex)
	if resp == nil {
		if retry && ex.watch.drained.Load() {
			ex.renew()
			s.mig.count(migrate.CauseDrain, migrate.Migrated)
			s.log.Warn("request moved off a worker that left the fleet", "worker", w.Name, "request_id", ex.ID, "grace", s.dw.grace)
			why = "the worker left the fleet and its drain grace ended"
		}
		return code, retry, why
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 == 2 {
		// The answer's first bytes before its headers go out: an answer
		// that ends before its body (an engine that closed its connection
		// as it died) is one that failed before answering, and the request
		// goes elsewhere while nothing has reached the client.
		bp := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(bp)
		n, rerr := readSome(resp.Body, *bp)
		if n == 0 && rerr != nil && ex.ctx.Err() == nil {
			s.workers.ReportFailure(w.Name)
			s.log.Warn("worker ended its answer before its body", "worker", w.Name, "request_id", ex.ID, "error", rerr)
			s.mig.count(migrate.CauseEOF, migrate.Migrated)
			return 0, true, "the worker's answer ended before its body"
		}
		ex.pre, ex.preErr = (*bp)[:n], rerr
	}
	s.answerStart(ex, w, resp)
	return s.relay(ex, h, w, resp)
}

// readSome reads r into buf until it gives a byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// renew gives ex a new context for its next attempt after a sweep cut
// the last one: the client's, bounded by the request's deadline.
func (ex *exchange) renew() {
	ctx, cancel := context.WithDeadline(ex.r.Context(), ex.watch.deadline)
	ex.ctx, ex.watch.cancel = ctx, cancel
	ex.watch.drained.Store(false)
}
