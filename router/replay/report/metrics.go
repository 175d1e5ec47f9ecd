package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Metric is one figure of a Report: a column of the comparison table
// (router replay --columns NAME) and, in the HTML report, a plot against
// fleet size. Values are in display units: ms for latencies, percent for
// shares (KV hit 30.1, not 0.301).
type Metric struct {
	// Name is the --columns name, such as "ttft_p90".
	Name string
	// Header is the table's column header, such as "TTFT p90".
	Header string
	// Unit is the value's unit for axis labels: "ms", "%", "tok/s",
	// "req/s", "s", or "" for a count or a ratio.
	Unit string
	// Lower is true when lower values are better (latencies, rejections).
	Lower bool
	// Legend explains the column under the table; "" for none.
	Legend string
	value  func(*Report) (float64, bool)
	format func(float64) string
	// single, when set, writes the cell of a single run in place of
	// format (fallbacks with their share).
	single func(*Report) string
	// shownWith, when set, keeps the column in a table only when some
	// run satisfies it: belief, which every run has, is shown when a row
	// is precise, for every row.
	shownWith func(*Report) bool
}

// Value is m's value in r, and false when r has none (belief without
// KV events, goodput without an SLO, shadow agreement without a shadow,
// latencies without a completed request).
func (m Metric) Value(r *Report) (float64, bool) { return m.value(r) }

// Format writes v as the table does.
func (m Metric) Format(v float64) string { return m.format(v) }

// Higher is true for the metrics higher values of are better: the
// shares and rates of requests served well (completed, KV hit, of ref,
// belief, output tokens/s, goodput, goodput/s, req/s (wall)). A metric
// is better lower (Lower), better higher, or neither (requests, KV ref,
// sim s...).
func (m Metric) Higher() bool {
	switch m.Name {
	case "completed", "kv_hit", "of_ref", "belief", "output_tok_s", "goodput", "goodput_per_s", "req_s_wall":
		return true
	}
	return false
}

// Ratio is true for the metrics that are shares in percent (Unit "%"):
// a change of one is a difference in percentage points, not a relative
// change.
func (m Metric) Ratio() bool { return m.Unit == "%" }

func always(f func(*Report) float64) func(*Report) (float64, bool) {
	return func(r *Report) (float64, bool) { return f(r), true }
}

