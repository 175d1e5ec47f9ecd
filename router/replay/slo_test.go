package replay

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// sloRefuser is a picker that records each request's latency targets and
// refuses, with a *shared.NoHeadroomError, those whose TTFT target is
// under a second (the policy's own answer: no fallback decides instead).
type sloRefuser struct {
	mu   sync.Mutex
	seen map[int]shared.SLO
}

func (*sloRefuser) Inputs() shared.Inputs { return 0 }

func (p *sloRefuser) Pick(_ context.Context, req *shared.Request, _ *shared.Candidates) (int, error) {
	i, _ := strconv.Atoi(req.ID)
	p.mu.Lock()
	p.seen[i] = req.SLO
	p.mu.Unlock()
	if req.SLO.TTFT < time.Second {
		return 0, &shared.NoHeadroomError{RetryAfter: time.Second, TTFT: 2, TPOT: 0.01}
	}
	return 0, nil
}

// TestSLOTargetsAndRefusals: --slo's TTFT and TPOT (Options.SLO) are every
// request's latency targets where its queue class sets none, field by
// field; a *shared.NoHeadroomError rejects the request with
// RejectNoHeadroom, one reason whatever the predictions, and the goodput
// accounting stays as it was.
func TestSLOTargetsAndRefusals(t *testing.T) {
	b := loadPolicy(t, queuePolicy(`
queue {
  class "fast" {
    ttft = "100ms"
  }
  class "slow" {}
}
`))
	p := &sloRefuser{seen: map[int]shared.SLO{}}
	b.Roles = map[shared.Role]*policy.Policy{shared.RoleAggregated: {Name: "refuser", PickerName: "pick", Picker: p}}
	recs := make([]trace.Record, 8)
	for i := range recs {
		recs[i] = trace.Record{Index: i, Line: i + 1, Arrival: time.Duration(i) * time.Second, InputLength: 64, OutputLength: 4,
			HasPriority: true, PolicyClass: []string{"fast", "slow"}[i%2]}
	}
	rep, outs, _ := runQueued(t, b, recs, 2, func(o *Options) {
		o.SLO = report.SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond, E2E: time.Minute}
	})
	for i, o := range outs {
		want, status := shared.SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond}, "ok"
		if i%2 == 0 {
			want.TTFT, status = 100*time.Millisecond, "rejected: "+RejectNoHeadroom
		}
		if got := p.seen[i]; got != want {
			t.Errorf("request %d (class %s): the policy saw %+v, want %+v", i, o.PolicyClass, got, want)
		}
		if o.Status != status {
			t.Errorf("request %d: status %q, want %q", i, o.Status, status)
		}
	}
	if rep.Rejected != 4 || rep.RejectionReasons[RejectNoHeadroom] != 4 || len(rep.RejectionReasons) != 1 {
		t.Errorf("rejected %d, reasons %v; want 4 for %q", rep.Rejected, rep.RejectionReasons, RejectNoHeadroom)
	}
	if rep.Goodput == nil || rep.Goodput.Met != 4 {
		t.Errorf("goodput %+v, want the 4 completed requests meeting ttft=2s,tpot=50ms,e2e=1m", rep.Goodput)
	}
}
