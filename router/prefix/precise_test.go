package prefix

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/shared"
)

func stored(parent *uint64, hashes []uint64, tokens []int64, size int64) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: size}
	if parent != nil {
		ev.ParentBlockHash, ev.HasParent = *parent, true
	}
	return ev
}

// setLen is the blocks held on GPU, as the lookup table counts them.
func setLen(p *Precise) int { return p.w.held[0] }

func ptr(v uint64) *uint64 { return &v }

func apply(p *Precise, evs ...kvevents.Event) { p.Apply(&kvevents.Batch{Events: evs}) }

// preciseIndex returns an index of 4-token router blocks with candidate 1
// precise and live (capacity 100 router blocks) and candidate 2
// approximate.
func preciseIndex(t *testing.T) (*Index, *Precise) {
	t.Helper()
	x := New(4)
	for id := 1; id <= 2; id++ {
		if err := x.AddWorker(cand(id), 100); err != nil {
			t.Fatal(err)
		}
	}
	p := x.Precise(cand(1))
	p.MarkLive()
	return x, p
}

func fill(x *Index, prompt shared.PromptKey, routerHashes []uint64) []int32 {
	out := make([]int32, 2)
	fillRows(x, []shared.WorkerID{1, 2}, nil, routerHashes, prompt, out)
	return out
}

func TestPreciseStoreRemoveOverlap(t *testing.T) {
	x, p := preciseIndex(t)
	// Engine blocks of 2 tokens, hashes opaque to the router.
	apply(p, stored(nil, []uint64{100, 101, 102}, []int64{1, 2, 3, 4, 5, 6}, 2))
	key := &Key{IDs: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}}
	if got, ok := x.OverlapTokens(cand(1), nil, key); got != 6 || !ok {
		t.Fatalf("OverlapTokens = %d, %v; want 6 exact", got, ok)
	}
	// 3 engine blocks of 2 = 6 tokens = 1 router block of 4 (floor).
	if diff := cmp.Diff([]int32{1, 0}, fill(x, key, nil)); diff != "" {
		t.Fatalf("overlap (-want +got):\n%s", diff)
	}
	// A child of block 102 extends the chain through the parent map.
	apply(p, stored(ptr(102), []uint64{103}, []int64{7, 8}, 2))
	if diff := cmp.Diff([]int32{2, 0}, fill(x, key, nil)); diff != "" {
		t.Fatalf("after child (-want +got):\n%s", diff)
	}
	if got := x.Overlap(cand(1), nil, key); got != 2 {
		t.Fatalf("Overlap = %d, want 2", got)
	}
	// A prompt that differs in its second block shares only the first.
	other := &Key{IDs: []int64{1, 2, 9, 9, 5, 6, 7, 8}}
	if got, _ := x.OverlapTokens(cand(1), nil, other); got != 2 {
		t.Fatalf("diverging prompt: %d tokens, want 2", got)
	}
	// Removing block 101 cuts the lead at one block.
	p.Apply(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{101}}}})
	if got, _ := x.OverlapTokens(cand(1), nil, key); got != 2 {
		t.Fatalf("after removal: %d tokens, want 2", got)
	}
	if diff := cmp.Diff([]int32{0, 0}, fill(x, key, nil)); diff != "" {
		t.Fatalf("after removal (-want +got):\n%s", diff)
	}
	s := p.Stats()
	if s.Stored != 4 || s.Removed != 1 || s.Blocks != 3 || !s.Live || s.BlockSize != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPreciseUnknownParentSkipped(t *testing.T) {
	x, p := preciseIndex(t)
	apply(p, stored(ptr(55), []uint64{100, 101}, []int64{1, 2, 3, 4}, 2))
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{1, 2, 3, 4}}); got != 0 {
		t.Fatalf("blocks under an unknown parent counted: %d tokens", got)
	}
	if s := p.Stats(); s.SkippedParent != 2 || s.Blocks != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPreciseLoRAExtraKeysTiers(t *testing.T) {
	x, p := preciseIndex(t)
	ids := []int64{1, 2, 3, 4}
	lora := stored(nil, []uint64{1, 2}, ids, 2)
	lora.LoRAName = []byte("ad")
	apply(p, lora)
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids}); got != 0 {
		t.Fatalf("LoRA blocks matched a base-model request: %d", got)
	}
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids, LoRA: "ad"}); got != 4 {
		t.Fatalf("LoRA request: %d tokens, want 4", got)
	}
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids, LoRA: "other"}); got != 0 {
		t.Fatalf("another adapter matched: %d", got)
	}
	// A multimodal block (extra keys) never matches text, nor its children.
	mm := stored(nil, []uint64{10, 11}, []int64{7, 7, 8, 8}, 2)
	mm.ExtraKeys = [][]byte{{0x91, 0xa3, 'i', 'm', 'g'}, nil}
	apply(p, mm)
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{7, 7, 8, 8}}); got != 0 {
		t.Fatalf("extra-keys block matched text: %d", got)
	}
	// CPU-tier blocks are not GPU hits; a CPU removal leaves the GPU copy;
	// a disk-tier store is skipped.
	cpu := stored(nil, []uint64{20}, []int64{5, 5}, 2)
	cpu.Medium = []byte("CPU")
	apply(p, cpu)
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{5, 5}}); got != 0 {
		t.Fatalf("CPU block counted: %d", got)
	}
	gpu := stored(nil, []uint64{21}, []int64{6, 6}, 2)
	gpu.Medium = []byte("GPU")
	apply(p, gpu, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{21}, Medium: []byte("CPU")})
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{6, 6}}); got != 2 {
		t.Fatalf("GPU block after a CPU removal: %d tokens, want 2", got)
	}
	disk := stored(nil, []uint64{22}, []int64{7, 7}, 2)
	disk.Medium = []byte("DISK")
	apply(p, disk)
	if s := p.Stats(); s.SkippedTier != 1 || s.CPUBlocks != 1 || s.GPUBlocks != 5 {
		t.Fatalf("stats %+v, want 1 block skipped for its tier, 1 CPU block, 5 GPU blocks (2 LoRA, 2 multimodal, 1 base)", s)
	}
}

