package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// The cases of vLLM's tests/distributed/test_kv_snapshot_bootstrap.py
// (vMaroon/vllm@08ee3e54), whose store() makes GPU blocks of 4 tokens
// [h·4, h·4+3] per hash h and tokenless CPU blocks (block_size 0): the
// residency they leave, worked by hand, is what the index holds.

// bootStore is that test's store(): GPU blocks with tokens, or a
// tokenless store on another medium.
func bootStore(hashes []uint64, parent *uint64, medium string) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, Medium: []byte(medium)}
	if parent != nil {
		ev.ParentBlockHash, ev.HasParent = *parent, true
	}
	if medium == "GPU" {
		ev.BlockSize = 4
		for _, h := range hashes {
			for j := range 4 {
				ev.TokenIDs = append(ev.TokenIDs, int64(h)*4+int64(j))
			}
		}
	}
	return ev
}

func bootRemove(medium string, hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes, Medium: []byte(medium)}
}

// bootKey is the prompt of blocks hs as bootStore stores them (chained:
// block i's parent is block i-1).
func bootKey(hs ...uint64) *Key {
	var ids []int64
	for _, h := range hs {
		for j := range 4 {
			ids = append(ids, int64(h)*4+int64(j))
		}
	}
	return &Key{IDs: ids}
}

func bootIndex(t *testing.T) (*Index, *Precise) {
	t.Helper()
	x := New(4)
	if err := x.AddWorker(cand(1), 1000); err != nil {
		t.Fatal(err)
	}
	p := x.Precise(cand(1))
	p.MarkLive()
	return x, p
}

// test_duplicate_references_survive_one_remove: two copies, one removal:
// still held; the second removal forgets it. A child stored while one copy
// is left is keyed through it.
func TestResidencyDuplicateSurvivesOneRemove(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{1}, nil, "GPU"), bootRemove("GPU", 1))
	if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1)); got != 4 {
		t.Fatalf("two copies, one removed: %d tokens, want 4", got)
	}
	apply(p, bootStore([]uint64{2}, ptr(1), "GPU"))
	if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1, 2)); got != 8 {
		t.Fatalf("child of the copy left: %d tokens, want 8", got)
	}
	if s := p.Stats(); s.Copies != 2 || s.SkippedParent != 0 || s.Stored != 3 || s.Removed != 1 {
		t.Fatalf("stats %+v, want 2 copies (1, 2), 3 stored, 1 removed", s)
	}
	apply(p, bootRemove("GPU", 1))
	if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1, 2)); got != 0 {
		t.Fatalf("both copies removed: %d tokens, want 0", got)
	}
	// A removal of a copy that is not there changes nothing.
	apply(p, bootRemove("GPU", 1), bootRemove("CPU", 2))
	if s := p.Stats(); s.Copies != 1 || s.Blocks != 1 || s.Removed != 2 {
		t.Fatalf("stats %+v, want block 2's copy only, 2 removals applied", s)
	}
}

// test_evicted_parent_metadata_is_retained: block 2 stored under block 1,
// then block 1 removed: block 2 stays held (the prompt starting at block
// 1 no longer leads).
func TestResidencyChildOutlivesParent(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{2}, ptr(1), "GPU"), bootRemove("GPU", 1))
	if s := p.Stats(); s.Blocks != 1 || s.Copies != 1 || s.GPUBlocks != 1 {
		t.Fatalf("stats %+v, want block 2 alone", s)
	}
	if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1, 2)); got != 0 {
		t.Fatalf("%d tokens, want 0 (block 1 is gone)", got)
	}
	// Block 2's own child is still keyed.
	apply(p, bootStore([]uint64{3}, ptr(2), "GPU"))
	if s := p.Stats(); s.SkippedParent != 0 || s.GPUBlocks != 2 {
		t.Fatalf("stats %+v, want blocks 2 and 3, none skipped", s)
	}
}

// test_cpu_only_block_retains_gpu_metadata: a tokenless CPU copy keyed
// through the GPU store of the same hash outlives the GPU copy, and stays
// keyed: a second CPU copy resolves after the GPU copy went.
func TestResidencyCPUCopyOutlivesGPU(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{1}, nil, "CPU"), bootRemove("GPU", 1))
	if o := x.TierOverlap(cand(1), bootKey(1)); o != (TierOverlap{Precise: true, BlockSize: 4, CPUTokens: 4}) {
		t.Fatalf("TierOverlap = %+v, want block 1 on the CPU tier only", o)
	}
	apply(p, bootStore([]uint64{1}, nil, "cpu")) // another copy, lowercase medium
	if s := p.Stats(); s.Copies != 2 || s.CPUBlocks != 1 || s.GPUBlocks != 0 || s.SkippedUnresolved != 0 {
		t.Fatalf("stats %+v, want two CPU copies of block 1", s)
	}
	// A tokenless store of a hash never stored with tokens is skipped.
	apply(p, bootStore([]uint64{9}, nil, "CPU"))
	if s := p.Stats(); s.SkippedUnresolved != 1 {
		t.Fatalf("SkippedUnresolved = %d, want 1", s.SkippedUnresolved)
	}
}

