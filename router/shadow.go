package router

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	// ShadowDropped: the decision was sampled in but the shadow was not
	// asked: ShadowOptions.QueueLen decisions were already waiting for a
	// shadow worker. It happens only while the sample rate is above what
	// the shadow can keep up with, before the next rate adjustment
	// (ShadowOptions.SampleInterval) or a drop brings it down.
	ShadowDropped ShadowResult = "dropped"
	// ShadowSampledOut: the shadow was not asked because the decision
	// was not in the sample: with sample rate 1/k (ShadowOutcome.SampleRate)
	// only every k-th decision is asked. Counted, never silent.
	ShadowSampledOut ShadowResult = "sampled_out"
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
	// mode (the decision itself, not its wait in the queue); 0 inline
	// (simulated time reads no clock), for ShadowDropped and
	// ShadowSampledOut.
	Elapsed time.Duration
	// Err is the shadow's error for ShadowFailed and ShadowNone.
	Err error
	// SampleRate is the share of decisions asked (1/k: every k-th) when
	// this one was sampled, in (0, 1]; 1 inline.
	SampleRate float64
	// RequestID is the request's shared.Request.ID (possibly empty).
	RequestID string
	// LiveWorker and LiveDPRank are the live decision's worker, for
	// every result but ShadowSampledOut and ShadowDropped (the live
	// decision is not booked yet when those are decided).
	LiveWorker shared.WorkerID
	LiveDPRank uint32
}

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
	part   *fleet.Partition // the candidates' partition (immutable), for names
	b      *Bundle          // held (enter) while asynchronous; nil inline
	stripe int
	// liveName and shadowName are the workers' names (fleet.Worker.Name)
	// for the /debug view; set asynchronously only.
	liveName, shadowName string
}

// shadowStart prepares the shadow decision of the live policy rp for
// req, or returns nil: rp has no shadow, the Router is closing, the
// decision is not in the sample (counted as ShadowSampledOut) or the
// queue is full (that one is counted as ShadowDropped by shadowRun).
// Asynchronously the job holds b in flight. The caller captures the
// candidates (capture) before the live decision and then calls shadowRun
// or shadowCancel exactly once.
func (r *Router) shadowStart(b *Bundle, rp *rolePolicy, req *shared.Request) *shadowJob {
	sp := rp.shadow
	if sp == nil {
		return nil
	}
	out := ShadowOutcome{Role: req.Role, Policy: rp.policy.Name, Shadow: sp.policy.Name, SampleRate: 1, RequestID: req.ID}
	if !r.shadow.Inline {
		p := r.shadowPool
		ask, rate := p.sample()
		out.SampleRate = rate
		if !ask {
			out.Result = ShadowSampledOut
			r.observeShadow(out)
			return nil
		}
		if !p.begin() {
			return nil // the Router is closing: a selection still in flight
		}
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
	j.part = part
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
// outcome; otherwise it queues j for the shadow workers (or, the queue
// full, counts it as ShadowDropped) and returns the zero outcome. It
// never blocks.
func (r *Router) shadowRun(j *shadowJob, w *fleet.Worker) ShadowOutcome {
	if j == nil {
		return ShadowOutcome{}
	}
	j.out.LiveWorker, j.out.LiveDPRank = w.ID, w.DPRank
	if r.shadow.Inline {
		r.shadowDecide(context.Background(), j)
		out := j.out
		r.observeShadow(out)
		r.shadowDone(j)
		return out
	}
	j.liveName = w.Name
	if !r.shadowPool.enqueue(j) {
		j.out.Result = ShadowDropped
		r.observeShadow(j.out)
		r.shadowDone(j)
	}
	return ShadowOutcome{}
}

// shadowAsync runs j on a shadow worker. A job taken after Close began
// is failed with the Router's context error without asking the shadow.
func (r *Router) shadowAsync(j *shadowJob) {
	ctx := r.shadowPool.ctx
	if err := ctx.Err(); err != nil {
		j.out.Result, j.out.Err = ShadowFailed, fmt.Errorf("shadow policy %q not asked: the router is closing: %w", j.out.Shadow, err)
	} else {
		t0 := time.Now()
		r.shadowDecide(ctx, j)
		j.out.Elapsed = time.Since(t0)
	}
	if j.out.Result == ShadowAgree || j.out.Result == ShadowDisagree {
		if i := locate(j.part, j.out.Worker, j.out.DPRank); i < len(j.part.Workers) && j.part.Workers[i].ID == j.out.Worker {
			j.shadowName = j.part.Workers[i].Name
		}
	}
	r.shadowPool.finished(j)
	r.observeShadow(j.out)
	r.shadowDone(j)
}

// shadowDecide runs the shadow policy over j's candidates and sets
// j.out's result against the live worker (j.out.LiveWorker,
// j.out.LiveDPRank). A panic of a shadow component is its failure, not
// the router's.
func (r *Router) shadowDecide(ctx context.Context, j *shadowJob) {
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
		if j.out.Worker == j.out.LiveWorker && j.out.DPRank == j.out.LiveDPRank {
			j.out.Result = ShadowAgree
		}
	}
}

// shadowDone releases what j holds and pools it.
func (r *Router) shadowDone(j *shadowJob) {
	if j.b != nil {
		j.b.release(j.stripe)
		r.shadowPool.end()
	}
	j.sp, j.b, j.c, j.part, j.req, j.out = nil, nil, nil, nil, shared.Request{}, ShadowOutcome{}
	j.liveName, j.shadowName = "", ""
	r.shadowJobs.Put(j)
}

func (r *Router) observeShadow(out ShadowOutcome) {
	r.shadowMetrics.observe(out)
	if r.shadow.Observe != nil {
		r.shadow.Observe(out)
	}
}