func count(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func pct1(v float64) string { return fmt.Sprintf("%.1f%%", v) }
func pct0(v float64) string { return fmt.Sprintf("%.0f%%", v) }
func fixed(digits int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', digits, 64) }
}

// latency makes the metric of a Summary's field. A run without a
// completed request has none (its Summary is zeros, which would read as
// the fastest run).
//
// A report has no value when no request completed.
func latency(name, header, what string, s func(*Report) *Summary, q func(*Summary) float64) Metric {
	return Metric{Name: name, Header: header, Unit: "ms", Lower: true, Legend: what,
		value: func(r *Report) (float64, bool) { return q(s(r)), r.Completed > 0 }, format: ms}
}

// perToken makes the metric of the TPOT or ITL summary, which has no
// sample, and the report no value, also when every completed request had
// one output token: an all-zero Summary, which a real TPOT or ITL never
// is (every engine step takes time).
func perToken(name, header, what string, s func(*Report) *Summary, q func(*Summary) float64) Metric {
	m := latency(name, header, what, s, q)
	m.value = func(r *Report) (float64, bool) {
		sum := s(r)
		return q(sum), r.Completed > 0 && *sum != (Summary{})
	}
	return m
}

var (
	p50  = func(s *Summary) float64 { return s.P50 }
	p90  = func(s *Summary) float64 { return s.P90 }
	p99  = func(s *Summary) float64 { return s.P99 }
	mean = func(s *Summary) float64 { return s.Mean }
)

// allMetrics is every Metric, in table order.
var allMetrics = []Metric{
	{Name: "requests", Header: "requests", Legend: "requests = requests replayed",
		value: always(func(r *Report) float64 { return float64(r.Requests) }), format: count},
	{Name: "completed", Header: "completed", Legend: "completed = requests that finished",
		value: always(func(r *Report) float64 { return float64(r.Completed) }), format: count},
	{Name: "rejected", Header: "rejected", Lower: true, Legend: "rejected = requests the router or a worker refused",
		value: always(func(r *Report) float64 { return float64(r.Rejected) }), format: count},
	{Name: "fallbacks", Header: "fallbacks", Lower: true,
		Legend: "fallbacks = selections a policy's fallback made because the policy failed (a plugin error, panic, timeout, restart...), with their share of all selections",
		value:  always(func(r *Report) float64 { return float64(r.Fallbacks) }), format: count,
		single: func(r *Report) string {
			if r.Fallbacks == 0 {
				return "0"
			}
			return fmt.Sprintf("%d (%s)", r.Fallbacks, share(r.Fallbacks, r.Selections))
		}},
	{Name: "fallback_share", Header: "fallback %", Unit: "%", Lower: true, Legend: "fallback % = fallbacks / all selections",
		value: always(func(r *Report) float64 { return 100 * r.FallbackShare }), format: fixed(2)},
	latency("ttft_p50", "TTFT p50", "TTFT = time to first token", func(r *Report) *Summary { return &r.TTFT }, p50),
	latency("ttft_p90", "TTFT p90", "TTFT = time to first token", func(r *Report) *Summary { return &r.TTFT }, p90),
	latency("ttft_p99", "TTFT p99", "TTFT = time to first token", func(r *Report) *Summary { return &r.TTFT }, p99),
	latency("ttft_mean", "TTFT mean", "TTFT = time to first token", func(r *Report) *Summary { return &r.TTFT }, mean),
	perToken("tpot_p50", "TPOT p50", tpotLegend, func(r *Report) *Summary { return &r.TPOT }, p50),
	perToken("tpot_p90", "TPOT p90", tpotLegend, func(r *Report) *Summary { return &r.TPOT }, p90),
	perToken("tpot_p99", "TPOT p99", tpotLegend, func(r *Report) *Summary { return &r.TPOT }, p99),
	perToken("itl_p50", "ITL p50", itlLegend, func(r *Report) *Summary { return &r.ITL }, p50),
	perToken("itl_p90", "ITL p90", itlLegend, func(r *Report) *Summary { return &r.ITL }, p90),
	perToken("itl_p99", "ITL p99", itlLegend, func(r *Report) *Summary { return &r.ITL }, p99),
	latency("e2e_p50", "E2E p50", e2eLegend, func(r *Report) *Summary { return &r.E2E }, p50),
	latency("e2e_p90", "E2E p90", e2eLegend, func(r *Report) *Summary { return &r.E2E }, p90),
	latency("e2e_p99", "E2E p99", e2eLegend, func(r *Report) *Summary { return &r.E2E }, p99),
	latency("queue_p50", "queue p50", queueLegend, func(r *Report) *Summary { return &r.Queue }, p50),
	latency("queue_p99", "queue p99", queueLegend, func(r *Report) *Summary { return &r.Queue }, p99),
	{Name: "kv_hit", Header: "KV hit", Unit: "%", Legend: "KV hit = prompt tokens served from the engines' prefix caches",
		value: always(func(r *Report) float64 { return 100 * r.KVHitRatio }), format: pct1},
	{Name: "kv_ref", Header: "KV ref", Unit: "%",
		Legend: "KV ref = the same for one LRU cache of the whole fleet's KV capacity fed the trace in arrival order (a reference, not a bound)",
		value:  always(func(r *Report) float64 { return 100 * r.KVHitReference }), format: pct1},
	{Name: "of_ref", Header: "of ref", Unit: "%",
		Legend: "of ref = KV hit / KV ref, KV ref being the KV hit of one LRU cache of the whole fleet's KV capacity fed the trace in arrival order (a reference, not a bound)",
		value:  always(func(r *Report) float64 { return 100 * r.KVHitOfReference }), format: pct0},
	{Name: "kv_ceiling", Header: "KV ceiling", Unit: "%", Legend: "KV ceiling = the KV hit of a cache that never evicts",
		value: always(func(r *Report) float64 { return 100 * r.KVHitCeiling }), format: pct1},
	{Name: "belief", Header: "belief", Unit: "%",
		Legend: "belief = requests whose router belief of the chosen worker's cached prefix equals what the engine served from cache; NAME+precise rows follow the engines' KV events (--prefix precise)",
		value: func(r *Report) (float64, bool) {
			return 100 * r.BeliefAccuracy, r.Completed > 0
		}, format: pct1,
		shownWith: func(r *Report) bool { return r.KVEvents != nil }},
	{Name: "shadow_agree", Header: "shadow agree", Unit: "%",
		Legend: "shadow agree = selections on which the role's shadow policy picked the live decision's worker",
		value: func(r *Report) (float64, bool) {
			if r.Shadow == nil {
				return 0, false
			}
			return 100 * r.Shadow.AgreeShare, true
		}, format: pct1},
	{Name: "preemptions", Header: "preempt", Lower: true, Legend: "preempt = the engines' recompute preemptions",
		value: always(func(r *Report) float64 { return float64(r.Preemptions) }), format: count},
	{Name: "output_tok_s", Header: "out tok/s", Unit: "tok/s", Legend: "out tok/s = output tokens of completed requests per simulated second",
		value: always(func(r *Report) float64 { return r.OutputTokensPerS }), format: fixed(0)},
	{Name: "goodput", Header: "goodput", Unit: "%", Legend: "goodput = requests that met every --slo target, of all requests",
		value: func(r *Report) (float64, bool) {
			if r.Goodput == nil {
				return 0, false
			}
			return 100 * r.Goodput.Share, true
		}, format: pct1},
	{Name: "goodput_per_s", Header: "goodput/s", Unit: "req/s", Legend: "goodput/s = those requests per simulated second",
		value: func(r *Report) (float64, bool) {
			if r.Goodput == nil {
				return 0, false
			}
			return r.Goodput.PerS, true
		}, format: fixed(2)},
	{Name: "imbalance", Header: "imbalance", Lower: true,
		Legend: "imbalance = max/mean requests per worker (1 is even; disaggregated: the worse pool)",
		value:  always(func(r *Report) float64 { return r.Imbalance }), format: fixed(3)},
	{Name: "sim_s", Header: "sim s", Unit: "s", Legend: "sim s = simulated first arrival to last completion",
		value: always(func(r *Report) float64 { return r.SimDurationS }), format: fixed(0)},
	{Name: "wall_s", Header: "wall s", Unit: "s", Lower: true, Legend: "wall s = real time incl. building the fleet",
		value: always(func(r *Report) float64 { return r.WallS }), format: fixed(2)},
	{Name: "req_s_wall", Header: "req/s (wall)", Unit: "req/s", Legend: "req/s (wall) = requests / wall s",
		value: always(func(r *Report) float64 { return r.SimRequestsPerS }), format: fixed(0)},
}

const (
	tpotLegend  = "TPOT = time per output token after the first, per request: (E2E − TTFT) / (output − 1)"
	itlLegend   = "ITL = inter-token latency, every token after a request's first on its engine"
	e2eLegend   = "E2E = arrival to last token"
	queueLegend = "queue = arrival to first scheduled engine step, the router's queue included"
)

// Metrics returns every metric, in table order.
func Metrics() []Metric { return slices.Clone(allMetrics) }

// MetricByName returns the metric called name, and false when there is
// none.
func MetricByName(name string) (Metric, bool) {
	i := slices.IndexFunc(allMetrics, func(m Metric) bool { return m.Name == name })
	if i < 0 {
		return Metric{}, false
	}
	return allMetrics[i], true
}

// DefaultColumns are the table's columns when --columns is not given: a
// concise table. Columns whose metric no row has (belief, shadow_agree,
// goodput without --slo) are left out (see Columns).
var DefaultColumns = []string{"requests", "completed", "rejected", "fallbacks", "ttft_p50", "ttft_p90", "ttft_p99",
	"tpot_p90", "itl_p99", "e2e_p99", "queue_p99", "kv_hit", "of_ref", "belief", "shadow_agree",
	"preemptions", "output_tok_s", "goodput", "goodput_per_s"}

// ParseColumns reads --columns: a comma-separated list of metric names,
// where "default" stands for DefaultColumns and "all" for every metric,
// such as "default,e2e_p50,imbalance". Repeats are kept once, in first
// order. The error lists the names.
func ParseColumns(spec string) ([]Metric, error) {
	var names []string
	for _, f := range strings.Split(spec, ",") {
		switch f = strings.TrimSpace(f); f {
		case "default":
			names = append(names, DefaultColumns...)
		case "all":
			for _, m := range allMetrics {
				names = append(names, m.Name)
			}
		default:
			if _, ok := MetricByName(f); !ok {
				return nil, fmt.Errorf("--columns %s: unknown column %q; want default, all or a comma-separated list of %s",
					spec, f, strings.Join(MetricNames(), ", "))
			}
			names = append(names, f)
		}
	}
	var out []Metric
	for _, n := range names {
		if !slices.ContainsFunc(out, func(m Metric) bool { return m.Name == n }) {
			m, _ := MetricByName(n)
			out = append(out, m)
		}
	}
	return out, nil
}

// MetricNames lists every metric's name, in table order.
func MetricNames() []string {
	names := make([]string, len(allMetrics))
	for i, m := range allMetrics {
		names[i] = m.Name
	}
	return names
}

// Cell is one row of a comparison: one policy on one fleet in one prefix
// mode, replayed once per seed. Runs holds at least one report, in seed
// order.
type Cell struct {
	Runs []*Report
}

// Label is the row's label: its first run's (Report.Label).
func (c Cell) Label() string { return c.Runs[0].Label() }

// Fleet is the row's fleet: "8" workers, or "4P+4D" in disaggregated mode.
func (c Cell) Fleet() string {
	r := c.Runs[0]
	if r.PrefillWorkers > 0 || r.DecodeWorkers > 0 {
		return fmt.Sprintf("%dP+%dD", r.PrefillWorkers, r.DecodeWorkers)
	}
	return strconv.Itoa(r.Workers)
}

// Stat is a metric over a cell's runs: their median (the mean of the two
// middle values for an even count), least and greatest, over N runs.
type Stat struct {
	Median, Min, Max float64
	N                int
}

// Stat returns m over c's runs, and false when no run has m.
func (c Cell) Stat(m Metric) (Stat, bool) {
	vs := make([]float64, 0, len(c.Runs))
	for _, r := range c.Runs {
		if v, ok := m.Value(r); ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return Stat{}, false
	}
	slices.Sort(vs)
	n := len(vs)
	med := vs[n/2]
	if n%2 == 0 {
		med = (vs[n/2-1] + vs[n/2]) / 2
	}
	return Stat{Median: med, Min: vs[0], Max: vs[n-1], N: n}, true
}

// Comparison is how WriteComparison lays out its table.
type Comparison struct {
	// Columns are the metric columns, in order (ParseColumns);
	// DefaultColumns when empty. A column no cell has is left out.
	Columns []Metric
	// Baseline, when set, names the policy (Report.Policy) the delta
	// column compares each row with: the row of that policy on the same
	// fleet in the same prefix mode.
	Baseline string
	// BaselineMetric is the delta column's metric (ttft_p90 when unset).
	BaselineMetric Metric
	// GoodputTarget, when > 0, is the goodput share, in percent, a row
	// must reach to meet the SLO: the table then ends with the smallest
	// fleet on which each row's policy reaches it (SmallestFleets).
	GoodputTarget float64
	// Width, when > 0, is the width in terminal columns (runes) the text
	// table is written for (WriteComparison): its legend is wrapped to
	// it, and with the default columns (Columns empty) columns are left
	// out until every row fits. 0 writes every column and unwrapped
	// lines. router replay sets it from $COLUMNS, else the terminal's
	// width, else 100.
	Width int
}

// FleetVerdict is, for one row label (a policy in one prefix mode), the
// smallest fleet of a comparison on which its median goodput reaches a
// target: Fleet and Goodput (percent) of that cell, or Fleet "" when no
// fleet does, Best then being its highest goodput.
type FleetVerdict struct {
	Policy  string
	Fleet   string
	Goodput float64
	Best    float64
}

// SmallestFleets returns, for each policy and prefix mode of cells in
// first-row order, the smallest fleet (by total workers) whose median
// goodput is at least target percent. Cells without goodput are skipped;
// nil when none has it.
func SmallestFleets(cells []Cell, target float64) []FleetVerdict {
	m, _ := MetricByName("goodput")
	var out []FleetVerdict
	index := map[string]int{}
	size := map[string]int{}
	for _, c := range cells {
		st, ok := c.Stat(m)
		if !ok {
			continue
		}
		r := c.Runs[0]
		key := r.Policy + "\x00" + r.Prefix + r.Sync.suffix()
		i, seen := index[key]
		if !seen {
			i = len(out)
			index[key] = i
			out = append(out, FleetVerdict{Policy: policyLabel(r)})
		}
		v := &out[i]
		v.Best = max(v.Best, st.Median)
		if st.Median >= target && (v.Fleet == "" || r.Workers < size[key]) {
			v.Fleet, v.Goodput, size[key] = c.Fleet(), st.Median, r.Workers
		}
	}
	return out
}

// policyLabel is r's policy as a row names it, without its pool sizes:
// the policy, and +precise for a precise run.
func policyLabel(r *Report) string {
	if r.KVEvents != nil {
		return r.Policy + "+precise" + r.Sync.suffix()
	}
	return r.Policy + r.Sync.suffix()
}

// GoodputVerdict words SmallestFleets in one line, as the table ends:
// "smallest fleet with goodput >= 95.0%: round-robin from 16 workers
// (96.1%); kv-affinity from 8 workers (95.3%); least-loaded on none
// (best 91.0%)"; "" without a target or goodput.
func GoodputVerdict(cells []Cell, target float64) string {
	vs := SmallestFleets(cells, target)
	if target <= 0 || len(vs) == 0 {
		return ""
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		if v.Fleet == "" {
			parts[i] = fmt.Sprintf("%s on none (best %s)", v.Policy, pct1(v.Best))
			continue
		}
		parts[i] = fmt.Sprintf("%s from %s workers (%s)", v.Policy, v.Fleet, pct1(v.Goodput))
	}
	return fmt.Sprintf("smallest fleet with goodput >= %s: %s", pct1(target), strings.Join(parts, "; "))
}

// Delta is the percent change of a cell's median of m against the
// baseline cell's, (v − base) / base × 100, and false when either has no
// value or the baseline's is 0.
func Delta(cell, base Cell, m Metric) (float64, bool) {
	a, ok1 := cell.Stat(m)
	b, ok2 := base.Stat(m)
	if !ok1 || !ok2 || b.Median == 0 {
		return 0, false
	}
	return (a.Median - b.Median) / math.Abs(b.Median) * 100, true
}

// Change is a cell's change in m against the baseline cell: for a
// Ratio metric the difference of the medians in percentage points
// (KV hit 9.1% against 6.0% is +3.1 pp), for any other the relative
// change in percent (Delta); text is "+3.1 pp" or "-42.0%". False when
// either has no value, or for a relative change the baseline's is 0.
func Change(cell, base Cell, m Metric) (d float64, text string, ok bool) {
	if m.Ratio() {
		a, ok1 := cell.Stat(m)
		b, ok2 := base.Stat(m)
		if !ok1 || !ok2 {
			return 0, "", false
		}
		d = a.Median - b.Median
		return d, fmt.Sprintf("%+.1f pp", d), true
	}
	d, ok = Delta(cell, base, m)
	if !ok {
		return 0, "", false
	}
	return d, fmt.Sprintf("%+.1f%%", d), true
}

// BaselineOf returns the cell of policy name on c's fleet, in c's prefix
// mode, with c's replicas and sync delay, and false when cells has none.
func BaselineOf(cells []Cell, c Cell, name string) (Cell, bool) {
	r := c.Runs[0]
	for _, b := range cells {
		br := b.Runs[0]
		if br.Policy == name && b.Fleet() == c.Fleet() && br.Prefix == r.Prefix && br.Sync.suffix() == r.Sync.suffix() {
			return b, true
		}
	}
	return Cell{}, false
}

// SyncLegend explains the row label of a replay with router replicas
// (Report.Label), under the table.
const SyncLegend = "NAME/N@D = routed by N router replicas (request i by replica i mod N), each seeing the others' bookings and the engines' KV events D later\n"

// WriteComparison writes cells as one aligned table: a row per cell (its
// label, its fleet when the cells have more than one, then each column's
// median, with [min–max] when the cell has several runs that differ),
// then the delta column when cmp has a baseline, then a legend of the
// columns shown. Cells of one run with more than one queue class are
// broken down by class in a second table under it.
//
// With cmp.Width set, the legend's lines are wrapped to it, and with
// the default columns (cmp.Columns empty) the table is fitted to it
// (Comparison.Width): count columns equal on every row move to one
// line under the table, then columns are left out, least important
// first (FitOrder), until every row fits, and a line names them.
func WriteComparison(w io.Writer, cells []Cell, cmp Comparison) error {
	cols := TableColumns(cells, cmp)
	fleets := map[string]bool{}
	seeds := 1
	for _, c := range cells {
		fleets[c.Fleet()] = true
		seeds = max(seeds, len(c.Runs))
	}
	bm := cmp.BaselineMetric
	if bm.Name == "" {
		bm, _ = MetricByName("ttft_p90")
	}
	t := textTable{cells: cells, fleets: len(fleets) > 1, baseline: cmp.Baseline, delta: bm}
	var folded, dropped []Metric
	if cmp.Width > 0 && len(cmp.Columns) == 0 {
		cols, folded, dropped = t.fit(cols, cmp.Width)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, line := range t.rows(cols) {
		fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var legend []string
	if len(folded) > 0 {
		parts := make([]string, len(folded))
		for i, m := range folded {
			parts[i] = m.Header + " " + cells[0].Text(m)
		}
		lead := "every row: "
		if len(cells) == 1 {
			lead = "also: "
		}
		legend = append(legend, lead+strings.Join(parts, ", "))
	}
	if len(dropped) > 0 {
		names := make([]string, len(dropped))
		for i, m := range dropped {
			names[i] = m.Header
		}
		legend = append(legend, fmt.Sprintf("left out to fit %d columns: %s (a wider terminal or $COLUMNS shows more; --columns all shows every one)",
			cmp.Width, strings.Join(names, ", ")))
	}
	if seeds > 1 {
		legend = append(legend, fmt.Sprintf("each cell: the median of %d seeds, [least–greatest] when they differ", seeds))
	}
	legend = append(legend, "latencies in ms of simulated time")
	legend = append(legend, "policy = the policy file's name (default: the built-in policy)")
	if t.fleets {
		legend = append(legend, "workers = the simulated fleet's workers (P+D: prefill and decode workers)")
	}
	if slices.ContainsFunc(cells, func(c Cell) bool { return c.Runs[0].Sync != nil }) {
		legend = append(legend, strings.TrimSuffix(SyncLegend, "\n"))
	}
	said := map[string]bool{}
	for _, m := range append(slices.Clone(cols), folded...) {
		if m.Legend != "" && !said[m.Legend] {
			said[m.Legend] = true
			legend = append(legend, m.Legend)
		}
	}
	if cmp.Baseline != "" {
		unit := "in percent (relative change)"
		if bm.Ratio() {
			unit = "in percentage points"
		}
		legend = append(legend, fmt.Sprintf("Δ %s = the row's %s against %s's on the same fleet, %s; base marks %s's own rows",
			bm.Header, bm.Header, cmp.Baseline, unit, cmp.Baseline))
	}
	if b := bestGoodput(cells); b != "" {
		legend = append(legend, strings.TrimSuffix(b, "\n"))
	}
	if v := GoodputVerdict(cells, cmp.GoodputTarget); v != "" {
		legend = append(legend, v)
	}
	var out strings.Builder
	for _, l := range legend {
		out.WriteString(Wrap(l, cmp.Width))
		out.WriteByte('\n')
	}
	if _, err := io.WriteString(w, out.String()); err != nil {
		return err
	}
	if err := writeClasses(w, cells); err != nil {
		return err
	}
	return writeMigrations(w, cells, cmp.Width)
}

// bestGoodput is the line naming, fleet by fleet, the row of the highest
// median goodput (ties named together; "none" when every row's is 0), ""
// without goodput or with a single row.
func bestGoodput(cells []Cell) string {
	m, _ := MetricByName("goodput")
	var fleets []string
	best := map[string][]string{}
	top := map[string]float64{}
	for _, c := range cells {
		s, ok := c.Stat(m)
		if !ok {
			continue
		}
		f := c.Fleet()
		switch t, seen := top[f]; {
		case !seen:
			fleets = append(fleets, f)
			fallthrough
		case s.Median > t:
			top[f], best[f] = s.Median, []string{c.Label()}
		case s.Median == t:
			best[f] = append(best[f], c.Label())
		}
	}
	if len(fleets) == 0 || len(cells) < 2 {
		return ""
	}
	parts := make([]string, len(fleets))
	for i, f := range fleets {
		on := f + " workers"
		if f == "1" {
			on = "1 worker"
		}
		if top[f] == 0 {
			parts[i] = "none on " + on + " (0%)" // no row to name: every row met no target
			continue
		}
		parts[i] = fmt.Sprintf("%s on %s (%s)", strings.Join(best[f], " and "), on, m.Format(top[f]))
	}
	return "highest goodput: " + strings.Join(parts, "; ") + "\n"
}

// TableColumns is the columns WriteComparison shows for cells: cmp.Columns
// (DefaultColumns when empty), less those of which no cell has a value,
// and belief unless some row is precise.
func TableColumns(cells []Cell, cmp Comparison) []Metric {
	cols := cmp.Columns
	if len(cols) == 0 {
		cols, _ = ParseColumns("default")
	}
	return slices.DeleteFunc(slices.Clone(cols), func(m Metric) bool {
		if m.shownWith != nil && !slices.ContainsFunc(cells, func(c Cell) bool { return slices.ContainsFunc(c.Runs, m.shownWith) }) {
			return true
		}
		return !slices.ContainsFunc(cells, func(c Cell) bool { _, ok := c.Stat(m); return ok })
	})
}

// Text is c's cell in column m as WriteComparison writes it: the median
// in m's format, then " [least–greatest]" when the runs' values differ;
// a single run's fallbacks with their share of selections; "-" when c
// has no value.
func (c Cell) Text(m Metric) string {
	s, ok := c.Stat(m)
	if !ok {
		return "-"
	}
	if len(c.Runs) == 1 && m.single != nil {
		return m.single(c.Runs[0])
	}
	text := m.Format(s.Median)
	if lo, hi := m.Format(s.Min), m.Format(s.Max); s.N > 1 && lo != hi {
		text += " [" + lo + "–" + hi + "]"
	}
	return text
}

// deltaText is c's delta cell against its baseline's.
func deltaText(cells []Cell, c Cell, name string, m Metric) string {
	base, ok := BaselineOf(cells, c, name)
	switch {
	case !ok:
		return "-"
	case base.Runs[0] == c.Runs[0]:
		return "base"
	}
	_, text, ok := Change(c, base, m)
	if !ok {
		return "-"
	}
	return text
}

// writeClasses writes, for the cells of one run with more than one queue
// class, a table of their classes: requests, completed, rejected, TTFT
// and queue time.
func writeClasses(w io.Writer, cells []Cell) error {
	var rows []*Report
	for _, c := range cells {
		if len(c.Runs) == 1 && len(c.Runs[0].Classes) > 1 {
			rows = append(rows, c.Runs[0])
		}
	}
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\npolicy/class\trequests\tcompleted\trejected\tTTFT p50\tTTFT p90\tTTFT p99\tqueue p50\tqueue p99\t")
	for _, r := range rows {
		for _, name := range r.order() {
			c := r.Classes[name]
			fmt.Fprintf(tw, "%s/%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Label(), name, c.Requests, c.Completed, c.Rejected,
				ms(c.TTFT.P50), ms(c.TTFT.P90), ms(c.TTFT.P99), ms(c.Queue.P50), ms(c.Queue.P99))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, ClassLegend)
	return err
}
