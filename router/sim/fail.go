package sim

import (
	"fmt"
	"time"
)

// Cut is a request a worker held when its engine failed (Worker.Fail).
type Cut struct {
	// ID is the request's Request.ID.
	ID int
	// Generated is the output tokens it had sampled before the failure,
	// Request.Generated included: what its client had received. A step
	// in flight at the failure samples nothing.
	Generated int
	// Started reports that the worker had scheduled it (it had held KV
	// blocks at least once); false for a request still waiting in the
	// engine's queue since its submission.
	Started bool
}

// Fail models the engine's process dying at time at (a crash, an OOM
// kill, a preempted GPU): every request it holds, running or waiting, is
// removed and appended to out (running ones in admission order, then the
// waiting ones in queue order), the step in flight is lost (it samples no
// token and emits no event), and the KV cache is emptied with no KV event
// (a dead engine publishes nothing; a router forgets the worker when it
// leaves the fleet). The worker is then an idle engine with an empty cache
// at time at, as after a restart: the caller keeps it out of the fleet
// for as long as its restart takes. Call Advance(at) first, so the steps
// that ended by at are delivered. Stats keep counting (Failures, Cut);
// the hook (SetKVEventHook) and TrackBlockCopies stay set.
//
// Errors: ErrTimeWentBackwards if at is before the worker's latest time.
// Cost: O(requests held + cached groups).
func (w *Worker) Fail(at time.Duration, out []Cut) ([]Cut, error) {
	if at < w.now {
		return out, fmt.Errorf("%w: fail at %v after %v", ErrTimeWentBackwards, at, w.now)
	}
	for _, idx := range w.running {
		s := &w.seqs[idx]
		out = append(out, Cut{ID: s.id, Generated: s.generated, Started: true})
	}
	for i := 0; i < w.wait.len(); i++ {
		s := &w.seqs[w.wait.at(i)]
		out = append(out, Cut{ID: s.id, Generated: s.generated, Started: s.scheduled})
	}
	n := int64(len(w.running) + w.wait.len())
	evicted := w.kv.evicted
	kv := newKVCache(w.cfg.TotalKVBlocks)
	kv.evicted, kv.copies, kv.hook, kv.worker = evicted, w.kv.copies, w.kv.hook, w.kv.worker
	w.kv = kv
	clear(w.seqs)
	w.seqs, w.free, w.running, w.sched = w.seqs[:0], w.free[:0], w.running[:0], w.sched[:0]
	w.wait = deque{}
	w.busy, w.now, w.ready, w.start, w.end = false, at, at, 0, 0
	w.stats.Failures++
	w.stats.Cut += n
	return out, nil
}

// Fail fails worker i at time at (see Worker.Fail). Errors:
// ErrNoSuchWorker for i out of range, or those of Worker.Fail.
func (c *Cluster) Fail(at time.Duration, i int, out []Cut) ([]Cut, error) {
	if i < 0 || i >= len(c.workers) {
		return out, fmt.Errorf("%w: %d of %d", ErrNoSuchWorker, i, len(c.workers))
	}
	return c.workers[i].Fail(at, out)
}

// Busy reports whether any worker holds a request (running or waiting),
// without forming a step (unlike NextEvent).
func (c *Cluster) Busy() bool {
	for _, w := range c.workers {
		if w.hasWork() {
			return true
		}
	}
	return false
}
