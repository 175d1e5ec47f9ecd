package builtin

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeSLO is the type name of the SLO filter.
const TypeSLO = "slo"

// Parameter names of the slo filter.
const (
	ParamTTFTHeadroom = "ttft_headroom"
	ParamTPOTHeadroom = "tpot_headroom"
	ParamCachedTPOT   = "cached_tpot_headroom"
	ParamOnMiss       = "on_miss"
	ParamLateness     = "tolerance"
	ParamDivert       = "divert"
)

// DefaultTTFTHeadroom and DefaultTPOTHeadroom are the slo filter's
// default headrooms: a candidate meets the TTFT target when its
// predicted TTFT is within what is left of it (no headroom), and the TPOT
// target when its predicted TPOT times 1.25 is. The asymmetry is
// measured (BENCHMARKS.md, "SLO-aware routing"): a TTFT prediction is of
// work already booked and errs both ways, so headroom only turns away
// candidates that would have met it; a TPOT prediction is of the batch
// at dispatch, which grows with every later arrival while the answer
// streams, so it errs low, by about its p90 relative error (15-35% at 8
// to 16 simulated workers).
//
// DefaultCachedTPOTHeadroom is the TPOT headroom of the candidates that
// hold the request's longest cached prefix among the candidates: -0.1, so
// such a row meets the target while its predicted TPOT is within 111% of
// it. Sending the request elsewhere recomputes that prefix and adds its
// prefill to a worker's batch, which costs the fleet more than a TPOT
// slightly over target costs the request: on the generated session trace
// at 8 workers this rule lifts the slo policy's goodput from 87.1% (no
// exception) to 90.5%, above the default's 88.7% (BENCHMARKS.md,
// "SLO-aware routing").
const (
	DefaultTTFTHeadroom       = 0.0
	DefaultTPOTHeadroom       = 0.25
	DefaultCachedTPOTHeadroom = -0.1
)

// Values of the slo filter's divert parameter: when some rows meet the
// targets, DivertAlways keeps only those (the default, DefaultSLODivert);
// DivertNever keeps every row, and on a least-late miss too, so the filter
// only holds (wait) or refuses (reject) requests; DivertClasses keeps
// every row unless the candidates span more than one worker class (their
// shared.LabelClass label, as the predictor models them), and then keeps
// the rows predicted to meet the TTFT target.
//
// examples/policies/slo.hcl sets DivertClasses, measured against the
// default policy with common tie-break draws (BENCHMARKS.md, "SLO-aware
// routing"; 4, 8 and 16 workers of the three bundled traces, uniform and
// mixed fleets, seeds 1-3: 54 cells). Diverting on a uniform fleet
// second-guesses kv-affinity, whose cost already counts the prefill
// queued on each worker, with a noisier model, and moves session turns
// off their cache: always loses to the default in 9 cells (worst -1.1
// pp), never in 3 (-0.2 pp). On a mixed fleet the predictor knows which
// workers are fast and kv-affinity does not: diverting there on the
// TTFT target is worth 1.5-3.6 pp on the conversation trace, while
// diverting on the TPOT target too loses on the generated sessions
// (-0.9 to -1.1 pp at 4 workers). classes loses in 1 cell (-0.2 pp).
const (
	DivertAlways  = "always"
	DivertNever   = "never"
	DivertClasses = "classes"
)

// DefaultSLODivert is the slo filter's default divert: DivertAlways.
const DefaultSLODivert = DivertAlways

// DefaultSLOTolerance is how much later than the least late a candidate
// may be predicted and still be kept when none meets the targets, as a
// fraction of the target: 0.5.
const DefaultSLOTolerance = 0.5

