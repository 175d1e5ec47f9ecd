package replay

import (
	"fmt"

	"github.com/HdrHistogram/hdrhistogram-go"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/shared"
)

// Summary is the distribution of one latency, in milliseconds, over the
// completed requests. Percentiles use the nearest-rank method.
type Summary struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// summarize sorts xs in place and returns its summary (zero when empty).
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Summary{
		P50:  nearestRank(xs, 0.50),
		P90:  nearestRank(xs, 0.90),
		P99:  nearestRank(xs, 0.99),
		Mean: round3(sum / float64(len(xs))),
	}
}

// nearestRank is the smallest value with at least q of the sorted sample at
// or below it.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// Report is the summary of one replay, written by --report as JSON.
type Report struct {
	// Policy is the policy file's name without its extension, or "default"
	// for the built-in policy.
	Policy string `json:"policy"`
	// RolePolicies names the policy each routed role ran, as the policy
	// file names it: the aggregated role, or the prefill and decode roles
	// in disaggregated mode. "default" is the built-in default policy (the
	// name is reserved), which also runs for a role the file's
	// worker_selection does not set. Absent when Options.RolePolicies was
	// not given.
	RolePolicies map[string]string `json:"role_policies,omitempty"`
	// Trace is the trace's file name.
	Trace string `json:"trace"`
	// Workers is the number of simulated workers, prefill and decode ones
	// included.
	Workers int `json:"workers"`
	// PrefillWorkers and DecodeWorkers split Workers in disaggregated mode
	// (fleet ids 0..PrefillWorkers−1 prefill, the rest decode); absent in
	// aggregated mode.
	PrefillWorkers int `json:"prefill_workers,omitempty"`
	DecodeWorkers  int `json:"decode_workers,omitempty"`
	// Requests is the number of requests replayed; Completed those that
	// finished; Rejected those the router or a worker refused.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// RejectionReasons counts the rejected requests by reason, the
	// per-request status without its "rejected: " prefix (for example
	// `policy "kv": all workers busy`, or `decode: ...` when the decode
	// hop was refused); absent when none was rejected.
	RejectionReasons map[string]int `json:"rejection_reasons,omitempty"`
	// TTFT is time to first token, E2E arrival to last token, Queue arrival
	// to first scheduled step; all in ms of simulated time. In
	// disaggregated mode TTFT ends at the prefill worker's first token, E2E
	// at the decode worker's last, and Queue is the prefill worker's.
	TTFT  Summary `json:"ttft_ms"`
	E2E   Summary `json:"e2e_ms"`
	Queue Summary `json:"queue_ms"`
	// TPOT is time per output token after the first, per completed
	// request of more than one output token: (E2E − TTFT) /
	// (output_length − 1), in ms, as vLLM's benchmark defines it. In
	// disaggregated mode it includes the KV transfer.
	TPOT Summary `json:"tpot_ms"`
	// ITL is the inter-token latency over every token after a request's
	// first on its engine (sim.Worker.OnTokenGap), in ms: the time between
	// the ends of the engine steps that sampled consecutive tokens, a
	// preemption's wait included. Percentiles come from an HDR histogram
	// of microseconds with 3 significant digits (within 0.1%), the mean
	// is exact to the microsecond.
	ITL Summary `json:"itl_ms"`
	// OutputTokens is the output tokens of completed requests;
	// OutputTokensPerS that over SimDurationS.
	OutputTokens     int64   `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// Goodput is the requests that met Options.SLO; absent without one.
	Goodput *Goodput `json:"goodput,omitempty"`
	// Seed is the seed the policy ran with, when the caller sets it
	// (router replay does, for --seeds).
	Seed *int64 `json:"seed,omitempty"`
	// Timeline is the replay's state over simulated time; Distributions
	// its latency distributions. Both absent without Options.Timeline.
	Timeline      *Timeline      `json:"timeline,omitempty"`
	Distributions *Distributions `json:"distributions,omitempty"`
	// KVTransfer is the prefill-to-decode KV transfer time of completed
	// requests that had one, in ms; absent in aggregated mode.
	KVTransfer Summary `json:"kv_transfer_ms,omitzero"`
	// KVHitRatio is prompt tokens served from the engines' prefix caches
	// divided by all prompt tokens of completed requests.
	KVHitRatio float64 `json:"kv_hit_ratio"`
	// KVHitReference is the hit ratio of one LRU cache holding the whole
	// fleet's KV capacity (the aggregated or prefill workers' engine
	// blocks), fed every request of the trace in arrival order with the
	// engines' cache rules; KVHitCeiling the same with a cache that never
	// evicts (KVReference; docs/replay.md "How much a better policy could
	// gain"). Both count the prompt tokens of every request, rejected ones
	// included. KVHitOfReference is KVHitRatio / KVHitReference (0 when
	// the reference is 0).
	KVHitReference   float64 `json:"kv_hit_reference"`
	KVHitOfReference float64 `json:"kv_hit_of_reference"`
	KVHitCeiling     float64 `json:"kv_hit_ceiling"`
	// RouterOverlapRatio is the same ratio as the router's prefix index
	// predicted it at selection time.
	RouterOverlapRatio float64 `json:"router_overlap_ratio"`
	// BeliefAccuracy is the share of completed requests whose router
	// belief at selection equals what the engine then served from cache:
	// min(overlap_blocks × block_size, ⌊(input_length − 1)/E⌋ × E) ==
	// cached_tokens (Outcome), E the engines' tokens per KV block
	// (sim.Config.BlockSize). The cap is the engine's own: it always
	// computes the block of a prompt's last token, so an entirely cached
	// prompt is served one engine block short (router/sim README, "KV
	// events"). 0 without completed requests.
	BeliefAccuracy float64 `json:"belief_accuracy"`
	// Prefix is how the router learned what the engines hold:
	// "approximate" or "precise" (Options.Prefix).
	Prefix string `json:"prefix"`
	// KVEvents describes the KV event feed in precise mode; absent in
	// approximate mode.
	KVEvents *KVEventsReport `json:"kv_events,omitempty"`
	// Sync describes the router replicas when there are several
	// (Options.Replicas); absent with one.
	Sync *SyncReport `json:"sync,omitempty"`
	// RequestsPerWorker counts the requests each worker was sent, by fleet
	// id: in disaggregated mode the prefill workers, then the decode
	// workers.
	RequestsPerWorker []int `json:"requests_per_worker"`
	// Imbalance is max over mean of RequestsPerWorker (1 is perfect); in
	// disaggregated mode, the larger of the prefill and decode pools'.
	Imbalance float64 `json:"imbalance"`
	// Preemptions is the engines' total of recompute preemptions.
	Preemptions int64 `json:"preemptions"`
	// SimDurationS is the simulated time from the first arrival to the last
	// completion, in seconds.
	SimDurationS float64 `json:"sim_duration_s"`
	// WallS is the wall time of the whole replay: building the router, its
	// fleet and the simulated clusters, then the replay loop (reading the
	// trace and writing outputs are not included). SimRequestsPerS is
	// requests replayed per second of WallS (setup, decisions and
	// simulation). DecisionsPerS is routing decisions per wall second
	// spent inside the router: Admit and Dispatch (classification,
	// queueing, selection) and, for the decode hop, Select.
	WallS           float64 `json:"wall_s"`
	DecisionsPerS   float64 `json:"decisions_per_s"`
	SimRequestsPerS float64 `json:"sim_requests_per_s"`
	// Selections is how many selections placed a request on a worker: one
	// per routed request, two (prefill and decode) per request that
	// reached a decode worker in disaggregated mode.
	Selections int64 `json:"selections"`
	// Fallbacks is how many selections a fallback policy answered,
	// because the role's policy failed.
	Fallbacks int64 `json:"fallbacks"`
	// FallbackShare is Fallbacks / Selections (0 without selections).
	FallbackShare float64 `json:"fallback_share"`
	// FallbackSources breaks Fallbacks down by the plugin (or policy)
	// that failed and by cause, most fallbacks first; absent when none
	// fell back.
	FallbackSources []FallbackSource `json:"fallback_sources,omitempty"`
	// Shadow counts the shadow decisions when a routed role's policy has a
	// shadow (policy.Policy.Shadow); absent otherwise.
	Shadow *ShadowReport `json:"shadow,omitempty"`
	// PluginRestarts is how many times the policy's plugins were restarted
	// during the replay (the caller that owns the plugins fills it in).
	PluginRestarts int64 `json:"plugin_restarts"`
	// Hosted is true when the policy requests are routed by on arrival (the
	// aggregated one, or the prefill one) ran on the hosted path.
	Hosted bool `json:"hosted"`
	// Classes summarises each queue class the requests were classified
	// into, by name: every class of the queue (the default queue's one
	// class "default" without a queue block), and any other class a
	// classifier named.
	Classes map[string]*ClassReport `json:"classes"`
	// classOrder is Classes' names in the queue's order, then the others
	// sorted: the table's order.
	classOrder []string
}

// Distributions are a replay's latency distributions over its completed
// requests, for CDF plots: each is the value, in ms, at quantiles 0,
// 1/DistributionPoints, ..., 1 (nearest rank; the first is the minimum,
// the last the maximum). Empty without completed requests.
type Distributions struct {
	TTFT []float64 `json:"ttft_ms"`
	E2E  []float64 `json:"e2e_ms"`
}

// DistributionPoints is the number of quantile steps of Distributions:
// 200, half a percent each.
const DistributionPoints = 200

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

// ShadowReport is how a replay's shadow policies compared with the live
// decisions. A replay asks each shadow inline, in simulated time, and
// never charges its decision latency to the request, so the live
// decisions are those of the same replay without shadows.
type ShadowReport struct {
	// Shadows names each routed role's shadow policy, by role; only the
	// roles whose policy has one.
	Shadows map[string]string `json:"shadows"`
	// Decisions is how many selections the shadows were asked about (the
	// selections of those roles that placed a request); Agree, Disagree,
	// Failed and None split it by router.ShadowResult.
	Decisions int64 `json:"decisions"`
	Agree     int64 `json:"agree"`
	Disagree  int64 `json:"disagree"`
	Failed    int64 `json:"failed"`
	None      int64 `json:"none"`
	// AgreeShare is Agree / Decisions (0 without decisions), rounded to
	// 4 decimals.
	AgreeShare float64 `json:"agree_share"`
	// FirstError is the error of the first failed shadow decision; absent
	// when none failed.
	FirstError string `json:"first_error,omitempty"`
}

// KVEventsReport is the KV event feed of a precise replay.
type KVEventsReport struct {
	// DelayMs is Options.KVEventDelay in ms.
	DelayMs float64 `json:"delay_ms"`
	// Batches and Events count the batches (one per worker and engine
	// step) and events (a prefix group stored or removed, or a clear)
	// the router applied.
	Batches int64 `json:"batches"`
	Events  int64 `json:"events"`
}

// SyncReport is the router replicas of a replay (Options.Replicas > 1).
type SyncReport struct {
	// Replicas is the number of router replicas; trace request i was
	// routed by replica i mod Replicas.
	Replicas int `json:"replicas"`
	// DelayMs is Options.SyncDelay in ms: from a replica's decision,
	// first token or release, or an engine's KV event, to the others
	// applying it.
	DelayMs float64 `json:"delay_ms"`
	// Mirrored counts the bookings made on replicas for hops that another
	// replica placed: (Replicas − 1) per placed hop.
	Mirrored int64 `json:"mirrored"`
}

// ClassReport is one policy class's share of a replay. TTFT and Queue are
// over its completed requests, in ms of simulated time; Queue (arrival to
// the first scheduled engine step) includes the wait in the router's queue.
type ClassReport struct {
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	TTFT      Summary `json:"ttft_ms"`
	Queue     Summary `json:"queue_ms"`
}

// WriteTable writes reports as WriteComparison does with the default
// columns, a row per report (each a cell of one run).
func WriteTable(w io.Writer, reports []*Report) error {
	cells := make([]Cell, len(reports))
	for i, r := range reports {
		cells[i] = Cell{Runs: []*Report{r}}
	}
	return WriteComparison(w, cells, Comparison{})
}

// ClassLegend is printed under the table of queue classes.
const ClassLegend = `POLICY/CLASS rows: the requests of one queue class (TTFT over its completed requests; queue = arrival to
first scheduled step including the router's queue)
`

// order returns the names of r.Classes in table order.
func (r *Report) order() []string {
	if len(r.classOrder) == len(r.Classes) {
		return r.classOrder
	}
	names := make([]string, 0, len(r.Classes))
	for name := range r.Classes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Label names a table row, in one word so that rows stay one field per
// column: the policy, plus the pool sizes in disaggregated mode, and a
// ":default" mark on each role that ran the built-in default policy
// although Policy names a policy file (its worker_selection does not set
// the role):
//
//	kv                         aggregated, the file's policy
//	kv(default)                aggregated, the built-in policy
//	default(4P+4D)             no policy file: the built-in policy everywhere
//	pd(4P+4D)                  the file's prefill and decode policies
//	kv(4P:default+4D:default)  the file sets neither prefill nor decode
//	kv+precise                 any of these, routed by KV events (Prefix "precise")
//	kv/3@10ms                  any of these, routed by 3 replicas with a 10 ms sync delay
func (r *Report) Label() string {
	if r.KVEvents != nil {
		return r.label() + "+precise" + r.Sync.suffix()
	}
	return r.label() + r.Sync.suffix()
}

// suffix is "/N@DELAY" for N replicas syncing after DELAY (a Go duration:
// 0s, 10ms, 1s), "" for one replica (nil s).
func (s *SyncReport) suffix() string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("/%d@%v", s.Replicas, time.Duration(math.Round(s.DelayMs*1e6)))
}

func (r *Report) label() string {
	fellBack := func(role shared.Role) bool {
		return r.Policy != config.DefaultPolicyName && r.RolePolicies[string(role)] == config.DefaultPolicyName
	}
	if r.PrefillWorkers == 0 && r.DecodeWorkers == 0 {
		if fellBack(shared.RoleAggregated) {
			return r.Policy + "(" + config.DefaultPolicyName + ")"
		}
		return r.Policy
	}
	pool := func(n int, kind string, role shared.Role) string {
		s := strconv.Itoa(n) + kind
		if fellBack(role) {
			s += ":" + config.DefaultPolicyName
		}
		return s
	}
	return r.Policy + "(" + pool(r.PrefillWorkers, "P", shared.RolePrefill) + "+" + pool(r.DecodeWorkers, "D", shared.RoleDecode) + ")"
}

// TopRejection returns the most common rejection reason and its count,
// the alphabetically first on a tie, or "" and 0 when none was rejected.
func (r *Report) TopRejection() (reason string, n int) {
	for k, c := range r.RejectionReasons {
		if c > n || (c == n && k < reason) {
			reason, n = k, c
		}
	}
	return reason, n
}

func ms(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.1f", v), "0"), ".")
	}
}

func (d *driver) report(o *Options, wall time.Duration) *Report {
	rep := &Report{
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
		rep.Sync = &SyncReport{Replicas: len(d.reps), DelayMs: millis(d.sync.delay), Mirrored: d.sync.applied}
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
	t := &d.tally
	rep.RequestsPerWorker = t.perWorker
	rep.Classes = make(map[string]*ClassReport, len(t.classes))
	for k := range t.classes {
		rep.Classes[t.classNames[k]] = &t.classes[k]
	}
	extra := slices.Clone(t.classNames[len(d.classes):]) // classes the queue does not declare
	slices.Sort(extra)
	rep.classOrder = append(append(rep.classOrder, d.classes...), extra...)
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
		rep.Distributions = &Distributions{TTFT: quantiles(t.ttft, DistributionPoints), E2E: quantiles(t.e2e, DistributionPoints)}
		rep.Timeline = d.tl.result(d.lastAt)
	}
	if rep.Completed > 0 {
		rep.BeliefAccuracy = round4(float64(t.believed) / float64(rep.Completed))
	}
	rep.Prefix = o.Prefix.String()
	if d.kv != nil {
		rep.KVEvents = &KVEventsReport{DelayMs: millis(o.KVEventDelay), Batches: d.kv.batches, Events: d.kv.events}
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
		rep.Goodput = &Goodput{SLO: o.SLO.String(), Met: t.met}
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
	rep.Shadow = d.shadowReport(o, roles)
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
	perWorker           []int // requests sent, by fleet id (Report.RequestsPerWorker)
	completed, rejected int
	reasons             map[string]int // Report.RejectionReasons
	// ttft, e2e, queue and class are by completed request, xfer by
	// completed request that had a KV transfer.
	ttft, e2e, queue, xfer    []float64
	tpot                      []float64 // by completed request of more than one output token
	class                     []int32   // index in classes
	output                    int64     // output tokens of completed requests
	slo                       SLO       // Options.SLO
	met                       int       // completed requests that met slo
	itl                       *hdrhistogram.Histogram
	gapUs, gapN               int64 // a run of equal gaps not yet in itl (tokenGap)
	prompt, cached, predicted int64 // tokens of completed requests (Report.KVHitRatio, RouterOverlapRatio)
	believed                  int   // Report.BeliefAccuracy's count
	// classes are the counts of each class, by index: the queue's classes
	// in its order, then the others as they first appear; classNames
	// names them, classIndex indexes them by name.
	classes    []ClassReport
	classNames []string
	classIndex map[string]int32
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
	t.classes = append(t.classes, ClassReport{})
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
	if !t.slo.IsZero() && t.slo.met(out.TTFTMs, out.E2EMs, out.OutputLength) {
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
func (d *driver) shadowReport(o *Options, roles []shared.Role) *ShadowReport {
	var sr *ShadowReport
	for _, role := range roles {
		if p := o.Roles[role]; p != nil && p.Shadow != nil {
			if sr == nil {
				sr = &ShadowReport{Shadows: make(map[string]string, len(roles))}
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
func (t *tally) itlSummary() Summary {
	t.flushGaps()
	h := t.itl
	if h == nil || h.TotalCount() == 0 {
		return Summary{}
	}
	ms := func(us int64) float64 { return round3(float64(us) / 1000) }
	return Summary{
		P50:  ms(h.ValueAtQuantile(50)),
		P90:  ms(h.ValueAtQuantile(90)),
		P99:  ms(h.ValueAtQuantile(99)),
		Mean: round3(h.Mean() / 1000),
	}
}

func round4(x float64) float64 { return float64(int64(x*10000+0.5)) / 10000 }
