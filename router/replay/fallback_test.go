package replay

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// flakyScorer scores like inner, except that call k (from 1) fails with
// fail(k) when that is not nil. Replay is single-threaded: no lock.
type flakyScorer struct {
	shared.Scorer
	calls int
	fail  func(k int) error
}

func (s *flakyScorer) Score(ctx context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	s.calls++
	if err := s.fail(s.calls); err != nil {
		return err
	}
	return s.Scorer.Score(ctx, req, c, costs)
}

// failingPicker fails every call with err.
type failingPicker struct{ err error }

func (failingPicker) Inputs() shared.Inputs { return 0 }
func (p failingPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return -1, p.err
}

const fallbackPolicies = `
policy "kv" {
  scorer "cost" { type = "kv-cost" }
  picker "pick" { type = "min-cost" }
  fallback = "round-robin"
}
policy "dec" {
  picker "pick" { type = "least-loaded" }
  fallback = "round-robin"
}
worker_selection {
  aggregated = "kv"
  prefill    = "kv"
  decode     = "dec"
}
`

// TestFallbackSources: every selection a fallback decided is counted by
// the plugin (a *supervisor.CallError), the plugins of an unavailable
// placeholder (a *config.UnavailableError) or the policy (any other error)
// that failed, by cause, with the first error's text; the table shows the
// count and its share of the selections, and WriteFallbacks one line per
// source.
func TestFallbackSources(t *testing.T) {
	b := loadPolicy(t, fallbackPolicies)
	// The prefill role's kv-cost scorer: calls 2, 5, 8 time out in plugin
	// "p1", calls 3, 6, 9 fail in-process, the others score.
	kv := b.Roles[shared.RolePrefill]
	kv.Scorers[0].Scorer = &flakyScorer{Scorer: kv.Scorers[0].Scorer, fail: func(k int) error {
		switch k % 3 {
		case 2:
			return &supervisor.CallError{Plugin: "p1", Cause: "timeout", Err: fmt.Errorf(`plugin "p1": no answer within call_timeout (call %d)`, k)}
		case 0:
			return fmt.Errorf("bad input on call %d", k)
		}
		return nil
	}}
	// The decode role's picker is a placeholder of a plugin that did not
	// start.
	dec := b.Roles[shared.RoleDecode]
	dec.Picker = failingPicker{&config.UnavailableError{Type: "pd-pick", Plugins: []string{"pd"}}}

	var perReq bytes.Buffer
	rep, err := Run(context.Background(), Options{PolicyName: "fb", Roles: b.Roles, RolePolicies: b.RolePolicies, BlockSize: b.BlockSize,
		TraceName: "t", Records: simultaneous(10), PrefillWorkers: 2, DecodeWorkers: 2, PerRequest: &perReq})
	if err != nil {
		t.Fatal(err)
	}
	// 10 prefill and 10 decode selections; 6 prefill and all 10 decode
	// ones fell back.
	if rep.Completed != 10 || rep.Selections != 20 || rep.Fallbacks != 16 || rep.FallbackShare != 0.8 {
		t.Fatalf("completed %d selections %d fallbacks %d share %v; want 10, 20, 16, 0.8",
			rep.Completed, rep.Selections, rep.Fallbacks, rep.FallbackShare)
	}
	want := []report.FallbackSource{
		{Plugin: "pd", Fallbacks: 10, Causes: map[string]int64{"unavailable": 10},
			FirstError: `picker "pick": plugin unavailable: type "pd-pick" may come from plugin "pd", which failed to start`},
		{Plugin: "p1", Fallbacks: 3, Causes: map[string]int64{"timeout": 3},
			FirstError: `scorer "cost": plugin "p1": no answer within call_timeout (call 2)`},
		{Policy: "kv", Fallbacks: 3, Causes: map[string]int64{"error": 3},
			FirstError: `scorer "cost": bad input on call 3`},
	}
	if diff := cmp.Diff(want, rep.FallbackSources); diff != "" {
		t.Errorf("fallback sources (-want +got):\n%s", diff)
	}
	if n := strings.Count(perReq.String(), `"fallback":true`); n != 10 {
		t.Errorf("%d per-request lines fell back, want 10 (every request's decode hop)", n)
	}

	var lines bytes.Buffer
	if err := report.WriteFallbacks(&lines, rep); err != nil {
		t.Fatal(err)
	}
	wantLines := `router: fb(2P+2D): plugin "pd" made 10 of 20 selections fall back (50.0%): unavailable 10; first error: picker "pick": plugin unavailable: type "pd-pick" may come from plugin "pd", which failed to start
router: fb(2P+2D): plugin "p1" made 3 of 20 selections fall back (15.0%): timeout 3; first error: scorer "cost": plugin "p1": no answer within call_timeout (call 2)
router: fb(2P+2D): policy "kv" made 3 of 20 selections fall back (15.0%): error 3; first error: scorer "cost": bad input on call 3
`
	if diff := cmp.Diff(wantLines, lines.String()); diff != "" {
		t.Errorf("WriteFallbacks (-want +got):\n%s", diff)
	}
	var table bytes.Buffer
	if err := report.WriteTable(&table, []*report.Report{rep}); err != nil {
		t.Fatal(err)
	}
	if row := strings.Fields(strings.Split(table.String(), "\n")[1]); len(row) < 6 || strings.Join(row[:6], " ") != "fb(2P+2D) 10 10 0 16 (80.0%)" {
		t.Errorf("table row %q, want the fallbacks cell 16 (80.0%%)", row)
	}
}

// A replay whose policies never fail has no sources and a zero share.
func TestNoFallbacks(t *testing.T) {
	rep := run(t, loadPolicy(t, roundRobin), "rr", simultaneous(7), 2, nil)
	if rep.Selections != 7 || rep.Fallbacks != 0 || rep.FallbackShare != 0 || rep.FallbackSources != nil {
		t.Fatalf("selections %d fallbacks %d share %v sources %v; want 7, 0, 0, none",
			rep.Selections, rep.Fallbacks, rep.FallbackShare, rep.FallbackSources)
	}
	var buf bytes.Buffer
	if err := report.WriteFallbacks(&buf, rep); err != nil || buf.Len() != 0 {
		t.Errorf("WriteFallbacks wrote %q, %v; want nothing", buf.String(), err)
	}
}
