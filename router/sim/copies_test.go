package sim

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// copiesWorker is a worker of total 16-token blocks with block copies
// tracked, recording its KV events.
func copiesWorker(t *testing.T, total int) (*Worker, *[]KVEvent) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.TotalKVBlocks = total
	w := newWorker(t, cfg)
	if err := w.TrackBlockCopies(); err != nil {
		t.Fatal(err)
	}
	var got []KVEvent
	w.SetKVEventHook(func(e KVEvent) { got = append(got, e) })
	return w, &got
}

// blockReq is a request of n tokens keyed by hashes, one per full block.
func blockReq(id, n int, hashes []uint64) *Request {
	return &Request{ID: id, InputLength: n, OutputLength: 1, PrefixHashes: hashes, PrefixBlockTokens: 16}
}

// TestBlockCopies follows vLLM's block pool without deduplication
// (vllm/v1/core/block_pool.py, BlockHashToBlockMap, "We currently don't
// de-duplicate the blocks in the cache"): a block-aligned prompt sent
// twice hits all but its last block (the last block is always computed,
// kv_cache_manager.get_computed_blocks caps the hit at num_tokens-1), and
// that recomputed block becomes a second cached copy of the same hash
// with its own BlockStored. Evicting one copy sends BlockRemoved of the
// hash while the other copy still serves hits; evicting the second sends
// a second BlockRemoved of the same hash.
func TestBlockCopies(t *testing.T) {
	w, got := copiesWorker(t, 8)
	h := []uint64{11, 12, 13, 14, 15}
	A := blockReq(1, 64, h[:4]) // 4 full blocks, block-aligned
	mustSubmit(t, w, 0, A)
	ev := w.Drain(nil)
	if len(*got) != 4 {
		t.Fatalf("A: %+v, want 4 stores", *got)
	}
	for g, e := range *got {
		if e.Kind != KVBlockStored || e.Hash != h[g] || e.Group != g || e.RequestID != 1 || (g > 0 && e.Parent != h[g-1]) {
			t.Fatalf("A's store %d: %+v", g, e)
		}
	}
	*got = (*got)[:0]

	// A again: 3 blocks hit, the fourth is recomputed into a second copy.
	mustSubmit(t, w, w.now, blockReq(2, 64, h[:4]))
	ev = w.Drain(ev[:0])
	if ev[0].CachedTokens != 48 {
		t.Fatalf("A again: cached %d tokens, want 48 (the last block is computed)", ev[0].CachedTokens)
	}
	want := []KVEvent{{Kind: KVBlockStored, At: ev[0].ScheduledAt, Hash: 14, Parent: 13, RequestID: 2, Group: 3, Tokens: 16}}
	if !slices.Equal(*got, want) {
		t.Fatalf("A again: events %+v, want %+v", *got, want)
	}
	checkWorker(t, w)
	*got = (*got)[:0]

	// C needs 4 new blocks: 3 never used, and the LRU head, the first copy
	// of 14 (A freed it first, tail-first).
	mustSubmit(t, w, w.now, blockReq(3, 64, []uint64{21, 22, 23, 24}))
	ev = w.Drain(ev[:0])
	if n := len(*got); n != 5 || (*got)[0] != (KVEvent{Kind: KVBlockRemoved, At: ev[0].ScheduledAt, Hash: 14}) {
		t.Fatalf("C: events %+v, want BlockRemoved of 14 then 4 stores", *got)
	}
	checkWorker(t, w)
	// The second copy of 14 still serves: A plus one block hits 4 blocks.
	if hit := w.CachedPrefixTokens(blockReq(0, 80, h)); hit != 64 {
		t.Fatalf("A+16 hits %d tokens with one copy of 14 left, want 64", hit)
	}
	*got = (*got)[:0]

	// E fills the whole cache: every cached copy is evicted, the second
	// copy of 14 among them, each with its own BlockRemoved.
	mustSubmit(t, w, w.now, &Request{ID: 4, InputLength: 128, OutputLength: 1})
	w.Drain(ev[:0])
	removed := map[uint64]int{}
	for _, e := range *got {
		if e.Kind != KVBlockRemoved {
			t.Fatalf("E: %+v", e)
		}
		removed[e.Hash]++
	}
	wantRemoved := map[uint64]int{11: 1, 12: 1, 13: 1, 14: 1, 21: 1, 22: 1, 23: 1, 24: 1}
	if len(removed) != len(wantRemoved) {
		t.Fatalf("E removed %v, want %v", removed, wantRemoved)
	}
	for k, n := range wantRemoved {
		if removed[k] != n {
			t.Fatalf("E removed %v, want %v", removed, wantRemoved)
		}
	}
	if len(w.kv.index) != 0 || len(w.kv.more) != 0 {
		t.Fatalf("cache not empty: index %v more %v", w.kv.index, w.kv.more)
	}
	checkWorker(t, w)
}

