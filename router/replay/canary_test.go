package replay

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/shared"
)

// canaried is round-robin live with the canary "trial" (least-loaded) on
// 20% of the sessions, never rolled back by TTFT; seeded, so a replay
// repeats.
const canaried = `
router { seed = 3 }
policy "rr" {
  picker "rr" { type = "round-robin" }
  canary {
    policy = "trial"
    weight = 0.2
    rollback {
      max_ttft_p90 = "0s"
      window       = "60s"
      min_requests = 20
    }
  }
}
policy "trial" {
  picker "ll" { type = "least-loaded" }
}
worker_selection { aggregated = "rr" }
`

// canaryRun replays the first n synthetic session records over 4 workers
// with roles and c, returning the report and the per-request lines.
func canaryRun(t *testing.T, roles map[shared.Role]*policy.Policy, n int, c Canary) (*report.Report, []byte) {
	t.Helper()
	var per bytes.Buffer
	rep, err := Run(context.Background(), Options{PolicyName: "canary", Roles: roles, BlockSize: 512, TraceName: "t",
		Records: readTrace(t, "synthetic_sessions.jsonl")[:n], Workers: 4, PerRequest: &per, Canary: c})
	if err != nil {
		t.Fatal(err)
	}
	return rep, per.Bytes()
}

// TestCanaryReplaySplitsBySession: the file's canary sends about its
// weight of the sessions to the candidate, every request of a session on
// one side; the report's sides add up to the replay's and the replay
// repeats byte for byte; --canary off and --canary trial=0 route as the
// file without a canary.
func TestCanaryReplaySplitsBySession(t *testing.T) {
	const n = 3000
	rep, per := canaryRun(t, loadPolicy(t, canaried).Roles, n, Canary{})
	recs := readTrace(t, "synthetic_sessions.jsonl")[:n]
	side := map[string]string{}
	sessions := map[string]int{}
	for i, o := range outcomes(t, per) {
		s := recs[i].SessionID
		if o.Canary != "live" && o.Canary != "candidate" {
			t.Fatalf("request %d: canary %q", i, o.Canary)
		}
		if prev, ok := side[s]; ok && prev != o.Canary {
			t.Fatalf("session %s on both sides (request %d %s, before %s)", s, i, o.Canary, prev)
		}
		if _, ok := side[s]; !ok && o.Canary == "candidate" {
			sessions["candidate"]++
		}
		side[s] = o.Canary
	}
	c := rep.Canary
	if c == nil {
		t.Fatal("no canary report")
	}
	// 20% of the sessions, within 5 standard deviations.
	total := len(side)
	if got, want := float64(sessions["candidate"]), 0.2*float64(total); got < want-5*0.4*math.Sqrt(float64(total)) || got > want+5*0.4*math.Sqrt(float64(total)) {
		t.Errorf("%v of %d sessions on the candidate, want about %v", got, total, want)
	}
	if c.Live.Requests+c.Candidate.Requests != n || c.Candidate.Requests == 0 || c.Live.Fallbacks+c.Candidate.Fallbacks != 0 ||
		c.Live.Completed+c.Candidate.Completed != rep.Completed || c.Candidate.TTFT.P90 == 0 || len(c.Rollbacks) != 0 {
		t.Errorf("canary report %+v (completed %d)", c, rep.Completed)
	}
	wantCfg := map[string]report.CanaryConfig{"aggregated": {Policy: "rr", Candidate: "trial", Weight: 0.2, Key: "session",
		MaxFallbackShare: config.DefaultCanaryMaxFallbackShare, WindowS: 60, MinRequests: 20}}
	if diff := cmp.Diff(wantCfg, c.Canaries); diff != "" {
		t.Errorf("canaries (-want +got):\n%s", diff)
	}

	// Deterministic: the same lines and report again.
	rep2, per2 := canaryRun(t, loadPolicy(t, canaried).Roles, n, Canary{})
	rep.WallS, rep2.WallS, rep.SimRequestsPerS, rep2.SimRequestsPerS, rep.DecisionsPerS, rep2.DecisionsPerS = 0, 0, 0, 0, 0, 0
	if !bytes.Equal(per, per2) {
		t.Error("a second replay's per-request lines differ")
	}
	if diff := cmp.Diff(rep, rep2); diff != "" {
		t.Errorf("a second replay's report differs (-first +second):\n%s", diff)
	}

	// Off, or weight 0: the live policy routes everything, as without the
	// block (round-robin, the same workers).
	plain, _ := canaryRun(t, loadPolicy(t, roundRobin).Roles, n, Canary{})
	for _, cc := range []Canary{{Off: true}, {SetWeight: true, Candidate: "trial"}} {
		r, _ := canaryRun(t, loadPolicy(t, canaried).Roles, n, cc)
		if cc.Off != (r.Canary == nil) || !cmp.Equal(r.RequestsPerWorker, plain.RequestsPerWorker) {
			t.Errorf("%+v: canary %+v, per worker %v, want %v", cc, r.Canary, r.RequestsPerWorker, plain.RequestsPerWorker)
		}
		if r.Canary != nil && (r.Canary.Candidate.Requests != 0 || r.Canary.Live.Requests != n) {
			t.Errorf("weight 0: %+v", r.Canary)
		}
	}
}

