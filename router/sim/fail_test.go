package sim

import (
	"errors"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// TestFailCutsAndContinues: a worker failing mid-decode returns its
// running request with the tokens it sampled and its waiting one with 0,
// loses its cache, and a continuation submitted with those tokens
// elsewhere prefills prompt + generated tokens (the prompt's blocks from
// the cache, the generated ones computed) and samples only the rest.
func TestFailCutsAndContinues(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = 1 // the second request waits
	a := newWorker(t, cfg)
	hashes := prefix.ChainHashes(nil, []uint64{1, 2}) // 1,024 tokens
	r := &Request{ID: 7, InputLength: 1024, OutputLength: 40, PrefixHashes: hashes, PrefixBlockTokens: 512}
	mustSubmit(t, a, 0, r)
	mustSubmit(t, a, 0, &Request{ID: 8, InputLength: 100, OutputLength: 5})
	// Run exactly 10 steps: the prefill (token 1) and 9 decodes.
	var evs []Event
	for range 10 {
		end, _ := a.NextEvent()
		evs = a.Advance(end, evs)
	}
	if len(evs) != 1 || evs[0].Kind != FirstToken || evs[0].RequestID != 7 {
		t.Fatalf("events before the failure: %+v", evs)
	}
	at, busy := a.NextEvent() // the 11th step is in flight: it is lost
	if !busy {
		t.Fatal("worker idle mid-answer")
	}
	cuts, err := a.Fail(at-time.Microsecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Cut{{ID: 7, Generated: 10, Started: true}, {ID: 8}}
	if len(cuts) != 2 || cuts[0] != want[0] || cuts[1] != want[1] {
		t.Fatalf("cuts = %+v, want %+v", cuts, want)
	}
	checkWorker(t, a)
	if l := a.Load(); l.Running != 0 || l.Waiting != 0 || l.UsedBlocks != 0 || l.CachedBlocks != 0 {
		t.Fatalf("load after the failure: %+v", l)
	}
	if s := a.Stats(); s.Failures != 1 || s.Cut != 2 {
		t.Fatalf("stats: failures %d cut %d, want 1 and 2", s.Failures, s.Cut)
	}
	if _, err := a.Fail(at-2*time.Microsecond, nil); !errors.Is(err, ErrTimeWentBackwards) {
		t.Fatalf("fail in the past: %v", err)
	}
	if got := a.CachedPrefixTokens(r); got != 0 {
		t.Fatalf("restarted engine serves %d cached tokens, want 0", got)
	}

	// The continuation on worker b, which holds the prompt's blocks from
	// an earlier request with the same hashes.
	b := newWorker(t, DefaultConfig())
	mustSubmit(t, b, 0, &Request{ID: 1, InputLength: 1024, OutputLength: 1, PrefixHashes: hashes, PrefixBlockTokens: 512})
	b.Drain(nil)
	before := b.Stats()
	now := at
	c := &Request{ID: 7, InputLength: 1024, OutputLength: 40, Generated: 10, PrefixHashes: hashes, PrefixBlockTokens: 512}
	mustSubmit(t, b, now, c)
	evs = b.Drain(nil)
	if len(evs) != 2 || evs[0].Kind != FirstToken || evs[1].Kind != Completed {
		t.Fatalf("continuation's events: %+v", evs)
	}
	// The continuation's prefill is 1,024 + 10 = 1,034 tokens; the cache
	// serves the whole prompt, 64 blocks (the cap, (1,034−1)/16 = 64
	// blocks, leaves it all), so the prefill computes the 10 generated
	// tokens, samples token 11, and the decodes the other 40 − 11 = 29.
	if evs[0].CachedTokens != 1024 {
		t.Errorf("cached tokens = %d, want 1024", evs[0].CachedTokens)
	}
	s := b.Stats()
	if got := s.PrefillTokens - before.PrefillTokens; got != 10 {
		t.Errorf("prefill tokens = %d, want 10", got)
	}
	if got := s.DecodeTokens - before.DecodeTokens; got != 29 {
		t.Errorf("decode tokens = %d, want 29", got)
	}
	checkWorker(t, b)
	for _, bad := range []Request{
		{ID: 9, InputLength: 10, OutputLength: 5, Generated: 5},
		{ID: 9, InputLength: 10, OutputLength: 5, Generated: -1},
		{ID: 9, InputLength: 10, OutputLength: 5, Generated: 1, KVTransferred: true},
	} {
		if err := b.Submit(b.now, &bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("submit %+v: %v, want ErrInvalidRequest", bad, err)
		}
	}
}
