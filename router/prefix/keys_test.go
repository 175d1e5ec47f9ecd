package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/shared"
)

// Key.TokenBlockHashes works at any block size: a plain key gives
// TokenBlocks' hashes; a LoRA, salted or multimodal key differs from it
// from the blocks those parts touch on, and equals, block for block, the
// chain of content ids keyDigest gives (worked here block by block).
func TestKeyAnySize(t *testing.T) {
	ids := seq(0, 50)
	for _, size := range []int{1, 3, 7, 16, 50, 64} {
		plain := &Key{IDs: ids}
		if diff := cmp.Diff(TokenBlocks(ids, size), plain.TokenBlockHashes(size), cmp.Comparer(func(a, b []uint64) bool {
			return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b))
		})); diff != "" {
			t.Fatalf("size %d, plain key (-TokenBlocks +Key):\n%s", size, diff)
		}
		mm := []MMItem{{Identifier: "img", Offset: 10, Length: 12}}
		for _, k := range []*Key{{IDs: ids, LoRA: "a"}, {IDs: ids, Salt: "s"}, {IDs: ids, MM: mm}, {IDs: ids, LoRA: "a", Salt: "s", MM: mm}} {
			got := k.TokenBlockHashes(size)
			if len(got) != len(ids)/size {
				t.Fatalf("size %d, key %+v: %d hashes, want %d", size, k, len(got), len(ids)/size)
			}
			var prev uint64
			var d extrasDigest
			for i := range got {
				start := i * size
				keyDigest(&d, start, start+size, k.LoRA, k.Salt, k.MM)
				prev = ChainHash(prev, d.content(tokenContentID(ids[start:start+size])))
				if got[i] != prev {
					t.Fatalf("size %d, key %+v, block %d: %x, want %x", size, k, i, got[i], prev)
				}
			}
			// Salt touches block 0, so every block differs from the plain
			// chain; MM only from the first block the item overlaps.
			firstDiff := 0
			if k.LoRA == "" && k.Salt == "" {
				firstDiff = 10 / size
			}
			for i := range got {
				if same := got[i] == plain.TokenBlockHashes(size)[i]; same != (i < firstDiff) {
					t.Fatalf("size %d, key %+v, block %d: equal to the plain chain %v", size, k, i, same)
				}
			}
		}
	}
}

// The request side's parts follow vLLM's generate_block_hash_extra_keys:
// the digest of a block equals the digest of the engine's extra-keys
// tuple for it, given as msgpack.
func TestKeyDigestMatchesEngineTuple(t *testing.T) {
	mm := []MMItem{{Identifier: "hash1", Offset: 0, Length: 5}, {Identifier: "hash2", Offset: 10, Length: 5}}
	for _, tc := range []struct {
		start, end int
		lora, salt string
		tuple      mp // the engine's extra keys for the block, nil for None
		loraName   []byte
	}{
		{0, 5, "", "", tuple(mmKey{"hash1", 0}), nil},
		{3, 8, "", "", tuple(mmKey{"hash1", -3}), nil},
		{6, 10, "", "", nil, nil},
		{0, 15, "", "", tuple(mmKey{"hash1", 0}, mmKey{"hash2", 10}), nil},
		{0, 5, "", "salt", tuple(mmKey{"hash1", 0}, "salt"), nil},
		{5, 10, "", "salt", nil, nil},
		{0, 5, "ad", "salt", tuple("ad", mmKey{"hash1", 0}, "salt"), []byte("ad")},
		{10, 15, "ad", "", tuple("ad", mmKey{"hash2", 0}), []byte("ad")},
	} {
		var want, got extrasDigest
		want.reset()
		if tc.loraName != nil {
			want.bytes('L', tc.loraName)
		}
		want.event(tc.tuple, tc.loraName)
		keyDigest(&got, tc.start, tc.end, tc.lora, tc.salt, mm)
		if got != want {
			t.Errorf("block [%d, %d) lora %q salt %q: request digest %+v, engine's %+v", tc.start, tc.end, tc.lora, tc.salt, got, want)
		}
	}
}

// Extra keys from outside are read without panicking and within their
// bytes, whatever they are; values the reader does not know still change
// the key.
func TestExtraKeysArbitraryBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var d extrasDigest
	for range 200_000 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(2) == 0 && len(b) > 0 {
			b[0] = 0x90 | byte(r.IntN(4)) // mostly arrays
		}
		d.reset()
		d.event(b, nil)
	}
	// A float, a map and a nested array are kept as raw parts.
	for _, raw := range []mp{
		mp{}.arr(1).f64(1.5),
		append(mp{}.arr(1).mapN(1).str("k"), 0x01),
		mp{}.arr(1).arr(3).str("x").int(1).int(2),
	} {
		d.reset()
		d.event(raw, nil)
		if d.n != 1 {
			t.Errorf("%x: %d parts, want 1", []byte(raw), d.n)
		}
	}
}

