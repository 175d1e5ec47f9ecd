package replay

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/shared"
)

// Canary changes the policy file's canaries for one replay
// (Options.Canary). The zero value runs them as the file declares them,
// as `router serve` would: a replay rehearses the split serve makes.
type Canary struct {
	// Off runs without canaries: the roles' live policies decide every
	// request.
	Off bool
	// Weight, when SetWeight, replaces the weight (0 to 1) of the canary
	// whose candidate is Candidate, or of every canary when Candidate is
	// "". The candidate must be a canary of a routed role's policy.
	SetWeight bool
	Candidate string
	Weight    float64
}

// ParseCanary parses `router replay --canary`: "off", "WEIGHT" (every
// canary of the file) or "CANDIDATE=WEIGHT", the weight a share from 0
// to 1 ("0.1") or a percentage ("10%").
func ParseCanary(s string) (Canary, error) {
	if s == "off" {
		return Canary{Off: true}, nil
	}
	name, w, named := strings.Cut(s, "=")
	if !named {
		name, w = "", s
	} else if name == "" {
		return Canary{}, fmt.Errorf("--canary %q: want CANDIDATE=WEIGHT with a candidate policy's name", s)
	}
	scale := 1.0
	if pct, ok := strings.CutSuffix(w, "%"); ok {
		w, scale = pct, 0.01
	}
	f, err := strconv.ParseFloat(w, 64)
	if err != nil || !(f*scale >= 0 && f*scale <= 1) {
		return Canary{}, fmt.Errorf("--canary %q: want off, WEIGHT or CANDIDATE=WEIGHT, the weight from 0 to 1 (or 0%% to 100%%)", s)
	}
	return Canary{SetWeight: true, Candidate: name, Weight: f * scale}, nil
}

// apply returns roles with c applied: the policies whose canary changes
// are shallow copies (the same components), the others roles' own.
func (c Canary) apply(roles map[shared.Role]*policy.Policy) (map[shared.Role]*policy.Policy, error) {
	if !c.Off && !c.SetWeight {
		return roles, nil
	}
	out := make(map[shared.Role]*policy.Policy, len(roles))
	var names []string
	found := false
	for role, p := range roles {
		out[role] = p
		if p == nil || p.Canary == nil {
			continue
		}
		names = append(names, p.Canary.Policy.Name)
		if c.Off || c.Candidate == "" || c.Candidate == p.Canary.Policy.Name {
			found = true
			cp := *p
			if c.Off {
				cp.Canary = nil
			} else {
				cc := *p.Canary
				cc.Weight = c.Weight
				cp.Canary = &cc
			}
			out[role] = &cp
		}
	}
	if c.SetWeight && !found {
		if len(names) == 0 {
			return nil, errors.New("replay: --canary sets a weight, but no routed role's policy has a canary block: add one (docs/policy-file.md, Canary)")
		}
		slices.Sort(names)
		return nil, fmt.Errorf("replay: --canary names candidate %q, but the routed roles' canaries are %s", c.Candidate, strings.Join(slices.Compact(names), ", "))
	}
	return out, nil
}

// Canary sides of a request (request.side).
const (
	sideNone uint8 = iota
	sideLive
	sideCandidate
)

// canaryPlaced records the side of request st's decision dec, the first
// of its hops that has a canary.
func canaryPlaced(st *request, dec *router.Decision) {
	if dec.Canary == nil || st.side != sideNone {
		return
	}
	st.side, st.out.Canary = sideLive, "live"
	if dec.Candidate {
		st.side, st.out.Canary = sideCandidate, "candidate"
	}
}

// canaryRolledBack records a rollback (router.CanaryOptions.OnRollback),
// in the order they happen.
func (d *driver) canaryRolledBack(rb router.CanaryRollback) {
	d.rollbacks = append(d.rollbacks, report.CanaryRollback{
		Role: string(rb.Role), Candidate: rb.Candidate, Reason: rb.Reason,
		AtS:                round3(rb.At.Sub(epoch).Seconds()),
		CandidateDecisions: rb.CandidateDecisions,
		WindowDecisions:    rb.Window.Decisions, WindowFallbacks: rb.Window.Fallbacks,
		WindowTTFTs: rb.Window.TTFTs, WindowTTFTP90Ms: report.Millis(rb.Window.TTFTP90),
	})
}

// canaryCount adds a request that is over to its side's tally.
func (t *tally) canaryCount(st *request) {
	if st.side == sideNone {
		return
	}
	k := st.side - sideLive
	s, out := &t.sides[k], &st.out
	s.Requests++
	if out.Fallback {
		s.Fallbacks++
	}
	if out.Status != "ok" {
		s.Rejected++
		return
	}
	s.Completed++
	t.sideTTFT[k] = append(t.sideTTFT[k], out.TTFTMs)
	t.sideE2E[k] = append(t.sideE2E[k], out.E2EMs)
}

// canaryReport is the report of the roles' canaries; nil when no routed
// role's policy has one.
func (d *driver) canaryReport(roles map[shared.Role]*policy.Policy, routed []shared.Role) *report.CanaryReport {
	var cr *report.CanaryReport
	for _, role := range routed {
		p := roles[role]
		if p == nil || p.Canary == nil {
			continue
		}
		if cr == nil {
			cr = &report.CanaryReport{Canaries: map[string]report.CanaryConfig{}, Rollbacks: []report.CanaryRollback{}}
		}
		c := p.Canary
		key := c.Key
		if key == "" {
			key = policy.CanaryKeySession
		}
		cr.Canaries[string(role)] = report.CanaryConfig{Policy: p.Name, Candidate: c.Policy.Name, Weight: c.Weight, Key: string(key),
			MaxFallbackShare: c.Rollback.MaxFallbackShare, MaxTTFTP90Ms: report.Millis(c.Rollback.MaxTTFTP90),
			WindowS: c.Rollback.Window.Seconds(), MinRequests: c.Rollback.MinRequests}
	}
	if cr == nil {
		return nil
	}
	t := &d.tally
	for k, s := range []*report.CanarySide{&cr.Live, &cr.Candidate} {
		*s = t.sides[k]
		s.TTFT, s.E2E = summarize(t.sideTTFT[k]), summarize(t.sideE2E[k])
	}
	cr.Rollbacks = append(cr.Rollbacks, d.rollbacks...)
	return cr
}