func TestPreciseGroupsNeedEveryGroup(t *testing.T) {
	x, p := preciseIndex(t)
	ids := []int64{1, 2, 3, 4}
	g := func(ev kvevents.Event, idx int64) kvevents.Event {
		ev.GroupIdx, ev.HasGroupIdx = idx, true
		return ev
	}
	key := &Key{IDs: ids}
	apply(p, g(stored(nil, []uint64{1, 2}, ids, 2), 0))
	if got, _ := x.OverlapTokens(cand(1), nil, key); got != 4 {
		t.Fatalf("one group: %d tokens, want 4", got)
	}
	// Group 1 appears holding only the first block: only it counts.
	apply(p, g(stored(nil, []uint64{1}, ids[:2], 2), 1))
	if got, _ := x.OverlapTokens(cand(1), nil, key); got != 2 {
		t.Fatalf("two groups, second holds block 0: %d tokens, want 2", got)
	}
	if diff := cmp.Diff([]int32{0, 0}, fill(x, key, nil)); diff != "" { // 2 tokens < one router block
		t.Fatalf("(-want +got):\n%s", diff)
	}
	apply(p, g(stored(ptr(1), []uint64{2}, ids[2:], 2), 1))
	if diff := cmp.Diff([]int32{1, 0}, fill(x, key, nil)); diff != "" {
		t.Fatalf("both groups hold both (-want +got):\n%s", diff)
	}
	// Group 0 dropping block 0 withdraws it.
	apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1}, GroupIdx: 0, HasGroupIdx: true})
	if got, _ := x.OverlapTokens(cand(1), nil, key); got != 0 {
		t.Fatalf("after group 0 removed block 0: %d tokens", got)
	}
	// A group at another block size: skipped, and nothing counts any more.
	apply(p, g(stored(nil, []uint64{9}, []int64{1, 2, 3, 4}, 4), 2))
	if s := p.Stats(); s.SkippedBlockSize != 1 {
		t.Fatalf("SkippedBlockSize = %d", s.SkippedBlockSize)
	}
	apply(p, g(stored(nil, []uint64{30}, []int64{8, 8}, 2), 0), g(stored(nil, []uint64{30}, []int64{8, 8}, 2), 1))
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{8, 8}}); got != 0 {
		t.Fatalf("group 2 never stored it, yet %d tokens", got)
	}
}

