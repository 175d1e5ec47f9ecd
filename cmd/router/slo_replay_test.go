package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// TestReplaySLOPolicy replays examples/policies/slo.hcl beside the default
// with --slo: both rows have goodput, the slo policy's run prints its
// predictor's accuracy on stderr (it reads LATENCY; the default's does
// not), and both reports carry the accuracy, Read only for the slo
// policy's.
func TestReplaySLOPolicy(t *testing.T) {
	code, stdout, stderr := runRouter("replay", "--limit", "400", "--slo", "ttft=1s,tpot=30ms",
		"--compare", "../../examples/policies/kv-affinity.hcl,../../examples/policies/slo.hcl", "--report", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var reps []report.Report
	if err := json.Unmarshal([]byte(stdout), &reps); err != nil {
		t.Fatalf("report: %v\n%s", err, stdout)
	}
	if len(reps) != 2 {
		t.Fatalf("%d reports, want 2", len(reps))
	}
	for _, r := range reps {
		if r.Goodput == nil || r.Goodput.Share <= 0 || r.Goodput.Share > 1 {
			t.Errorf("%s: goodput %+v, want a share in (0, 1]", r.Policy, r.Goodput)
		}
		p := r.Predictor
		if p == nil || p.TTFTN < 300 || p.TPOTN < 300 || !(p.TTFTP50 > 0) || p.TTFTP90 < p.TTFTP50 {
			t.Errorf("%s: predictor %+v, want hundreds of comparisons and p50 <= p90", r.Policy, p)
			continue
		}
		if want := r.Policy == "slo"; p.Read != want {
			t.Errorf("%s: predictor read %v, want %v", r.Policy, p.Read, want)
		}
	}
	if !strings.Contains(stderr, "router: slo, 8 workers: latency predictor, relative error p50/p90: TTFT ") ||
		strings.Contains(stderr, "router: kv-affinity, 8 workers: latency predictor") {
		t.Errorf("stderr %q: want the slo policy's predictor line and not the default's", stderr)
	}
}

// TestReplaySLOReplicas: with router replicas the predictor's figures
// cover every replica's decisions, not the first's alone.
func TestReplaySLOReplicas(t *testing.T) {
	code, stdout, stderr := runRouter("replay", "--limit", "400", "--slo", "ttft=1s", "--replicas", "2",
		"--policy", "../../examples/policies/slo.hcl", "--report", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var reps []report.Report
	if err := json.Unmarshal([]byte(stdout), &reps); err != nil {
		var one report.Report
		if err2 := json.Unmarshal([]byte(stdout), &one); err2 != nil {
			t.Fatalf("report: %v\n%s", err, stdout)
		}
		reps = []report.Report{one}
	}
	// Each replica's first decision has nothing to predict from.
	if p := reps[0].Predictor; p == nil || p.TTFTN < 380 {
		t.Fatalf("predictor %+v over two replicas, want about 398 TTFT comparisons", p)
	}
}
