package replay

import (
	"fmt"
	"time"

	"github.com/switchyard-router/switchyard/internal/heap"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// Router replicas (Options.Replicas): trace request i is routed by
// replica i mod N, and what a replica decides reaches the others
// Options.SyncDelay later, as it would through the shared bus (relay,
// JetStream, consumers). Each hop a replica places becomes a mirror: the
// same request (block hashes, prompt, role) booked on every other replica
// on the placement's worker, so the peer books it and records its prompt
// in its prefix index without running its policy (router.Router.Bind),
// and no capacity check (the worker took
// the request whatever the peer believed). The booking's first token
// (PrefillDone) and release follow, each SyncDelay after it happened, so
// the peers' ACTIVE_REQUESTS and LOAD count the others' in-flight work
// after the delay.

// mirror is one placed hop as the other replicas see it.
type mirror struct {
	origin int             // the replica that placed it
	req    *shared.Request // the admitted request (read only)
	worker shared.WorkerID
	// bookings are the peers' bookings, by replica; origin's is unused.
	bookings []fleet.Booking
}

// mirrorKind is what a sync event tells the peers.
type mirrorKind uint8

const (
	mirrorPlaced mirrorKind = iota
	mirrorFirstToken
	mirrorReleased
)

// syncEvent is one change of a mirror, due on the peers at `at`.
type syncEvent struct {
	at   time.Duration
	seq  uint64 // publication order: ties at one instant apply in it
	kind mirrorKind
	m    *mirror
}

// syncFeed holds the sync events not yet applied, by (at, seq). Every
// placed hop publishes three (placed, first token, released), each
// applied to the N−1 peers, so the work is linear in requests × replicas;
// a mirror is dropped with its release, so memory is the hops in flight
// plus those published within one delay.
type syncFeed struct {
	delay  time.Duration
	events heap.Heap[syncEvent] // by syncLess
	seq    uint64
	// applied counts the mirror bookings made on peers (Report.Mirrored).
	applied int64
	// err is the first failed mirror placement: the replay ends with it.
	err error
}

// publish queues kind of m, which happened at `at`, for the peers.
func (f *syncFeed) publish(at time.Duration, kind mirrorKind, m *mirror) {
	f.events.Push(syncEvent{at: at + f.delay, seq: f.seq, kind: kind, m: m})
	f.seq++
}

// next is the due time of the earliest event not yet applied; false when
// none is pending (or f is nil: one replica).
func (f *syncFeed) next() (time.Duration, bool) {
	if f == nil || f.events.Len() == 0 {
		return 0, false
	}
	return f.events.At(0).at, true
}

// deliver applies, in (due time, publication) order, every event due at
// or before now to every peer of its mirror's origin. No-op for a nil
// feed.
func (f *syncFeed) deliver(d *driver, now time.Duration) {
	if f == nil {
		return
	}
	for f.events.Len() > 0 && f.events.At(0).at <= now {
		e := f.events.Pop()
		if f.err != nil {
			continue // the replay is ending with f.err
		}
		m := e.m
		for p, rep := range d.reps {
			if p == m.origin {
				continue
			}
			b := &m.bookings[p]
			switch e.kind {
			case mirrorPlaced:
				// Only the context's end can fail a Bind on a member of
				// the partition.
				if _, err := rep.r.Bind(d.ctx, m.req, router.Binding{Worker: m.worker, Capacity: int64(d.capacity), Booking: b}); err != nil {
					f.err = fmt.Errorf("replay: replica %d mirroring request %s of replica %d: %w", p, m.req.ID, m.origin, err)
					return
				}
				f.applied++
			case mirrorFirstToken:
				b.PrefillDone()
			case mirrorReleased:
				b.Release()
			}
		}
	}
}

// mirrorPlaced publishes hop k of request i, placed by its replica on
// fleet worker id at `at`, to the other replicas.
func (d *driver) mirrorPlaced(i, k int, id shared.WorkerID, at time.Duration) {
	if d.sync == nil {
		return
	}
	hp := &d.req(i).hops[k]
	m := &mirror{origin: i % len(d.reps), req: hp.h.Request(), worker: id, bookings: make([]fleet.Booking, len(d.reps))}
	hp.mirror = m
	d.sync.publish(at, mirrorPlaced, m)
}

// mirrorFirstToken publishes the first token of hop k of request i, at
// `at`.
func (d *driver) mirrorFirstToken(i, k int, at time.Duration) {
	if m := d.req(i).hops[k].mirror; m != nil {
		d.sync.publish(at, mirrorFirstToken, m)
	}
}

// mirrorReleased publishes the end of hop k of request i, at `at`, and
// lets its mirror go once the peers have applied it.
func (d *driver) mirrorReleased(i, k int, at time.Duration) {
	hp := &d.req(i).hops[k]
	if hp.mirror != nil {
		d.sync.publish(at, mirrorReleased, hp.mirror)
		hp.mirror = nil
	}
}

// syncLess orders sync events by (at, seq): a total order (seq is
// unique), so the order does not depend on the heap's tie-breaking.
func syncLess(a, b syncEvent) bool {
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}
