package fleet

import "sync/atomic"

// Booking is one dispatched request's hold on a worker: +1 ACTIVE_REQUESTS,
// its uncached prompt tokens as active prefill until the first token, and
// its prompt blocks as active decode blocks until it ends. It is released
// exactly once, whatever ends the request.
type Booking struct {
	w       *Worker
	prefill int64
	blocks  int64
	state   atomic.Uint32 // bookedState, prefilledState, releasedState
}

const (
	bookedState uint32 = iota
	prefilledState
	releasedState
)

// Book charges a request to w: prefillTokens (uncached prompt tokens, >= 0)
// and blocks (KV blocks it will hold, >= 0).
func Book(w *Worker, prefillTokens, blocks int64) *Booking {
	b := &Booking{w: w, prefill: max(prefillTokens, 0), blocks: max(blocks, 0)}
	w.active.Add(1)
	w.prefillTokens.Add(b.prefill)
	w.decodeBlocks.Add(b.blocks)
	return b
}

// Worker is the worker (join generation) the booking charges.
func (b *Booking) Worker() *Worker { return b.w }

// PrefillDone moves the request out of active prefill (its first token
// arrived). Later calls, and calls after Release, do nothing.
func (b *Booking) PrefillDone() {
	if b.state.CompareAndSwap(bookedState, prefilledState) {
		b.w.prefillTokens.Add(-b.prefill)
	}
}

// Release returns everything the booking holds and reports whether this call
// did it: only the first call releases, so completion, error, cancel and
// worker removal can all call it.
func (b *Booking) Release() bool {
	for {
		s := b.state.Load()
		if s == releasedState {
			return false
		}
		if b.state.CompareAndSwap(s, releasedState) {
			if s == bookedState {
				b.w.prefillTokens.Add(-b.prefill)
			}
			b.w.decodeBlocks.Add(-b.blocks)
			b.w.active.Add(-1)
			return true
		}
	}
}
