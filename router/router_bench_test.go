package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// BenchmarkSelectShapes measures one whole selection of the default
// policy (kv-cost + min-cost) through Router.Place, the scope Dynamo's
// router benchmark times (docs in BENCHMARKS.md, "Whole selection"):
// the candidate partition, the prefix-index lookup, the load and capacity
// columns, scoring, picking, booking, recording the prefix and releasing
// the booking; a 16-block (8k-token) prompt, at 64, 1,024 and 4,096
// workers, with its prefix held by no worker, by one, or by every worker.
//
//	go test -run='^$' -bench=SelectShapes -benchmem ./router/
func BenchmarkSelectShapes(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		for _, shape := range []string{"none", "one", "all"} {
			b.Run(fmt.Sprintf("workers=%d/held=%s", n, shape), func(b *testing.B) {
				kv, _ := builtin.NewKVCost(nil)
				mc, _ := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
				pol := &policy.Policy{Name: "default", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
				r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol}, BookingsAreLoad: true})
				if err != nil {
					b.Fatal(err)
				}
				specs := make([]fleet.Spec, n)
				for i := range specs {
					specs[i] = fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated, TotalKVBlocks: 4096}
				}
				if _, err := r.AddWorkers(specs...); err != nil {
					b.Fatal(err)
				}
				ids := make([]uint64, 16)
				for k := range ids {
					ids[k] = uint64(k)
				}
				held := prefix.ChainHashes(nil, ids)
				switch shape {
				case "one":
					r.index.Record(prefix.Candidate{ID: 7}, held)
				case "all":
					for i := range n {
						r.index.Record(prefix.Candidate{ID: shared.WorkerID(i)}, held)
					}
				}
				req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8192, BlockSize: 512, BlockHashes: held}
				if shape == "none" {
					ids[0] = 1 << 40
					req.BlockHashes = prefix.ChainHashes(nil, ids)
				}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					d, err := r.Place(ctx, req, Placement{})
					if err != nil {
						b.Fatal(err)
					}
					d.Booking.Release()
				}
			})
		}
	}
}

// BenchmarkSelect measures one whole selection through the Router: the
// hosted path or the pipeline with the inputs it declares (the prefix index
// lookup for CACHE included), booking, prefix-index recording, and the
// release, for a 24-block (12k-token) prompt that shares 8 leading blocks
// with earlier traffic. The component-only numbers are BenchmarkHosted* in
// hosted/ and BenchmarkDefaultPolicy* in builtin/.
//
//	go test -run='^$' -bench=Select -benchmem ./router/
func BenchmarkSelect(b *testing.B) {
	policies := []struct {
		name string
		make func() *policy.Policy
	}{
		{"round-robin", func() *policy.Policy {
			return &policy.Policy{Name: "rr", PickerName: "rr", Picker: builtin.NewRoundRobin()}
		}},
		{"default", func() *policy.Policy {
			kv, _ := builtin.NewKVCost(nil)
			mc, _ := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
			return &policy.Policy{Name: "default", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
		}},
	}
	for _, pol := range policies {
		for _, n := range []int{8, 64, 1024} {
			b.Run(fmt.Sprintf("%s/workers=%d", pol.name, n), func(b *testing.B) {
				r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol.make()}, BookingsAreLoad: true})
				if err != nil {
					b.Fatal(err)
				}
				for i := range n {
					if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated, TotalKVBlocks: 859}); err != nil {
						b.Fatal(err)
					}
				}
				ids := make([]uint64, 24)
				// Warm the index: every worker has seen a different 8-block prefix.
				for i := range n {
					for k := range ids {
						ids[k] = uint64(i*1000 + k)
					}
					r.index.Record(prefix.Candidate{ID: shared.WorkerID(i)}, prefix.ChainHashes(nil, ids[:8]))
				}
				for k := range ids {
					ids[k] = uint64(3*1000 + k) // shares worker 3's prefix
				}
				req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 12000, BlockSize: 512, BlockHashes: prefix.ChainHashes(nil, ids)}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					d, err := r.Place(ctx, req, Placement{})
					if err != nil {
						b.Fatal(err)
					}
					d.Booking.Release()
				}
			})
		}
	}
}