// The index's block size (the approximate hashes' unit) and the engine's
// E are independent: a request hashed at 16 tokens per block is credited
// floor(n·E/16) blocks by FillAt, RecordOverlapAt and BeliefAt, whatever
// New was given; Member.BlockSize states the capacity's unit.
func TestBlockSizesIndependent(t *testing.T) {
	x := New(512)
	if _, err := x.AddWorkers(Member{Candidate: cand(1), Capacity: 100, BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	p := x.Precise(cand(1))
	p.MarkLive()
	// E = 4: 10 blocks, 40 tokens.
	apply(p, stored(nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, seq(0, 40), 4))
	key := &Key{IDs: seq(0, 64)}
	out := make([]int32, 1)
	slots := []int32{x.Slot(cand(1))}
	x.FillAt(slots, nil, 16, key, out)
	if out[0] != 2 { // 40 tokens / 16
		t.Fatalf("FillAt(16) = %d blocks, want 2", out[0])
	}
	x.Fill(slots, nil, key, out)
	if out[0] != 0 { // 40 tokens / 512
		t.Fatalf("Fill (512) = %d blocks, want 0", out[0])
	}
	if got := x.RecordOverlapAt(cand(1), nil, 8, key); got != 5 {
		t.Fatalf("RecordOverlapAt(8) = %d, want 5", got)
	}
	b := x.BeliefAt(cand(1), []uint64{11, 12}, 16, key)
	if !b.Precise || b.PreciseTokens != 40 || b.EngineBlockSize != 4 || b.ApproxTokens != 0 {
		t.Fatalf("BeliefAt = %+v", b)
	}
	x.Record(cand(1), []uint64{11, 12})
	if got, ok := x.OverlapTokensAt(cand(1), []uint64{11, 12, 13}, 16, nil); got != 32 || ok {
		t.Fatalf("OverlapTokensAt(16), approximate = %d, %v; want 32 approximate", got, ok)
	}
	// Capacity 100 blocks of 16 tokens: the precise bound is 2·1600/4.
	if s := p.Stats(); p.capacity != 800 || s.Blocks != 10 {
		t.Fatalf("bound %d, stats %+v; want 800", p.capacity, s)
	}
	if _, err := x.AddWorkers(Member{Candidate: cand(2), BlockSize: -1}); err == nil {
		t.Fatal("a negative block size was accepted")
	}
}

// Export carries the CPU tier and duplicate copies; Import puts them
// back, so a replica's warm start keeps both.
func TestExportImportTiersAndCopies(t *testing.T) {
	x, p := bootIndex(t)
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{1}, nil, "GPU"),
		bootStore([]uint64{2}, ptr(1), "GPU"), bootStore([]uint64{2}, nil, "CPU"),
		bootStore([]uint64{3}, ptr(2), "GPU"), bootStore([]uint64{3}, nil, "CPU"), bootRemove("GPU", 3))
	c, ok := x.Export(cand(1))
	if !ok || c.Precise == nil {
		t.Fatal("no precise content")
	}
	// Most recently stored first: 3, 2, 1; four GPU stores.
	h := bootKey(1, 2, 3).TokenBlockHashes(4)
	want := &PreciseContent{BlockSize: 4, Groups: 1, CPUGroups: 1, Live: true, SinceClear: 4,
		Router: []uint64{h[2], h[1], h[0]}, Engine: []uint64{3, 2, 1}, Mask: []uint64{0, 1, 1},
		CPU: []uint64{1, 1, 0}, Copies: []uint32{1, 1, 2}}
	if diff := cmp.Diff(want, c.Precise); diff != "" {
		t.Fatalf("exported (-want +got):\n%s", diff)
	}
	y, q := bootIndex(t)
	q.Clear()
	if ok, precise := y.Import(cand(1), c); !ok || !precise {
		t.Fatalf("Import = %v, %v", ok, precise)
	}
	if got, _ := y.Export(cand(1)); !cmp.Equal(c, got) {
		t.Fatalf("re-exported differs (-exported +imported):\n%s", cmp.Diff(c, got))
	}
	if s := q.Stats(); s.Copies != 5 || s.GPUBlocks != 2 || s.CPUBlocks != 2 {
		t.Fatalf("imported stats %+v, want 5 copies, 2 GPU and 2 CPU blocks", s)
	}
	// One GPU copy of block 1 removed: the other stays, as on the source.
	apply(q, bootRemove("GPU", 1))
	if got, _ := y.OverlapTokens(cand(1), nil, bootKey(1, 2)); got != 8 {
		t.Fatalf("after one of two copies went: %d tokens, want 8", got)
	}
	bad := *c.Precise
	bad.Copies = bad.Copies[:1]
	if ok, _ := y.Import(cand(1), Content{Precise: &bad}); ok {
		t.Fatal("Import of unequal Copies succeeded")
	}
}

