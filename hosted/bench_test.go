package hosted_test

import (
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// The hosted-path benchmarks build a WorkerInputView on the stack per
// iteration and run hosted.Select, as the router does per request. The
// candidate-set key is precomputed (the router computes it once per
// membership change) and the active-requests accessor reads a slice of
// varied counts. The number to watch is 0 allocs/op; compare runs with
//
//	go test -run='^$' -bench=BenchmarkHosted -benchmem -count=10 ./hosted/ > new.txt
//	benchstat old.txt new.txt

var benchSizes = []int{8, 64, 1024, 4096}

func benchHosted(b *testing.B, p hosted.HostedWorkerPicker) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			ids := make([]shared.WorkerID, n)
			counts := make([]int64, n)
			for i := range ids {
				ids[i] = shared.WorkerID(100 + 3*i)
				counts[i] = int64((i*7919)%37 + 1) // varied, with ties
			}
			active := func(row int) int64 { return counts[row] }
			key := hosted.CandidateSetKey("model", shared.RoleAggregated, ids)
			b.ReportAllocs()
			for b.Loop() {
				v := hosted.NewWorkerInputView(ids, key, active, 512)
				if _, err := hosted.Select(p, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkHostedRoundRobin(b *testing.B) { benchHosted(b, builtin.NewRoundRobin()) }

func BenchmarkHostedRandom(b *testing.B) {
	benchHosted(b, builtin.NewRandom(shared.Params{builtin.ParamSeed: int64(1)}))
}

func BenchmarkHostedLeastLoaded(b *testing.B) {
	benchHosted(b, builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(1)}))
}

func BenchmarkHostedPowerOfTwo(b *testing.B) {
	benchHosted(b, builtin.NewPowerOfTwo(shared.Params{builtin.ParamSeed: int64(1)}))
}
