package sim

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// drainChecked runs w to idle one step at a time, checking the KV
// invariants after every step.
func drainChecked(t *testing.T, w *Worker) []Event {
	t.Helper()
	var ev []Event
	for {
		next, busy := w.NextEvent()
		if !busy {
			return ev
		}
		ev = w.Advance(next, ev)
		if err := w.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKVTransferredDecodesOnly: a 1000-token prompt whose KV arrived from a
// prefill worker, with 3 output tokens (the first sampled there), decodes
// 2 tokens and computes no prefill. By hand, with the default timing:
//
//	step 1: one decode over 1000+1 tokens:
//	        0.5 + 0.005·1 + max(6.0, 1.5 + 0.021·1) + 7.6e-5·1001 = 6.581076 ms
//	step 2: one decode over 1002 tokens:        6.581152 ms, ends at 13.162228 ms
//
// It holds ceil(1001/16) = 63 blocks from admission, none of them cached.
func TestKVTransferredDecodesOnly(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	hashes := []uint64{11, 12}
	if err := w.Submit(0, &Request{ID: 7, InputLength: 1000, OutputLength: 3, KVTransferred: true,
		PrefixHashes: hashes, PrefixBlockTokens: 512}); err != nil {
		t.Fatal(err)
	}
	if end, busy := w.NextEvent(); !busy || end != 6581076*time.Nanosecond {
		t.Fatalf("first step ends at %v (busy %v), want 6.581076ms", end, busy)
	}
	if l := w.Load(); l.Running != 1 || l.UsedBlocks != 63 {
		t.Fatalf("load after admission %+v, want 1 running on 63 blocks", l)
	}
	ev := drainChecked(t, w)
	want := []Event{
		{Kind: FirstToken, RequestID: 7, At: 6581076 * time.Nanosecond, ScheduledAt: 0},
		{Kind: Completed, RequestID: 7, At: 13162228 * time.Nanosecond},
	}
	if !slices.Equal(ev, want) {
		t.Fatalf("events %+v\nwant %+v", ev, want)
	}
	st := w.Stats()
	if st.PrefillTokens != 0 || st.DecodeTokens != 2 || st.TransferredTokens != 1000 || st.Steps != 2 || st.CacheHitTokens != 0 {
		t.Fatalf("stats %+v: want 0 prefill, 2 decode, 1000 transferred tokens in 2 steps", st)
	}
	// The transferred prompt stayed private: nothing was published.
	if l := w.Load(); l.UsedBlocks != 0 || l.CachedBlocks != 0 {
		t.Fatalf("load after completion %+v, want no used or cached blocks", l)
	}
	if got := w.CachedPrefixTokens(&Request{InputLength: 1000, OutputLength: 1, PrefixHashes: hashes, PrefixBlockTokens: 512}); got != 0 {
		t.Fatalf("a later request would hit %d tokens of the transferred prompt, want 0", got)
	}
}

// TestKVTransferredSharesAStep: an ordinary 100-token prefill and a
// transferred 1000-token prompt submitted together run in one step, a
// chunk and a decode, N = 101 tokens, B = 2 sequences:
//
//	0.5 + 0.005·2 + max(6.0, 1.5 + 0.021·101) + 1.05e-6·100·(0 + 100/2)
//	+ 7.6e-5·1001 = 0.5 + 0.01 + 6.0 + 0.00525 + 0.076076 = 6.591326 ms
func TestKVTransferredSharesAStep(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	if err := w.Submit(0, &Request{ID: 1, InputLength: 100, OutputLength: 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Submit(0, &Request{ID: 2, InputLength: 1000, OutputLength: 2, KVTransferred: true}); err != nil {
		t.Fatal(err)
	}
	step := DefaultTiming().StepTime(StepShape{Decodes: 1, DecodeContext: 1001, Chunks: 1, PrefillTokens: 100, PrefillPairs2: 100 * 100})
	if step != 6591326*time.Nanosecond {
		t.Fatalf("StepTime = %v, want 6.591326ms", step)
	}
	ev := drainChecked(t, w)
	checkEvents(t, ev, 2)
	for _, e := range ev {
		if e.At != step {
			t.Fatalf("event %+v, want every event at %v (one step)", e, step)
		}
	}
}

// TestKVTransferredPreempted: two transferred requests of 64 prompt
// tokens and 40 output tokens each need ceil((64+39)/16) = 7 blocks at the
// end but only 5 at admission, so on a 10-block worker the newer one is
// preempted when the older needs its sixth block. Its transferred KV is
// lost: it recomputes prompt and generated tokens as a prefill, samples
// one token there, and both complete with one FirstToken each.
func TestKVTransferredPreempted(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 10
	w := newWorker(t, cfg)
	for i := 1; i <= 2; i++ {
		if err := w.Submit(0, &Request{ID: i, InputLength: 64, OutputLength: 40, KVTransferred: true}); err != nil {
			t.Fatal(err)
		}
	}
	ev := drainChecked(t, w)
	checkEvents(t, ev, 2)
	st := w.Stats()
	if st.Preemptions == 0 || st.PrefillTokens == 0 || st.TransferredTokens != 128 {
		t.Fatalf("stats %+v: want a preemption, a recompute and 128 transferred tokens", st)
	}
	// 2 × 39 tokens decoded here, less one sampled by each recompute.
	if st.DecodeTokens+st.Preemptions != 2*39 {
		t.Fatalf("decode tokens %d + preemptions %d, want %d", st.DecodeTokens, st.Preemptions, 2*39)
	}
	if ev[len(ev)-1].RequestID != 2 {
		t.Fatalf("the newer request should finish last: %+v", ev)
	}
}

func TestKVTransferredValidation(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	for _, out := range []int{0, 1} {
		err := w.Submit(0, &Request{ID: 1, InputLength: 100, OutputLength: out, KVTransferred: true})
		if !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("output %d: err = %v, want ErrInvalidRequest", out, err)
		}
	}
	err := w.Submit(0, &Request{ID: 1, InputLength: 27500 * 16, OutputLength: 2, KVTransferred: true})
	if !errors.Is(err, ErrRequestTooLarge) {
		t.Errorf("err = %v, want ErrRequestTooLarge", err)
	}
	if st := w.Stats(); st.Submitted != 0 {
		t.Fatalf("rejected requests counted: %+v", st)
	}
}
