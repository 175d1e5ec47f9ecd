package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/shared"
)

// ShadowResult is how one shadow decision compared with the live one
// (ShadowOutcome.Result); the empty result means no shadow ran.
type ShadowResult string

// The shadow results, the values of the metrics' result label.
const (
	// ShadowAgree: the shadow picked the live decision's worker (same id
	// and data-parallel rank).
	ShadowAgree ShadowResult = "agree"
	// ShadowDisagree: the shadow picked another candidate.
	ShadowDisagree ShadowResult = "disagree"
	// ShadowFailed: the shadow erred (a plugin error, its call_timeout,
	// a panic, the Router closing) and picked nothing.
	ShadowFailed ShadowResult = "failed"
	// ShadowDropped: the shadow was not asked because
	// ShadowOptions.MaxInFlight shadow decisions were already running.
	ShadowDropped ShadowResult = "dropped"
	// ShadowNone: the shadow's filters kept no candidate
	// (shared.ErrAllFiltered): it made no choice.
	ShadowNone ShadowResult = "none"
)

// ShadowOutcome is one shadow decision (policy.Policy.Shadow): what the
// shadow policy picked for a request the live policy placed, never acted
// on.
type ShadowOutcome struct {
	// Role is the request's role; Policy the role's policy (also when its
	// fallback decided), Shadow that policy's shadow.
	Role   shared.Role
	Policy string
	Shadow string
	// Result compares the shadow's pick with the live worker.
	Result ShadowResult
	// Worker and DPRank are the shadow's pick; set for ShadowAgree and
	// ShadowDisagree only.
	Worker shared.WorkerID
	DPRank uint32
	// Elapsed is the shadow decision's wall-clock time in asynchronous
	// mode; 0 inline (simulated time reads no clock) and for
	// ShadowDropped.
	Elapsed time.Duration
	// Err is the shadow's error for ShadowFailed and ShadowNone.
	Err error
}

// ShadowOptions set how a Router runs the shadow policies of its
// policies. The live decision never waits for a shadow decision, except
// Inline, where the shadow runs inside Place after the live booking.
type ShadowOptions struct {
	// Inline runs each shadow decision inside Place, after the live
	// decision was booked, and returns its outcome in Decision.Shadow:
	// deterministic, for simulated time (replay). Otherwise each runs on
	// a goroutine of its own, bounded by MaxInFlight, and its outcome
	// reaches Observe only.
	Inline bool
	// MaxInFlight bounds the asynchronous shadow decisions running at
	// once; one more is dropped (ShadowDropped), so a slow shadow never
	// piles up goroutines. 0 means DefaultShadowInFlight.
	MaxInFlight int
	// Observe, when set, receives every outcome: inside Place when
	// Inline, else on the shadow's goroutine (ShadowDropped inside
	// Place). It must not block.
	Observe func(ShadowOutcome)
}

// DefaultShadowInFlight is ShadowOptions.MaxInFlight's default (and
// `router serve --shadow-max-inflight`'s). Few: a shadow plugin's calls
// take CPU from live requests, and with few in flight a shadow whose
// calls slow down because the CPUs are busy is asked less often (the rest
// are dropped). On 2 busy cores, 64 let a plugin shadow cut the live
// throughput to 0.6x in two runs of three; 4 kept it at 0.96-1.03x,
// dropping two thirds of the shadow decisions (BENCHMARKS.md, "Shadow
// mode"). A healthy plugin
// answers in about 100 us, so 4 in flight still keep up with tens of
// thousands of decisions per second.
const DefaultShadowInFlight = 4

// shadowJob is one shadow decision: a copy of the request, the candidate
// inputs as the live decision saw them (before its booking changed
// them), and the bundle it holds in flight while it runs asynchronously.
// Pooled (Router.shadowJobs): steady state allocates nothing.
type shadowJob struct {
	sp     *rolePolicy // the shadow
	out    ShadowOutcome
	req    shared.Request
	s      pipeline.Scratch
	c      *shared.Candidates
	b      *Bundle // held (enter) while asynchronous; nil inline
	stripe int
}

