package sim

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/trace"
)

// checkInvariants verifies the block conservation law of kvCache and the
// LRU bookkeeping.
func (w *Worker) checkInvariants() error {
	kv := w.kv
	lru, priv := 0, 0
	prev := int32(-1)
	for i := kv.lru.Front(); i >= 0; i = kv.lru.Next(i) {
		n := kv.nodes[i]
		if !n.inLRU || n.refs != 0 || kv.lru.Prev(i) != prev || n.blocks <= 0 {
			return fmt.Errorf("bad LRU node %d: %+v", i, n)
		}
		lru += int(n.blocks)
		if n.private {
			priv += int(n.blocks)
		}
		prev = i
	}
	if prev != kv.lru.Back() || lru != kv.lruBlocks || priv != kv.lruPrivate {
		return fmt.Errorf("LRU sums %d/%d private %d/%d", lru, kv.lruBlocks, priv, kv.lruPrivate)
	}
	pinned := 0
	for i, n := range kv.nodes {
		if n.refs > 0 {
			if n.inLRU {
				return fmt.Errorf("node %d referenced and in LRU", i)
			}
			pinned += int(n.blocks)
		}
	}
	for k, i := range kv.index {
		if n := kv.nodes[i]; n.key != k || n.private || (n.refs == 0 && !n.inLRU) {
			return fmt.Errorf("index %x → node %d %+v", k, i, n)
		}
	}
	if kv.copies {
		// Every cached copy is findable exactly once; nothing else is.
		seen := map[int32]bool{}
		for k, i := range kv.index {
			seen[i] = true
			if n := kv.nodes[i]; n.blocks != 1 {
				return fmt.Errorf("copies: index %x → node %d not cached: %+v", k, i, n)
			}
		}
		for k, is := range kv.more {
			if len(is) == 0 {
				return fmt.Errorf("copies: empty list for %x", k)
			}
			for _, i := range is {
				if n := kv.nodes[i]; seen[i] || n.key != k || n.private || n.blocks != 1 {
					return fmt.Errorf("copies: more %x → node %d %+v (seen %v)", k, i, n, seen[i])
				}
				seen[i] = true
			}
		}
		for i, n := range kv.nodes {
			if cached := !n.private && n.blocks > 0; cached != seen[int32(i)] {
				return fmt.Errorf("copies: node %d %+v cached %v, indexed %v", i, n, cached, seen[int32(i)])
			}
		}
	}
	private := 0
	for _, idx := range w.running {
		s := w.seqs[idx]
		private += s.private
		if s.private < 0 || s.alloc < w.blocksFor(s.computed) {
			return fmt.Errorf("seq %d: private %d alloc %d computed %d", s.id, s.private, s.alloc, s.computed)
		}
	}
	if got := kv.freePlain + kv.lruBlocks + pinned + private; got != kv.total {
		return fmt.Errorf("blocks: plain %d + lru %d + pinned %d + private %d = %d, want %d",
			kv.freePlain, kv.lruBlocks, pinned, private, got, kv.total)
	}
	return nil
}

func newWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	w, err := NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func within(t *testing.T, what string, got time.Duration, wantMs float64) {
	t.Helper()
	if g := float64(got) / 1e6; math.Abs(g-wantMs) > 0.02*wantMs {
		t.Errorf("%s = %.3f ms, want %.1f ms ± 2%%", what, g, wantMs)
	}
}

// TestStepTimeSanity checks the README.md, Model: step time sanity table. The exact
// nanosecond values are the formula evaluated by hand, e.g. prefill 1k:
// 0.5 + 0.005 + max(6, 1.5 + 0.021·1024) + 1.05e-6·1024·512 = 24.0595024 ms.
func TestStepTimeSanity(t *testing.T) {
	tm := DefaultTiming()
	tests := []struct {
		name   string
		shape  StepShape
		exact  time.Duration
		approx float64 // ms, README.md
	}{
		{"prefill 1k", StepShape{Chunks: 1, PrefillTokens: 1024, PrefillPairs2: 1024 * 1024}, 24059502, 24},
		{"prefill 8k", StepShape{Chunks: 1, PrefillTokens: 8192, PrefillPairs2: 8192 * 8192}, 209269154, 209},
		{"decode 1 × 1k", StepShape{Decodes: 1, DecodeContext: 1024}, 6582824, 6.6},
		{"decode 64 × 2k", StepShape{Decodes: 64, DecodeContext: 64 * 2048}, 16781472, 16.8},
		{"decode 256 × 1.5k", StepShape{Decodes: 256, DecodeContext: 256 * 1500}, 37840000, 37.8},
		{"64 decodes + 8128 chunk", StepShape{Decodes: 64, DecodeContext: 64 * 2048, Chunks: 1,
			PrefillTokens: 8128, PrefillPairs2: 8128 * 8128}, 219002274, 218},
	}
	for _, tt := range tests {
		got := tm.StepTime(tt.shape)
		if got != tt.exact {
			t.Errorf("%s: %d ns, want %d ns", tt.name, got, tt.exact)
		}
		within(t, tt.name, got, tt.approx)
	}
}