// test_reset_keeps_cpu_dependencies: AllBlocksCleared takes the GPU
// copies away and leaves the CPU ones: residency {("CPU", None, 1): 1}.
func TestResidencyResetKeepsCPU(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{2}, ptr(1), "GPU"),
		bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{1}, nil, "CPU"))
	apply(p, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	if o := x.TierOverlap(cand(1), bootKey(1, 2)); o != (TierOverlap{Precise: true, BlockSize: 4, CPUTokens: 4}) {
		t.Fatalf("TierOverlap = %+v, want block 1 on the CPU tier only", o)
	}
	if s := p.Stats(); s.Copies != 1 || s.Blocks != 1 || s.GPUBlocks != 0 || s.CPUBlocks != 1 || s.Cleared != 1 || !s.Live {
		t.Fatalf("stats %+v", s)
	}
	// The GPU fills again; the GPU groups are learnt again.
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{2}, ptr(1), "GPU"))
	if o := x.TierOverlap(cand(1), bootKey(1, 2)); o != (TierOverlap{Precise: true, BlockSize: 4, GPUTokens: 8}) {
		t.Fatalf("after refilling: %+v, want both blocks on GPU", o)
	}
}

// test_snapshot_preserves_independent_residency_scopes: copies in
// different ownership (or locality) scopes are counted apart; a removal
// in one scope leaves the other's. A REMOTE copy is counted but not held.
func TestResidencyScopes(t *testing.T) {
	for _, tc := range []struct {
		field      string
		a, b       []byte
		heldBlock2 bool
	}{
		{"ownership", nil, []byte("disk"), true},
		{"locality", []byte("LOCAL"), []byte("REMOTE"), false},
	} {
		t.Run(tc.field, func(t *testing.T) {
			x, p := bootIndex(t)
			set := func(ev kvevents.Event, v []byte) kvevents.Event {
				if tc.field == "ownership" {
					ev.Ownership = v
				} else {
					ev.Locality = v
				}
				return ev
			}
			first, second := set(bootStore([]uint64{1}, nil, "GPU"), tc.a), set(bootStore([]uint64{1, 2}, nil, "GPU"), tc.b)
			apply(p, first, second, set(bootRemove("GPU", 1), tc.b))
			// Residency: (GPU, a, 1): 1 and (GPU, b, 2): 1.
			if s := p.Stats(); s.Copies != 2 || s.Blocks != 2 {
				t.Fatalf("stats %+v, want 2 copies of 2 blocks", s)
			}
			if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1)); got != 4 {
				t.Fatalf("block 1: %d tokens, want 4", got)
			}
			want := 4 // block 1 only
			if tc.heldBlock2 {
				want = 8
			}
			if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1, 2)); got != want {
				t.Fatalf("blocks 1, 2: %d tokens, want %d", got, want)
			}
			// The last copy of block 1 is in scope a: a removal there
			// forgets it.
			apply(p, set(bootRemove("GPU", 1), tc.a))
			if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1)); got != 0 {
				t.Fatalf("after removing scope a's copy: %d tokens", got)
			}
		})
	}
}

