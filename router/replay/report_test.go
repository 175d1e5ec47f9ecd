package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// busyOne admits one request per worker at a time and refuses the rest.
const busyOne = `
policy "busy" {
  filter "b" {
    type                = "busy"
    max_active_requests = 1
  }
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "busy" }
`

// simultaneous returns n requests that all arrive at time 0.
func simultaneous(n int) []trace.Record {
	recs := make([]trace.Record, n)
	for i := range recs {
		recs[i] = trace.Record{Index: i, Line: i + 1, InputLength: 100, OutputLength: 10}
	}
	return recs
}

// Five requests arrive at once on two workers that admit one each: the
// first two are served, the other three rejected by the filter, and the
// report counts them by reason.
func TestReportRejections(t *testing.T) {
	b := loadPolicy(t, busyOne)
	var perReq bytes.Buffer
	rep, err := Run(context.Background(), Options{PolicyName: "busy", Roles: b.Roles, RolePolicies: b.RolePolicies,
		BlockSize: b.BlockSize, TraceName: "t", Records: simultaneous(5), Workers: 2, PerRequest: &perReq})
	if err != nil {
		t.Fatal(err)
	}
	const reason = `policy "busy": filter "b": all candidates filtered out`
	if rep.Requests != 5 || rep.Completed != 2 || rep.Rejected != 3 {
		t.Fatalf("requests %d completed %d rejected %d, want 5, 2, 3", rep.Requests, rep.Completed, rep.Rejected)
	}
	if len(rep.RejectionReasons) != 1 || rep.RejectionReasons[reason] != 3 {
		t.Fatalf("rejection reasons %v, want {%q: 3}", rep.RejectionReasons, reason)
	}
	if r, n := rep.TopRejection(); r != reason || n != 3 {
		t.Errorf("TopRejection() = %q, %d; want %q, 3", r, n, reason)
	}
	if got := rep.RolePolicies; len(got) != 1 || got["aggregated"] != "busy" {
		t.Errorf("role policies %v, want {aggregated: busy}", got)
	}
	if n := strings.Count(perReq.String(), `"status":"rejected: `+strings.ReplaceAll(reason, `"`, `\"`)+`"`); n != 3 {
		t.Errorf("%d per-request lines carry the rejection, want 3:\n%s", n, perReq.String())
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`"rejection_reasons":{"policy \"busy\": filter \"b\": all candidates filtered out":3}`)) {
		t.Errorf("report JSON lacks rejection_reasons: %s", raw)
	}
}

// TestWallIncludesSetup replays 100 requests on 256 workers with wall_s
// counted from a start taken before the driver is built, as Run does.
func TestWallIncludesSetup(t *testing.T) {
	b := loadPolicy(t, roundRobin)
	// A start two seconds back shows that the whole span from the start,
	// setup included, is counted, whatever the machine's speed.
	start := time.Now().Add(-2 * time.Second)
	rep, _, err := executeFrom(context.Background(), Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize,
		Records: simultaneous(100), Workers: 256}, start)
	if err != nil {
		t.Fatal(err)
	}
	if rep.WallS < 2 {
		t.Fatalf("wall_s %v, want at least 2 (counted from the start given)", rep.WallS)
	}
	// The rate is the whole number of requests per unrounded second, so it
	// lies within the rounding of wall_s (0.5 ms either way) of 100 / wall_s.
	if lo, hi := math.Floor(100/(rep.WallS+0.0005)), math.Floor(100/(rep.WallS-0.0005)); rep.SimRequestsPerS < lo || rep.SimRequestsPerS > hi {
		t.Errorf("sim_requests_per_s %v, want 100 requests / wall_s (%v s): %g to %g", rep.SimRequestsPerS, rep.WallS, lo, hi)
	}
}

// A disaggregated replay copies the prefill and decode roles' policy
// names, not the aggregated one's.
func TestReportRolePoliciesDisaggregated(t *testing.T) {
	b := loadPolicy(t, roundRobin)
	rep, err := Run(context.Background(), Options{PolicyName: "rr", Roles: b.Roles, RolePolicies: b.RolePolicies,
		BlockSize: b.BlockSize, Records: simultaneous(4), PrefillWorkers: 1, DecodeWorkers: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{string(shared.RolePrefill): "default", string(shared.RoleDecode): "default"}
	if len(rep.RolePolicies) != 2 || rep.RolePolicies["prefill"] != want["prefill"] || rep.RolePolicies["decode"] != want["decode"] {
		t.Fatalf("role policies %v, want %v", rep.RolePolicies, want)
	}
	if got := rep.Label(); got != "rr(1P:default+2D:default)" {
		t.Errorf("label %q", got)
	}
}