// SLO keeps the candidates predicted to meet the request's latency
// targets (shared.Request.SLO) with headroom: a row meets them when
//
//	PredictedTTFT × (1 + ttft_headroom) <= SLO.TTFT − SLO.Waited   (when TTFT is set)
//	PredictedTPOT × (1 + tpot_headroom) <= SLO.TPOT               (when TPOT is set)
//
// except that the rows holding the request's longest cached prefix among
// the candidates (OverlapBlocks, when it is > 0) use
// cached_tpot_headroom for TPOT (DefaultCachedTPOTHeadroom). The divert
// parameter (DivertAlways, DivertNever, DivertClasses) can turn that off:
// the filter then removes no row and only decides, when no row meets the
// targets, whether the request waits or is refused; the scorers place
// every request that goes.
//
// A request without targets, and every request while the predictor has
// learned nothing (its predictions are 0), keeps every row. When no row
// meets them, the request's SLO.OnMiss (else the filter's on_miss)
// decides, and a request of negative priority is refused whatever it
// says (it sheds first):
//   - "least-late" keeps the rows whose summed lateness, each target's
//     excess over what is left of it as a fraction of the target, is
//     within tolerance of the smallest (the scorers choose among them:
//     a strict least-late would override the cache affinity of every
//     request in an overloaded fleet);
//   - "wait" answers shared.ErrAllBusy, so the request waits in the
//     router's queue and is placed again when a request ends, while no
//     row meets its TTFT target, the target is not yet gone and every row
//     has requests in flight; otherwise (a row meets the TTFT target but
//     not the TPOT one, a request with a TPOT target only, an idle
//     row, a target already gone) it goes to the least-late rows at
//     once;
//   - "reject" answers a *shared.NoHeadroomError whose RetryAfter is the
//     best row's TTFT excess, at least one second.
//
// It composes with any scorers: a policy of slo followed by the default
// kv-affinity scorer places for the cache among the rows with headroom.
// It declares LATENCY (so the router also computes LOAD and CACHE), and
// LABELS with divert "classes".
type SLO struct {
	cachedTPOTHead     float64 // tpot_headroom of the rows holding the longest prefix
	tolerance          float64
	ttftHead, tpotHead float64
	onMiss             shared.SLOMiss
	divert             string
}

// SLOType describes the slo filter.
func SLOType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeSLO,
		Kind:   shared.KindFilter,
		Inputs: shared.InputLatency | shared.InputLabels, // LABELS with divert "classes" only (SLO.Inputs)
		Params: []shared.ParamSpec{
			{Name: ParamTTFTHeadroom, Type: shared.Number,
				Doc: "A candidate meets the TTFT target when its predicted TTFT times (1 + ttft_headroom) is within what is left of it. " +
					"Fraction, 0 to 10; default 0."},
			{Name: ParamTPOTHeadroom, Type: shared.Number,
				Doc: "A candidate meets the TPOT target when its predicted TPOT times (1 + tpot_headroom) is within it. " +
					"Fraction, 0 to 10; default 0.25."},
			{Name: ParamOnMiss, Type: shared.String,
				Doc: "What to do when no candidate meets the targets and the request says nothing " +
					"(its class's or header's on_miss): \"least-late\" (default), \"wait\" or \"reject\"."},
			{Name: ParamCachedTPOT, Type: shared.Number,
				Doc: "tpot_headroom of the candidates holding the request's longest cached prefix among them. " +
					"-0.5 to 10; default -0.1 (such a row meets the TPOT target while predicted within 111% of it)."},
			{Name: ParamLateness, Type: shared.Number,
				Doc: "When no candidate meets the targets (least-late): keep those predicted at most this much later than the least late, " +
					"as a fraction of the target, for the scorers to choose among. >= 0; default 0.5."},
			{Name: ParamDivert, Type: shared.String, Default: DefaultSLODivert,
				Doc: "When some candidates meet the targets: \"always\" (default) keeps only them; \"never\" keeps every " +
					"candidate, then and on a least-late miss, so the filter only holds (wait) or refuses (reject); " +
					"\"classes\" is never unless the candidates span more than one worker class (switchyard.io/class), " +
					"and then keeps those predicted to meet the TTFT target."},
		},
		Doc: "Keeps the candidates predicted (LATENCY) to meet the request's TTFT and TPOT targets " +
			"with headroom; when none does: the least late, wait in the queue, or refuse with 429.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewSLO(p) },
	}
}

