package sim

import (
	"slices"
	"testing"
	"time"
)

// TestKVEventsStoreAndEvict: request A caches 4 groups, reported stored in
// chain order with their parents at the end of its prefill; request B needs
// the whole cache and evicts them from the LRU head, which holds A's groups
// last to first (freed tail-first), at the start of its step.
func TestKVEventsStoreAndEvict(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 40
	w := newWorker(t, cfg)
	var got []KVEvent
	w.SetKVEventHook(func(e KVEvent) { got = append(got, e) })
	A := Request{ID: 7, InputLength: 256, OutputLength: 1, PrefixHashes: []uint64{11, 12, 13, 14}, PrefixBlockTokens: 64}
	mustSubmit(t, w, 0, &A)
	ev := w.Drain(nil)
	end := ev[0].At
	want := []KVEvent{
		{Kind: KVBlockStored, At: end, Hash: 11, Parent: 0, RequestID: 7, Group: 0, Tokens: 64},
		{Kind: KVBlockStored, At: end, Hash: 12, Parent: 11, RequestID: 7, Group: 1, Tokens: 64},
		{Kind: KVBlockStored, At: end, Hash: 13, Parent: 12, RequestID: 7, Group: 2, Tokens: 64},
		{Kind: KVBlockStored, At: end, Hash: 14, Parent: 13, RequestID: 7, Group: 3, Tokens: 64},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after A: events\n%+v\nwant\n%+v", got, want)
	}
	got = got[:0]
	start := end + time.Millisecond
	mustSubmit(t, w, start, &Request{ID: 8, InputLength: 640, OutputLength: 1}) // 40 blocks
	w.Drain(ev[:0])
	want = []KVEvent{
		{Kind: KVBlockRemoved, At: start, Hash: 14},
		{Kind: KVBlockRemoved, At: start, Hash: 13},
		{Kind: KVBlockRemoved, At: start, Hash: 12},
		{Kind: KVBlockRemoved, At: start, Hash: 11},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after B: events\n%+v\nwant\n%+v", got, want)
	}
	checkWorker(t, w)
}

// TestKVEventsPartialEviction: a group reported stored stays reported while
// any of its engine blocks is cached; evicting some of them sends nothing,
// evicting the last sends BlockRemoved.
func TestKVEventsPartialEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 8
	w := newWorker(t, cfg)
	var got []KVEvent
	w.SetKVEventHook(func(e KVEvent) { got = append(got, e) })
	A := Request{ID: 1, InputLength: 128, OutputLength: 1, PrefixHashes: []uint64{5}, PrefixBlockTokens: 128} // one 8-block group
	mustSubmit(t, w, 0, &A)
	ev := w.Drain(nil)
	if len(got) != 1 || got[0].Kind != KVBlockStored || got[0].Hash != 5 {
		t.Fatalf("after A: %+v, want one BlockStored of 5", got)
	}
	mustSubmit(t, w, ev[len(ev)-1].At, &Request{ID: 2, InputLength: 48, OutputLength: 1}) // 3 blocks
	ev = w.Drain(ev[:0])
	if len(got) != 1 {
		t.Fatalf("a partial eviction sent %+v", got[1:])
	}
	if hit := w.CachedPrefixTokens(&Request{InputLength: 256, PrefixHashes: []uint64{5}, PrefixBlockTokens: 128}); hit != 5*16 {
		t.Fatalf("group 5 hits %d tokens, want 80 (5 of 8 blocks left)", hit)
	}
	mustSubmit(t, w, ev[len(ev)-1].At, &Request{ID: 3, InputLength: 128, OutputLength: 1}) // 8 blocks
	w.Drain(ev[:0])
	if len(got) != 2 || got[1].Kind != KVBlockRemoved || got[1].Hash != 5 {
		t.Fatalf("after the full eviction: %+v, want BlockRemoved of 5 last", got)
	}
	checkWorker(t, w)
}

