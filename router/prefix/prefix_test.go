package prefix

import (
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/internal/ilist"
	"github.com/switchyard-router/switchyard/shared"
)

func hashes(ids ...uint64) []uint64 { return ChainHashes(nil, ids) }

func cand[T ~uint64 | ~int](id T) Candidate { return Candidate{ID: shared.WorkerID(id)} }

func TestChainHashSharesPrefixOnly(t *testing.T) {
	a := hashes(0, 1, 2, 3)
	b := hashes(0, 1, 9, 3)
	if a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("equal leading ids must hash equal: %x %x", a[:2], b[:2])
	}
	if a[2] == b[2] || a[3] == b[3] {
		t.Fatalf("a differing block must change every later hash: %x %x", a[2:], b[2:])
	}
}

func TestFillOverlap(t *testing.T) {
	x := New(1)
	for id := shared.WorkerID(1); id <= 4; id++ {
		if err := x.AddWorker(cand(id), 100); err != nil {
			t.Fatal(err)
		}
	}
	x.Record(cand(1), hashes(0, 1, 2, 3))
	x.Record(cand(2), hashes(0, 1))
	x.Record(cand(3), hashes(0, 5, 6))
	// Worker 4 holds nothing.
	req := hashes(0, 1, 2, 7)
	ids := []shared.WorkerID{1, 2, 3, 4}
	got := make([]int32, 4)
	fillRows(x, ids, nil, req, nil, got)
	if diff := cmp.Diff([]int32{3, 2, 1, 0}, got); diff != "" {
		t.Fatalf("overlap (-want +got):\n%s", diff)
	}
	// A candidate subset in order; the scratch must be reset between calls.
	got = got[:2]
	fillRows(x, []shared.WorkerID{2, 3}, nil, req, nil, got)
	if diff := cmp.Diff([]int32{2, 1}, got); diff != "" {
		t.Fatalf("subset overlap (-want +got):\n%s", diff)
	}
	for id, want := range map[shared.WorkerID]int{1: 3, 2: 2, 3: 1, 4: 0, 99: 0} {
		if got := x.Overlap(cand(id), req, nil); got != want {
			t.Errorf("Overlap(%d) = %d, want %d", id, got, want)
		}
	}
}

func TestEvictionTakesSuffixesFirst(t *testing.T) {
	x := New(1)
	if err := x.AddWorker(cand(1), 4); err != nil {
		t.Fatal(err)
	}
	a := hashes(0, 1, 2)
	x.Record(cand(1), a) // holds 0,1,2
	b := hashes(0, 3, 4)
	x.Record(cand(1), b) // needs 2 new slots of 4: evicts a's tail (block 2) only
	if got := x.Len(cand(1)); got != 4 {
		t.Fatalf("Len = %d, want 4 (capacity)", got)
	}
	if got := x.Overlap(cand(1), a, nil); got != 2 {
		t.Errorf("overlap with a = %d, want 2: its suffix block goes first, its prefix stays", got)
	}
	if got := x.Overlap(cand(1), b, nil); got != 3 {
		t.Errorf("overlap with b = %d, want 3", got)
	}
	// The evicted hash is gone from the holder map too.
	ids := []shared.WorkerID{1}
	got := []int32{0}
	fillRows(x, ids, nil, a, nil, got)
	if got[0] != 2 {
		t.Errorf("Fill overlap with a = %d, want 2", got[0])
	}
	if _, ok := x.holders.Load(a[2]); ok {
		t.Errorf("evicted block still has holders")
	}
}

func TestRemoveWorkerPurges(t *testing.T) {
	x := New(1)
	_ = x.AddWorker(cand(1), 10)
	_ = x.AddWorker(cand(2), 10)
	h := hashes(0, 1)
	x.Record(cand(1), h)
	x.Record(cand(2), h)
	x.RemoveWorker(cand(1))
	if hs, _ := x.holders.Load(h[0]); len(hs) != 1 {
		t.Fatalf("holders after removal = %d, want 1", len(hs))
	}
	got := []int32{9, 9}
	fillRows(x, []shared.WorkerID{1, 2}, nil, h, nil, got)
	if diff := cmp.Diff([]int32{0, 2}, got); diff != "" {
		t.Fatalf("overlap after removal (-want +got):\n%s", diff)
	}
	// Rejoining starts empty.
	_ = x.AddWorker(cand(1), 10)
	if x.Overlap(cand(1), h, nil) != 0 || len(*x.byID.Load()) != 2 {
		t.Fatalf("rejoined worker: overlap %d, workers %d; want 0, 2", x.Overlap(cand(1), h, nil), len(*x.byID.Load()))
	}
	x.RemoveWorker(cand(1))
	x.RemoveWorker(cand(2))
	holders := x.holders.Size()
	if holders != 0 || len(*x.byID.Load()) != 0 {
		t.Fatalf("index not empty after removing all: %d holders, %d workers", holders, len(*x.byID.Load()))
	}
}