// TestBlockCopiesSameStep: two requests for the same new prompt admitted
// in one step: the first caches its blocks when scheduled (vLLM's
// allocate_slots), the second hits them; one copy each, no duplicate.
func TestBlockCopiesSameStep(t *testing.T) {
	w, got := copiesWorker(t, 64)
	h := []uint64{1, 2, 3}
	mustSubmit(t, w, 0, blockReq(1, 50, h))
	mustSubmit(t, w, 0, blockReq(2, 50, h))
	ev := w.Drain(nil)
	var cached []int
	for _, e := range ev {
		if e.Kind == FirstToken {
			cached = append(cached, e.CachedTokens)
		}
	}
	if !slices.Equal(cached, []int{0, 48}) || len(*got) != 3 {
		t.Fatalf("cached %v, events %+v; want 0 and 48 cached, 3 stores", cached, *got)
	}
	checkWorker(t, w)
}

// TestBlockCopiesResidency drives a small worker with overlapping prompts
// (shared prefixes, block-aligned repeats, concurrent arrivals, aborts,
// evictions): after every step, the residency the events describe (stores
// minus removes per hash, AllBlocksCleared resetting) equals the cached
// copies per hash, and a hash is findable exactly while some copy is.
func TestBlockCopiesResidency(t *testing.T) {
	w, got := copiesWorker(t, 96)
	rng := rand.New(rand.NewPCG(1, 2))
	chains := make([][]uint64, 6)
	for c := range chains {
		for g := range 12 {
			chains[c] = append(chains[c], uint64(1000*(c+1)+g))
		}
	}
	residency := map[uint64]int{}
	apply := func() {
		for _, e := range *got {
			switch e.Kind {
			case KVBlockStored:
				residency[e.Hash]++
			case KVBlockRemoved:
				if residency[e.Hash] == 0 {
					t.Fatalf("BlockRemoved of %d with no copy stored", e.Hash)
				}
				residency[e.Hash]--
			case KVAllCleared:
				clear(residency)
			}
		}
		*got = (*got)[:0]
	}
	check := func() {
		t.Helper()
		checkWorker(t, w)
		copies := map[uint64]int{}
		for _, n := range w.kv.nodes {
			if !n.private && n.blocks > 0 {
				copies[n.key]++
			}
		}
		for k, n := range residency {
			if n != copies[k] {
				t.Fatalf("hash %d: events say %d copies, the cache has %d", k, n, copies[k])
			}
			if _, ok := w.kv.index[k]; ok != (n > 0) {
				t.Fatalf("hash %d: %d copies, findable %v", k, n, ok)
			}
		}
		for k, n := range copies {
			if residency[k] != n {
				t.Fatalf("hash %d: cache has %d copies, events say %d", k, n, residency[k])
			}
		}
	}
	id := 0
	dups := 0
	for round := range 300 {
		for range 1 + rng.IntN(3) {
			id++
			c := chains[rng.IntN(len(chains))]
			blocks := 1 + rng.IntN(len(c))
			n := 16 * blocks // block-aligned: its last block is recomputed on a repeat
			if rng.IntN(2) == 0 {
				n += 1 + rng.IntN(15)
			}
			r := &Request{ID: id, InputLength: n, OutputLength: 1 + rng.IntN(20), PrefixHashes: c[:blocks], PrefixBlockTokens: 16}
			mustSubmit(t, w, w.now, r)
		}
		if round%17 == 0 {
			w.Abort(id)
		}
		if round%97 == 96 {
			w.Drain(nil)
			apply()
			if !w.ClearPrefixCache() {
				t.Fatal("ClearPrefixCache refused on an idle worker")
			}
		}
		end, busy := w.NextEvent()
		if busy {
			w.Advance(end, nil)
		}
		for _, e := range *got {
			if e.Kind == KVBlockStored && residency[e.Hash] > 0 {
				dups++
			}
		}
		apply()
		check()
	}
	w.Drain(nil)
	apply()
	check()
	if dups == 0 {
		t.Fatal("no duplicate copy was ever stored: the test tests nothing")
	}
	t.Logf("%d stores of a hash already cached", dups)
}

