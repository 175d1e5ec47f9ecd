package sim

import (
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/prefix"
)

func mustSubmit(t *testing.T, w *Worker, now time.Duration, r *Request) {
	t.Helper()
	if err := w.Submit(now, r); err != nil {
		t.Fatal(err)
	}
}

func checkWorker(t *testing.T, w *Worker) {
	t.Helper()
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestAbortRunningMidPrefill: a chunked prefill aborted after its first
// chunk frees every block it holds, keeps the published prefix cached, and
// never emits an event.
func TestAbortRunningMidPrefill(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	ids := make([]uint64, 40) // 40 × 512 = 20,480 tokens
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	hashes := prefix.ChainHashes(nil, ids)
	r := &Request{ID: 1, InputLength: 20000, OutputLength: 50, PrefixHashes: hashes, PrefixBlockTokens: 512}
	mustSubmit(t, w, 0, r)
	end, busy := w.NextEvent()
	if !busy {
		t.Fatal("worker idle after submit")
	}
	if ev := w.Advance(end, nil); len(ev) != 0 {
		t.Fatalf("events after the first chunk: %+v", ev)
	}
	if l := w.Load(); l.Running != 1 || l.UsedBlocks == 0 {
		t.Fatalf("load mid-prefill: %+v", l)
	}
	if !w.Abort(1) {
		t.Fatal("Abort(1) = false for a running request")
	}
	checkWorker(t, w)
	l := w.Load()
	if l.Running != 0 || l.Waiting != 0 || l.UsedBlocks != 0 || l.FreeBlocks != DefaultConfig().TotalKVBlocks {
		t.Fatalf("load after abort: %+v", l)
	}
	if l.CachedBlocks != 8192/16 {
		t.Errorf("cached blocks after abort = %d, want the first chunk's %d", l.CachedBlocks, 8192/16)
	}
	if got := w.CachedPrefixTokens(r); got != 8192 {
		t.Errorf("CachedPrefixTokens after abort = %d, want 8192", got)
	}
	if ev := w.Drain(nil); len(ev) != 0 {
		t.Fatalf("events after abort: %+v", ev)
	}
	if w.Abort(1) {
		t.Error("second Abort(1) = true")
	}
	if s := w.Stats(); s.Aborted != 1 || s.Completed != 0 || s.Submitted != 1 {
		t.Errorf("stats %+v", s)
	}
	// The worker keeps working, the freed slot reused, and the new request
	// hits the aborted one's published prefix.
	mustSubmit(t, w, end, &Request{ID: 2, InputLength: 20000, OutputLength: 2, PrefixHashes: hashes, PrefixBlockTokens: 512})
	ev := w.Drain(nil)
	if len(ev) != 2 || ev[0].Kind != FirstToken || ev[0].RequestID != 2 || ev[0].CachedTokens != 8192 || ev[1].Kind != Completed {
		t.Fatalf("events of the next request: %+v", ev)
	}
	checkWorker(t, w)
}

// TestAbortInFlightStep: a request aborted while the step that includes it
// is in flight takes no part in it; the step still ends at its planned time
// and the other requests carry on.
func TestAbortInFlightStep(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	mustSubmit(t, w, 0, &Request{ID: 1, InputLength: 1000, OutputLength: 3})
	mustSubmit(t, w, 0, &Request{ID: 2, InputLength: 1000, OutputLength: 3})
	end, _ := w.NextEvent()
	if !w.Abort(2) {
		t.Fatal("Abort(2) = false")
	}
	checkWorker(t, w)
	if l := w.Load(); l.Running != 1 {
		t.Fatalf("load: %+v", l)
	}
	ev := w.Advance(end, nil)
	if len(ev) != 1 || ev[0].RequestID != 1 || ev[0].Kind != FirstToken || ev[0].At != end {
		t.Fatalf("events of the step: %+v, want request 1's first token at %v", ev, end)
	}
	// Abort a decoding request: nothing is left running or held.
	if !w.Abort(1) {
		t.Fatal("Abort(1) = false while decoding")
	}
	checkWorker(t, w)
	if l := w.Load(); l.Running != 0 || l.UsedBlocks != 0 {
		t.Fatalf("load after aborting the decode: %+v", l)
	}
	if _, busy := w.NextEvent(); busy {
		t.Fatal("worker busy with nothing to run")
	}
	if s := w.Stats(); s.Aborted != 2 {
		t.Errorf("Aborted = %d, want 2", s.Aborted)
	}
}

// TestAbortWaiting: a queued request leaves the queue, in order, without
// touching the KV cache; an unknown ID is reported.
func TestAbortWaiting(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = 1
	w := newWorker(t, cfg)
	for id := 1; id <= 4; id++ {
		mustSubmit(t, w, 0, &Request{ID: id, InputLength: 100, OutputLength: 2})
	}
	w.NextEvent()
	if l := w.Load(); l.Running != 1 || l.Waiting != 3 {
		t.Fatalf("load: %+v", l)
	}
	used := w.Load().UsedBlocks
	if !w.Abort(3) {
		t.Fatal("Abort(3) = false for a waiting request")
	}
	if w.Abort(99) {
		t.Error("Abort(99) = true for an unknown request")
	}
	if l := w.Load(); l.Waiting != 2 || l.UsedBlocks != used {
		t.Fatalf("load after aborting a waiting request: %+v", l)
	}
	checkWorker(t, w)
	var order []int
	for _, e := range w.Drain(nil) {
		if e.Kind == Completed {
			order = append(order, e.RequestID)
		}
	}
	if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 4 {
		t.Fatalf("completion order %v, want [1 2 4]", order)
	}
	checkWorker(t, w)
}

// TestDequeRemoveAt checks removal across the ring's wrap-around.
func TestDequeRemoveAt(t *testing.T) {
	var q deque
	for i := range 16 {
		q.pushBack(int32(i))
	}
	for range 10 {
		q.popFront()
	}
	for i := 16; i < 24; i++ {
		q.pushBack(int32(i)) // wraps
	}
	q.removeAt(3) // 13
	q.removeAt(0) // 10
	want := []int32{11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}
	if q.len() != len(want) {
		t.Fatalf("len %d, want %d", q.len(), len(want))
	}
	for i, v := range want {
		if q.at(i) != v {
			t.Fatalf("at(%d) = %d, want %d", i, q.at(i), v)
		}
	}
}
