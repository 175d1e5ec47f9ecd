package cluster

import (
	"testing"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// snapshotFleet returns a router of workers workers of blocks KV blocks
// each, whose approximate lists are full of distinct block hashes when
// fill.
func snapshotFleet(b *testing.B, workers, blocks int, fill bool) *router.Router {
	b.Helper()
	r, err := router.New(router.Options{BlockSize: 16, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(b)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close(b.Context()) })
	hashes := make([]uint64, 1000)
	for w := range workers {
		id := shared.WorkerID(w + 1)
		if _, err := r.AddWorker(fleet.Spec{ID: id, Name: "w" + string(rune('a'+w)), Role: shared.RoleAggregated, TotalKVBlocks: int64(blocks)}); err != nil {
			b.Fatal(err)
		}
		for i := 0; fill && i < blocks; i += len(hashes) {
			for j := range hashes {
				hashes[j] = uint64(w)<<40 | uint64(i+j)
			}
			r.Prefix().Record(prefix.Candidate{ID: id}, hashes)
		}
	}
	return r
}

// BenchmarkSnapshotWrite times what the writing replica does per
// snapshot but the object store's put: every member's index copied
// (Router.PrefixExport, each member's list locked while copied) and
// encoded, for 16 workers of 100,000 blocks each (12.8 MB).
func BenchmarkSnapshotWrite(b *testing.B) {
	r := snapshotFleet(b, 16, 100_000, true)
	var n int
	for b.Loop() {
		n = len(encodeSnapshot(&indexSnapshot{Writer: "a", Workers: exportPrefix(r)}))
	}
	b.ReportMetric(float64(n), "bytes/snapshot")
}

// BenchmarkSnapshotLoad times what a starting replica does with a
// snapshot but the object store's get: decoded and imported into a fresh
// router's index, for 16 workers of 100,000 blocks each.
func BenchmarkSnapshotLoad(b *testing.B) {
	data := encodeSnapshot(&indexSnapshot{Writer: "a", Workers: exportPrefix(snapshotFleet(b, 16, 100_000, true))})
	for b.Loop() {
		b.StopTimer()
		fresh := snapshotFleet(b, 16, 100_000, false)
		b.StartTimer()
		s, err := decodeSnapshot(data)
		if err != nil {
			b.Fatal(err)
		}
		for i, w := range s.Workers {
			fresh.Prefix().Import(prefix.Candidate{ID: shared.WorkerID(i + 1), Rank: w.Rank}, w.Content)
		}
	}
	b.ReportMetric(float64(len(data)), "bytes/snapshot")
}
