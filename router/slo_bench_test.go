package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// benchSLOPolicy is examples/policies/slo.hcl's policy: the slo filter
// in front of the default kv-affinity scorer and min-cost picker.
func benchSLOPolicy() *policy.Policy {
	p := benchDefaultPolicy()
	p.Name = "slo"
	f, _ := builtin.NewSLO(nil)
	p.Filters = []policy.NamedFilter{{Name: "headroom", Filter: f}}
	return p
}

// BenchmarkSelectSLO times whole selections, as BenchmarkSelect does (one
// Router.Place and the release of its booking, same fleet and prompt), of
// the default policy and of the slo policy beside it in the same run, so
// the difference is what the latency predictor and the slo filter add:
// the LATENCY columns (each candidate's features and a prediction from
// its class model: 64 workers in 8 classes), the filter's pass over them
// and the decision's learning sample. The request has targets of 10 s
// TTFT and 1 s TPOT, which every worker meets, so the filter keeps every
// row and the scorer and picker see the same candidates as the default's.
// The models are trained (200 observations per class) before the timed
// loop; no answer is observed in it.
func BenchmarkSelectSLO(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		for _, shape := range []string{"none", "all"} {
			for _, pol := range []struct {
				name string
				make func() *policy.Policy
			}{{"default", benchDefaultPolicy}, {"slo", benchSLOPolicy}} {
				b.Run(fmt.Sprintf("workers=%d/held=%s/%s", n, shape, pol.name), func(b *testing.B) {
					r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol.make()}, BookingsAreLoad: true})
					if err != nil {
						b.Fatal(err)
					}
					specs := make([]fleet.Spec, n)
					for i := range specs {
						specs[i] = fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated, TotalKVBlocks: 4096,
							Labels: map[string]string{shared.LabelClass: fmt.Sprintf("gpu-%d", i%8)}}
					}
					ws, err := r.AddWorkers(specs...)
					if err != nil {
						b.Fatal(err)
					}
					ids := make([]uint64, 16)
					for k := range ids {
						ids[k] = uint64(k)
					}
					held := prefix.ChainHashes(nil, ids)
					if shape == "all" {
						for i := range n {
							r.index.Record(prefix.Candidate{ID: shared.WorkerID(i)}, held)
						}
					}
					req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8192, BlockSize: 512, BlockHashes: held,
						SLO: shared.SLO{TTFT: 10 * time.Second, TPOT: time.Second}}
					ctx := context.Background()
					var booking fleet.Booking
					pl := Placement{Booking: &booking}
					// Train each class: 200 decisions observed at made-up latencies.
					for k := range 200 * 8 {
						d, err := r.Place(ctx, req, pl)
						if err != nil {
							b.Fatal(err)
						}
						if !d.Learn && pol.name == "slo" {
							b.Fatal("the slo policy's decision keeps no sample")
						}
						r.ObserveFirstToken(&d, time.Duration(100+k%50)*time.Millisecond)
						r.ObserveEnd(&d, 100, time.Duration(10+k%5)*time.Millisecond)
						d.Booking.Release()
					}
					_ = ws
					b.ReportAllocs()
					for i := uint64(1 << 40); b.Loop(); i++ {
						if shape == "none" {
							ids[0] = i
							req.BlockHashes = prefix.ChainHashes(req.BlockHashes[:0], ids)
						}
						d, err := r.Place(ctx, req, pl)
						if err != nil {
							b.Fatal(err)
						}
						d.Booking.Release()
					}
				})
			}
		}
	}
}