// Residency that Mask and CPU cannot say (CPU duplicates, duplicates in
// another group, a remote copy, an ownership scope) is exported in the
// exact form: the imported index counts the same copies per scope, so its
// stats, its tiers for a prompt and what later removals leave equal the
// source's.
func TestExportImportExactResidency(t *testing.T) {
	x, p := bootIndex(t)
	group1 := func(ev kvevents.Event) kvevents.Event { ev.GroupIdx, ev.HasGroupIdx = 1, true; return ev }
	remote := bootStore([]uint64{3}, nil, "CPU")
	remote.Locality = []byte("REMOTE")
	owned := bootStore([]uint64{2}, nil, "CPU")
	owned.Ownership = []byte("lmcache")
	apply(p, bootStore([]uint64{1}, nil, "GPU"), bootStore([]uint64{1}, nil, "GPU"),
		group1(bootStore([]uint64{1}, nil, "GPU")), group1(bootStore([]uint64{1}, nil, "GPU")),
		bootStore([]uint64{2}, ptr(1), "GPU"), group1(bootStore([]uint64{2}, ptr(1), "GPU")),
		bootStore([]uint64{2}, nil, "CPU"), bootStore([]uint64{2}, nil, "CPU"), owned,
		bootStore([]uint64{3}, ptr(2), "GPU"), group1(bootStore([]uint64{3}, ptr(2), "GPU")), remote,
		bootRemove("GPU", 3))
	c, ok := x.Export(cand(1))
	if !ok || c.Precise == nil || len(c.Precise.Scopes) == 0 {
		t.Fatalf("exported %+v: want the exact form", c.Precise)
	}
	y, q := bootIndex(t)
	q.Clear()
	if ok, precise := y.Import(cand(1), c); !ok || !precise {
		t.Fatalf("Import = %v, %v", ok, precise)
	}
	same := func(what string) {
		t.Helper()
		a, b := p.Stats(), q.Stats()
		if a.Blocks != b.Blocks || a.GPUBlocks != b.GPUBlocks || a.CPUBlocks != b.CPUBlocks || a.Copies != b.Copies || a.Live != b.Live {
			t.Fatalf("%s: imported stats %+v, source %+v", what, b, a)
		}
		for _, k := range []*Key{bootKey(1, 2, 3), bootKey(2, 3), bootKey(3)} {
			if a, b := x.TierOverlap(cand(1), k), y.TierOverlap(cand(1), k); a != b {
				t.Fatalf("%s: TierOverlap %v imported, %v source", what, b, a)
			}
		}
	}
	same("imported")
	// A snapshot carries the engine hashes' folds only: every imported
	// block says so.
	if bs, _ := q.EngineBlocks(0, 0, nil); len(bs) == 0 {
		t.Fatal("imported index lists no blocks")
	} else {
		for _, b := range bs {
			if !b.Folded {
				t.Fatalf("imported block %+v not marked folded", b)
			}
		}
	}
	if s := q.Stats(); s.Copies != 11 || s.GPUBlocks != 2 || s.CPUBlocks != 1 {
		t.Fatalf("imported %+v: want 11 copies, blocks 1 and 2 on GPU, 2 on CPU (3's CPU copy is remote)", s)
	}
	if got, _ := y.Export(cand(1)); !cmp.Equal(c, got) {
		t.Fatalf("re-exported differs (-exported +imported):\n%s", cmp.Diff(c, got))
	}
	// The same removals on both leave the same: one of block 1's two
	// copies in group 1, one of block 2's two default CPU copies, the
	// remote copy of 3, the owned copy of 2.
	ownedRm := bootRemove("CPU", 2)
	ownedRm.Ownership = []byte("lmcache")
	remoteRm := bootRemove("CPU", 3)
	remoteRm.Locality = []byte("REMOTE")
	for _, ev := range []kvevents.Event{group1(bootRemove("GPU", 1)), bootRemove("CPU", 2), remoteRm, ownedRm, bootRemove("CPU", 2)} {
		apply(p, ev)
		apply(q, ev)
		same("after a removal")
	}
	if s := q.Stats(); s.CPUBlocks != 0 || s.Copies != 6 {
		t.Fatalf("after the removals %+v: want no CPU block, 6 copies", s)
	}

	// Malformed exact forms are refused.
	for name, mod := range map[string]func(pc *PreciseContent){
		"no copies":          func(pc *PreciseContent) { pc.Copies = nil },
		"block out of range": func(pc *PreciseContent) { pc.More[0].Block = uint32(len(pc.Router)) },
		"scope out of range": func(pc *PreciseContent) { pc.More[0].Scope = uint8(len(pc.Scopes)) },
		"zero copies":        func(pc *PreciseContent) { pc.More[0].Copies = 0 },
		"unordered":          func(pc *PreciseContent) { pc.More[0], pc.More[1] = pc.More[1], pc.More[0] },
		"scope 0 named":      func(pc *PreciseContent) { pc.Scopes[0] = ResidencyScope{Local: true} },
		"group 64":           func(pc *PreciseContent) { pc.Scopes[0].Group = 64 },
		"absent locality, not local": func(pc *PreciseContent) {
			pc.Scopes[0].Locality, pc.Scopes[0].Local = 0, false
		},
		"a scope twice":       func(pc *PreciseContent) { pc.Scopes = append(pc.Scopes, pc.Scopes[0]) },
		"more without scopes": func(pc *PreciseContent) { pc.Scopes = nil },
		"too many scopes": func(pc *PreciseContent) {
			for i := range MaxContentScopes {
				pc.Scopes = append(pc.Scopes, ResidencyScope{CPU: true, Ownership: uint64(i + 1), Local: true})
			}
		},
	} {
		bad := *c.Precise
		bad.Copies = slices.Clone(bad.Copies)
		bad.More = slices.Clone(bad.More)
		bad.Scopes = slices.Clone(bad.Scopes)
		mod(&bad)
		z, _ := bootIndex(t)
		if ok, _ := z.Import(cand(1), Content{Precise: &bad}); ok {
			t.Errorf("%s: imported", name)
		}
	}
}

