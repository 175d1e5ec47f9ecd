package builtin

import (
	"context"
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// BenchmarkDefaultPolicy measures the default policy's scorer and picker
// (kv-affinity + min-cost; kv-cost, the default before issue #14, beside
// it) on prebuilt candidates with LOAD, CACHE and CAPACITY columns of
// varied values: the scorer writes a scratch column that is summed with its
// weight into Costs, exactly as the pipeline does, then the picker runs. The
// candidate columns and scratch are allocated once, outside the loop, as the
// pipeline reuses its buffers. Compare runs with
//
//	go test -run='^$' -bench=BenchmarkDefaultPolicy -benchmem -count=10 ./builtin/ > new.txt
//	benchstat old.txt new.txt
func BenchmarkDefaultPolicy(b *testing.B) {
	scorers := []struct {
		name string
		make func() (shared.Scorer, error)
	}{
		{TypeKVAffinity, func() (shared.Scorer, error) { return NewKVAffinity(nil) }},
		{TypeKVCost, func() (shared.Scorer, error) { return NewKVCost(nil) }},
	}
	for _, sc := range scorers {
		for _, n := range []int{64, 1024, 4096} {
			for _, temp := range []float64{0, 0.7} {
				b.Run(fmt.Sprintf("scorer=%s/workers=%d/temp=%v", sc.name, n, temp), func(b *testing.B) {
					c := &shared.Candidates{
						IDs:           idsN(n),
						Load:          make([]shared.Load, n),
						OverlapBlocks: make([]int32, n),
						TotalKVBlocks: make([]int64, n),
						Costs:         make([]float64, n),
					}
					for i := range n {
						c.Load[i] = shared.Load{
							Available:           i%17 != 0,
							ActivePrefillTokens: int64((i * 7919) % 20000),
							ActiveDecodeBlocks:  int64((i * 104729) % 3000),
							ActiveRequests:      int64(i % 23),
							KVUsage:             float64(i%100) / 100,
							HasKVUsage:          true,
						}
						c.OverlapBlocks[i] = int32((i * 31) % 40)
						c.TotalKVBlocks[i] = 4096
					}
					req := &shared.Request{PromptTokens: 8192, BlockSize: 512}
					scorer, err := sc.make()
					if err != nil {
						b.Fatal(err)
					}
					picker, err := NewMinCost(shared.Params{ParamTemperature: temp, ParamSeed: int64(1)})
					if err != nil {
						b.Fatal(err)
					}
					const weight = 1.0
					scratch := make([]float64, n)
					ctx := context.Background()
					b.ReportAllocs()
					for b.Loop() {
						clear(c.Costs)
						if err := scorer.Score(ctx, req, c, scratch); err != nil {
							b.Fatal(err)
						}
						for i, s := range scratch {
							c.Costs[i] += weight * s
						}
						if _, err := picker.Pick(ctx, req, c); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
