package prefix

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

func TestExportImportRoundTrip(t *testing.T) {
	x, p := preciseIndex(t)
	x.Record(cand(1), []uint64{1, 2, 3})
	x.Record(cand(2), []uint64{7, 8})
	x.Record(cand(2), []uint64{9}) // 9 most recent
	apply(p, stored(nil, []uint64{100, 101}, []int64{1, 2, 3, 4}, 2))
	apply(p, stored(ptr(101), []uint64{102}, []int64{5, 6}, 2))
	apply(p, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{100}})

	c1, ok := x.Export(cand(1))
	if !ok || c1.Precise == nil {
		t.Fatalf("Export(1) = %+v, %v; want precise content", c1, ok)
	}
	c2, _ := x.Export(cand(2))
	if diff := cmp.Diff([]uint64{9, 7, 8}, c2.Approx); diff != "" {
		t.Fatalf("approximate list, most recent first (-want +got):\n%s", diff)
	}
	if got := c1.Blocks(); got != 3+2 {
		t.Fatalf("Blocks = %d, want 5 (3 approximate, 2 precise)", got)
	}

	// Another router's index: the same candidates, candidate 1 precise
	// (something feeds it) but cold and empty.
	y := New(4)
	for id := 1; id <= 2; id++ {
		if err := y.AddWorker(cand(id), 100); err != nil {
			t.Fatal(err)
		}
	}
	q := y.Precise(cand(1))
	if ok, precise := y.Import(cand(1), c1); !ok || !precise {
		t.Fatalf("Import of candidate 1 = %v, %v; want its precise content taken", ok, precise)
	}
	if ok, precise := y.Import(cand(2), c2); !ok || precise {
		t.Fatalf("Import of candidate 2 = %v, %v; want approximate content only", ok, precise)
	}
	for id, want := range map[int]Content{1: c1, 2: c2} {
		got, _ := y.Export(cand(id))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("candidate %d after import (-exported +imported):\n%s", id, diff)
		}
	}
	if !q.Stats().Live {
		t.Fatal("imported precise index not live, the exported one was")
	}
	// It answers as the original: blocks 101, 102 stay, 100 was removed,
	// so a prompt starting at block 100 overlaps nothing, and the chain
	// learnt through the parent map still extends.
	key := &Key{IDs: []int64{1, 2, 3, 4, 5, 6}}
	for _, ix := range []*Index{x, y} {
		if got, _ := ix.OverlapTokens(cand(1), nil, key); got != 0 {
			t.Fatalf("overlap of a prompt whose first block was removed = %d, want 0", got)
		}
	}
	apply(q, stored(ptr(102), []uint64{103}, []int64{7, 8}, 2))
	apply(p, stored(ptr(102), []uint64{103}, []int64{7, 8}, 2))
	a, _ := x.Export(cand(1))
	b, _ := y.Export(cand(1))
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("after a child event on both (-original +imported):\n%s", diff)
	}
	if n := len(b.Precise.Router); n != 3 {
		t.Fatalf("imported index holds %d blocks after a child of an imported block, want 3", n)
	}
}

func TestImportRules(t *testing.T) {
	x, p := preciseIndex(t)
	apply(p, stored(nil, []uint64{100}, []int64{1, 2}, 2))
	if ok, _ := x.Import(cand(9), Content{Approx: []uint64{1}}); ok {
		t.Fatal("Import on an untracked candidate succeeded")
	}
	bad := Content{Precise: &PreciseContent{BlockSize: 2, Router: []uint64{1, 2}, Engine: []uint64{1}, Mask: []uint64{1, 1}}}
	if ok, _ := x.Import(cand(1), bad); ok {
		t.Fatal("Import of unequal precise slices succeeded")
	}
	noSize := Content{Precise: &PreciseContent{Router: []uint64{1}, Engine: []uint64{1}, Mask: []uint64{1}}}
	if ok, _ := x.Import(cand(1), noSize); ok {
		t.Fatal("Import of precise blocks without a block size succeeded")
	}
	// A running stream is never overwritten.
	other := Content{Precise: &PreciseContent{BlockSize: 2, Groups: 1, Live: true, Router: []uint64{5, 6}, Engine: []uint64{50, 60}, Mask: []uint64{1, 1}}}
	if ok, precise := x.Import(cand(1), other); !ok || precise {
		t.Fatalf("Import over a fed index = %v, %v; want ok, its precise content not taken", ok, precise)
	}
	if got := p.Stats().Blocks; got != 1 {
		t.Fatalf("precise blocks after importing over a fed index = %d, want 1 (untouched)", got)
	}
	// An approximate candidate takes the approximate part only.
	if ok, precise := x.Import(cand(2), other); !ok || precise {
		t.Fatalf("Import on an approximate candidate = %v, %v; want ok, approximate only", ok, precise)
	}
	if c, _ := x.Export(cand(2)); c.Precise != nil {
		t.Fatal("Import made an approximate candidate precise")
	}
}