// The CPU-tier figure counts the blocks after the GPU lead that the CPU
// tier holds, in order: the offloading connector looks them up after the
// GPU hit.
func TestTierOverlapCountsCPUAfterGPU(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1, 2, 3, 4}, nil, "GPU"),
		bootStore([]uint64{2, 3}, nil, "CPU"), bootStore([]uint64{4}, nil, "CPU_PINNED"),
		bootRemove("GPU", 3, 4))
	// GPU: 1, 2; CPU: 2, 3, 4.
	if o := x.TierOverlap(cand(1), bootKey(1, 2, 3, 4, 5)); o != (TierOverlap{Precise: true, BlockSize: 4, GPUTokens: 8, CPUTokens: 8}) {
		t.Fatalf("TierOverlap = %+v, want 2 GPU blocks then 2 CPU blocks", o)
	}
	b := x.Belief(cand(1), nil, bootKey(1, 2, 3, 4))
	if !b.Precise || b.PreciseTokens != 8 || b.CPUTokens != 8 {
		t.Fatalf("Belief = %+v", b)
	}
	// FillTiersAt: the same in the request's blocks. At 4 tokens (E):
	// 2 GPU blocks, then 2 CPU-tier blocks. At 8: GPU 8 tokens = 1 block,
	// GPU and CPU 16 tokens = 2 blocks, so 1 CPU-tier block. At 12:
	// floor(8/12) = 0 GPU, floor(16/12) = 1 CPU-tier block (tokens 0-11,
	// 8 of them on GPU, counted as CPU-tier). Candidate 9 is untracked,
	// and a prompt without token ids scores approximately: 0 on the CPU
	// tier.
	slots := []int32{x.Slot(cand(1)), x.Slot(cand(9))}
	for _, c := range []struct {
		bs       int
		gpu, cpu int32
	}{{4, 2, 2}, {8, 1, 1}, {12, 0, 1}, {16, 0, 1}, {20, 0, 0}} {
		overlap, cpu := []int32{-1, -1}, []int32{-1, -1}
		x.FillTiersAt(slots, nil, c.bs, bootKey(1, 2, 3, 4, 5), overlap, cpu)
		if overlap[0] != c.gpu || cpu[0] != c.cpu || overlap[1] != 0 || cpu[1] != 0 {
			t.Errorf("block size %d: overlap %v, CPU tier %v; want [%d 0], [%d 0]", c.bs, overlap, cpu, c.gpu, c.cpu)
		}
		if got := x.OverlapAt(cand(1), nil, c.bs, bootKey(1, 2, 3, 4, 5)); got != int(c.gpu) {
			t.Errorf("block size %d: OverlapAt %d, FillTiersAt %d", c.bs, got, c.gpu)
		}
	}
	cpu := []int32{-1, -1}
	x.FillTiersAt(slots, nil, 4, nil, []int32{0, 0}, cpu)
	if cpu[0] != 0 || cpu[1] != 0 {
		t.Errorf("no token ids: CPU tier %v, want zeros", cpu)
	}
	// A cold index, or an untracked candidate: the zero TierOverlap.
	p.Clear()
	x.FillTiersAt(slots, nil, 4, bootKey(1, 2, 3, 4, 5), []int32{0, 0}, cpu)
	if cpu[0] != 0 {
		t.Errorf("cold: CPU tier %v, want zeros", cpu)
	}
	if o := x.TierOverlap(cand(1), bootKey(1)); o != (TierOverlap{}) {
		t.Fatalf("cold: %+v", o)
	}
	if o := x.TierOverlap(cand(9), bootKey(1)); o != (TierOverlap{}) {
		t.Fatalf("untracked: %+v", o)
	}
}

// A snapshot is applied after ClearCold: however many blocks it
// stores, the candidate stays cold until MarkLive; after a plain Clear,
// stores reaching the bound make it live (the cache has turned over).
func TestClearColdHoldsCold(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 2) // bound 2·8/4 = 4 blocks of 4
	p := x.Precise(cand(1))
	p.MarkLive()
	chunk := []kvevents.Event{bootStore([]uint64{1, 2, 3, 4, 5, 6}, nil, "GPU")}
	p.ClearCold()
	apply(p, chunk...)
	apply(p, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	apply(p, chunk...)
	if p.Stats().Live {
		t.Fatal("live before MarkLive, in the middle of a snapshot")
	}
	p.MarkLive()
	if s := p.Stats(); !s.Live || s.Blocks != 4 {
		t.Fatalf("after MarkLive: %+v, want live with 4 blocks (the bound)", s)
	}
	p.Clear()
	apply(p, chunk...)
	if !p.Stats().Live {
		t.Fatal("after Clear, 6 GPU stores over a bound of 4: not live")
	}
}

// A hybrid model's sliding-window group publishes sparse stores (token
// ids span more blocks than it names): its blocks are keyed through the
// full-attention group's stores of the same hashes.
func TestSparseStoreResolvesThroughOtherGroup(t *testing.T) {
	x, p := bootIndex(t)
	g := func(ev kvevents.Event, idx int64) kvevents.Event {
		ev.GroupIdx, ev.HasGroupIdx = idx, true
		return ev
	}
	full := g(bootStore([]uint64{1, 2, 3}, nil, "GPU"), 0)
	sparse := g(bootStore([]uint64{1, 3}, nil, "GPU"), 1)
	sparse.TokenIDs = full.TokenIDs // 12 tokens, 2 hashes: block 2 skipped
	apply(p, full, sparse)
	if got, _ := x.OverlapTokens(cand(1), nil, bootKey(1, 2, 3)); got != 4 {
		t.Fatalf("%d tokens, want 4 (block 2 is not in group 1)", got)
	}
	if s := p.Stats(); s.GPUBlocks != 2 || s.SkippedMalformed+s.SkippedUnresolved != 0 {
		t.Fatalf("stats %+v, want blocks 1 and 3 held by both groups", s)
	}
}