func TestAddWorkerCapacity(t *testing.T) {
	x := New(1)
	if err := x.AddWorker(cand(1), -1); err == nil {
		t.Fatal("want an error for capacity -1")
	}
	// Unknown capacity (0) is bounded by DefaultUnknownCapacity.
	if err := x.AddWorker(cand(1), 0); err != nil {
		t.Fatal(err)
	}
	ids := make([]uint64, DefaultUnknownCapacity+10)
	for i := range ids {
		ids[i] = uint64(i)
	}
	x.Record(cand(1), hashes(ids...))
	if got := x.Len(cand(1)); got != DefaultUnknownCapacity {
		t.Fatalf("Len = %d, want %d", got, DefaultUnknownCapacity)
	}
}

// AddWorkers joins several candidates in one membership change, with the
// same rules as AddWorker: each bounded by its capacity, a tracked one
// reset, and a negative capacity refusing the whole batch.
func TestAddWorkers(t *testing.T) {
	x := New(1)
	_ = x.AddWorker(cand(1), 10)
	x.Record(cand(1), hashes(0, 1, 2))
	if _, err := x.AddWorkers(Member{Candidate: cand(2), Capacity: 2}, Member{Candidate: cand(3), Capacity: -1}); err == nil {
		t.Fatal("want an error for capacity -1")
	}
	if n := len(*x.byID.Load()); n != 1 {
		t.Fatalf("%d members after a refused batch, want 1", n)
	}
	slots, err := x.AddWorkers(Member{Candidate: cand(1), Capacity: 10}, Member{Candidate: cand(2), Capacity: 2}, Member{Candidate: cand(3), Capacity: 0})
	if err != nil {
		t.Fatal(err)
	}
	// Candidate 1 keeps its slot; the others take the next ones.
	if diff := cmp.Diff([]int32{0, 1, 2}, slots); diff != "" {
		t.Errorf("slots (-want +got):\n%s", diff)
	}
	if n := len(*x.byID.Load()); n != 3 {
		t.Fatalf("%d members, want 3", n)
	}
	if got := x.Len(cand(1)); got != 0 {
		t.Errorf("re-added candidate 1 holds %d blocks, want 0 (reset)", got)
	}
	x.Record(cand(2), hashes(0, 1, 2))
	x.Record(cand(3), hashes(0, 1, 2))
	if a, b := x.Len(cand(2)), x.Len(cand(3)); a != 2 || b != 3 {
		t.Errorf("Len = %d, %d; want 2 (its capacity) and 3", a, b)
	}
}

func BenchmarkFill(b *testing.B) {
	x := New(1)
	ids := make([]shared.WorkerID, 64)
	for i := range ids {
		ids[i] = shared.WorkerID(i)
		_ = x.AddWorker(cand(ids[i]), 1000)
		x.Record(cand(ids[i]), hashes(0, uint64(i), 2, 3))
	}
	req := hashes(0, 5, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
	out := make([]int32, len(ids))
	slots := make([]int32, len(ids))
	for i, id := range ids {
		slots[i] = x.Slot(cand(id))
	}
	b.ReportAllocs()
	for b.Loop() {
		x.Fill(slots, req, nil, out)
	}
}

// BenchmarkFillPrecise is BenchmarkFill over 64 live precise candidates
// (engine blocks of 4 tokens, a request of 16 such blocks at block size
// 4): candidate i holds the prompt's first i%9 blocks on GPU and the next
// 4 on its CPU tier, so each row costs the GPU lookups and, for the
// CPU-tier figure (tiers: FillTiersAt, what a selection declaring CACHE
// runs), the CPU lookups after them; gpu is FillAt, the GPU figure alone.
// The prompt's hashes are computed once (prefix.Key caches them), as a
// selection's are.
//
//	go test -run='^$' -bench=FillPrecise -benchmem ./router/prefix/
func BenchmarkFillPrecise(b *testing.B) {
	x := New(4)
	const n = 64
	blocks := make([]uint64, 16)
	for k := range blocks {
		blocks[k] = uint64(k + 1)
	}
	slots := make([]int32, n)
	for i := range n {
		if err := x.AddWorker(cand(i), 1000); err != nil {
			b.Fatal(err)
		}
		p := x.Precise(cand(i))
		p.MarkLive()
		gpu := i % 9
		apply(p, bootStore(blocks[:gpu+4], nil, "GPU"))
		apply(p, bootStore(blocks[gpu:gpu+4], nil, "CPU"), bootRemove("GPU", blocks[gpu:gpu+4]...))
		slots[i] = x.Slot(cand(i))
	}
	key := bootKey(blocks...)
	out, cpu := make([]int32, n), make([]int32, n)
	x.FillTiersAt(slots, nil, 4, key, out, cpu)
	for i := range n {
		if want := int32(i % 9); out[i] != want || cpu[i] != 4 {
			b.Fatalf("row %d: overlap %d, CPU tier %d; want %d and 4", i, out[i], cpu[i], want)
		}
	}
	b.Run("gpu", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			x.FillAt(slots, nil, 4, key, out)
		}
	})
	b.Run("tiers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			x.FillTiersAt(slots, nil, 4, key, out, cpu)
		}
	})
}