func TestPreciseBoundEvictsOldest(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 2) // 2 router blocks = 8 tokens; bound 2·8/2 = 8 engine blocks
	p := x.Precise(cand(1))
	p.MarkLive()
	ids := make([]int64, 20)
	hs := make([]uint64, 10)
	for i := range ids {
		ids[i] = int64(i)
	}
	for i := range hs {
		hs[i] = uint64(100 + i)
	}
	apply(p, stored(nil, hs, ids, 2))
	s := p.Stats()
	if s.Blocks != 8 || s.Evicted != 2 {
		t.Fatalf("stats %+v, want 8 blocks and 2 evicted", s)
	}
	// The first two (least recently stored) went: nothing leads any more.
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids}); got != 0 {
		t.Fatalf("overlap %d after the head was evicted", got)
	}
	if n := setLen(p); n != 8 {
		t.Fatalf("holder map has %d blocks, want 8", n)
	}
	if p.engine.len() != 8 {
		t.Fatalf("engine map has %d entries, want 8", p.engine.len())
	}
}

func TestPreciseColdScoresApproximately(t *testing.T) {
	x := New(2)
	_ = x.AddWorker(cand(1), 100)
	_ = x.AddWorker(cand(2), 100)
	p := x.Precise(cand(1))
	ids := []int64{1, 2, 3, 4}
	key := &Key{IDs: ids}
	routerHashes := TokenBlocks(ids, 2)
	x.Record(cand(1), routerHashes[:1]) // dispatch belief: one block
	apply(p, stored(nil, []uint64{1, 2}, ids, 2))
	if diff := cmp.Diff([]int32{1, 0}, fill(x, key, routerHashes)); diff != "" {
		t.Fatalf("cold: approximate (-want +got):\n%s", diff)
	}
	p.MarkLive()
	if diff := cmp.Diff([]int32{2, 0}, fill(x, key, routerHashes)); diff != "" {
		t.Fatalf("live: precise (-want +got):\n%s", diff)
	}
	// A text-only request (no token ids) scores the live candidate approximately.
	if diff := cmp.Diff([]int32{1, 0}, fill(x, nil, routerHashes)); diff != "" {
		t.Fatalf("text prompt (-want +got):\n%s", diff)
	}
	p.Clear()
	if s := p.Stats(); s.Live || s.Blocks != 0 || s.Resets != 1 || setLen(p) != 0 {
		t.Fatalf("after Clear: %+v, holder map %d", s, setLen(p))
	}
	if diff := cmp.Diff([]int32{1, 0}, fill(x, key, routerHashes)); diff != "" {
		t.Fatalf("cleared: approximate (-want +got):\n%s", diff)
	}
	// AllBlocksCleared makes the engine's state known: live again.
	apply(p, kvevents.Event{Kind: kvevents.AllBlocksCleared}, stored(nil, []uint64{1}, ids[:2], 2))
	if s := p.Stats(); !s.Live || s.Blocks != 1 {
		t.Fatalf("after AllBlocksCleared: %+v", s)
	}
	// RemoveWorker keeps it: events still apply, and the candidate
	// re-added is scored by it at once.
	x.RemoveWorker(cand(1))
	apply(p, stored(nil, []uint64{5}, []int64{9, 9}, 2))
	if s := p.Stats(); !s.Live || s.Blocks != 2 {
		t.Fatalf("removed candidate's precise index: %+v, want live with 2 blocks", s)
	}
	if err := x.AddWorker(cand(1), 10); err != nil {
		t.Fatal(err)
	}
	if got := x.Precise(cand(1)); got != p {
		t.Fatal("re-added candidate got a new precise index")
	}
	if diff := cmp.Diff([]int32{1, 0}, fill(x, key, routerHashes)); diff != "" {
		t.Fatalf("re-added: precise (-want +got):\n%s", diff)
	}
	// DropPrecise ends it.
	x.DropPrecise(cand(1))
	apply(p, stored(nil, []uint64{6}, []int64{8, 8}, 2))
	if setLen(p) != 0 || x.live.Load() != 0 {
		t.Fatalf("dropped precise index still indexed: %d blocks, %d live", setLen(p), x.live.Load())
	}
	if x.Precise(cand(1)) == p {
		t.Fatal("Precise after DropPrecise returned the dropped index")
	}
}

func TestPreciseDataParallelRanks(t *testing.T) {
	x := New(2)
	a, b := Candidate{ID: 7, Rank: 0}, Candidate{ID: 7, Rank: 1}
	_ = x.AddWorker(a, 10)
	_ = x.AddWorker(b, 10)
	pb := x.Precise(b)
	pb.MarkLive()
	ids := []int64{1, 2, 3, 4}
	apply(pb, stored(nil, []uint64{1, 2}, ids, 2))
	out := make([]int32, 2)
	fillRows(x, []shared.WorkerID{7, 7}, []uint32{0, 1}, nil, &Key{IDs: ids}, out)
	if diff := cmp.Diff([]int32{0, 2}, out); diff != "" {
		t.Fatalf("per-rank overlap (-want +got):\n%s", diff)
	}
	x.Record(a, TokenBlocks(ids, 2))
	fillRows(x, []shared.WorkerID{7, 7}, []uint32{0, 1}, TokenBlocks(ids, 2), nil, out)
	if diff := cmp.Diff([]int32{2, 0}, out); diff != "" {
		t.Fatalf("approximate per rank (-want +got):\n%s", diff)
	}
}