// TestBlockCopiesValidates: copies need one group per engine block, and
// must be chosen before any request.
func TestBlockCopiesValidates(t *testing.T) {
	w, _ := copiesWorker(t, 64)
	err := w.Submit(0, &Request{ID: 1, InputLength: 64, OutputLength: 1, PrefixHashes: []uint64{1}, PrefixBlockTokens: 64})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("64-token groups with copies: %v, want ErrInvalidRequest", err)
	}
	v := newWorker(t, DefaultConfig())
	mustSubmit(t, v, 0, &Request{ID: 1, InputLength: 8, OutputLength: 1})
	if err := v.TrackBlockCopies(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("TrackBlockCopies after a submit: %v, want ErrInvalidConfig", err)
	}
}

// cachedBlocks is w.CachedBlocks as a map from hash to copies.
func cachedBlocks(w *Worker) map[uint64]int {
	m := map[uint64]int{}
	w.CachedBlocks(func(h uint64, n int) {
		if _, dup := m[h]; dup {
			m[h] = -1 // a hash reported twice: never equal to a want
			return
		}
		m[h] = n
	})
	return m
}

// TestCachedBlocks: the cache's own view follows the copies as vLLM's
// block pool holds them: one copy per request that computed a block, a
// block-aligned prompt sent again adding a second copy of its last
// block, an eviction taking one copy away; and, without copies tracked,
// one entry per cached group.
func TestCachedBlocks(t *testing.T) {
	w, _ := copiesWorker(t, 8)
	if got := cachedBlocks(w); len(got) != 0 {
		t.Fatalf("empty cache: %v", got)
	}
	h := []uint64{11, 12, 13, 14}
	mustSubmit(t, w, 0, blockReq(1, 64, h))
	w.Drain(nil)
	if got, want := cachedBlocks(w), map[uint64]int{11: 1, 12: 1, 13: 1, 14: 1}; !maps.Equal(got, want) {
		t.Fatalf("after A: %v, want %v", got, want)
	}
	mustSubmit(t, w, w.now, blockReq(2, 64, h))
	w.Drain(nil)
	if got, want := cachedBlocks(w), map[uint64]int{11: 1, 12: 1, 13: 1, 14: 2}; !maps.Equal(got, want) {
		t.Fatalf("after A again: %v, want %v", got, want)
	}
	// C takes the 3 never-used blocks and the LRU head, the first copy
	// of 14.
	mustSubmit(t, w, w.now, blockReq(3, 64, []uint64{21, 22, 23, 24}))
	w.Drain(nil)
	if got, want := cachedBlocks(w), map[uint64]int{11: 1, 12: 1, 13: 1, 14: 1, 21: 1, 22: 1, 23: 1, 24: 1}; !maps.Equal(got, want) {
		t.Fatalf("after C: %v, want %v", got, want)
	}

	cfg := DefaultConfig()
	cfg.TotalKVBlocks = 8
	d := newWorker(t, cfg) // groups deduplicated
	mustSubmit(t, d, 0, blockReq(1, 64, h))
	d.Drain(nil)
	mustSubmit(t, d, d.now, blockReq(2, 64, h))
	d.Drain(nil)
	if got, want := cachedBlocks(d), map[uint64]int{11: 1, 12: 1, 13: 1, 14: 1}; !maps.Equal(got, want) {
		t.Fatalf("without copies, A twice: %v, want %v", got, want)
	}
}
