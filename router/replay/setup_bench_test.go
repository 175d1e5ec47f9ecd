package replay

import (
	"context"
	"testing"

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