func TestKeyCachesPerSize(t *testing.T) {
	k := &Key{IDs: []int64{1, 2, 3, 4, 5}}
	h2 := k.TokenBlockHashes(2)
	if diff := cmp.Diff(TokenBlocks(k.IDs, 2), h2); diff != "" {
		t.Fatal(diff)
	}
	if &k.TokenBlockHashes(2)[0] != &h2[0] {
		t.Fatal("hashes at one size computed twice")
	}
	if h := k.TokenBlockHashes(8); h == nil || len(h) != 0 {
		t.Fatalf("short prompt: %v, want empty non-nil", h)
	}
	if (&Key{}).TokenBlockHashes(2) != nil {
		t.Fatal("no ids: want nil")
	}
}

// TestPreciseConcurrentApplyFill applies events while selections read
// (for the race detector), then checks the holder map against the
// candidates' own state.
func TestPreciseConcurrentApplyFill(t *testing.T) {
	x := New(2)
	ps := make([]*Precise, 4)
	for i := range ps {
		_ = x.AddWorker(cand(i), 8)
		ps[i] = x.Precise(cand(i))
		ps[i].MarkLive()
	}
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range 300 {
				ids := []int64{int64(n % 7), 1, int64(n % 3), 2}
				apply(p, stored(nil, []uint64{uint64(n*10 + i), uint64(n*10 + i + 1)}, ids, 2))
				if n%5 == 0 {
					apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(n*10 + i)}})
				}
				if n%50 == 0 {
					p.Clear()
					p.MarkLive()
				}
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]int32, 4)
			for n := range 300 {
				fillRows(x, []shared.WorkerID{0, 1, 2, 3}, nil, nil, &Key{IDs: []int64{int64(n % 7), 1, int64(n % 3), 2}}, out)
			}
		}()
	}
	wg.Wait()
	for _, p := range ps {
		held := 0
		for i := p.head; i >= 0; i = p.slot(i).next {
			if p.held(tierGPU, i) {
				held++
				if !p.w.has(p.slot(i).rh, flagGPU) {
					t.Fatalf("held block %x missing from the lookup set", p.slot(i).rh)
				}
			}
		}
		if held != setLen(p) {
			t.Fatalf("lookup set has %d blocks, index holds %d", setLen(p), held)
		}
		if s := p.Stats(); s.Blocks > 16 { // 2·8 router blocks·2 tokens / 2
			t.Fatalf("bound exceeded: %+v", s)
		}
	}
}

// A stream whose engine hashes are the router's chained hashes (replay's
// simulated engines) is keyed by them once KeyByEngineHashes is set, with
// no token ids, and found by a HashKey at E; without the option the same
// events are malformed (no token ids) and never count.
func TestPreciseEngineHashKeys(t *testing.T) {
	chain := func(ids ...uint64) []uint64 { return ChainHashes(nil, ids) }
	held := chain(7, 8, 9)
	ev := func() []kvevents.Event {
		return []kvevents.Event{
			stored(nil, held[:2], nil, 4),
			stored(ptr(held[1]), held[2:], nil, 4),
		}
	}

	x, p := preciseIndex(t) // router blocks of 4 tokens
	apply(p, ev()...)
	// Stores without token ids are keyed through earlier stores of their
	// engine hashes, and there are none.
	if s := p.Stats(); s.SkippedUnresolved != 3 || s.Blocks != 0 {
		t.Fatalf("without engine keys: stats %+v, want 3 unresolved blocks and none held", s)
	}
	// Nor did any teach it E: the candidate is scored approximately.
	if got, ok := x.OverlapTokens(cand(1), nil, &HashKey{Hashes: held, BlockSize: 4}); got != 0 || ok {
		t.Fatalf("without engine keys: OverlapTokens = %d, %v; want 0 approximate", got, ok)
	}

	x, p = preciseIndex(t)
	p.KeyByEngineHashes()
	apply(p, ev()...)
	want := chain(7, 8, 10, 11) // shares two leading blocks
	key := &HashKey{Hashes: want, BlockSize: 4}
	if got, ok := x.OverlapTokens(cand(1), nil, key); got != 8 || !ok {
		t.Fatalf("OverlapTokens = %d, %v; want 8 exact", got, ok)
	}
	if diff := cmp.Diff([]int32{3, 0}, fill(x, &HashKey{Hashes: held, BlockSize: 4}, held)); diff != "" {
		t.Fatalf("Fill (-want +got):\n%s", diff)
	}
	// At another size the prompt is unknown: scored approximately (the
	// approximate list holds nothing).
	if got, ok := x.OverlapTokens(cand(1), nil, &HashKey{Hashes: want, BlockSize: 8}); got != 0 || ok {
		t.Fatalf("HashKey at another size: %d, %v; want 0 approximate", got, ok)
	}
	// BlockRemoved by engine hash cuts the lead.
	apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: held[1:2]})
	if got, _ := x.OverlapTokens(cand(1), nil, key); got != 4 {
		t.Fatalf("after removal: %d tokens, want 4", got)
	}
	// A block at another size is skipped, as for any stream.
	apply(p, stored(nil, chain(1), nil, 8))
	if s := p.Stats(); s.Stored != 3 || s.Removed != 1 || s.Blocks != 2 || s.SkippedBlockSize != 1 || s.SkippedMalformed != 0 {
		t.Fatalf("stats %+v", s)
	}
	if got := (&HashKey{BlockSize: 4}).TokenBlockHashes(4); got == nil || len(got) != 0 {
		t.Fatalf("empty HashKey: %v, want empty, not nil", got)
	}
}