// TestConcurrentRecordFillRemove runs records, lookups and membership
// changes from many goroutines (for the race detector) and then checks
// that the index agrees with itself: every holder of a block holds it in
// its own list, and the overlap Fill reports for each worker equals
// Overlap's.
func TestConcurrentRecordFillRemove(t *testing.T) {
	x := New(1)
	for id := range shared.WorkerID(8) {
		if err := x.AddWorker(cand(id), 64); err != nil {
			t.Fatal(err)
		}
	}
	ids := []shared.WorkerID{0, 1, 2, 3, 4, 5, 6, 7}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blocks := make([]uint64, 12)
			overlap := make([]int32, len(ids))
			for i := range 500 {
				for k := range blocks {
					blocks[k] = uint64((g+i)%5*100 + k)
				}
				h := ChainHashes(nil, blocks[:1+i%12])
				x.Record(cand(shared.WorkerID((g+i)%8)), h)
				fillRows(x, ids, nil, h, nil, overlap)
				_ = x.Overlap(cand(shared.WorkerID(i%8)), h, nil)
				if g == 0 && i%100 == 99 {
					x.RemoveWorker(cand(7))
					_ = x.AddWorker(cand(7), 64)
				}
			}
		}()
	}
	wg.Wait()
	{
		for h, hs := range x.holders.All() {
			for _, w := range hs {
				l := (*x.bySlot.Load())[w]
				if l == nil {
					t.Fatalf("block %x held by untracked worker %d", h, w)
				}
				if _, ok := l.lru.pos.get(h); !ok {
					t.Fatalf("block %x listed as held by %d, which does not hold it", h, w)
				}
			}
		}
	}
	for g := range 5 {
		blocks := make([]uint64, 12)
		for k := range blocks {
			blocks[k] = uint64(g*100 + k)
		}
		h := ChainHashes(nil, blocks)
		overlap := make([]int32, len(ids))
		fillRows(x, ids, nil, h, nil, overlap)
		for i, id := range ids {
			if want := x.Overlap(cand(id), h, nil); int(overlap[i]) != want {
				t.Fatalf("prefix %d, worker %d: Fill says %d, Overlap %d", g, id, overlap[i], want)
			}
		}
	}
}

// TestRecordOverlapIsOverlapThenRecord: RecordOverlap returns what
// Overlap said just before, and leaves the index as Record does.
func TestRecordOverlapIsOverlapThenRecord(t *testing.T) {
	a, b := New(1), New(1)
	for _, x := range []*Index{a, b} {
		_ = x.AddWorker(cand(1), 6)
	}
	prompts := [][]uint64{hashes(0, 1, 2), hashes(0, 1, 3, 4), hashes(0, 1, 2, 5), hashes(7), hashes(0, 1, 3, 4, 8, 9), hashes(0)}
	for i, h := range prompts {
		want := a.Overlap(cand(1), h, nil)
		a.Record(cand(1), h)
		if got := b.RecordOverlap(cand(1), h, nil); got != want {
			t.Fatalf("prompt %d: RecordOverlap %d, Overlap before Record %d", i, got, want)
		}
		for _, q := range prompts {
			if a.Overlap(cand(1), q, nil) != b.Overlap(cand(1), q, nil) {
				t.Fatalf("after prompt %d the two indexes differ on %v", i, q)
			}
		}
	}
	if b.RecordOverlap(cand(2), hashes(0), nil) != 0 || b.RecordOverlap(cand(1), nil, nil) != 0 {
		t.Fatal("unknown worker or no hashes: want 0")
	}
}

