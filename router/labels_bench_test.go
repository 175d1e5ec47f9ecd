package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// nopScorer adds cost 0 and declares in: it makes a policy declare LABELS
// (or nothing) without doing any work of its own.
type nopScorer struct{ in shared.Inputs }

func (s nopScorer) Inputs() shared.Inputs { return s.in }
func (nopScorer) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return nil
}

// BenchmarkSelectLabels measures what the LABELS input costs an in-process
// selection: the default policy (kv-affinity + min-cost) plus a scorer
// that does nothing and declares LABELS (labels=declared) or nothing
// (labels=none), over named workers with three labels of their own, one
// of which holds the prompt's 16-block prefix. Each iteration is one
// Router.Place and its release, as in BenchmarkSelect.
//
//	go test -run='^$' -bench='^BenchmarkSelectLabels$' -benchmem ./router/
func BenchmarkSelectLabels(b *testing.B) {
	for _, n := range []int{64, 1024} {
		for _, declared := range []bool{false, true} {
			name := "none"
			in := shared.Inputs(0)
			if declared {
				name, in = "declared", shared.InputLabels
			}
			b.Run(fmt.Sprintf("workers=%d/labels=%s", n, name), func(b *testing.B) {
				pol := benchDefaultPolicy()
				pol.Scorers = append(pol.Scorers, policy.WeightedScorer{Name: "nop", Weight: 1, Scorer: nopScorer{in}})
				r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol}, BookingsAreLoad: true})
				if err != nil {
					b.Fatal(err)
				}
				specs := make([]fleet.Spec, n)
				for i := range specs {
					name := fmt.Sprintf("gpu-%d", i)
					specs[i] = fleet.Spec{ID: shared.WorkerIDOf(name), Name: name, Role: shared.RoleAggregated, TotalKVBlocks: 4096,
						Models: []string{"llama"}, Labels: map[string]string{"zone": fmt.Sprint("z", i%4), "rack": fmt.Sprint("r", i%16), "gpu": "h100"}}
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
				r.index.Record(prefix.Candidate{ID: ws[7].ID}, held)
				req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8192, BlockSize: 512, BlockHashes: held}
				ctx := context.Background()
				var booking fleet.Booking
				pl := Placement{Booking: &booking}
				b.ReportAllocs()
				for b.Loop() {
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