// NewSLO returns an slo filter from p. It fails with a *shared.ParamError
// for a headroom outside its range, a negative tolerance or an unknown
// on_miss.
func NewSLO(p shared.Params) (*SLO, error) {
	s := &SLO{ttftHead: DefaultTTFTHeadroom, tpotHead: DefaultTPOTHeadroom, cachedTPOTHead: DefaultCachedTPOTHeadroom,
		onMiss: shared.SLOMissLeastLate, tolerance: DefaultSLOTolerance, divert: p.String(ParamDivert, DefaultSLODivert)}
	switch s.divert {
	case DivertAlways, DivertNever, DivertClasses:
	default:
		return nil, &shared.ParamError{Param: ParamDivert, Err: fmt.Errorf("%q: want \"always\", \"never\" or \"classes\"", s.divert)}
	}
	if p.Has(ParamLateness) {
		s.tolerance = p.Float(ParamLateness, 0)
		if math.IsNaN(s.tolerance) || s.tolerance < 0 {
			return nil, &shared.ParamError{Param: ParamLateness, Err: fmt.Errorf("must be >= 0, got %v", s.tolerance)}
		}
	}
	for _, h := range [...]struct {
		name string
		v    *float64
		lo   float64
	}{{ParamTTFTHeadroom, &s.ttftHead, 0}, {ParamTPOTHeadroom, &s.tpotHead, 0}, {ParamCachedTPOT, &s.cachedTPOTHead, -0.5}} {
		if p.Has(h.name) {
			*h.v = p.Float(h.name, 0)
			if math.IsNaN(*h.v) || *h.v < h.lo || *h.v > 10 {
				return nil, &shared.ParamError{Param: h.name, Err: fmt.Errorf("must be in [%v, 10], got %v", h.lo, *h.v)}
			}
		}
	}
	if p.Has(ParamOnMiss) {
		name := p.String(ParamOnMiss, "")
		m, ok := shared.ParseSLOMiss(name)
		if !ok {
			return nil, &shared.ParamError{Param: ParamOnMiss, Err: fmt.Errorf("%q: want \"least-late\", \"wait\" or \"reject\"", name)}
		}
		s.onMiss = m
	}
	return s, nil
}

// Inputs returns LATENCY, and LABELS with divert "classes".
func (s *SLO) Inputs() shared.Inputs {
	if s.divert == DivertClasses {
		return shared.InputLatency | shared.InputLabels
	}
	return shared.InputLatency
}

