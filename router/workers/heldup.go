package workers

import (
	"context"
	"sync"
	"time"
)

// heldUp measures how long the router process was held up: kept from
// running while it had something to do (CPU starvation by other
// processes, a CPU limit's throttling, a stop-the-world pause, a stopped
// process). A goroutine sleeps one tick at a time and adds how much later
// than asked it woke up; a probe reads the total before and after it ran
// (held), and a probe that timed out while the router lost a quarter of
// its timeout this way is not counted against its worker (observe). One
// timer wake-up per tick is its whole cost. Safe for concurrent use.
type heldUp struct {
	tick time.Duration
	base time.Time // the monotonic origin of wake

	mu    sync.Mutex
	total time.Duration // held up so far, as measured at the wake-ups
	wake  time.Duration // the last wake-up, since base
	once  sync.Once
}

// heldUpTick returns the meter's tick for a scrape interval: a tenth of
// it, between 5 ms and 100 ms (10 wake-ups a second at the default
// interval).
func heldUpTick(interval time.Duration) time.Duration {
	return min(max(interval/10, 5*time.Millisecond), 100*time.Millisecond)
}

func newHeldUp(tick time.Duration) *heldUp {
	return &heldUp{tick: tick, base: time.Now()}
}

// start runs the meter, a goroutine added to wg, until ctx ends; only the
// first call starts it.
func (h *heldUp) start(ctx context.Context, wg *sync.WaitGroup) {
	h.once.Do(func() {
		h.mu.Lock()
		h.wake = time.Since(h.base)
		h.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.run(ctx)
		}()
	})
}

func (h *heldUp) run(ctx context.Context) {
	t := time.NewTimer(h.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Since(h.base)
		h.mu.Lock()
		if late := now - h.wake - h.tick; late > 0 {
			h.total += late
		}
		h.wake = now
		h.mu.Unlock()
		t.Reset(h.tick)
	}
}

// held returns the time held up so far: the total measured, and the
// meter's own wait past its tick now (a hold-up still going on, which its
// next wake-up will measure). It never decreases.
func (h *heldUp) held() time.Duration {
	now := time.Since(h.base)
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.total
	if late := now - h.wake - h.tick; late > 0 {
		d += late
	}
	return d
}