// fillRows is Fill over the candidates (ids[i], ranks[i]) (ranks nil: all 0),
// by their slots.
func fillRows(x *Index, ids []shared.WorkerID, ranks []uint32, hashes []uint64, prompt shared.PromptKey, out []int32) {
	slots := make([]int32, len(ids))
	for i, id := range ids {
		c := Candidate{ID: id}
		if ranks != nil {
			c.Rank = ranks[i]
		}
		slots[i] = x.Slot(c)
	}
	x.Fill(slots, hashes, prompt, out)
}

// TestRecordSharesHolderLists: the blocks of a prompt sent to the same
// candidates share one holder list (what lets Fill walk a prefix held by
// n candidates once, not once per block), also after a candidate leaves
// and after eviction takes one candidate's copy of the tail.
func TestRecordSharesHolderLists(t *testing.T) {
	x := New(1)
	for id := range 4 {
		if err := x.AddWorker(cand(id), 100); err != nil {
			t.Fatal(err)
		}
	}
	h := hashes(1, 2, 3, 4, 5, 6, 7, 8)
	lists := func(hs []uint64) [][]int32 {
		var out [][]int32
		for _, b := range hs {
			l, _ := x.holders.Load(b)
			out = append(out, l)
		}
		return out
	}
	shared := func(what string, hs []uint64, want []int32) {
		t.Helper()
		ls := lists(hs)
		for k, l := range ls {
			if diff := cmp.Diff(want, l); diff != "" {
				t.Fatalf("%s: block %d holders (-want +got):\n%s", what, k, diff)
			}
			if !sameList(l, ls[0]) {
				t.Fatalf("%s: block %d has its own copy of the holder list", what, k)
			}
		}
	}
	for id := range 4 {
		x.Record(cand(id), h)
	}
	shared("sent to all four", h, []int32{0, 1, 2, 3})
	x.RemoveWorker(cand(2))
	shared("after one left", h, []int32{0, 1, 3})
	// Worker 0 records a prompt that shares the first 4 blocks and has 4
	// new ones: the first 4 keep one list; the new 4 share worker 0's
	// one-slot list.
	h2 := append(h[:4:4], hashes(1, 2, 3, 4, 50, 60, 70, 80)[4:]...)
	x.Record(cand(0), h2)
	shared("the shared part", h2[:4], []int32{0, 1, 3})
	shared("the new part", h2[4:], []int32{0})
}

// TestFillAgreesWithOverlap: whatever the index holds (prefixes recorded
// in part, blocks held without the block before them, eviction, leaving
// and rejoining), Fill's overlap of every candidate equals Overlap's,
// which counts leading blocks in the candidate's own list one by one.
// The block ids are drawn from a small range and not chained, so lists
// that are equal without being shared, and holdings that are not
// prefixes, both occur.
func TestFillAgreesWithOverlap(t *testing.T) {
	x := New(1)
	const n = 6
	ids := make([]shared.WorkerID, n)
	for i := range ids {
		ids[i] = shared.WorkerID(i)
		if err := x.AddWorker(cand(i), 5+i); err != nil {
			t.Fatal(err)
		}
	}
	rng := uint64(1)
	next := func(m int) int {
		rng = rng*6364136223846793005 + 1442695040888963407
		return int(rng>>33) % m
	}
	prompt := func() []uint64 {
		p := make([]uint64, 1+next(8))
		for k := range p {
			p[k] = uint64(next(10))
		}
		return p
	}
	got := make([]int32, n)
	for step := range 3000 {
		switch r := next(20); {
		case r == 0:
			c := cand(next(n))
			x.RemoveWorker(c)
			if err := x.AddWorker(c, 5+int(c.ID)); err != nil {
				t.Fatal(err)
			}
		case r < 12:
			x.Record(cand(next(n)), prompt())
		default:
			q := prompt()
			fillRows(x, ids, nil, q, nil, got)
			for i, id := range ids {
				if want := x.Overlap(cand(id), q, nil); int(got[i]) != want {
					t.Fatalf("step %d: Fill gives worker %d %d leading blocks of %v, Overlap %d", step, id, got[i], q, want)
				}
			}
		}
	}
}

