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
	// capacity is TryBook's capacity (0 for Book): the release that takes
	// the worker from it back below it updates the fleet's full count.
	capacity int64
	state    atomic.Uint32 // bookedState, prefilledState, releasedState
	// held is released with the booking (SetHeld); nil when none.
	held Held
}

// Held is something a request holds as long as its booking: Release is
// called once, when the booking is released.
type Held interface{ Release() }

// SetHeld makes the booking release h when it is released. Call it before
// the booking is handed on (before Release can run).
func (b *Booking) SetHeld(h Held) { b.held = h }

const (
	bookedState uint32 = iota
	prefilledState
	releasedState
)

// Book charges a request to w: prefillTokens (uncached prompt tokens, >= 0)
// and blocks (KV blocks it will hold, >= 0).
func Book(w *Worker, prefillTokens, blocks int64) *Booking {
	return BookInto(nil, w, prefillTokens, blocks)
}

// AddPrefill adds tokens (>= 0) to the booking's active prefill, for a
// booking made before its uncached prompt was known. Call it before the
// booking is handed on (before PrefillDone or Release can run).
func (b *Booking) AddPrefill(tokens int64) {
	if tokens > 0 && b.state.Load() == bookedState {
		b.prefill += tokens
		b.w.prefillTokens.Add(tokens)
	}
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
			if b.w.active.Add(-1) == b.capacity-1 && b.capacity > 0 && b.w.full != nil {
				b.w.full.Add(-1)
			}
			if b.held != nil {
				b.held.Release()
			}
			return true
		}
	}
}

// TryBook is Book when w has fewer than capacity requests in flight, and
// nil when it has capacity or more: the check and the charge are one
// atomic step, so concurrent bookings never take w past capacity
// (capacity > 0). into, when not nil, is the storage the booking is made
// in (a caller that owns one per request saves an allocation); it must
// not hold a live booking.
func TryBook(into *Booking, w *Worker, capacity, prefillTokens, blocks int64) *Booking {
	for {
		n := w.active.Load()
		if n >= capacity {
			return nil
		}
		if w.active.CompareAndSwap(n, n+1) {
			if n+1 == capacity && w.full != nil {
				w.full.Add(1)
			}
			break
		}
	}
	b := charge(into, w, prefillTokens, blocks)
	b.capacity = capacity
	return b
}

// BookOver books w whatever its requests in flight, counting the booking
// toward capacity (> 0) as TryBook's are: the request is on w already (it
// was served there, or another router replica placed it), so it must
// count, and a worker it takes to capacity is at capacity for every
// selection (Fleet.AtCapacity) until a release takes it below. Mixing
// BookOver and TryBook under one capacity keeps that count exact; a
// booking with no capacity (Book) does not take part in it. into as for
// TryBook.
func BookOver(into *Booking, w *Worker, capacity, prefillTokens, blocks int64) *Booking {
	if n := w.active.Add(1); capacity > 0 && n == capacity && w.full != nil {
		w.full.Add(1)
	}
	b := charge(into, w, prefillTokens, blocks)
	b.capacity = max(capacity, 0)
	return b
}

// BookInto is Book in caller-owned storage (see TryBook); nil into
// allocates.
func BookInto(into *Booking, w *Worker, prefillTokens, blocks int64) *Booking {
	w.active.Add(1)
	return charge(into, w, prefillTokens, blocks)
}

// charge fills a booking whose +1 ACTIVE_REQUESTS is already counted.
func charge(into *Booking, w *Worker, prefillTokens, blocks int64) *Booking {
	if into == nil {
		into = new(Booking)
	}
	into.w, into.prefill, into.blocks, into.capacity, into.held = w, max(prefillTokens, 0), max(blocks, 0), 0, nil
	into.state.Store(bookedState)
	w.prefillTokens.Add(into.prefill)
	w.decodeBlocks.Add(into.blocks)
	return into
}
