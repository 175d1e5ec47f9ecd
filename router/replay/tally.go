package replay

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/predict"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/shared"
)

// summarize sorts xs in place and returns its summary (zero when empty).
func summarize(xs []float64) report.Summary {
	if len(xs) == 0 {
		return report.Summary{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return report.Summary{
		P50:  nearestRank(xs, 0.50),
		P90:  nearestRank(xs, 0.90),
		P99:  nearestRank(xs, 0.99),
		Mean: round3(sum / float64(len(xs))),
		N:    len(xs),
	}
}

// nearestRank is the smallest value with at least q of the sorted sample at
// or below it.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// quantiles is sorted's values at quantiles 0, 1/n, ..., 1 (nearest rank).
func quantiles(sorted []float64, n int) []float64 {
	if len(sorted) == 0 {
		return nil
	}
	out := make([]float64, n+1)
	for k := range out {
		out[k] = nearestRank(sorted, float64(k)/float64(n))
	}
	return out
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func (d *driver) report(o *Options, wall time.Duration) *report.Report {
	rep := &report.Report{
		Policy:          o.PolicyName,
		Trace:           o.TraceName,
		Workers:         d.workers,
		Requests:        d.next,
		WallS:           round3(wall.Seconds()),
		Selections:      d.selections,
		FallbackSources: d.fell.list(),
		Hosted:          d.reps[0].r.Hosted(d.path.Hop(firstHop).Role),
	}
	for _, x := range d.reps {
		rep.Fallbacks += x.r.Fallbacks()
	}
	if d.sync != nil {
		rep.Sync = &report.SyncReport{Replicas: len(d.reps), DelayMs: report.Millis(d.sync.delay), Mirrored: d.sync.applied}
	}
	roles := []shared.Role{shared.RoleAggregated}
	if d.decode != nil {
		rep.PrefillWorkers, rep.DecodeWorkers = d.first.Len(), d.decode.Len()
		roles = []shared.Role{shared.RolePrefill, shared.RoleDecode}
	}
	if len(o.RolePolicies) > 0 {
		rep.RolePolicies = make(map[string]string, len(roles))
		for _, role := range roles {
			rep.RolePolicies[string(role)] = o.RolePolicies[role]
		}
	}
	if slices.ContainsFunc(d.speeds, func(v float64) bool { return v != 1 }) {
		rep.Speeds = slices.Clone(d.speeds)
	}
	t := &d.tally
	rep.RequestsPerWorker = t.perWorker
	rep.Classes = make(map[string]*report.ClassReport, len(t.classes))
	for k := range t.classes {
		rep.Classes[t.classNames[k]] = &t.classes[k]
	}
	extra := slices.Clone(t.classNames[len(d.classes):]) // classes the queue does not declare
	slices.Sort(extra)
	rep.ClassOrder = append(append(rep.ClassOrder, d.classes...), extra...)
	// Each class's summaries before the whole's, which sort the samples.
	var ttft, queue []float64
	for k := range t.classes {
		c := &t.classes[k]
		if c.Completed == t.completed {
			ttft, queue = t.ttft, t.queue // every completed request: no copy
		} else {
			ttft, queue = ttft[:0:0], queue[:0:0]
			for j, ck := range t.class {
				if int(ck) == k {
					ttft, queue = append(ttft, t.ttft[j]), append(queue, t.queue[j])
				}
			}
		}
		c.TTFT, c.Queue = summarize(ttft), summarize(queue)
	}
	rep.Completed, rep.Rejected, rep.RejectionReasons = t.completed, t.rejected, t.reasons
	rep.TTFT, rep.E2E, rep.Queue = summarize(t.ttft), summarize(t.e2e), summarize(t.queue)
	rep.TPOT, rep.ITL = summarize(t.tpot), t.itlSummary()
	rep.OutputTokens = t.output
	if o.Timeline {
		rep.Distributions = &report.Distributions{TTFT: quantiles(t.ttft, report.DistributionPoints), E2E: quantiles(t.e2e, report.DistributionPoints)}
		rep.Timeline = d.tl.result(d.lastAt)
	}
	if rep.Completed > 0 {
		rep.BeliefAccuracy = round4(float64(t.believed) / float64(rep.Completed))
	}
	rep.Prefix = o.Prefix.String()
	if d.kv != nil {
		rep.KVEvents = &report.KVEventsReport{DelayMs: report.Millis(o.KVEventDelay), Batches: d.kv.batches, Events: d.kv.events}
	}
	rep.KVTransfer = summarize(t.xfer)
	if t.prompt > 0 {
		rep.KVHitRatio = round4(float64(t.cached) / float64(t.prompt))
		rep.RouterOverlapRatio = round4(float64(t.predicted) / float64(t.prompt))
	}
	ref := d.ref.result()
	rep.KVHitReference, rep.KVHitCeiling = ref.HitRatio, ref.CeilingRatio
	if ref.HitRatio > 0 {
		rep.KVHitOfReference = round4(rep.KVHitRatio / ref.HitRatio)
	}
	rep.Imbalance = imbalance(rep.RequestsPerWorker[:d.first.Len()])
	clusters := []*sim.Cluster{d.first}
	if d.decode != nil {
		rep.Imbalance = max(rep.Imbalance, imbalance(rep.RequestsPerWorker[d.base[decodeHop]:]))
		clusters = append(clusters, d.decode)
	}
	for _, c := range clusters {
		rep.Preemptions += c.Stats().Preemptions
	}
	if d.next > 0 {
		rep.SimDurationS = round3((d.lastAt - d.firstArrival).Seconds())
	}
	if rep.SimDurationS > 0 {
		rep.OutputTokensPerS = round3(float64(rep.OutputTokens) / rep.SimDurationS)
	}
	if !o.SLO.IsZero() {
		rep.Goodput = &report.Goodput{SLO: o.SLO.String(), Met: t.met}
		if rep.Requests > 0 {
			rep.Goodput.Share = round4(float64(t.met) / float64(rep.Requests))
		}
		if rep.SimDurationS > 0 {
			rep.Goodput.PerS = round3(float64(t.met) / rep.SimDurationS)
		}
	}
	if rep.Selections > 0 {
		rep.FallbackShare = float64(rep.Fallbacks) / float64(rep.Selections)
	}
	if d.faults != nil {
		rep.Migration = d.faults.report()
	}
	rep.Predictor = d.predictorAccuracy()
	rep.Shadow = d.shadowReport(o, roles)
	rep.Canary = d.canaryReport(d.reps[0].roles, roles)
	if s := wall.Seconds(); s > 0 {
		rep.SimRequestsPerS = float64(int(float64(d.next) / s))
	}
	if s := d.decisionTime.Seconds(); s > 0 {
		rep.DecisionsPerS = float64(int(float64(d.decisions) / s))
	}
	return rep
}

// tally accumulates a replay's report over its requests as they are
// retired: counts and sums, and for each completed request its TTFT, E2E
// and queue time and its class (one float64 per figure the percentiles
// need, as the per-request lines print it, and an int32), which is all a
// request leaves behind.
type tally struct {
	perWorker           []int // requests sent, by worker index (Report.RequestsPerWorker)
	completed, rejected int
	reasons             map[string]int // Report.RejectionReasons
	// ttft, e2e, queue and class are by completed request, xfer by
	// completed request that had a KV transfer.
	ttft, e2e, queue, xfer    []float64
	tpot                      []float64  // by completed request of more than one output token
	class                     []int32    // index in classes
	output                    int64      // output tokens of completed requests
	slo                       report.SLO // Options.SLO
	met                       int        // completed requests that met slo
	itl                       *hdrhistogram.Histogram
	gapUs, gapN               int64 // a run of equal gaps not yet in itl (tokenGap)
	prompt, cached, predicted int64 // tokens of completed requests (Report.KVHitRatio, RouterOverlapRatio)
	believed                  int   // Report.BeliefAccuracy's count
	// classes are the counts of each class, by index: the queue's classes
	// in its order, then the others as they first appear; classNames
	// names them, classIndex indexes them by name.
	classes    []report.ClassReport
	classNames []string
	classIndex map[string]int32
	// sides are the canary sides' counts (live, candidate), sideTTFT and
	// sideE2E their completed requests' figures (canaryCount).
	sides             [2]report.CanarySide
	sideTTFT, sideE2E [2][]float64
}

// init sizes t for workers fleet members and the queue's classes.
func (t *tally) init(workers int, classes []string) {
	t.perWorker = make([]int, workers)
	t.classIndex = make(map[string]int32, len(classes))
	for _, name := range classes {
		t.addClass(name)
	}
}

// addClass adds class name and returns its index.
func (t *tally) addClass(name string) int32 {
	k := int32(len(t.classes))
	t.classes = append(t.classes, report.ClassReport{})
	t.classNames = append(t.classNames, name)
	t.classIndex[name] = k
	return k
}

// count adds a request that is over to the tally.
func (d *driver) count(st *request) {
	t, out := &d.tally, &st.out
	k, ok := t.classIndex[st.class]
	if !ok {
		k = t.addClass(st.class)
	}
	t.canaryCount(st)
	if st.migrations > 0 {
		d.faults.countMigrated(out)
	}
	c := &t.classes[k]
	c.Requests++
	if out.Worker >= 0 {
		t.perWorker[out.Worker]++
	}
	if d.decode != nil && out.DecodeWorker >= 0 {
		t.perWorker[out.DecodeWorker]++
	}
	if out.Status != "ok" {
		c.Rejected++
		t.rejected++
		if t.reasons == nil {
			t.reasons = make(map[string]int)
		}
		t.reasons[strings.TrimPrefix(out.Status, "rejected: ")]++
		return
	}
	c.Completed++
	t.completed++
	t.ttft = append(t.ttft, out.TTFTMs)
	t.e2e = append(t.e2e, out.E2EMs)
	t.queue = append(t.queue, out.QueueMs)
	t.class = append(t.class, k)
	if out.OutputLength > 1 {
		t.tpot = append(t.tpot, round3((out.E2EMs-out.TTFTMs)/float64(out.OutputLength-1)))
	}
	t.output += int64(out.OutputLength)
	if !t.slo.IsZero() && t.slo.Met(out.TTFTMs, out.E2EMs, out.OutputLength) {
		t.met++
	}
	if out.DecodeWorker > 0 {
		t.xfer = append(t.xfer, out.KVTransferMs)
	}
	t.prompt += int64(out.InputLength)
	t.cached += int64(out.CachedTokens)
	t.predicted += min(int64(out.OverlapBlocks)*int64(d.blockSize), int64(max(out.InputLength-1, 0)))
	if d.believed(out) {
		t.believed++
	}
}

// shadowReport is the report of the roles' shadows; nil when no routed
// role's policy has one.
func (d *driver) shadowReport(o *Options, roles []shared.Role) *report.ShadowReport {
	var sr *report.ShadowReport
	for _, role := range roles {
		if p := o.Roles[role]; p != nil && p.Shadow != nil {
			if sr == nil {
				sr = &report.ShadowReport{Shadows: make(map[string]string, len(roles))}
			}
			sr.Shadows[string(role)] = p.Shadow.Name
		}
	}
	if sr == nil {
		return nil
	}
	sr.Agree, sr.Disagree = d.shadow[router.ShadowAgree], d.shadow[router.ShadowDisagree]
	sr.Failed, sr.None = d.shadow[router.ShadowFailed], d.shadow[router.ShadowNone]
	sr.Decisions = sr.Agree + sr.Disagree + sr.Failed + sr.None
	sr.FirstError = d.shadowFirstErr
	if sr.Decisions > 0 {
		sr.AgreeShare = round4(float64(sr.Agree) / float64(sr.Decisions))
	}
	return sr
}

// believed reports whether a completed request's router belief equals
// the tokens its engine served from cache (Report.BeliefAccuracy).
func (d *driver) believed(out *Outcome) bool {
	e := int64(d.engineBlock)
	limit := int64(max(out.InputLength, 1)-1) / e * e
	return min(int64(out.OverlapBlocks)*int64(d.blockSize), limit) == int64(out.CachedTokens)
}

// imbalance is max over mean of one pool's request counts (0 when the
// pool got none).
func imbalance(counts []int) float64 {
	var maxN, sum int
	for _, n := range counts {
		maxN = max(maxN, n)
		sum += n
	}
	if sum == 0 {
		return 0
	}
	return round3(float64(maxN) / (float64(sum) / float64(len(counts))))
}

// newITLHistogram is the inter-token latency histogram: microseconds
// from 1 to one hour, 3 significant digits.
func newITLHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3)
}

// tokenGap records n inter-token gaps of length gap
// (sim.Worker.OnTokenGap), rounded to the microsecond (at least 1). Runs
// of equal gaps, which a step gives every request that decoded in the
// step before, are recorded at once.
func (t *tally) tokenGap(gap time.Duration, n int) {
	us := max(int64((gap+time.Microsecond/2)/time.Microsecond), 1)
	if us != t.gapUs {
		t.flushGaps()
		t.gapUs = us
	}
	t.gapN += int64(n)
}

// flushGaps records the run of equal gaps tokenGap holds.
func (t *tally) flushGaps() {
	if t.gapN > 0 {
		_ = t.itl.RecordValues(min(t.gapUs, t.itl.HighestTrackableValue()), t.gapN) // in range: cannot fail
	}
	t.gapN = 0
}

// itlSummary is the ITL histogram's summary in ms.
func (t *tally) itlSummary() report.Summary {
	t.flushGaps()
	h := t.itl
	if h == nil || h.TotalCount() == 0 {
		return report.Summary{}
	}
	ms := func(us int64) float64 { return round3(float64(us) / 1000) }
	return report.Summary{
		P50:  ms(h.ValueAtQuantile(50)),
		P90:  ms(h.ValueAtQuantile(90)),
		P99:  ms(h.ValueAtQuantile(99)),
		Mean: round3(h.Mean() / 1000),
		N:    int(h.TotalCount()),
	}
}

func round4(x float64) float64 { return float64(int64(x*10000+0.5)) / 10000 }

// predictorAccuracy is the predictor's accuracy over every replica's
// decisions (each replica learns on its own, as replicas of router serve
// do; their histograms are summed); nil when nothing was compared.
func (d *driver) predictorAccuracy() *report.PredictorAccuracy {
	acc := new(predict.Accuracy)
	for _, rep := range d.reps {
		a := &rep.r.Predictor().Accuracy
		a.TTFT.AddTo(&acc.TTFT)
		a.TPOT.AddTo(&acc.TPOT)
	}
	if acc.TTFT.Count() == 0 && acc.TPOT.Count() == 0 {
		return nil
	}
	q := func(h *predict.ErrorHistogram, p float64) float64 {
		if h.Count() == 0 {
			return 0
		}
		return round4(h.Quantile(p))
	}
	return &report.PredictorAccuracy{
		TTFTN: acc.TTFT.Count(), TPOTN: acc.TPOT.Count(),
		TTFTP50: q(&acc.TTFT, 0.5), TTFTP90: q(&acc.TTFT, 0.9),
		TPOTP50: q(&acc.TPOT, 0.5), TPOTP90: q(&acc.TPOT, 0.9),
		Read: d.reps[0].r.ReadsLatency(),
	}
}
