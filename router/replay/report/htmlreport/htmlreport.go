// Package htmlreport writes `router replay --html`: one self-contained
// HTML page with the comparison table and plots of the replays behind
// it. The plots are SVG drawn in Go by gonum.org/v1/plot and inlined in
// the page; the page loads nothing (no script, font, style sheet or
// image), so it opens offline. docs/replay.md describes each plot.
package htmlreport

import (
	"cmp"
	"errors"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/router/replay/report"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Input is what a report shows.
type Input struct {
	// Title is the page's title and heading; "router replay" when empty.
	Title string
	// Trace is the trace's name, shown under the title.
	Trace string
	// Requests is the number of requests each run replayed.
	Requests int
	// Cells are the table's rows, in table order (report.Cell: one policy
	// on one fleet in one prefix mode, one Report per seed). Plots of
	// state over time and CDFs use each cell's first run; plots against
	// fleet size the median of its runs, with min–max error bars. A run
	// without Timeline or Distributions (replay.Options.Timeline unset)
	// gets a note in place of those plots. At least one cell, each with
	// at least one run.
	Cells []report.Cell
	// Comparison chooses the table's columns (report.TableColumns) and
	// its baseline: with Baseline set, every cell shows its percent
	// change against the baseline policy's cell on the same fleet, so
	// BaselineMetric (the text table's one delta column) is not used.
	Comparison report.Comparison
	// SLO is --slo as given (such as "ttft=500ms,tpot=50ms"), shown with
	// the goodput columns; "" for none.
	SLO string
	// Command is the command line that made the report, shown verbatim;
	// "" to leave it out.
	Command string
}

// ErrNoCells is Write's error for an Input without cells or with a cell
// without runs.
var ErrNoCells = errors.New("htmlreport: no replay to report (a cell without runs, or no cells)")

// sweepMetrics are the metrics plotted against fleet size, when the cells
// have more than one fleet size and the metric has a value.
var sweepMetrics = []string{"ttft_p50", "ttft_p90", "ttft_p99", "tpot_p90", "itl_p99", "kv_hit", "goodput", "output_tok_s"}

// Write writes in's report to w as one HTML page. Its size is bounded by
// the cells: at most MaxWorkerLines lines of report.MaxTimelineSamples
// points per timeline chart, report.DistributionPoints per CDF line,
// whatever the number of workers or requests. The error is ErrNoCells,
// a chart's that could not be drawn, or w's.
func Write(w io.Writer, in Input) error {
	if len(in.Cells) == 0 || slices.ContainsFunc(in.Cells, func(c report.Cell) bool { return len(c.Runs) == 0 }) {
		return ErrNoCells
	}
	p := page{Input: in, Seeds: 1, NoisePP: report.NoisePP, NoiseRelative: report.NoiseRelative}
	if p.Title == "" {
		p.Title = "router replay"
	}
	for _, c := range in.Cells {
		p.Seeds = max(p.Seeds, len(c.Runs))
	}
	p.Table = newTable(in.Cells, in.Comparison)
	p.Verdict = report.GoodputVerdict(in.Cells, in.Comparison.GoodputTarget)
	p.Decision = newDecision(in.Cells)
	p.Failures = report.MigrationLines(in.Cells)
	fleets := fleetsOf(in.Cells)
	var err error
	for _, f := range fleets {
		var s fleetSection
		if s, err = newFleetSection(f, in.Cells, len(fleets) > 1); err != nil {
			return err
		}
		p.Fleets = append(p.Fleets, s)
	}
	if len(fleets) > 1 {
		if p.Sweep, err = sweepFigures(in.Cells, in.Comparison.GoodputTarget); err != nil {
			return err
		}
	}
	return pageTemplate.Execute(w, p)
}

// page is the template's data.
type page struct {
	Input
	Seeds int
	// NoisePP and NoiseRelative are the verdict's noise rule
	// (report.NoisePP, report.NoiseRelative), stated on the page.
	NoisePP, NoiseRelative float64
	Table                  table
	// Verdict is report.GoodputVerdict of the cells ("" without a
	// goodput target).
	Verdict string
	// Decision is the verdict at the top of the page: per fleet, the best
	// row on each headline metric.
	Decision decision
	Fleets   []fleetSection
	Sweep    []figure
	// Failures are report.MigrationLines: the runs' engine failures and
	// migrations (replay --fail, --fail-rate); none without.
	Failures []string
}

// figure is one chart on the page, or a note in its place.
type figure struct {
	SVG  template.HTML
	Note string
	// Collapsed, when set, is why the chart tells nothing (Flatness): the
	// page shows this line, and the chart only when the reader opens it.
	Collapsed string
}

// FlatShare is the rule for an uninformative chart of several lines:
// when the largest gap between any two lines, at any point they share,
// is under FlatShare of the chart's value range (its y range; for a CDF
// the x range in log10, the axis it is drawn on), the lines are equal
// within noise and the page collapses the chart, with a note.
const FlatShare = 0.02

// flatness is the largest gap between two of lines, in the unit of
// their values, and whether they have one: lines are value series over
// shared points (one per quantile of a CDF, or per fleet of a sweep),
// NaN where a line has no point.
func flatness(lines [][]float64) (gap float64, ok bool) {
	for a := range lines {
		for b := a + 1; b < len(lines); b++ {
			for k := range min(len(lines[a]), len(lines[b])) {
				x, y := lines[a][k], lines[b][k]
				if math.IsNaN(x) || math.IsNaN(y) {
					continue
				}
				gap, ok = max(gap, math.Abs(x-y)), true
			}
		}
	}
	return gap, ok
}

// collapseNote is the note of a chart of lines over a value range
// (span) whose largest gap is under FlatShare of it, "" for a chart that
// tells something: fewer than two lines, or a gap at least that.
func collapseNote(lines [][]float64, span float64, what string) string {
	if len(lines) < 2 || span <= 0 {
		return ""
	}
	gap, ok := flatness(lines)
	if !ok || gap >= FlatShare*span {
		return ""
	}
	return fmt.Sprintf("%s: the %d lines lie within %.1f%% of the axis range of each other (under %.0f%%: equal within noise); open to see the chart",
		what, len(lines), 100*gap/span, 100*FlatShare)
}

// fleetsOf is the cells' fleets (report.Cell.Fleet), in first order.
func fleetsOf(cells []report.Cell) []string { return distinct(cells, report.Cell.Fleet) }

// labels is the cells' labels (report.Cell.Label), in first order: a
// label's index is its color in every chart.
func labels(cells []report.Cell) []string { return distinct(cells, report.Cell.Label) }

// distinct is the cells' values of key, each once, in first order.
func distinct(cells []report.Cell, key func(report.Cell) string) []string {
	var out []string
	for _, c := range cells {
		if k := key(c); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// table is the comparison table.
type table struct {
	Fleets  bool // a workers column: the cells have more than one fleet
	Columns []column
	Rows    []row
	Legend  []string
	Delta   string // the baseline's name, when the cells show deltas
}

// column is a column's header: its unit, and "↓" or "↑" when lower or
// higher values are better.
type column struct {
	Header, Unit, Better string
}

// row is a table row; Baseline marks the baseline policy's own rows.
type row struct {
	Label, Fleet string
	Baseline     bool
	Cells        []tableCell
}

// decision is the page's verdict: per fleet, a block of the headline
// metrics as rows (report.Bests), the blocks in a grid that wraps, so
// the verdict reads at a 900 px window without a sideways scroll; and a
// sentence over it.
type decision struct {
	Summary string
	Metrics []column
	Fleets  []decisionRow
}

type decisionRow struct {
	Fleet string
	Cells []decisionCell // one per Metrics; Label "" where the fleet has no verdict
}

// decisionCell is one fleet's verdict on one metric: the metric's
// header and "↓" or "↑" (its column of Metrics), then the verdict.
type decisionCell struct {
	Header, Better              string
	Label, Value, Margin, Seeds string
	Tie, Split                  bool
}

// newDecision is the verdict of cells on report.HeadlineMetrics; empty
// (no Fleets) when no fleet has two rows to compare.
func newDecision(cells []report.Cell) decision {
	var metrics []report.Metric
	for _, name := range report.HeadlineMetrics {
		m, _ := report.MetricByName(name)
		metrics = append(metrics, m)
	}
	bests := report.Bests(cells, metrics)
	if len(bests) == 0 {
		return decision{}
	}
	var d decision
	var shown []report.Metric
	for _, m := range metrics {
		if slices.ContainsFunc(bests, func(b report.Best) bool { return b.Metric.Name == m.Name }) {
			shown = append(shown, m)
			col := column{Header: m.Header, Unit: shownUnit(m), Better: "↑"}
			if m.Lower {
				col.Better = "↓"
			}
			d.Metrics = append(d.Metrics, col)
		}
	}
	wins := map[string]int{}
	var order []string
	decided, ties := 0, 0
	for _, f := range fleetsOf(cells) {
		r := decisionRow{Fleet: fleetName(f)}
		for k, m := range shown {
			i := slices.IndexFunc(bests, func(b report.Best) bool { return b.Fleet == f && b.Metric.Name == m.Name })
			if i < 0 {
				r.Cells = append(r.Cells, decisionCell{Header: d.Metrics[k].Header, Better: d.Metrics[k].Better})
				continue
			}
			b := bests[i]
			c := decisionCell{Header: d.Metrics[k].Header, Better: d.Metrics[k].Better,
				Label: b.Label, Value: withUnit(m, b.Value), Margin: b.MarginText(), Tie: b.Tie}
			if b.Seeds > 1 {
				c.Seeds = fmt.Sprintf("%d of %d seeds agree", b.SeedsAgree, b.Seeds)
				c.Split = b.SeedsAgree < b.Seeds
			}
			if b.Tie {
				c.Label = b.Label + " ≈ " + b.RunnerUp
				ties++
			} else {
				decided++
				if wins[b.Label] == 0 {
					order = append(order, b.Label)
				}
				wins[b.Label]++
			}
			r.Cells = append(r.Cells, c)
		}
		d.Fleets = append(d.Fleets, r)
	}
	switch {
	case decided == 0:
		d.Summary = "No policy is ahead beyond the noise on any headline metric."
	case len(order) == 1:
		d.Summary = fmt.Sprintf("%s is best on every headline metric that differs (%d of %d verdicts; %d within noise).",
			order[0], decided, decided+ties, ties)
	default:
		slices.SortStableFunc(order, func(a, b string) int { return wins[b] - wins[a] })
		parts := make([]string, len(order))
		for i, l := range order {
			parts[i] = fmt.Sprintf("%s %d", l, wins[l])
		}
		d.Summary = fmt.Sprintf("Verdicts won: %s (of %d; %d within noise).", strings.Join(parts, ", "), decided+ties, ties)
	}
	return d
}

// withUnit is v in m's format with m's unit ("951 ms", "15.1%").
func withUnit(m report.Metric, v float64) string {
	s := m.Format(v)
	if m.Unit != "" && m.Unit != "%" {
		s += " " + m.Unit
	}
	return s
}

// tableCell is one cell: the median (report.Cell.Text before its
// range), the runs' range ("least–greatest", "" when they agree), and the
// change against the baseline ("" for none, and on the baseline's own
// row).
type tableCell struct {
	Value, Range, Delta string
	// Better is true, and Worse, when the delta is an improvement or a
	// regression for a metric with a direction.
	Better, Worse bool
	// Best marks the best value of its fleet in the column
	// (report.BestMarks).
	Best bool
}

func newTable(cells []report.Cell, cmp report.Comparison) table {
	cols := report.TableColumns(cells, cmp)
	t := table{Fleets: len(fleetsOf(cells)) > 1, Delta: cmp.Baseline}
	said := map[string]bool{}
	for _, m := range cols {
		col := column{Header: m.Header, Unit: shownUnit(m)}
		switch {
		case m.Lower:
			col.Better = "↓"
		case directed(m):
			col.Better = "↑"
		}
		t.Columns = append(t.Columns, col)
		if m.Legend != "" && !said[m.Legend] {
			said[m.Legend] = true
			t.Legend = append(t.Legend, m.Legend)
		}
	}
	marks := make([][]bool, len(cols))
	for j, m := range cols {
		marks[j] = report.BestMarks(cells, m)
	}
	for i, c := range cells {
		r := row{Label: c.Label(), Fleet: c.Fleet(), Baseline: cmp.Baseline != "" && c.Runs[0].Policy == cmp.Baseline}
		for j, m := range cols {
			text := c.Text(m)
			value, rng, _ := strings.Cut(text, " [")
			tc := tableCell{Value: value, Range: strings.TrimSuffix(rng, "]"), Best: marks[j][i]}
			if cmp.Baseline != "" {
				tc.Delta, tc.Better, tc.Worse = delta(cells, c, cmp.Baseline, m)
			}
			r.Cells = append(r.Cells, tc)
		}
		t.Rows = append(t.Rows, r)
	}
	return t
}

// delta is c's change in m against the baseline's cell on its fleet
// (report.Change): "+3.1 pp" for a share, "-42.0%" for any other, "" on
// the baseline's own row, without one, and where the row shows the same
// value as the baseline (so no "+0.0%" under the trace's own request
// count); and whether it is better or
// worse, for metrics lower is better of (report.Metric's Lower) and
// those higher is better of (Higher).
func delta(cells []report.Cell, c report.Cell, baseline string, m report.Metric) (text string, better, worse bool) {
	base, ok := report.BaselineOf(cells, c, baseline)
	switch {
	case !ok, base.Runs[0] == c.Runs[0]:
		return "", false, false
	}
	d, text, ok := report.Change(c, base, m)
	if !ok || c.Text(m) == base.Text(m) {
		return "", false, false
	}
	if text == "+0.0%" || text == "-0.0%" || text == "+0.0 pp" || text == "-0.0 pp" || !directed(m) {
		return text, false, false
	}
	if m.Lower {
		return text, d < 0, d > 0
	}
	return text, d > 0, d < 0
}

// directed is true for the metrics one direction of is better.
func directed(m report.Metric) bool { return m.Higher() || m.Lower }

// fleetSection is one fleet's plots: the CDFs of its cells, then each
// cell's state over time.
type fleetSection struct {
	Fleet, Heading string
	CDFs           []figure
	Cells          []cellFigures
}

type cellFigures struct {
	Label   string
	Figures []figure
}

func fleetName(f string) string {
	if strings.Contains(f, "P+") {
		return f + " workers (prefill + decode)"
	}
	if f == "1" {
		return "1 worker"
	}
	return f + " workers"
}

func newFleetSection(f string, cells []report.Cell, sweep bool) (fleetSection, error) {
	s := fleetSection{Fleet: f, Heading: fleetName(f)}
	on := slices.DeleteFunc(slices.Clone(cells), func(c report.Cell) bool { return c.Fleet() != f })
	if mix := on[0].Runs[0].SpeedMix(); mix != "" {
		s.Heading += " (" + mix + ")" // a mixed fleet: its hardware classes
	}
	names := labels(cells)
	suffix := ""
	if sweep {
		suffix = ", " + fleetName(f)
	}
	for _, which := range []string{"TTFT", "E2E"} {
		ch := chart{title: which + " CDF" + suffix, xLabel: which + " (ms, log scale)", yLabel: "requests at or below (%)",
			logX: true, xMax: math.NaN(), yMax: 100}
		var missing []string
		for _, c := range on {
			d := c.Runs[0].Distributions
			if d == nil || len(d.TTFT) == 0 {
				missing = append(missing, c.Label())
				continue
			}
			q := d.TTFT
			if which == "E2E" {
				q = d.E2E
			}
			xys := cdf(q)
			if len(xys) == 0 { // every value 0: nothing on a log axis
				missing = append(missing, c.Label())
				continue
			}
			col, dash := colorOf(slices.Index(names, c.Label()))
			ch.series = append(ch.series, series{name: c.Label(), xys: xys, color: col, dashes: dash})
		}
		fig, err := figureOf(ch, len(ch.series) > 0, "no "+which+" distribution: no completed request (or none above 0 ms), or replayed without timelines")
		if err != nil {
			return s, err
		}
		fig.Collapsed = collapseNote(logQuantiles(on, which), logSpan(on, which), ch.title)
		if len(missing) > 0 && len(ch.series) > 0 {
			fig.Note = "left out (no distribution, or none above 0 ms): " + strings.Join(missing, ", ")
		}
		s.CDFs = append(s.CDFs, fig)
	}
	// One scale for the fleet's cells, so their charts compare at a glance.
	xMax, inFlightMax, queueMax := 0.0, 0.0, 0.0
	for _, c := range on {
		if tl := c.Runs[0].Timeline; tl != nil {
			xMax = max(xMax, float64(len(tl.RouterQueue))*tl.IntervalS)
			for k := range tl.RouterQueue {
				queueMax = max(queueMax, float64(tl.RouterQueue[k]), float64(tl.EngineQueue[k]))
				inFlightMax = max(inFlightMax, float64(slices.Max(tl.InFlight[k])))
			}
		}
	}
	for _, c := range on {
		cf := cellFigures{Label: c.Label()}
		tl := c.Runs[0].Timeline
		if tl == nil || len(tl.RouterQueue) == 0 {
			cf.Figures = []figure{{Note: "no timeline: replayed without timelines, or nothing arrived"}}
			s.Cells = append(s.Cells, cf)
			continue
		}
		title := c.Label() + suffix + ": "
		hit, ref := kvSeries(tl)
		col, dash := colorOf(slices.Index(names, c.Label()))
		charts := []chart{
			{title: title + "requests in flight", xLabel: "simulated time (s)", yLabel: "requests on the worker",
				xMax: xMax, yMax: inFlightMax, series: inFlightSeries(tl)},
			queueChart(title+"queue depth", tl, xMax, queueMax),
			{title: title + "KV hit over time", xLabel: "simulated time (s)", yLabel: "prompt tokens from cache (%)",
				xMax: xMax, yMax: 100, series: []series{
					{name: "KV hit", xys: hit, color: col, dashes: dash},
					{name: "KV reference", xys: ref, color: color.Black, dashes: []vg.Length{vg.Points(4), vg.Points(2)}},
				}},
		}
		for _, ch := range charts {
			fig, err := figureOf(ch, true, "")
			if err != nil {
				return s, err
			}
			cf.Figures = append(cf.Figures, fig)
		}
		s.Cells = append(s.Cells, cf)
	}
	return s, nil
}

// logQuantiles is each cell's distribution of which ("TTFT" or "E2E") in
// log10 ms, NaN where a quantile is 0 or less (off the log axis); cells
// without one are left out.
func logQuantiles(cells []report.Cell, which string) [][]float64 {
	var out [][]float64
	for _, c := range cells {
		d := c.Runs[0].Distributions
		if d == nil || len(d.TTFT) == 0 {
			continue
		}
		q := d.TTFT
		if which == "E2E" {
			q = d.E2E
		}
		l := make([]float64, len(q))
		for k, v := range q {
			l[k] = math.NaN()
			if v > 0 {
				l[k] = math.Log10(v)
			}
		}
		out = append(out, l)
	}
	return out
}

// logSpan is the x range of the cells' CDFs of which, in log10 ms.
func logSpan(cells []report.Cell, which string) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, l := range logQuantiles(cells, which) {
		for _, v := range l {
			if !math.IsNaN(v) {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if hi < lo {
		return 0
	}
	return hi - lo
}

// figureOf is ch's figure, or a note when ok is false.
func figureOf(ch chart, ok bool, note string) (figure, error) {
	if !ok {
		return figure{Note: note}, nil
	}
	svg, err := ch.svg()
	if err != nil {
		return figure{}, fmt.Errorf("htmlreport: drawing %q: %w", ch.title, err)
	}
	// gonum's SVG escapes its text (html.EscapeString).
	return figure{SVG: template.HTML(svg), Note: ch.note}, nil
}

// seriesNames names the sweep line each cell is a point of: its label
// without its fleet's pool sizes in disaggregated mode (pd(2P+4D) is a
// point of pd, kv(2P:default+4D:default) of kv(P:default+D:default)). When
// both pools vary, fleets of one total would share an x, so the prefill
// size stays in the name (pd(2P+D)): one line per prefill pool over the
// decode sizes.
func seriesNames(cells []report.Cell) []string {
	prefill := map[int]bool{}
	decode := map[int]bool{}
	for _, c := range cells {
		prefill[c.Runs[0].PrefillWorkers], decode[c.Runs[0].DecodeWorkers] = true, true
	}
	out := make([]string, len(cells))
	for i, c := range cells {
		r, name := c.Runs[0], c.Label()
		if r.PrefillWorkers > 0 || r.DecodeWorkers > 0 {
			if len(prefill) == 1 || len(decode) == 1 {
				name = strings.Replace(name, "("+strconv.Itoa(r.PrefillWorkers)+"P", "(P", 1)
			}
			name = strings.Replace(name, "+"+strconv.Itoa(r.DecodeWorkers)+"D", "+D", 1)
			name = strings.Replace(name, "(P+D)", "", 1)
		}
		out[i] = name
	}
	return out
}

// sweepFigures plots each of sweepMetrics that a cell has against fleet
// size (report.Report.Workers, prefill and decode workers together), one
// line per policy (seriesNames), at the median of the cell's runs with
// min–max error bars when it has several.
func sweepFigures(cells []report.Cell, goodputTarget float64) ([]figure, error) {
	lineOf := seriesNames(cells)
	var names []string
	for _, n := range lineOf {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	disagg := slices.ContainsFunc(cells, func(c report.Cell) bool { return strings.Contains(c.Fleet(), "P+") })
	xLabel := "workers"
	if disagg {
		xLabel = "workers (prefill + decode)"
	}
	var ticks []plot.Tick
	for _, c := range cells {
		x := float64(c.Runs[0].Workers)
		switch i := slices.IndexFunc(ticks, func(t plot.Tick) bool { return t.Value == x }); {
		case i < 0:
			ticks = append(ticks, plot.Tick{Value: x, Label: c.Fleet()})
		case ticks[i].Label != c.Fleet():
			ticks[i].Label = strconv.Itoa(c.Runs[0].Workers) // two fleets of one total
		}
	}
	var out []figure
	for _, name := range sweepMetrics {
		m, _ := report.MetricByName(name)
		ch := chart{title: m.Header + " against fleet size", xLabel: xLabel, yLabel: axisLabel(m), xMax: math.NaN(), xTicks: ticks}
		top := 0.0
		for i, label := range names {
			type point struct {
				workers float64
				st      report.Stat
			}
			var ps []point
			for j, c := range cells {
				if st, ok := c.Stat(m); ok && lineOf[j] == label {
					ps = append(ps, point{float64(c.Runs[0].Workers), st})
				}
			}
			if len(ps) == 0 {
				continue
			}
			slices.SortStableFunc(ps, func(a, b point) int { return cmp.Compare(a.workers, b.workers) })
			col, dash := colorOf(i)
			s := series{name: label, color: col, dashes: dash, points: true}
			spread := false
			for _, p := range ps {
				s.xys = append(s.xys, plotter.XY{X: p.workers, Y: p.st.Median})
				s.errs = append(s.errs, struct{ Low, High float64 }{p.st.Median - p.st.Min, p.st.Max - p.st.Median})
				spread = spread || p.st.Min != p.st.Max
				top = max(top, p.st.Max)
			}
			if !spread {
				s.errs = nil
			}
			ch.series = append(ch.series, s)
		}
		if len(ch.series) == 0 {
			continue
		}
		if name == "goodput" && goodputTarget > 0 && len(ticks) > 0 {
			// The --goodput-target line across the fleets, grey and
			// dashed: a policy meets it where its line is above.
			lo, hi := ticks[0].Value, ticks[0].Value
			for _, t := range ticks {
				lo, hi = min(lo, t.Value), max(hi, t.Value)
			}
			ch.series = append(ch.series, series{name: fmt.Sprintf("target %.1f%%", goodputTarget),
				xys: plotter.XYs{{X: lo, Y: goodputTarget}, {X: hi, Y: goodputTarget}}, color: color.Gray{Y: 0x80},
				dashes: []vg.Length{vg.Points(4), vg.Points(3)}})
			top = max(top, goodputTarget)
		}
		ch.yMax = top * 1.08 // room between the highest bar and the title
		fig, err := figureOf(ch, true, "")
		if err != nil {
			return nil, err
		}
		fig.Collapsed = collapseNote(sweepLines(ch.series, ticks), ch.yMax, ch.title)
		out = append(out, fig)
	}
	return out, nil
}

// sweepLines is each policy's line of a sweep chart (not the target's)
// as values at the ticks' fleet sizes, NaN where it has no point.
func sweepLines(ss []series, ticks []plot.Tick) [][]float64 {
	var out [][]float64
	for _, s := range ss {
		if !s.points {
			continue // the goodput target's line
		}
		l := make([]float64, len(ticks))
		for k, t := range ticks {
			l[k] = math.NaN()
			for _, p := range s.xys {
				if p.X == t.Value {
					l[k] = p.Y
				}
			}
		}
		out = append(out, l)
	}
	return out
}

// shownUnit is m's unit for a header or an axis, "" when m's header
// already ends with it ("out tok/s", not "out tok/s tok/s").
func shownUnit(m report.Metric) string {
	if strings.HasSuffix(m.Header, m.Unit) {
		return ""
	}
	return m.Unit
}

func axisLabel(m report.Metric) string {
	if shownUnit(m) == "" {
		return m.Header
	}
	return m.Header + " (" + m.Unit + ")"
}