// Scopes are bounded: beyond 256 (tier, group, locality, ownership)
// scopes, blocks are skipped and counted; a Clear frees them. Evicting a
// block frees its counts in every scope.
func TestScopesBounded(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 3) // bound 2·12/4 = 6 blocks of 4
	p := x.Precise(cand(1))
	p.MarkLive()
	for i := range 300 {
		ev := bootStore([]uint64{uint64(i % 4)}, nil, "GPU")
		ev.Ownership = []byte(fmt.Sprint("tier-", i))
		apply(p, ev)
	}
	if s := p.Stats(); s.SkippedScope != 300-255 || s.Copies != 255 {
		t.Fatalf("stats %+v, want 45 skipped, 255 copies", s)
	}
	// Storing 6 more blocks evicts the 4 with copies in many scopes.
	for i := range 6 {
		apply(p, bootStore([]uint64{uint64(10 + i)}, nil, "GPU"))
	}
	if s := p.Stats(); s.Evicted != 4 || s.Copies != 6 || len(p.more) != 0 {
		t.Fatalf("stats %+v, %d scope counts left; want 4 evicted, 6 copies, none", s, len(p.more))
	}
	p.Clear()
	if len(p.scopes) != 1 {
		t.Fatalf("%d scopes after Clear, want 1", len(p.scopes))
	}
}

// TestPreciseConcurrentTiers applies stores, removals and clears of both
// tiers while selections read both figures (for the race detector), then
// checks the table's flags against the blocks' residency.
func TestPreciseConcurrentTiers(t *testing.T) {
	x := New(2)
	_ = x.AddWorker(cand(1), 50)
	p := x.Precise(cand(1))
	p.MarkLive()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(1, 1))
		for n := range 3000 {
			b := uint64(r.IntN(60))
			tok := []int64{int64(b), 7}
			switch r.IntN(6) {
			case 0, 1:
				apply(p, stored(nil, []uint64{b}, tok, 2))
			case 2:
				apply(p, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{b}, TokenIDs: []int64{}, Medium: []byte("CPU")})
			case 3:
				apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{b}})
			case 4:
				apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{b}, Medium: []byte("CPU")})
			default:
				if n%50 == 0 {
					apply(p, kvevents.Event{Kind: kvevents.AllBlocksCleared})
				}
			}
		}
	}()
	out := make([]int32, 1)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		for b := range 60 {
			key := &Key{IDs: []int64{int64(b), 7}}
			_ = x.TierOverlap(cand(1), key)
			fillRows(x, []shared.WorkerID{1}, nil, nil, key, out)
		}
	}
	tab := p.w
	for i := p.head; i >= 0; i = p.slot(i).next {
		st := p.slot(i)
		if tab.has(st.rh, flagGPU) != p.held(tierGPU, i) || tab.has(st.rh, flagCPU) != p.held(tierCPU, i) {
			t.Fatalf("block %x: table flags disagree with its residency %+v", st.rh, *st)
		}
	}
}