// shadowStart prepares the shadow decision of the live policy rp for
// req, or returns nil: rp has no shadow, the Router is closing, or
// (counted as ShadowDropped) MaxInFlight shadow decisions are running.
// Asynchronously the job holds b in flight. The caller captures the
// candidates (capture) before the live decision and then calls shadowRun
// or shadowCancel exactly once.
func (r *Router) shadowStart(b *Bundle, rp *rolePolicy, req *shared.Request) *shadowJob {
	sp := rp.shadow
	if sp == nil {
		return nil
	}
	if !r.shadow.Inline && r.shadowClosed.Load() {
		return nil // the Router is closing: a selection still in flight
	}
	out := ShadowOutcome{Role: req.Role, Policy: rp.policy.Name, Shadow: sp.policy.Name}
	if !r.shadow.Inline && r.shadowInFlight.Add(1) > int64(r.shadow.MaxInFlight) {
		r.shadowInFlight.Add(-1)
		out.Result = ShadowDropped
		r.observeShadow(out)
		return nil
	}
	j := r.shadowJobs.Get().(*shadowJob)
	j.sp, j.out, j.req = sp, out, *req
	if !r.shadow.Inline {
		j.b, j.stripe = b, b.enter()
	}
	return j
}

// capture sets j's candidates from the partition: the columns the live
// decision computed (live, nil when it computed none) are copied, the
// others computed here, before the live booking changes any.
func (r *Router) capture(j *shadowJob, live *shared.Candidates, part *fleet.Partition) {
	in := j.sp.inputs
	j.c = j.s.Candidates(len(part.Workers), in, part.DPRanks != nil)
	var have shared.Inputs
	if live != nil {
		if live.ActiveRequests != nil && j.c.ActiveRequests != nil {
			copy(j.c.ActiveRequests, live.ActiveRequests)
			have |= shared.InputActiveRequests
		}
		if live.Load != nil && j.c.Load != nil {
			copy(j.c.Load, live.Load)
			have |= shared.InputLoad
		}
		if live.OverlapBlocks != nil && j.c.OverlapBlocks != nil && (j.c.CPUOverlapBlocks == nil || live.CPUOverlapBlocks != nil) {
			copy(j.c.OverlapBlocks, live.OverlapBlocks)
			if j.c.CPUOverlapBlocks != nil {
				copy(j.c.CPUOverlapBlocks, live.CPUOverlapBlocks)
			}
			have |= shared.InputCache
		}
		if live.TotalKVBlocks != nil && j.c.TotalKVBlocks != nil {
			copy(j.c.TotalKVBlocks, live.TotalKVBlocks)
			have |= shared.InputCapacity
		}
	}
	r.fill(j.c, in&^have, &j.req, part)
}

// shadowCancel ends a job whose live decision failed: nothing to compare.
func (r *Router) shadowCancel(j *shadowJob) {
	if j != nil {
		r.shadowDone(j)
	}
}

// shadowRun runs j, whose live decision booked w: inline it returns the
// outcome; otherwise it starts j's goroutine and returns the zero outcome.
func (r *Router) shadowRun(j *shadowJob, w *fleet.Worker) ShadowOutcome {
	if j == nil {
		return ShadowOutcome{}
	}
	if r.shadow.Inline {
		r.shadowDecide(context.Background(), j, w.ID, w.DPRank)
		out := j.out
		r.observeShadow(out)
		r.shadowDone(j)
		return out
	}
	r.shadowWG.Add(1)
	go r.shadowAsync(j, w.ID, w.DPRank)
	return ShadowOutcome{}
}