// An entry a call set 2^32 calls ago carries the stamp the wrapped counter
// hands out again: begin clears the entries when it wraps, so the entry
// reads as depth 0, not as the old call's depth.
func TestDepthScratchStampWraps(t *testing.T) {
	var d depthScratch
	depth, first := d.begin(4)
	if first != 1<<32 {
		t.Fatalf("first stamp %#x, want 1<<32", first)
	}
	depth[2] = first | 5
	d.stamp = stampMask // the last call had the largest stamp
	depth, again := d.begin(4)
	if again != first || depth[2] != 0 {
		t.Fatalf("after the wrap: stamp %#x (want %#x), entry %#x (want 0)", again, first, depth[2])
	}
	// Growing keeps counting and reads every new entry as depth 0.
	depth, grown := d.begin(8)
	if len(depth) != 8 || grown != again+1<<32 || depth[7] != 0 {
		t.Fatalf("grown: len %d stamp %#x entry %#x", len(depth), grown, depth[7])
	}
}

// Recording keeps the list in the order a naive recency list would: each
// prompt's blocks most recent, its first block first, the least recent
// evicted. The prompts repeat and nest often, so the front-match shortcut
// (lru.run) is taken, and not taken, many times.
func TestRecordOrderMatchesNaiveRecency(t *testing.T) {
	const capacity = 12
	x := New(1)
	c := cand(1)
	if err := x.AddWorker(c, capacity); err != nil {
		t.Fatal(err)
	}
	var naive []uint64 // front first
	rng := uint64(7)
	next := func(m int) int {
		rng = rng*6364136223846793005 + 1442695040888963407
		return int(rng>>33) % m
	}
	prompts := [][]uint64{hashes(1, 2, 3, 4), hashes(1, 2), hashes(1, 2, 3, 4, 5, 6), hashes(9, 8, 7), hashes(1, 5)}
	shortcuts := 0
	for step := range 2000 {
		p := prompts[next(len(prompts))]
		m := x.member(c)
		m.lru.mu.Lock()
		if _, _, ok := m.lru.run(p); ok {
			shortcuts++
		}
		m.lru.mu.Unlock()
		x.Record(c, p)
		for i := len(p) - 1; i >= 0; i-- {
			naive = slices.DeleteFunc(naive, func(h uint64) bool { return h == p[i] })
			naive = append([]uint64{p[i]}, naive...)
		}
		if len(naive) > capacity {
			naive = naive[:capacity]
		}
		var got []uint64
		l := m.lru
		l.mu.Lock()
		for i := l.order.Front(); i != ilist.None; i = l.order.Next(i) {
			got = append(got, l.hash[i])
		}
		l.mu.Unlock()
		if !slices.Equal(got, naive) {
			t.Fatalf("step %d: list %x, naive recency %x", step, got, naive)
		}
	}
	if shortcuts < 100 || shortcuts > 1900 {
		t.Fatalf("the shortcut was taken %d times of 2000: the test does not exercise both ways", shortcuts)
	}
}

// RecordAt records on the candidate it names whatever the slot hint says:
// the hint is taken when the slot is still that candidate's, and a slot
// reused since by another, out of range or negative falls back to the id.
func TestRecordAtStaleSlot(t *testing.T) {
	x := New(1)
	for id := 1; id <= 2; id++ {
		if err := x.AddWorker(cand(id), 10); err != nil {
			t.Fatal(err)
		}
	}
	s1 := x.Slot(cand(1))
	s2 := x.Slot(cand(2))
	x.RemoveWorker(cand(1))
	if err := x.AddWorker(cand(3), 10); err != nil {
		t.Fatal(err)
	}
	if s3 := x.Slot(cand(3)); s3 != s1 {
		t.Fatalf("worker 3 took slot %d, not worker 1's %d: the test needs the reuse", s3, s1)
	}
	p, q, r := hashes(1, 2), hashes(3), hashes(4, 5, 6)
	x.RecordAt(s1, cand(2), p) // worker 3's slot now
	x.RecordAt(99, cand(2), q)
	x.RecordAt(s2, cand(2), r) // its own
	x.RecordAt(s1, cand(1), r) // gone: nothing
	for _, c := range []struct {
		id     int
		prompt []uint64
		want   int
	}{{2, p, 2}, {2, q, 1}, {2, r, 3}, {3, p, 0}, {3, r, 0}} {
		if got := x.Overlap(cand(c.id), c.prompt, nil); got != c.want {
			t.Errorf("worker %d holds %d blocks of %x, want %d", c.id, got, c.prompt, c.want)
		}
	}
}
