package replay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/trace"
)

// BenchmarkReplaySetup4096 times a whole replay of one request on 4,096
// simulated workers with the default policy: building the router, its
// fleet, its prefix index and the simulated cluster, then routing and
// simulating the one request. Setup is nearly all of it (issue #14's
// target: under 0.2 s).
func BenchmarkReplaySetup4096(b *testing.B) {
	recs := []trace.Record{{InputLength: 1000, OutputLength: 10, HashIDs: []uint64{1, 2}}}
	pf := loadPolicy(b, "")
	for b.Loop() {
		o := Options{Roles: pf.Roles, BlockSize: 512, Records: recs, Workers: 4096}
		if _, err := Run(context.Background(), o); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayReplicas times a whole replay of the arXiv sample (1,000
// requests) on 8 workers with the default policy, by one router and by
// three replicas with a 10 ms sync delay, in both prefix modes: the cost
// of the replicas' own routing and of the mirrored bookings (two per
// request with three replicas), and in precise mode of applying every KV
// event three times.
func BenchmarkReplayReplicas(b *testing.B) {
	recs := readTrace(b, "mooncake_arxiv_trace_first1000.jsonl")
	for _, mode := range []PrefixMode{PrefixApproximate, PrefixPrecise} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%v/replicas=%d", mode, n), func(b *testing.B) {
				for b.Loop() {
					pf := loadPolicy(b, seededDefault)
					o := Options{Roles: pf.Roles, BlockSize: 512, Records: recs, Workers: 8, Prefix: mode, Replicas: n,
						Replica: func(int) (Replica, error) { return Replica{Roles: loadPolicy(b, seededDefault).Roles}, nil }}
					if n > 1 {
						o.SyncDelay = 10 * time.Millisecond
					}
					if mode == PrefixPrecise {
						o.KVEventDelay = DefaultKVEventDelay
					}
					if _, err := Run(context.Background(), o); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
