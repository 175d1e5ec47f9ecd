package router

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/internal/cputime"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// benchDefaultPolicy is the built-in default policy as the benchmarks run
// it: the kv-affinity scorer with its defaults and min-cost at temperature
// 0, seeded.
func benchDefaultPolicy() *policy.Policy {
	kv, _ := builtin.NewKVAffinity(nil)
	mc, _ := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
	return &policy.Policy{Name: "default", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
}

// benchDefaultFleet returns a router over n aggregated workers of 4,096
// KV blocks each (ids 0 to n-1), with the default policy
// (benchDefaultPolicy), 512-token blocks and bookings as load.
func benchDefaultFleet(b *testing.B, n int) *Router {
	b.Helper()
	r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: benchDefaultPolicy()}, BookingsAreLoad: true})
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
	return r
}

// BenchmarkSelect times whole selections of the default policy
// (kv-affinity scorer + min-cost picker, temperature 0) at 64, 1,024 and 4,096
// workers, for a 16-block (8,192-token, 512-token blocks) prompt whose
// prefix no worker holds (none), one worker holds (one: it wins every
// selection), every worker holds (all: a tie among all, broken at
// random) or every worker holds the first half of (half: a shared
// system prompt and a new question, the last 8 blocks new every
// iteration). Each timed iteration is one Router.Place and the release of
// its booking: reading the fleet snapshot and the bundle, the CACHE
// column from the prefix index (Index.Fill), the LOAD column (each
// worker's booking counters), the CAPACITY column, kv-affinity's costs,
// min-cost's pick, the booking (into storage the caller owns, as the
// admission layer books: Placement.Booking), recording the prompt in the
// chosen worker's recency list, and Booking.Release. With none, every
// iteration's prompt is new (its first block id is the iteration
// number), so the iteration also computes its 16 chained hashes and
// records 16 new blocks in the index (evicting the worker's 16 least
// recent once its 4,096-block list is full); with half, its 9th block id
// is the iteration number, so it records the 8 held blocks and 8 new
// ones; one and all record blocks the chosen worker already holds. Not timed: building the fleet
// and recording the held prefix. Besides ns/op (wall time) it reports
// cpu-ns/op, the process's CPU time per selection (getrusage), which
// other processes on a shared machine do not stretch.
//
//	go test -run='^$' -bench='^BenchmarkSelect$' -benchmem ./router/
func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		for _, shape := range []string{"none", "one", "all", "half"} {
			b.Run(fmt.Sprintf("workers=%d/held=%s", n, shape), func(b *testing.B) {
				r := benchDefaultFleet(b, n)
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
				case "half":
					for i := range n {
						r.index.Record(prefix.Candidate{ID: shared.WorkerID(i)}, held[:8])
					}
				}
				req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8192, BlockSize: 512, BlockHashes: held}
				ctx := context.Background()
				var booking fleet.Booking
				pl := Placement{Booking: &booking}
				b.ReportAllocs()
				n, cpu0 := 0, cputime.Process()
				for i := uint64(1 << 40); b.Loop(); i++ {
					switch shape {
					case "none":
						ids[0] = i
						req.BlockHashes = prefix.ChainHashes(req.BlockHashes[:0], ids)
					case "half":
						ids[8] = i
						req.BlockHashes = prefix.ChainHashes(req.BlockHashes[:0], ids)
					}
					d, err := r.Place(ctx, req, pl)
					if err != nil {
						b.Fatal(err)
					}
					d.Booking.Release()
					n++
				}
				if cpu := cputime.Process() - cpu0; cpu > 0 {
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkSelectPolicies measures one whole selection through the Router: the
// hosted path or the pipeline with the inputs it declares (the prefix index
// lookup for CACHE included), booking, prefix-index recording, and the
// release, for a 24-block (12k-token) prompt that shares 8 leading blocks
// with earlier traffic. The component-only numbers are BenchmarkHosted* in
// hosted/ and BenchmarkDefaultPolicy* in builtin/.
//
//	go test -run='^$' -bench=SelectPolicies -benchmem ./router/
func BenchmarkSelectPolicies(b *testing.B) {
	policies := []struct {
		name string
		make func() *policy.Policy
	}{
		{"round-robin", func() *policy.Policy {
			return &policy.Policy{Name: "rr", PickerName: "rr", Picker: builtin.NewRoundRobin()}
		}},
		{"default", benchDefaultPolicy},
		{"kv-cost", func() *policy.Policy {
			kv, _ := builtin.NewKVCost(nil)
			mc, _ := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
			return &policy.Policy{Name: "kv", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
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

// shadowBenchRouter is BenchmarkSelectPolicies' router of the default policy
// over 64 workers, warmed the same way, with the default policy's twin (a
// second, in-process instance) as its shadow when mode is "async"
// (serve's) or "inline" (replay's), and the request it places.
func shadowBenchRouter(b *testing.B, mode string) (*Router, *shared.Request) {
	defaultPolicy := benchDefaultPolicy
	live := defaultPolicy()
	var o ShadowOptions
	if mode != "off" {
		live.Shadow = defaultPolicy()
		o.Inline = mode == "inline"
	}
	const n = 64
	r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: live}, BookingsAreLoad: true, Shadow: o})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close(context.Background()) })
	for i := range n {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated, TotalKVBlocks: 859}); err != nil {
			b.Fatal(err)
		}
	}
	ids := make([]uint64, 24)
	for i := range n {
		for k := range ids {
			ids[k] = uint64(i*1000 + k)
		}
		r.index.Record(prefix.Candidate{ID: shared.WorkerID(i)}, prefix.ChainHashes(nil, ids[:8]))
	}
	for k := range ids {
		ids[k] = uint64(3*1000 + k)
	}
	return r, &shared.Request{Role: shared.RoleAggregated, PromptTokens: 12000, BlockSize: 512, BlockHashes: prefix.ChainHashes(nil, ids)}
}

