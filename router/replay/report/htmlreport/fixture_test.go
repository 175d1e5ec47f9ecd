package htmlreport

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

// The fixture's sweep: two policies on two fleets, two seeds each. 20
// workers is over MaxWorkerLines, so its in-flight charts draw the band.
var (
	fixtureFleets   = []int{4, 20}
	fixtureSeeds    = []int64{3, 4}
	fixtureRequests = 400
	fixtureSLO      = report.SLO{TTFT: 2 * time.Second}
	fixturePolicies = []struct{ name, src string }{
		{"power-of-two", `router { seed = %d }
policy "p2c" {
  picker "p2c" { type = "power-of-two" }
}
worker_selection { aggregated = "p2c" }
`},
		// The built-in default policy (kv-affinity), seeded.
		{"default", "router { seed = %d }\n"},
	}
)

// fixtureCells replays fixtureRequests requests of the bundled Mooncake
// trace with timelines, once per policy, fleet and seed: cells in table
// order (fleet, then policy). Built once for the package's tests.
var fixtureCells = sync.OnceValues(func() ([]report.Cell, error) {
	recs, err := trace.ReadFile("../../../../testdata/traces/mooncake_arxiv_trace_first1000.jsonl")
	if err != nil {
		return nil, err
	}
	recs = recs[:fixtureRequests]
	var cells []report.Cell
	for _, workers := range fixtureFleets {
		for _, p := range fixturePolicies {
			var c report.Cell
			for _, seed := range fixtureSeeds {
				b, diags := config.Load(p.name+".hcl", fmt.Appendf(nil, p.src, seed), catalog.Default())
				if diags.HasErrors() {
					return nil, fmt.Errorf("%s: %s", p.name, config.FormatDiagnostics(diags))
				}
				rep, err := replay.Run(context.Background(), replay.Options{PolicyName: p.name, Roles: b.Roles, BlockSize: b.BlockSize,
					TraceName: "mooncake_arxiv_trace_first1000.jsonl", Records: recs, Workers: workers, Timeline: true,
					SLO: fixtureSLO})
				if err != nil {
					return nil, fmt.Errorf("%s on %d workers, seed %d: %w", p.name, workers, seed, err)
				}
				rep.Seed = &seed
				c.Runs = append(c.Runs, rep)
			}
			cells = append(cells, c)
		}
	}
	return cells, nil
})

func mustCells(t *testing.T) []report.Cell {
	t.Helper()
	cells, err := fixtureCells()
	if err != nil {
		t.Fatal(err)
	}
	return cells
}