// TestKVEventsMirrorCache replays part of the Mooncake conversation trace
// on two small workers (evicting often): the groups the events say are
// cached are, at every arrival, exactly the groups each worker's cache
// holds, every store names its request's hash and parent, times never go
// back, and the request events are the same as without a hook.
func TestKVEventsMirrorCache(t *testing.T) {
	recs := readTrace(t, "mooncake_conversation_trace.jsonl")[:1500]
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 8000
	plain, _ := replay(t, recs, 2, cfg, nil)

	c, err := NewCluster(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	held := []map[uint64]bool{{}, {}}
	last := []time.Duration{0, 0}
	var reqs []Request
	var stored, removed int
	c.SetKVEventHook(func(e KVEvent) {
		h := held[e.Worker]
		if e.At < last[e.Worker] {
			t.Fatalf("worker %d: event at %v after one at %v", e.Worker, e.At, last[e.Worker])
		}
		last[e.Worker] = e.At
		switch e.Kind {
		case KVBlockStored:
			stored++
			r := reqs[e.RequestID]
			if h[e.Hash] || e.Hash != r.PrefixHashes[e.Group] || e.Tokens != r.PrefixBlockTokens ||
				(e.Group == 0 && e.Parent != 0) || (e.Group > 0 && e.Parent != r.PrefixHashes[e.Group-1]) {
				t.Fatalf("bad store %+v (already held %v)", e, h[e.Hash])
			}
			h[e.Hash] = true
		case KVBlockRemoved:
			removed++
			if !h[e.Hash] {
				t.Fatalf("removal of a group never stored: %+v", e)
			}
			delete(h, e.Hash)
		default:
			t.Fatalf("unexpected %+v", e)
		}
	})
	var hashes []uint64
	for i, r := range recs {
		off := len(hashes)
		hashes = chain(hashes, r.HashIDs)
		reqs = append(reqs, Request{ID: i, InputLength: r.InputLength, OutputLength: r.OutputLength,
			PrefixHashes: hashes[off:len(hashes):len(hashes)], PrefixBlockTokens: 512})
	}
	var events []Event
	for i := range reqs {
		events = c.AdvanceTo(recs[i].Arrival, events)
		if err := c.Submit(recs[i].Arrival, i%2, &reqs[i]); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			for k := range held {
				checkMirror(t, c.Worker(k), held[k])
			}
		}
	}
	events = c.Drain(events)
	for k := range held {
		checkMirror(t, c.Worker(k), held[k])
	}
	if !slices.Equal(events, plain) {
		t.Fatal("the request events differ with a hook set")
	}
	if removed == 0 || stored <= removed {
		t.Fatalf("%d stores, %d removals: want evictions and something left", stored, removed)
	}
	t.Logf("%d stores, %d removals", stored, removed)
}

// checkMirror compares the groups the events reported with the worker's
// cache: the index nodes that hold at least one engine block.
func checkMirror(t *testing.T, w *Worker, held map[uint64]bool) {
	t.Helper()
	n := 0
	for k, i := range w.kv.index {
		if w.kv.nodes[i].blocks > 0 {
			n++
			if !held[k] {
				t.Fatalf("worker %d caches %x, never reported", w.index, k)
			}
		}
	}
	if n != len(held) {
		t.Fatalf("worker %d caches %d groups, events say %d", w.index, n, len(held))
	}
}

// TestClearPrefixCache: refused while a request runs; afterwards every
// group is dropped (no hits, no cached blocks, all blocks free) and the
// hook hears one AllBlocksCleared.
func TestClearPrefixCache(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 100
	w := newWorker(t, cfg)
	var got []KVEvent
	w.SetKVEventHook(func(e KVEvent) { got = append(got, e) })
	A := Request{ID: 1, InputLength: 256, OutputLength: 20, PrefixHashes: []uint64{1, 2}, PrefixBlockTokens: 128}
	mustSubmit(t, w, 0, &A)
	first, _ := w.NextEvent()
	w.Advance(first, nil)
	if w.ClearPrefixCache() {
		t.Fatal("cleared while A runs")
	}
	ev := w.Drain(nil)
	if !w.ClearPrefixCache() {
		t.Fatal("refused with nothing running")
	}
	checkWorker(t, w)
	if hit := w.CachedPrefixTokens(&A); hit != 0 {
		t.Errorf("A still hits %d tokens", hit)
	}
	if l := w.Load(); l.CachedBlocks != 0 || l.FreeBlocks != 100 {
		t.Errorf("load %+v, want nothing cached, 100 free", l)
	}
	end := ev[len(ev)-1].At
	if n := len(got); n != 3 || got[2] != (KVEvent{Kind: KVAllCleared, At: end}) {
		t.Fatalf("events %+v, want 2 stores then AllBlocksCleared at %v", got, end)
	}
	// The cache works again: A's groups are stored anew.
	mustSubmit(t, w, end, &A)
	w.Drain(nil)
	if len(got) != 5 || got[3].Hash != 1 || got[4].Hash != 2 {
		t.Fatalf("after resubmitting A: %+v", got[3:])
	}
	checkWorker(t, w)
}