// BenchmarkPlaceShadow measures one whole selection through Place, as
// BenchmarkSelectPolicies does (the default policy over 64 workers: candidate
// inputs, the policy, booking, prefix-index recording, the release),
// without a shadow (off) and with the default policy's twin as its
// shadow: async is serve's mode (the live path copies the shadow's
// candidate inputs and starts its goroutine; the shadow runs beside it,
// on the other core when there is one), inline is replay's (the shadow's
// whole decision is inside Place). off vs async is what shadow mode costs
// the live path. BenchmarkPlaceShadowInterleaved times the same on a busy
// machine.
//
//	go test -run='^$' -bench=PlaceShadow -benchmem ./router/
func BenchmarkPlaceShadow(b *testing.B) {
	for _, mode := range []string{"off", "async", "inline"} {
		b.Run(mode, func(b *testing.B) {
			r, req := shadowBenchRouter(b, mode)
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

// BenchmarkPlaceShadowInterleaved is BenchmarkPlaceShadow's three modes
// timed in turn within each iteration (off, async, inline), so that a
// machine whose load drifts slows all three alike, and reports each
// mode's median and p90 Place time (off-p50-ns and so on; ns/op is the
// three together).
func BenchmarkPlaceShadowInterleaved(b *testing.B) {
	modes := []string{"off", "async", "inline"}
	var routers [3]*Router
	var reqs [3]*shared.Request
	for i, m := range modes {
		routers[i], reqs[i] = shadowBenchRouter(b, m)
	}
	var times [3][]time.Duration
	ctx := context.Background()
	for b.Loop() {
		for i, r := range routers {
			t0 := time.Now()
			d, err := r.Place(ctx, reqs[i], Placement{})
			times[i] = append(times[i], time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			d.Booking.Release()
		}
	}
	for i, m := range modes {
		slices.Sort(times[i])
		q := func(p float64) float64 { return float64(times[i][int(p*float64(len(times[i])-1))]) }
		b.ReportMetric(q(0.5), m+"-p50-ns")
		b.ReportMetric(q(0.9), m+"-p90-ns")
	}
}

// BenchmarkSelectFloor is the floor under BenchmarkSelect's held=all
// shape: the least a load- and cache-aware selection over n workers must
// do, timed with the same fleets. Each timed iteration reads the fleet
// snapshot's partition, reads every worker's load counters into a
// column (fleet.FillLoads, as fill does), computes a cost per row from
// them and a constant overlap (every worker holds the prompt: no index
// lookup), and takes the first lowest. No prefix-index lookup, no
// booking, no recording, no random tie-break: what is left of a whole
// selection is its per-worker scan, which this times.
//
//	go test -run='^$' -bench='^BenchmarkSelect(Floor)?$' -benchmem ./router/
func BenchmarkSelectFloor(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r := benchDefaultFleet(b, n)
			req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8192, BlockSize: 512}
			loads := make([]shared.Load, n)
			const overlap, bs = 16, 512.0
			b.ReportAllocs()
			var sink int
			n, cpu0 := 0, cputime.Process()
			for b.Loop() {
				n++
				part, err := r.partition(req)
				if err != nil {
					b.Fatal(err)
				}
				ls := loads[:len(part.Workers)]
				fleet.FillLoads(part.Workers, ls, true)
				best, low := 0, 0.0
				for i := range ls {
					c := float64(ls[i].ActivePrefillTokens)/bs + 16 - 4*overlap + float64(ls[i].ActiveDecodeBlocks)/32
					if i == 0 || c < low {
						best, low = i, c
					}
				}
				sink += best
			}
			if sink < 0 {
				b.Fatal("unreachable")
			}
			if cpu := cputime.Process() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
			}
		})
	}
}