// refModel is the reference: a plain map of copy counts per (block,
// tier, ownership), as vLLM's KVCacheSnapshot keeps them.
type refModel struct {
	counts map[refKey]int
}

type refKey struct {
	block int
	cpu   bool
	owner bool
}

func (m *refModel) held(b int, cpu bool) bool {
	return m.counts[refKey{b, cpu, false}]+m.counts[refKey{b, cpu, true}] > 0
}

func (m *refModel) known(b int) bool {
	return m.held(b, false) || m.held(b, true)
}

// TestResidencyRandomAgainstReference drives random sequences of stores
// (with duplicates, GPU and CPU, tokenless CPU stores, two ownership
// scopes), removals (of copies there and not there), AllBlocksCleared and
// Clear, and checks after every batch each block's GPU and CPU residency,
// and the counters, against the reference's counts.
func TestResidencyRandomAgainstReference(t *testing.T) {
	const blocks = 48
	eh := func(b int) uint64 { return uint64(b)*0x9e3779b97f4a7c15 | 1 }
	tokens := func(b int) []int64 { return []int64{int64(b), int64(b) + 1000} }
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 26))
			x := New(2)
			_ = x.AddWorker(cand(1), 10_000)
			p := x.Precise(cand(1))
			p.MarkLive()
			ref := &refModel{counts: map[refKey]int{}}
			var stored, removed, unresolved uint64
			for step := range 400 {
				var evs []kvevents.Event
				for range 1 + rng.IntN(6) {
					b := rng.IntN(blocks)
					owner := rng.IntN(4) == 0
					var own []byte
					if owner {
						own = []byte("disk")
					}
					switch r := rng.IntN(100); {
					case r < 35: // GPU store with tokens
						evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{eh(b)},
							TokenIDs: tokens(b), BlockSize: 2, Medium: []byte("GPU"), Ownership: own})
						ref.counts[refKey{b, false, owner}]++
						stored++
					case r < 45: // CPU store with tokens
						evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{eh(b)},
							TokenIDs: tokens(b), BlockSize: 2, Medium: []byte("CPU"), Ownership: own})
						ref.counts[refKey{b, true, owner}]++
						stored++
					case r < 60: // tokenless CPU store: keyed if the block is known
						evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{eh(b)},
							TokenIDs: []int64{}, Medium: []byte("CPU"), Ownership: own})
						if ref.known(b) {
							ref.counts[refKey{b, true, owner}]++
							stored++
						} else {
							unresolved++
						}
					case r < 85: // GPU removal
						evs = append(evs, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{eh(b)}, Medium: []byte("GPU"), Ownership: own})
						if k := (refKey{b, false, owner}); ref.counts[k] > 0 {
							ref.counts[k]--
							removed++
						}
					case r < 97: // CPU removal
						evs = append(evs, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{eh(b)}, Medium: []byte("CPU"), Ownership: own})
						if k := (refKey{b, true, owner}); ref.counts[k] > 0 {
							ref.counts[k]--
							removed++
						}
					default:
						evs = append(evs, kvevents.Event{Kind: kvevents.AllBlocksCleared})
						for k := range ref.counts {
							if !k.cpu {
								delete(ref.counts, k)
							}
						}
					}
				}
				apply(p, evs...)
				if step%100 == 99 { // a restart: everything goes
					p.Clear()
					p.MarkLive()
					clear(ref.counts)
				}
				copies, known, gpu, cpu := 0, 0, 0, 0
				for b := range blocks {
					want := TierOverlap{Precise: true, BlockSize: 2}
					if ref.held(b, false) {
						want.GPUTokens = 2
						gpu++
					} else if ref.held(b, true) {
						want.CPUTokens = 2
					}
					if ref.held(b, true) {
						cpu++
					}
					if ref.known(b) {
						known++
					}
					if got := x.TierOverlap(cand(1), &Key{IDs: tokens(b)}); got != want && p.Stats().BlockSize != 0 {
						t.Fatalf("step %d block %d: %+v, want %+v", step, b, got, want)
					}
				}
				for _, c := range ref.counts {
					copies += c
				}
				s := p.Stats()
				if s.Copies != copies || s.Blocks != known || s.GPUBlocks != gpu || s.CPUBlocks != cpu {
					t.Fatalf("step %d: stats %+v; want %d copies, %d blocks, %d GPU, %d CPU", step, s, copies, known, gpu, cpu)
				}
				if s.Stored != stored || s.Removed != removed || s.SkippedUnresolved != unresolved {
					t.Fatalf("step %d: stats %+v; want %d stored, %d removed, %d unresolved", step, s, stored, removed, unresolved)
				}
				if n := len(p.more); n > 2*known*2 {
					t.Fatalf("step %d: %d scope counts kept for %d blocks", step, n, known)
				}
			}
		})
	}
}
