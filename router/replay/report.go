package replay

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
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
	// Policy is the policy file (or "default" for the built-in policy).
	Policy string `json:"policy"`
	// Trace is the trace's file name.
	Trace string `json:"trace"`
	// Workers is the number of simulated workers.
	Workers int `json:"workers"`
	// Requests is the number of requests replayed; Completed those that
	// finished; Rejected those no worker could take.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// TTFT is time to first token, E2E arrival to last token, Queue arrival
	// to first scheduled step; all in ms of simulated time.
	TTFT  Summary `json:"ttft_ms"`
	E2E   Summary `json:"e2e_ms"`
	Queue Summary `json:"queue_ms"`
	// KVHitRatio is prompt tokens served from the engines' prefix caches
	// divided by all prompt tokens of completed requests.
	KVHitRatio float64 `json:"kv_hit_ratio"`
	// RouterOverlapRatio is the same ratio as the router's prefix index
	// predicted it at selection time.
	RouterOverlapRatio float64 `json:"router_overlap_ratio"`
	// RequestsPerWorker counts the requests each worker was sent, by row.
	RequestsPerWorker []int `json:"requests_per_worker"`
	// Imbalance is max over mean of RequestsPerWorker (1 is perfect).
	Imbalance float64 `json:"imbalance"`
	// Preemptions and Evictions are the engines' totals.
	Preemptions int64 `json:"preemptions"`
	// SimDurationS is the simulated time from the first arrival to the last
	// completion, in seconds.
	SimDurationS float64 `json:"sim_duration_s"`
	// WallS is the wall time of the replay loop; DecisionsPerS is routing
	// decisions per wall second and SimRequestsPerS requests replayed per
	// wall second (decision plus simulation).
	WallS           float64 `json:"wall_s"`
	DecisionsPerS   float64 `json:"decisions_per_s"`
	SimRequestsPerS float64 `json:"sim_requests_per_s"`
	// Fallbacks is how many selections a fallback policy answered.
	Fallbacks int64 `json:"fallbacks"`
	// Hosted is true when the aggregated policy ran on the hosted path.
	Hosted bool `json:"hosted"`
}

// WriteTable writes reports as one aligned table, a row per report.
func WriteTable(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\trequests\tcompleted\tTTFT p50\tTTFT p90\tTTFT p99\tE2E p50\tE2E p99\tKV hit\timbalance\tsim s\twall s\treq/s (wall)\t")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.3f\t%.0f\t%.2f\t%.0f\t\n",
			r.Policy, r.Requests, r.Completed,
			ms(r.TTFT.P50), ms(r.TTFT.P90), ms(r.TTFT.P99), ms(r.E2E.P50), ms(r.E2E.P99),
			100*r.KVHitRatio, r.Imbalance, r.SimDurationS, r.WallS, r.SimRequestsPerS)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, "latencies in ms of simulated time; KV hit = prompt tokens served from the engines' prefix caches\n")
	return err
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