// A request's blocks the engine has not published yet count as held while
// it is in flight (AddInflight), for the requests placed after it; its
// release (idempotent, by its booking) ends that, and what the engine then
// publishes is what counts.
func TestInflightCountsUntilReleased(t *testing.T) {
	x, p := preciseIndex(t) // candidate 1 precise and live; E is set by the first store
	c := Candidate{ID: 1}
	ids := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(100 + i)
		}
		return out
	}
	// The engine holds the first 2-token block of the prompt.
	apply(p, stored(nil, []uint64{11}, ids(2), 2))
	a := &Key{IDs: ids(8)} // 4 blocks of 2: 1 held, 3 new
	if got, _ := x.OverlapTokens(c, nil, a); got != 2 {
		t.Fatalf("before: %d tokens, want 2", got)
	}
	inA := x.AddInflight(c, a)
	if inA == nil || len(inA.hashes) != 3 {
		t.Fatalf("AddInflight: %+v, want the 3 blocks not held", inA)
	}
	// A second request sharing 3 of A's blocks, placed while A is in flight.
	b := &Key{IDs: append(ids(6), 7, 7)}
	if got, _ := x.OverlapTokens(c, nil, b); got != 6 {
		t.Fatalf("with A in flight: %d tokens, want 6", got)
	}
	inB := x.AddInflight(c, b) // B's last block only
	if inB == nil || len(inB.hashes) != 3 {
		t.Fatalf("AddInflight(B): %+v", inB)
	}
	inA.Release()
	inA.Release() // idempotent: B's counts of the shared blocks stay
	if got, _ := x.OverlapTokens(c, nil, a); got != 8 {
		t.Fatalf("A just released: %d tokens of A, want 8 (lingering)", got)
	}
	for range lingerBatches {
		apply(p)
	}
	if got, _ := x.OverlapTokens(c, nil, a); got != 6 {
		t.Fatalf("A released, B in flight: %d tokens of A, want 6 (B still holds them)", got)
	}
	// Released through a booking.
	fw := &fleet.Worker{}
	bk := fleet.Book(fw, 0, 0)
	bk.SetHeld(inB)
	bk.Release()
	// Released, the blocks linger for lingerBatches batches of the
	// engine's stream (their store events may still be on the way).
	for i := range lingerBatches {
		if got, _ := x.OverlapTokens(c, nil, a); got != 6 {
			t.Fatalf("both released, %d batches later: %d tokens, want 6 (lingering)", i, got)
		}
		apply(p)
	}
	if got, _ := x.OverlapTokens(c, nil, a); got != 2 {
		t.Fatalf("both released, %d batches later: %d tokens, want the held 2", lingerBatches, got)
	}
	if n := p.inflightN.Load(); n != 0 {
		t.Fatalf("%d in-flight keys left", n)
	}
	// A fully held prompt needs none; a cold index counts none.
	if x.AddInflight(c, &Key{IDs: ids(2)}) != nil {
		t.Error("AddInflight of a held prompt")
	}
	// Released on a cold index, they are dropped at once.
	inC := x.AddInflight(c, a)
	p.Clear()
	inC.Release()
	if n := p.inflightN.Load(); n != 0 {
		t.Fatalf("released on a cold index: %d in-flight keys left", n)
	}
	if x.AddInflight(c, a) != nil {
		t.Error("AddInflight on a cold index")
	}
}

