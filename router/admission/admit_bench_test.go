package admission

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// BenchmarkAdmitParallel measures whole requests through the admission
// layer from every goroutine at once: Admit (the classifier-less default
// path: uncached tokens for the queue's charge, placement with the
// capacity try-book, the live table), Wait (placed at once), and End
// (release, live table), for a 24-block (12k-token) prompt over 64
// workers with max_active_requests = 8, so the capacity check is on the
// path but never full. The timed loop is one request's whole life in the
// router, without a proxy or an engine.
//
//	go test -run='^$' -bench=AdmitParallel -benchmem -cpu 1,2 ./router/admission/
//
// Throughput should scale with cores: nothing in it takes a router-wide
// lock.
func BenchmarkAdmitParallel(b *testing.B) {
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
	const workers = 64
	for _, pol := range policies {
		b.Run(pol.name, func(b *testing.B) {
			r, err := router.New(router.Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol.make()}, BookingsAreLoad: true})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = r.Close(context.Background()) }()
			for i := range workers {
				if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated, TotalKVBlocks: 859}); err != nil {
					b.Fatal(err)
				}
			}
			q := config.DefaultQueue()
			q.MaxActiveRequests = 8
			c, err := New(r, Options{Queue: q})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var g atomic.Int64
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := g.Add(1)
				ids := make([]uint64, 24)
				for k := range ids {
					ids[k] = uint64(n*1000) + uint64(k)
				}
				req := &shared.Request{ID: fmt.Sprintf("g%d", n), Role: shared.RoleAggregated, PromptTokens: 12000, BlockHashes: prefix.ChainHashes(nil, ids)}
				for pb.Next() {
					h, err := c.Admit(ctx, req)
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := h.Wait(ctx); err != nil {
						b.Error(err)
						return
					}
					h.End(Completed(12001))
				}
			})
		})
	}
}
