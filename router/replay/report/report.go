package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// Summary is the distribution of one latency, in milliseconds, over the
// completed requests. Percentiles use the nearest-rank method.
type Summary struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	// N is how many values the distribution is over. It is not written:
	// a Summary without any (N 0 and every value 0, as the zero Summary)
	// is written as null, so that a run where no request completed does
	// not read as one of 0 ms latencies.
	N int `json:"-"`
}

// MarshalJSON implements json.Marshaler: null for a Summary without
// values (N 0 and P50, P90, P99 and Mean all 0), else the object
// {"p50", "p90", "p99", "mean"}. A Summary with values and N 0 (one
// built by hand, or read back from JSON) is written as an object.
func (s Summary) MarshalJSON() ([]byte, error) {
	if s == (Summary{}) {
		return []byte("null"), nil
	}
	type plain Summary // without this method
	return json.Marshal(plain(s))
}

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
	// Speeds is each worker's speed relative to the modelled H100, by
	// worker index (replay.Options.Speeds: aggregated workers, or the
	// prefill then the decode workers), on a fleet of mixed hardware;
	// absent when every worker runs at speed 1.
	Speeds []float64 `json:"speeds,omitempty"`
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
	// Predictor is the latency predictor's accuracy over the run: each
	// decision's predicted TTFT and TPOT on the worker it chose, against
	// what that worker then took (router/predict); absent when no
	// prediction was compared.
	Predictor *PredictorAccuracy `json:"predictor,omitempty"`
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
	// RequestsPerWorker counts the requests each worker was sent, by
	// worker index (N of "sim-N", not the fleet id): in disaggregated mode
	// the prefill workers, then the decode workers.
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
	// Canary is each side's figures and the rollbacks when a routed
	// role's policy has a canary; absent otherwise.
	Canary *CanaryReport `json:"canary,omitempty"`
	// Migration is the engine failures and the migrations of the requests
	// they cut (router replay --fail, --fail-rate); absent without.
	Migration *MigrationReport `json:"migration,omitempty"`
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
	// ClassOrder is Classes' names in the queue's order, then the others
	// sorted: the table's order. Not in the JSON report; a Report without
	// it (one read back) orders its classes by name.
	ClassOrder []string `json:"-"`
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
	if len(r.ClassOrder) == len(r.Classes) {
		return r.ClassOrder
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

// SpeedMix words the fleet's hardware classes (Speeds) as the number of
// workers of each speed, in the order of their first worker: "4 × speed 2
// + 4 × speed 1"; "" when every worker runs at speed 1.
func (r *Report) SpeedMix() string {
	if len(r.Speeds) == 0 {
		return ""
	}
	var (
		order []float64
		count = map[float64]int{}
	)
	for _, v := range r.Speeds {
		if count[v] == 0 {
			order = append(order, v)
		}
		count[v]++
	}
	parts := make([]string, len(order))
	for i, v := range order {
		parts[i] = fmt.Sprintf("%d × speed %s", count[v], strconv.FormatFloat(v, 'g', -1, 64))
	}
	return strings.Join(parts, " + ")
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

// ms writes a latency in milliseconds: whole ms from 100 ms, one decimal
// under it, the decimal kept when it is 0 ("47.0" beside "46.8"), so a
// column's values have the same precision (docs/replay.md, "Reading the
// report").
func ms(v float64) string {
	if math.Round(v*10) >= 1000 { // 99.96 shows as 100, not 100.0
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// KVReference is what one shared cache would have served of a trace: the
// yardstick the replay report sets beside a policy's KV hit ratio
// (docs/replay.md, "How much a better policy could gain").
type KVReference struct {
	// HitRatio is the prompt tokens one LRU cache holding the whole
	// fleet's KV capacity would have served, fed every request of the
	// trace in arrival order, over all prompt tokens. A reference, not a
	// bound: a router can beat it (an LRU is not the best eviction order,
	// and the engines' caches are not one pool) and it ignores what the
	// engines' caches also hold (outputs, running requests' blocks).
	HitRatio float64
	// CeilingRatio is the same with a cache that never evicts: every
	// prefix block seen before is served. No placement serves more.
	CeilingRatio float64
}

// Millis is d in milliseconds, rounded to the microsecond (3 decimals):
// how the per-request lines and the report give simulated times.
func Millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*1000) / 1000
}