// An engine that restarts with another block size (its stream went back
// to sequence 0: the subscriber Clears, then MarkLive) is keyed at its new
// size: the old E is not kept after Clear, or every later store would be
// skipped while the candidate scores precisely as holding nothing.
func TestPreciseRelearnsBlockSizeAfterClear(t *testing.T) {
	x, p := preciseIndex(t)
	apply(p, stored(nil, []uint64{100}, []int64{1, 2}, 2))
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: []int64{1, 2}}); got != 2 {
		t.Fatalf("before the restart: %d tokens, want 2", got)
	}
	p.Clear() // the engine restarted
	p.MarkLive()
	apply(p, stored(nil, []uint64{200, 201}, []int64{1, 2, 3, 4, 5, 6, 7, 8}, 4))
	key := &Key{IDs: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}}
	if got, ok := x.OverlapTokens(cand(1), nil, key); got != 8 || !ok {
		t.Fatalf("after a restart at block size 4: %d tokens, %v; want 8 exact", got, ok)
	}
	if s := p.Stats(); s.BlockSize != 4 || s.Blocks != 2 || s.SkippedBlockSize != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// The precise bound follows the candidate's capacity when it is added
// again with another (the engine reported one later, or a reload changed
// total_kv_blocks): it grows, or shrinks evicting the oldest, and the
// blocks it keeps are still found.
func TestPreciseBoundFollowsCapacity(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 2) // bound 2·8/2 = 8 engine blocks of 2 tokens
	p := x.Precise(cand(1))
	p.MarkLive()
	ids := make([]int64, 60)
	hs := make([]uint64, 30)
	for i := range ids {
		ids[i] = int64(i)
	}
	for i := range hs {
		hs[i] = uint64(100 + i)
	}
	apply(p, stored(nil, hs[:4], ids[:8], 2))
	_ = x.AddWorker(cand(1), 10) // bound 2·40/2 = 40
	apply(p, stored(ptr(hs[3]), hs[4:], ids[8:], 2))
	if s := p.Stats(); s.Blocks != 30 || s.Evicted != 0 {
		t.Fatalf("after growing: stats %+v, want 30 blocks, none evicted", s)
	}
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids}); got != 60 {
		t.Fatalf("after growing: overlap %d tokens, want 60", got)
	}
	_ = x.AddWorker(cand(1), 1) // bound 2·4/2 = 4: the 26 oldest go
	if s := p.Stats(); s.Blocks != 4 || s.Evicted != 26 {
		t.Fatalf("after shrinking: stats %+v, want 4 blocks, 26 evicted", s)
	}
	if n, e := setLen(p), p.engine.len(); n != 4 || e != 4 {
		t.Fatalf("after shrinking: %d blocks in the set, %d engine hashes; want 4", n, e)
	}
	// The head went, so nothing leads; a store chained to a kept block is
	// keyed through it.
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids}); got != 0 {
		t.Fatalf("after shrinking: overlap %d tokens, want 0", got)
	}
	apply(p, stored(ptr(hs[29]), []uint64{500}, []int64{7, 7}, 2))
	if s := p.Stats(); s.Blocks != 4 || s.Evicted != 27 || s.SkippedParent != 0 {
		t.Fatalf("after a store past the bound: stats %+v", s)
	}
}

// A capacity of exactly DefaultUnknownCapacity blocks is a known one: the
// precise bound follows it, not MaxPreciseBlocks.
func TestKnownCapacityEqualToTheUnknownBound(t *testing.T) {
	x := New(4)
	if err := x.AddWorker(cand(1), DefaultUnknownCapacity); err != nil {
		t.Fatal(err)
	}
	p := x.Precise(cand(1))
	if want := 2 * DefaultUnknownCapacity * 4; p.capTokens != want {
		t.Fatalf("capTokens %d, want %d", p.capTokens, want)
	}
	if err := x.AddWorker(cand(1), 0); err != nil {
		t.Fatal(err)
	}
	if p.capTokens != 0 {
		t.Fatalf("unknown capacity: capTokens %d, want 0 (MaxPreciseBlocks)", p.capTokens)
	}
}