// TestWorkerSanity runs the same cases through an idle worker.
func TestWorkerSanity(t *testing.T) {
	for _, tt := range []struct {
		in   int
		want time.Duration
		ms   float64
	}{{1024, 24059502, 24}, {8192, 209269154, 209}} {
		w := newWorker(t, DefaultConfig())
		if err := w.Submit(0, &Request{ID: 7, InputLength: tt.in, OutputLength: 1}); err != nil {
			t.Fatal(err)
		}
		ev := w.Drain(nil)
		want := []Event{{Kind: FirstToken, RequestID: 7, At: tt.want}, {Kind: Completed, RequestID: 7, At: tt.want}}
		if !slices.Equal(ev, want) {
			t.Errorf("prefill %d: %+v, want %+v", tt.in, ev, want)
		}
		within(t, fmt.Sprint("prefill ", tt.in), ev[0].At, tt.ms)
	}
	// Decode with 1k context: a 1023-token prompt, then one decode step
	// attending to 1024 tokens.
	w := newWorker(t, DefaultConfig())
	if err := w.Submit(0, &Request{InputLength: 1023, OutputLength: 2}); err != nil {
		t.Fatal(err)
	}
	ev := w.Drain(nil)
	if len(ev) != 2 || ev[1].At-ev[0].At != 6582824 {
		t.Fatalf("decode: %+v, want a 6,582,824 ns gap", ev)
	}
	within(t, "decode 1 × 1k", ev[1].At-ev[0].At, 6.6)
}

// TestChunkedPrefill: a 20,000-token prompt runs as chunks of 8192, 8192
// and 3616 tokens over 0, 8192 and 16384 tokens already in KV.
func TestChunkedPrefill(t *testing.T) {
	tm := DefaultTiming()
	chunk := func(c, p int64) time.Duration {
		return tm.StepTime(StepShape{Chunks: 1, PrefillTokens: c, PrefillPairs2: c * (2*p + c)})
	}
	want := chunk(8192, 0) + chunk(8192, 8192) + chunk(3616, 16384)
	w := newWorker(t, DefaultConfig())
	if err := w.Submit(0, &Request{InputLength: 20000, OutputLength: 1}); err != nil {
		t.Fatal(err)
	}
	ev := w.Drain(nil)
	if ev[0].At != want || w.Stats().Steps != 3 || w.Stats().PrefillTokens != 20000 {
		t.Errorf("first token %v (%d steps, %d tokens), want %v in 3 steps", ev[0].At, w.Stats().Steps, w.Stats().PrefillTokens, want)
	}

	// The budget is shared FCFS: A (100 tokens) and B (10,000) arrive
	// together; step 1 runs A's prompt and 8092 of B's, step 2 A's first
	// decode (context 101) and B's last 1908 tokens.
	w = newWorker(t, DefaultConfig())
	_ = w.Submit(0, &Request{ID: 1, InputLength: 100, OutputLength: 3})
	_ = w.Submit(0, &Request{ID: 2, InputLength: 10000, OutputLength: 1})
	s1 := tm.StepTime(StepShape{Chunks: 2, PrefillTokens: 8192, PrefillPairs2: 100*100 + 8092*8092})
	s2 := tm.StepTime(StepShape{Decodes: 1, DecodeContext: 101, Chunks: 1, PrefillTokens: 1908, PrefillPairs2: 1908 * (2*8092 + 1908)})
	s3 := tm.StepTime(StepShape{Decodes: 1, DecodeContext: 102})
	ev = w.Drain(nil)
	wantEv := []Event{
		{Kind: FirstToken, RequestID: 1, At: s1},
		{Kind: FirstToken, RequestID: 2, At: s1 + s2},
		{Kind: Completed, RequestID: 2, At: s1 + s2},
		{Kind: Completed, RequestID: 1, At: s1 + s2 + s3},
	}
	if !slices.Equal(ev, wantEv) {
		t.Errorf("shared budget:\n got %+v\nwant %+v", ev, wantEv)
	}
}