// brokenPicker fails every pick, as a plugin whose calls fail.
type brokenPicker struct{}

func (brokenPicker) Inputs() shared.Inputs { return 0 }
func (brokenPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return -1, errors.New("candidate broke")
}

// TestCanaryReplayRollsBack: a candidate whose every decision falls back
// rolls back at its min_requests-th decision, in simulated time (the
// arrival of that request), and one whose TTFT p90 passes a 1 ms bound
// at its min_requests-th first token; no candidate decides after.
func TestCanaryReplayRollsBack(t *testing.T) {
	const n = 2000
	t.Run("fallback share", func(t *testing.T) {
		roles := loadPolicy(t, canaried).Roles
		live := roles[shared.RoleAggregated]
		cand := *live.Canary.Policy
		cand.Picker = brokenPicker{} // its fallback (least-loaded, the default) decides
		live.Canary.Policy = &cand
		rep, per := canaryRun(t, roles, n, Canary{SetWeight: true, Weight: 0.5})
		c := rep.Canary
		if len(c.Rollbacks) != 1 {
			t.Fatalf("rollbacks %+v", c.Rollbacks)
		}
		rb := c.Rollbacks[0]
		var cands []Outcome
		for _, o := range outcomes(t, per) {
			if o.Canary == "candidate" {
				cands = append(cands, o)
			}
		}
		// Every decision of the candidate fell back: 100% > 5% once the
		// window holds min_requests (20) of them.
		if len(cands) != 20 || rb.Reason != "fallback_share" || rb.CandidateDecisions != 20 || rb.WindowFallbacks != 20 || rb.WindowDecisions != 20 {
			t.Fatalf("%d candidate requests; rollback %+v", len(cands), rb)
		}
		for _, o := range cands {
			if !o.Fallback {
				t.Fatalf("candidate request %d without a fallback", o.Index)
			}
		}
		if last := cands[len(cands)-1]; rb.AtS*1000 != last.ArrivalMs {
			t.Errorf("rolled back at %v s, the 20th candidate request arrived at %v ms", rb.AtS, last.ArrivalMs)
		}
		if c.Candidate.Fallbacks != 20 || c.Live.Fallbacks != 0 || c.Candidate.Requests != 20 {
			t.Errorf("sides %+v %+v", c.Live, c.Candidate)
		}
		var w bytes.Buffer
		if err := report.WriteCanary(&w, rep); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.String(), `canary "trial" (aggregated) would roll back at`) || !strings.Contains(w.String(), "on fallback_share: 20 of 20 decisions fell back") {
			t.Errorf("WriteCanary:\n%s", w.String())
		}
	})
	t.Run("ttft p90", func(t *testing.T) {
		roles := loadPolicy(t, canaried).Roles
		live := roles[shared.RoleAggregated]
		live.Canary.Rollback.MaxTTFTP90 = time.Millisecond
		rep, per := canaryRun(t, roles, n, Canary{})
		c := rep.Canary
		if len(c.Rollbacks) != 1 || c.Rollbacks[0].Reason != "ttft_p90" || c.Rollbacks[0].WindowTTFTs != 20 {
			t.Fatalf("rollbacks %+v", c.Rollbacks)
		}
		// The candidate's requests with a first token before the rollback
		// are those 20; some more were placed before it and still ran.
		ttfts := 0
		for _, o := range outcomes(t, per) {
			if o.Canary == "candidate" && o.ArrivalMs+o.TTFTMs <= c.Rollbacks[0].AtS*1000+1 { // AtS is rounded to the ms
				ttfts++
			}
		}
		if ttfts != 20 || int64(c.Candidate.Requests) != c.Rollbacks[0].CandidateDecisions {
			t.Errorf("%d candidate first tokens by the rollback; candidate %+v, rollback %+v", ttfts, c.Candidate, c.Rollbacks[0])
		}
	})
}

func TestParseCanary(t *testing.T) {
	for in, want := range map[string]Canary{
		"off":        {Off: true},
		"0.1":        {SetWeight: true, Weight: 0.1},
		"trial=0.25": {SetWeight: true, Candidate: "trial", Weight: 0.25},
		"trial=10%":  {SetWeight: true, Candidate: "trial", Weight: 0.1},
		"1":          {SetWeight: true, Weight: 1},
	} {
		got, err := ParseCanary(in)
		if err != nil || got != want {
			t.Errorf("ParseCanary(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "=0.1", "trial=", "trial=1.5", "-0.1", "trial=abc", "NaN", "120%"} {
		if _, err := ParseCanary(in); err == nil {
			t.Errorf("ParseCanary(%q): no error", in)
		}
	}
	// A weight for a file without a canary, or for another candidate.
	if _, err := (Canary{SetWeight: true, Weight: 0.1}).apply(loadPolicy(t, roundRobin).Roles); err == nil ||
		!strings.Contains(err.Error(), "no routed role's policy has a canary block") {
		t.Errorf("err = %v", err)
	}
	if _, err := (Canary{SetWeight: true, Candidate: "other", Weight: 0.1}).apply(loadPolicy(t, canaried).Roles); err == nil ||
		err.Error() != `replay: --canary names candidate "other", but the routed roles' canaries are trial` {
		t.Errorf("err = %v", err)
	}
}