func (r *Router) shadowAsync(j *shadowJob, id shared.WorkerID, dp uint32) {
	defer r.shadowWG.Done()
	t0 := time.Now()
	r.shadowDecide(r.shadowCtx, j, id, dp)
	j.out.Elapsed = time.Since(t0)
	r.observeShadow(j.out)
	r.shadowDone(j)
}

// shadowDecide runs the shadow policy over j's candidates and sets
// j.out's result against the live worker (id, dp). A panic of a shadow
// component is its failure, not the router's.
func (r *Router) shadowDecide(ctx context.Context, j *shadowJob, id shared.WorkerID, dp uint32) {
	defer func() {
		if p := recover(); p != nil {
			j.out.Result, j.out.Err = ShadowFailed, fmt.Errorf("shadow policy %q panicked: %v", j.out.Shadow, p)
		}
	}()
	row, err := pipeline.Execute(pipeline.WithShadow(ctx), j.sp.compiled, &j.req, j.c, &j.s)
	switch {
	case errors.Is(err, shared.ErrAllFiltered):
		j.out.Result, j.out.Err = ShadowNone, err
	case err != nil:
		j.out.Result, j.out.Err = ShadowFailed, err
	default:
		j.out.Worker, j.out.DPRank = j.c.IDs[row], rank(j.c, row)
		j.out.Result = ShadowDisagree
		if j.out.Worker == id && j.out.DPRank == dp {
			j.out.Result = ShadowAgree
		}
	}
}

// shadowDone releases what j holds and pools it.
func (r *Router) shadowDone(j *shadowJob) {
	if j.b != nil {
		j.b.release(j.stripe)
		r.shadowInFlight.Add(-1)
	}
	j.sp, j.b, j.c, j.req, j.out = nil, nil, nil, shared.Request{}, ShadowOutcome{}
	r.shadowJobs.Put(j)
}

func (r *Router) observeShadow(out ShadowOutcome) {
	r.shadowMetrics.observe(out)
	if r.shadow.Observe != nil {
		r.shadow.Observe(out)
	}
}

// shadowMetrics are the Router's shadow series (Options.Registerer).
type shadowMetrics struct {
	decisions *prometheus.CounterVec   // role, policy, shadow, result
	seconds   *prometheus.HistogramVec // role, shadow
}

// shadowBuckets span 1us to about 4s: a built-in shadow takes
// microseconds, a plugin call milliseconds up to its call_timeout.
var shadowBuckets = prometheus.ExponentialBuckets(1e-6, 4, 12)

// registerShadow registers switchyard_shadow_decisions_total and
// switchyard_shadow_decision_seconds, or takes the ones a previous
// Router registered on reg.
func registerShadow(reg prometheus.Registerer) (*shadowMetrics, error) {
	m := &shadowMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_shadow_decisions_total",
			Help: "Shadow decisions by role, live policy, shadow policy and result: agree (the shadow picked the live worker), disagree, failed (error, call_timeout, panic), dropped (too many shadow decisions running) or none (the shadow's filters kept no candidate).",
		}, []string{"role", "policy", "shadow", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_shadow_decision_seconds",
			Help:    "Wall time of each shadow decision that ran (not the dropped ones), off the live request's path, by role and shadow policy.",
			Buckets: shadowBuckets,
		}, []string{"role", "shadow"}),
	}
	if err := reg.Register(m.decisions); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.decisions, _ = are.ExistingCollector.(*prometheus.CounterVec); m.decisions == nil {
			return nil, err
		}
	}
	if err := reg.Register(m.seconds); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.seconds, _ = are.ExistingCollector.(*prometheus.HistogramVec); m.seconds == nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *shadowMetrics) observe(out ShadowOutcome) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(string(out.Role), out.Policy, out.Shadow, string(out.Result)).Inc()
	if out.Result != ShadowDropped {
		m.seconds.WithLabelValues(string(out.Role), out.Shadow).Observe(out.Elapsed.Seconds())
	}
}