// Filter keeps the rows predicted to meet req's targets, or applies the
// miss action (see SLO). It fails with ErrMissingColumn when the LATENCY
// columns are missing.
func (s *SLO) Filter(_ context.Context, req *shared.Request, c *shared.Candidates, keep []bool) error {
	n := c.Len()
	if len(keep) != n {
		return fmt.Errorf("slo: keep has %d entries for %d candidates", len(keep), n)
	}
	slo := req.SLO
	if !slo.Has() {
		return nil
	}
	if len(c.PredictedTTFT) != n || len(c.PredictedTPOT) != n {
		return fmt.Errorf("slo: %w: LATENCY", ErrMissingColumn)
	}
	kt, kp := 1+s.ttftHead, 1+s.tpotHead
	ttftLeft := (slo.TTFT - slo.Waited).Seconds()
	tpot := slo.TPOT.Seconds()
	// late is row i's summed lateness: each target's predicted excess
	// (with headroom) over what is left of it, as a fraction of the
	// target; 0 when it meets both.
	maxOverlap := int32(0)
	for _, o := range c.OverlapBlocks {
		maxOverlap = max(maxOverlap, o)
	}
	late := func(i int) float64 {
		kp := kp
		if maxOverlap > 0 && len(c.OverlapBlocks) == n && c.OverlapBlocks[i] == maxOverlap {
			kp = 1 + s.cachedTPOTHead
		}
		var l float64
		if slo.TTFT > 0 {
			if over := c.PredictedTTFT[i]*kt - ttftLeft; over > 0 {
				l += over / slo.TTFT.Seconds()
			}
		}
		if slo.TPOT > 0 {
			if over := c.PredictedTPOT[i]*kp - tpot; over > 0 {
				l += over / tpot
			}
		}
		return l
	}
	met, metTTFT := 0, 0
	best, bestRow := math.Inf(1), 0
	for i := range n {
		if slo.TTFT > 0 && c.PredictedTTFT[i]*kt <= ttftLeft {
			metTTFT++
		}
		late := late(i)
		if late == 0 {
			met++
			continue
		}
		keep[i] = false
		if late < best {
			best, bestRow = late, i
		}
	}
	if met > 0 {
		switch {
		case s.divert == DivertNever:
			keepAll(keep)
		case s.divert == DivertClasses && slo.TTFT > 0 && mixedClasses(c):
			for i := range n {
				keep[i] = c.PredictedTTFT[i]*kt <= ttftLeft
			}
		case s.divert == DivertClasses:
			keepAll(keep)
		}
		return nil
	}
	action := slo.OnMiss
	if action == shared.SLOMissDefault {
		action = s.onMiss
	}
	if req.Priority < 0 {
		action = shared.SLOMissReject
	}
	switch action {
	case shared.SLOMissReject:
		retry := time.Second
		if slo.TTFT > 0 {
			excess := time.Duration((c.PredictedTTFT[bestRow]*kt - ttftLeft) * float64(time.Second))
			retry = max(retry, excess)
		}
		return &shared.NoHeadroomError{RetryAfter: retry, TTFT: c.PredictedTTFT[bestRow], TPOT: c.PredictedTPOT[bestRow],
			TTFTLeft: ttftLeft, HasTTFTLeft: slo.TTFT > 0}
	case shared.SLOMissWait:
		// Waiting spends the TTFT target: only when no row can meet it
		// now and it is not yet gone. A row that meets the TTFT target
		// but not the TPOT one is taken as least-late.
		// A request no idle worker could serve in time waits too: held
		// back until its target is gone, it leaves the engines to the
		// requests that can still meet theirs (BENCHMARKS.md, "SLO-aware
		// routing": the goodput comes from there).
		// And only while every row has requests in flight: their end is
		// what places a waiting request again, and no row gets faster
		// than idle, so a request an idle row is predicted to serve late
		// gains nothing by waiting and loses what the prediction erred
		// (measured: waiting with an idle row lost 0.2-0.6 pp of goodput
		// to the default at 16 workers; BENCHMARKS.md, "SLO-aware
		// routing"). Without a TTFT target there is none to wait for.
		if slo.TTFT > 0 && metTTFT == 0 && ttftLeft > 0 && allBusy(c) {
			return shared.ErrAllBusy
		}
	}
	if s.divert != DivertAlways {
		keepAll(keep)
		return nil
	}
	// least-late, and a wait that can no longer help: every row as late
	// as the least late (ties kept for the scorers to break).
	for i := range n {
		keep[i] = late(i) <= best+s.tolerance
	}
	return nil
}

// Interface guard.
var _ shared.Filter = (*SLO)(nil)

// allBusy reports whether every row has requests in flight (LOAD); true
// when the column is missing, as nothing says a row is idle.
func allBusy(c *shared.Candidates) bool {
	if len(c.Load) != c.Len() {
		return true
	}
	for i := range c.Load {
		if c.Load[i].ActiveRequests == 0 {
			return false
		}
	}
	return true
}

// mixedClasses reports whether the rows' shared.LabelClass labels differ
// (a row without one counts as the empty class, so an unlabelled fleet is
// one class). False without the LABELS columns.
func mixedClasses(c *shared.Candidates) bool {
	n := c.Len()
	if len(c.Labels) != n || n < 2 {
		return false
	}
	first, _ := c.Labels[0].Get(shared.LabelClass)
	for i := 1; i < n; i++ {
		if cl, _ := c.Labels[i].Get(shared.LabelClass); cl != first {
			return true
		}
	}
	return false
}

// keepAll sets every entry of keep.
func keepAll(keep []bool) {
	for i := range keep {
		keep[i] = true
	}
}