// TestPrefixHit: a repeated prompt hits every block but the last; a prompt
// sharing only the first 512-token block hits 32 engine blocks.
func TestPrefixHit(t *testing.T) {
	tm := DefaultTiming()
	tests := []struct {
		name        string
		first, then Request
		cached      int
	}{
		// 1024 tokens = 64 blocks; the cap (1024−1)/16 = 63 blocks.
		{"identical 1024", Request{InputLength: 1024, PrefixHashes: []uint64{10, 11}},
			Request{InputLength: 1024, PrefixHashes: []uint64{10, 11}}, 1008},
		// 700 tokens: group 1 covers 188 tokens = 11 full blocks + 12 tokens.
		{"identical 700", Request{InputLength: 700, PrefixHashes: []uint64{10, 11}},
			Request{InputLength: 700, PrefixHashes: []uint64{10, 11}}, 688},
		{"shared first block", Request{InputLength: 1024, PrefixHashes: []uint64{10, 11}},
			Request{InputLength: 1000, PrefixHashes: []uint64{10, 12}}, 512},
		// A longer prompt extending the cached one hits all 64 blocks.
		{"extension", Request{InputLength: 1024, PrefixHashes: []uint64{10, 11}},
			Request{InputLength: 1030, PrefixHashes: []uint64{10, 11, 13}}, 1024},
		{"no hashes", Request{InputLength: 1024}, Request{InputLength: 1024}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorker(t, DefaultConfig())
			a, b := tt.first, tt.then
			a.ID, b.ID = 1, 2
			a.PrefixBlockTokens, b.PrefixBlockTokens = 512, 512
			_ = w.Submit(0, &a)
			ev := w.Drain(nil)
			if got := w.CachedPrefixTokens(&b); got != tt.cached {
				t.Errorf("CachedPrefixTokens = %d, want %d", got, tt.cached)
			}
			start := ev[len(ev)-1].At
			_ = w.Submit(start, &b)
			ev = w.Drain(nil)
			c := int64(b.InputLength - tt.cached)
			want := start + tm.StepTime(StepShape{Chunks: 1, PrefillTokens: c, PrefillPairs2: c * (2*int64(tt.cached) + c)})
			if ev[0].CachedTokens != tt.cached || ev[0].At != want {
				t.Errorf("FirstToken %+v, want cached %d at %v", ev[0], tt.cached, want)
			}
			if st := w.Stats(); st.CacheHitTokens != int64(tt.cached) {
				t.Errorf("CacheHitTokens %d", st.CacheHitTokens)
			}
			if err := w.checkInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestEviction: 40 blocks of 16 tokens, 64-token prefix groups (4 blocks).
// A caches groups 1,2,3,4; B's 7 private blocks follow them in the free
// queue. C hits groups 1 and 2 and keeps them referenced while D, which
// needs 10 blocks with only 8 never-used ones left, evicts 2: the last two
// sub-blocks of A's last group, the LRU head because freed blocks enter
// tail first. Referenced groups 1 and 2, group 3 and B's run stay.
func TestEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 40
	w := newWorker(t, cfg)
	A := Request{ID: 1, InputLength: 256, OutputLength: 1, PrefixHashes: []uint64{1, 2, 3, 4}, PrefixBlockTokens: 64}
	_ = w.Submit(0, &A)
	ev := w.Drain(nil)
	if l := w.Load(); l.CachedBlocks != 16 || l.FreeBlocks != 40 {
		t.Fatalf("after A: %+v", l)
	}
	now := ev[len(ev)-1].At
	_ = w.Submit(now, &Request{ID: 2, InputLength: 100, OutputLength: 1})
	ev = w.Drain(ev[:0])
	now = ev[len(ev)-1].At
	if got := w.CachedPrefixTokens(&A); got != 240 || w.kv.freePlain != 17 {
		t.Fatalf("after B: A hits %d tokens, %d plain blocks", got, w.kv.freePlain)
	}
	C := Request{ID: 3, InputLength: 256, OutputLength: 40, PrefixHashes: []uint64{1, 2, 5, 6}, PrefixBlockTokens: 64}
	_ = w.Submit(now, &C)
	e1, _ := w.NextEvent() // C's prefill: hits groups 1 and 2
	ev = w.Advance(e1, ev[:0])
	if len(ev) != 1 || ev[0].CachedTokens != 128 {
		t.Fatalf("C: %+v, want a first token with 128 cached tokens", ev)
	}
	D := Request{ID: 4, InputLength: 160, OutputLength: 1}
	_ = w.Submit(e1, &D)
	w.NextEvent() // forms the step: C decodes, D is admitted
	if st := w.Stats(); st.EvictedBlocks != 2 {
		t.Errorf("evicted %d blocks, want 2", st.EvictedBlocks)
	}
	// Groups 1, 2, 3 intact, group 4 keeps sub-blocks 0 and 1: 14 blocks.
	if got := w.CachedPrefixTokens(&A); got != 224 {
		t.Errorf("A now hits %d tokens, want 224", got)
	}
	E := Request{ID: 5, InputLength: 480, OutputLength: 1} // 30 blocks
	_ = w.Submit(e1, &E)
	e2, _ := w.NextEvent()
	ev = w.Advance(e2, ev[:0])
	w.NextEvent()
	if l := w.Load(); l.Waiting != 1 || l.Running != 1 || l.FreeBlocks != 23 {
		t.Errorf("E should wait for C's pinned blocks: %+v", l)
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	_ = w.Drain(ev[:0])
	// C takes group 4's last 2 blocks for its 18th and 19th blocks; when C
	// completes, E (30 blocks) evicts group 3 (4), the 20-block private run,
	// then groups 6 (4) and 5 (2): 2 + 2 + 4 + 4 + 2 = 14 in all.
	if st := w.Stats(); st.EvictedBlocks != 14 || st.Completed != 5 {
		t.Errorf("stats %+v, want 14 evicted blocks, 5 completed", st)
	}
	if l := w.Load(); l.UsedBlocks != 0 || l.CachedBlocks != 10 {
		t.Errorf("final load %+v, want 10 cached blocks (groups 1, 2 and half of 5)", l)
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestPreemption: 4 requests of 200 + 300 tokens each need up to 32 blocks,
// 128 in all, on a 64-block worker. When KV runs out the newest running
// request is preempted and recomputed later; all complete, each with one
// first token, and the oldest finishes first.
func TestPreemption(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 64
	w := newWorker(t, cfg)
	for i := 1; i <= 4; i++ {
		if err := w.Submit(0, &Request{ID: i, InputLength: 200, OutputLength: 300}); err != nil {
			t.Fatal(err)
		}
	}
	var ev []Event
	for {
		next, busy := w.NextEvent()
		if !busy {
			break
		}
		ev = w.Advance(next, ev)
		if err := w.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	}
	st := w.Stats()
	if st.Preemptions == 0 || st.Completed != 4 {
		t.Fatalf("stats %+v: want preemptions and 4 completions", st)
	}
	// Every request samples 299 tokens after its first; a recompute of a
	// preempted (decoding) request samples one of them in its prefill
	// instead, and adds prefill tokens.
	if st.DecodeTokens+st.Preemptions != 4*299 || st.PrefillTokens <= 800 {
		t.Errorf("decode %d, prefill %d tokens", st.DecodeTokens, st.PrefillTokens)
	}
	checkEvents(t, ev, 4)
	if ev[len(ev)-1].RequestID == 1 {
		t.Errorf("oldest request finished last: %+v", ev)
	}
	var firstDone int
	for _, e := range ev {
		if e.Kind == Completed {
			firstDone = e.RequestID
			break
		}
	}
	if firstDone != 1 {
		t.Errorf("first completion %d, want 1 (never preempted)", firstDone)
	}
}

// checkEvents asserts one FirstToken then one Completed per request ID
// 1..n (or 0..n-1 when zeroBased), in time order.
func checkEvents(t *testing.T, ev []Event, n int) {
	t.Helper()
	first := map[int]time.Duration{}
	done := map[int]bool{}
	for i, e := range ev {
		if i > 0 && e.At < ev[i-1].At {
			t.Fatalf("event %d at %v before %v", i, e.At, ev[i-1].At)
		}
		switch e.Kind {
		case FirstToken:
			if _, dup := first[e.RequestID]; dup {
				t.Fatalf("second FirstToken for %d", e.RequestID)
			}
			first[e.RequestID] = e.At
		case Completed:
			if _, ok := first[e.RequestID]; !ok || done[e.RequestID] {
				t.Fatalf("Completed for %d without FirstToken or twice", e.RequestID)
			}
			done[e.RequestID] = true
		}
	}
	if len(first) != n || len(done) != n {
		t.Fatalf("%d first tokens, %d completions, want %d", len(first), len(done), n)
	}
}

// TestArxivReplay replays the 1,000-request arXiv sample on 4 workers:
// every request completes, the replay is byte-identical when repeated and
// when the decode fast path is disabled, and all KV is free at the end.
func TestArxivReplay(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	ev1, c := replay(t, recs, 4, DefaultConfig(), nil)
	checkEvents(t, ev1, 1000)
	st := c.Stats()
	if st.Completed != 1000 || st.Submitted != 1000 || st.CacheHitTokens == 0 {
		t.Errorf("stats %+v", st)
	}
	for i := 0; i < c.Len(); i++ {
		w := c.Worker(i)
		if err := w.checkInvariants(); err != nil {
			t.Error(err)
		}
		if l := w.Load(); l.UsedBlocks != 0 || l.Running+l.Waiting != 0 {
			t.Errorf("worker %d not drained: %+v", i, l)
		}
	}
	ev2, _ := replay(t, recs, 4, DefaultConfig(), nil)
	if !slices.Equal(ev1, ev2) {
		t.Error("two replays differ")
	}
	slow := replaySlow(t, recs, 4)
	if !slices.Equal(ev1, slow) {
		t.Error("replay without the decode fast path differs")
	}
	// Tie order: the cluster sorts by time, then worker index.
	for i := 1; i < len(ev1); i++ {
		if ev1[i].At == ev1[i-1].At && ev1[i].Worker < ev1[i-1].Worker {
			t.Fatalf("events %d, %d: worker order %d after %d at equal time", i-1, i, ev1[i].Worker, ev1[i-1].Worker)
		}
	}
}

func replaySlow(t *testing.T, recs []trace.Record, n int) []Event {
	c, _ := NewCluster(n, DefaultConfig())
	for i := 0; i < n; i++ {
		c.Worker(i).noFast = true
	}
	var ev []Event
	for i, r := range recs {
		ev = c.AdvanceTo(r.Arrival, ev)
		req := &Request{ID: i, InputLength: r.InputLength, OutputLength: r.OutputLength,
			PrefixHashes: chain(nil, r.HashIDs), PrefixBlockTokens: trace.MooncakeBlockTokens}
		if err := c.Submit(r.Arrival, i%n, req); err != nil {
			t.Fatal(err)
		}
	}
	return c.Drain(ev)
}

// TestAzureReplay: requests without prefix hashes get private blocks only.
func TestAzureReplay(t *testing.T) {
	recs := readTrace(t, "azure_llm_2023_code.csv")[:2000]
	ev, c := replay(t, recs, 2, DefaultConfig(), nil)
	checkEvents(t, ev, 2000)
	if st := c.Stats(); st.CacheHitTokens != 0 || st.EvictedBlocks != 0 {
		t.Errorf("stats %+v: no hashes, so no hits or cached evictions", st)
	}
}

func TestValidation(t *testing.T) {
	bad := DefaultConfig()
	bad.BlockSize = 0
	if _, err := NewWorker(bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("BlockSize 0: %v", err)
	}
	bad = DefaultConfig()
	bad.Timing.PerToken = math.NaN()
	if _, err := NewCluster(2, bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NaN timing: %v", err)
	}
	if _, err := NewCluster(0, DefaultConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("0 workers: %v", err)
	}
	w := newWorker(t, DefaultConfig())
	for _, tt := range []struct {
		r    *Request
		want error
	}{
		{nil, ErrInvalidRequest},
		{&Request{InputLength: 0, OutputLength: 1}, ErrInvalidRequest},
		{&Request{InputLength: 1, OutputLength: -1}, ErrInvalidRequest},
		{&Request{InputLength: 600, PrefixHashes: []uint64{1, 2}, PrefixBlockTokens: 500}, ErrInvalidRequest},
		{&Request{InputLength: 440000, OutputLength: 2}, ErrRequestTooLarge},
	} {
		if err := w.Submit(0, tt.r); !errors.Is(err, tt.want) {
			t.Errorf("Submit(%+v) = %v, want %v", tt.r, err, tt.want)
		}
	}
	if err := w.Submit(0, &Request{InputLength: 440000, OutputLength: 1}); err != nil {
		t.Errorf("exactly full KV: %v", err)
	}
	w.Advance(time.Second, nil)
	if err := w.Submit(time.Millisecond, &Request{InputLength: 1}); !errors.Is(err, ErrTimeWentBackwards) {
		t.Errorf("backwards: %v", err)
	}
	c, _ := NewCluster(2, DefaultConfig())
	if err := c.Submit(0, 2, &Request{InputLength: 1}); !errors.Is(err, ErrNoSuchWorker) {
		t.Errorf("worker 2 of 2: %v", err)
	}
	if FirstToken.String() != "FirstToken" || Completed.String() != "Completed" || EventKind(9).String() != "EventKind(9)" {
		t.Error("EventKind.String")
	}
}

// TestSameInstantBatching: requests submitted at the instant a step would
// start share that step (Mooncake arrivals come in 3 s ticks).
func TestSameInstantBatching(t *testing.T) {
	w := newWorker(t, DefaultConfig())
	_ = w.Submit(0, &Request{ID: 1, InputLength: 1024, OutputLength: 1})
	ev := w.Advance(0, nil)
	_ = w.Submit(0, &Request{ID: 2, InputLength: 1024, OutputLength: 1})
	ev = w.Drain(ev)
	want := DefaultTiming().StepTime(StepShape{Chunks: 2, PrefillTokens: 2048, PrefillPairs2: 2 * 1024 * 1024})
	if len(ev) != 4 || ev[0].At != want || ev[3].At != want {
		t.Errorf("%+v, want all at %v", ev, want)
	}
}

// TestTokenGaps: the inter-token latencies OnTokenGap reports are the same
// with and without the decode fast path; there are output_length − 1 of
// them per request; and, for requests that run alone (one worker each,
// spaced apart), they add up to the request's completion minus its first
// token.
func TestTokenGaps(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:300]
	gaps := func(fast bool) (map[time.Duration]int, int) {
		c, _ := NewCluster(4, DefaultConfig())
		hist := map[time.Duration]int{}
		tokens := 0
		for i := range 4 {
			c.Worker(i).noFast = !fast
		}
		c.OnTokenGap(func(gap time.Duration, n int) {
			if gap <= 0 || n <= 0 {
				t.Fatalf("gap %v x %d: want positive", gap, n)
			}
			hist[gap] += n
			tokens += n
		})
		var ev []Event
		for i, r := range recs {
			ev = c.AdvanceTo(r.Arrival, ev)
			req := &Request{ID: i, InputLength: r.InputLength, OutputLength: r.OutputLength,
				PrefixHashes: chain(nil, r.HashIDs), PrefixBlockTokens: trace.MooncakeBlockTokens}
			if err := c.Submit(r.Arrival, i%4, req); err != nil {
				t.Fatal(err)
			}
		}
		c.Drain(ev)
		return hist, tokens
	}
	fastHist, fastTokens := gaps(true)
	slowHist, slowTokens := gaps(false)
	want := 0
	for _, r := range recs {
		want += max(r.OutputLength, 1) - 1
	}
	if fastTokens != want || slowTokens != want {
		t.Errorf("gaps: %d with the fast path, %d without; want output_length − 1 per request, %d", fastTokens, slowTokens, want)
	}
	if !maps.Equal(fastHist, slowHist) {
		t.Errorf("the fast path's gaps differ from stepping one by one (%d and %d distinct values)", len(fastHist), len(slowHist))
	}

	// One request alone: the gaps add up to completion − first token.
	for _, fast := range []bool{true, false} {
		w := newWorker(t, DefaultConfig())
		w.noFast = !fast
		var sum time.Duration
		n := 0
		w.OnTokenGap(func(gap time.Duration, k int) { sum += gap * time.Duration(k); n += k })
		if err := w.Submit(0, &Request{ID: 1, InputLength: 3000, OutputLength: 200}); err != nil {
			t.Fatal(err)
		}
		var first, done time.Duration
		for _, e := range w.Drain(nil) {
			switch e.Kind {
			case FirstToken:
				first = e.At
			case Completed:
				done = e.At
			}
		}
		if n != 199 || sum != done-first {
			t.Errorf("fast path %v: %d gaps adding up to %v; want 199 adding up to completion − first token = %v", fast, n, sum, done-first)
		}
	}
}
