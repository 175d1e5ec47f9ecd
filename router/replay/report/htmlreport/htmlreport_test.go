package htmlreport

import (
	"bytes"
	"errors"
	"fmt"
	"html"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay/report"
	"gonum.org/v1/plot/plotter"
)

// The table has the text table's columns, each cell the text table's
// (the median, then the runs' range), and under it the percent change
// against the baseline's cell on the same fleet, marked better or worse
// by the metric's direction; the page holds every value.
func TestTableMatchesTheTextTable(t *testing.T) {
	cells := mustCells(t)
	cmp := report.Comparison{Baseline: "power-of-two"}
	tab := newTable(cells, cmp)
	cols := report.TableColumns(cells, cmp)
	if len(tab.Columns) != len(cols) || !tab.Fleets || tab.Delta != "power-of-two" {
		t.Fatalf("%d columns (fleets %v, delta %q), want %d, a workers column and the baseline", len(tab.Columns), tab.Fleets, tab.Delta, len(cols))
	}
	var page bytes.Buffer
	if err := Write(&page, Input{Cells: cells, Comparison: cmp}); err != nil {
		t.Fatal(err)
	}
	ranges, deltas, sameCount := 0, 0, 0
	for i, c := range cells {
		r := tab.Rows[i]
		if r.Label != c.Label() || r.Fleet != c.Fleet() || r.Baseline != (c.Runs[0].Policy == "power-of-two") {
			t.Fatalf("row %d: %q on %q (baseline %v), want %q on %q", i, r.Label, r.Fleet, r.Baseline, c.Label(), c.Fleet())
		}
		base, ok := report.BaselineOf(cells, c, "power-of-two")
		if !ok {
			t.Fatalf("row %d: no baseline", i)
		}
		for j, m := range cols {
			unit := m.Unit
			if strings.HasSuffix(m.Header, m.Unit) {
				unit = "" // "out tok/s", not "out tok/s tok/s"
			}
			if tab.Columns[j].Header != m.Header || tab.Columns[j].Unit != unit {
				t.Fatalf("column %d: %+v, want %s in %q", j, tab.Columns[j], m.Header, unit)
			}
			if m.Name == "output_tok_s" && unit != "" {
				t.Errorf("out tok/s: unit %q under a header that has it", unit)
			}
			got := r.Cells[j]
			text := got.Value
			if got.Range != "" {
				text += " [" + got.Range + "]"
				ranges++
			}
			if want := c.Text(m); text != want {
				t.Errorf("%s/%s %s: %q, want the text table's %q", c.Label(), c.Fleet(), m.Name, text, want)
			}
			if !strings.Contains(page.String(), ">"+html.EscapeString(got.Value)+"<") {
				t.Errorf("%s/%s %s: the page has no cell %q", c.Label(), c.Fleet(), m.Name, got.Value)
			}
			d, want, ok := report.Change(c, base, m)
			switch {
			case r.Baseline:
				if got.Delta != "" {
					t.Errorf("baseline row %s %s: delta %q, want none", c.Fleet(), m.Name, got.Delta)
				}
				continue
			case !ok:
				if got.Delta != "" {
					t.Errorf("%s/%s %s: delta %q without a baseline value", c.Label(), c.Fleet(), m.Name, got.Delta)
				}
				continue
			case c.Text(m) == base.Text(m):
				// The same value as the baseline's, such as the trace's
				// own request count: no "+0.0%".
				if got.Delta != "" {
					t.Errorf("%s/%s %s: delta %q where the row shows the baseline's %q", c.Label(), c.Fleet(), m.Name, got.Delta, c.Text(m))
				}
				if m.Name == "requests" {
					sameCount++
				}
				continue
			}
			deltas++
			if m.Ratio() != strings.HasSuffix(want, " pp") {
				t.Errorf("%s: delta %q; want percentage points for a share, percent for another figure", m.Name, want)
			}
			if got.Delta != want {
				t.Errorf("%s/%s %s: delta %q, want %q", c.Label(), c.Fleet(), m.Name, got.Delta, want)
			}
			if m.Name == "ttft_p90" && (got.Better != (d < -0.05) || got.Worse != (d > 0.05)) {
				t.Errorf("%s/%s TTFT p90 %+.2f%%: better %v worse %v; lower is better", c.Label(), c.Fleet(), d, got.Better, got.Worse)
			}
			if m.Name == "kv_hit" && (got.Better != (d > 0.05) || got.Worse != (d < -0.05)) {
				t.Errorf("%s/%s KV hit %+.2f%%: better %v worse %v; higher is better", c.Label(), c.Fleet(), d, got.Better, got.Worse)
			}
		}
	}
	// Two seeds of power-of-two differ; the default policy's deltas exist.
	if ranges == 0 || deltas == 0 || sameCount == 0 {
		t.Errorf("%d cells with a range, %d with a delta, %d request counts equal to the baseline's; want some of each", ranges, deltas, sameCount)
	}
}

// KV hit over time is the ratio of the token sums, per window of
// samples (one sample per window up to kvBins samples), at the window's
// middle, leaving out windows without prompt tokens; the reference's
// likewise.
func TestKVSeriesIsTheRatioOfTokenSums(t *testing.T) {
	tl := &report.Timeline{IntervalS: 0.5,
		PromptTokens: []int64{100, 0, 300, 50}, CachedTokens: []int64{25, 0, 300, 0},
		ReferencePromptTokens: []int64{0, 200, 300, 50}, ReferenceHitTokens: []int64{0, 100, 150, 50}}
	hit, ref := kvSeries(tl)
	if want := (plotter.XYs{{X: 0.25, Y: 25}, {X: 1.25, Y: 100}, {X: 1.75, Y: 0}}); !equalXYs(hit, want) {
		t.Errorf("hit %v, want %v", hit, want)
	}
	if want := (plotter.XYs{{X: 0.75, Y: 50}, {X: 1.25, Y: 50}, {X: 1.75, Y: 100}}); !equalXYs(ref, want) {
		t.Errorf("reference %v, want %v", ref, want)
	}

	// 130 samples: windows of 3 (the last of one), at most kvBins.
	n := 130
	tl = &report.Timeline{IntervalS: 1, PromptTokens: make([]int64, n), CachedTokens: make([]int64, n),
		ReferencePromptTokens: make([]int64, n), ReferenceHitTokens: make([]int64, n)}
	for k := range n {
		tl.PromptTokens[k], tl.CachedTokens[k] = int64(10*k+10), int64(k)
	}
	hit, ref = kvSeries(tl)
	if len(hit) != 44 || len(ref) != 0 {
		t.Fatalf("%d hit points, %d reference points; want 44 windows of 3 samples and none", len(hit), len(ref))
	}
	// Window 1 is samples 3..5: cached 3+4+5, prompt 40+50+60.
	if want := (plotter.XY{X: 4.5, Y: 100 * 12.0 / 150}); hit[1] != want {
		t.Errorf("window 1: %v, want %v", hit[1], want)
	}
	if want := (plotter.XY{X: 129.5, Y: 100 * 129.0 / 1300}); hit[43] != want {
		t.Errorf("last window: %v, want %v", hit[43], want)
	}
}

// Up to MaxWorkerLines workers the in-flight chart has a line per
// worker; over it, the min–max band, the p10–p90 band and the median
// worker's line.
func TestInFlightBandOverSixteenWorkers(t *testing.T) {
	timeline := func(workers int) *report.Timeline {
		tl := &report.Timeline{IntervalS: 2}
		for k := range 3 {
			row := make([]int32, workers)
			for w := range row {
				row[w] = int32(w * (k + 1))
			}
			tl.InFlight = append(tl.InFlight, row)
		}
		return tl
	}
	lines := inFlightSeries(timeline(MaxWorkerLines))
	if len(lines) != MaxWorkerLines {
		t.Fatalf("%d series for %d workers, want a line each", len(lines), MaxWorkerLines)
	}
	if want := (plotter.XYs{{X: 2, Y: 1}, {X: 4, Y: 2}, {X: 6, Y: 3}}); lines[1].name != "worker 1" || !equalXYs(lines[1].xys, want) {
		t.Errorf("worker 1: %q %v, want %v", lines[1].name, lines[1].xys, want)
	}
	for _, tt := range []struct {
		workers  int
		p10, p90 int // ranks of the nearest-rank quantiles, from 0: ⌈p·n⌉ − 1
	}{
		{MaxWorkerLines + 1, 0, 2}, {16, 1, 14}, {20, 1, 17}, {4096, 409, 3686},
	} {
		ss := inFlightSeries(timeline(tt.workers))
		if len(ss) != 3 || ss[0].lo == nil || ss[1].lo == nil || ss[2].xys == nil {
			t.Fatalf("%d workers: %d series, want two bands and the median", tt.workers, len(ss))
		}
		// Sample k holds w·(k+1) for w in 0..workers−1: least 0, most
		// (workers−1)(k+1), median (workers−1)(k+1)/2, the worker of rank
		// r r·(k+1).
		for k := range 3 {
			f := float64(k + 1)
			top := float64(tt.workers-1) * f
			if ss[0].lo[k].Y != 0 || ss[0].hi[k].Y != top || ss[2].xys[k].Y != top/2 {
				t.Errorf("%d workers, sample %d: band %v–%v, median %v; want 0–%v, %v", tt.workers, k, ss[0].lo[k].Y, ss[0].hi[k].Y, ss[2].xys[k].Y, top, top/2)
			}
			if ss[1].lo[k].Y != float64(tt.p10)*f || ss[1].hi[k].Y != float64(tt.p90)*f {
				t.Errorf("%d workers, sample %d: p10–p90 %v–%v, want %v–%v", tt.workers, k, ss[1].lo[k].Y, ss[1].hi[k].Y, float64(tt.p10)*f, float64(tt.p90)*f)
			}
		}
	}
}

// simplify drops only points in the middle of a flat run, so the line
// through what is left passes through every point it dropped.
func TestSimplifyKeepsTheLine(t *testing.T) {
	in := plotter.XYs{{X: 0, Y: 1}, {X: 1, Y: 1}, {X: 2, Y: 1}, {X: 3, Y: 2}, {X: 4, Y: 2}, {X: 5, Y: 2}, {X: 6, Y: 2}, {X: 7, Y: 0}}
	want := plotter.XYs{{X: 0, Y: 1}, {X: 2, Y: 1}, {X: 3, Y: 2}, {X: 6, Y: 2}, {X: 7, Y: 0}}
	if got := simplify(in); !equalXYs(got, want) {
		t.Errorf("simplify: %v, want %v", got, want)
	}
	flat := plotter.XYs{{X: 0, Y: 3}, {X: 1, Y: 3}, {X: 2, Y: 3}}
	if got := simplify(flat); !equalXYs(got, plotter.XYs{{X: 0, Y: 3}, {X: 2, Y: 3}}) {
		t.Errorf("a flat line: %v, want its ends", got)
	}
}

// Runs without timelines or distributions get notes in place of those
// charts; no cells is an error.
func TestWriteWithoutTimelines(t *testing.T) {
	cells := mustCells(t)
	bare := make([]report.Cell, 2)
	for i := range bare {
		r := *cells[i].Runs[0]
		r.Timeline, r.Distributions = nil, nil
		bare[i] = report.Cell{Runs: []*report.Report{&r}}
	}
	var page bytes.Buffer
	if err := Write(&page, Input{Trace: "t", Requests: 1, Cells: bare}); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	if n := strings.Count(s, "<svg"); n != 0 {
		t.Errorf("%d charts without timelines and distributions (one fleet, no sweep), want none", n)
	}
	if n := strings.Count(s, "no timeline: replayed without timelines"); n != 2 {
		t.Errorf("%d timeline notes, want one per cell (2)", n)
	}
	if n := strings.Count(s, "distribution: no completed request (or none above 0 ms), or replayed without timelines"); n != 2 {
		t.Errorf("%d distribution notes, want 2 (TTFT, E2E)", n)
	}
	// Degenerate distributions: one value, and only zeros (nothing on a
	// log axis).
	one := syntheticReport("one", 2, 1)
	for i := range one.Distributions.TTFT {
		one.Distributions.TTFT[i], one.Distributions.E2E[i] = 5, 0
	}
	page.Reset()
	if err := Write(&page, Input{Cells: []report.Cell{{Runs: []*report.Report{one}}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "TTFT CDF") || !strings.Contains(page.String(), "no E2E distribution") {
		t.Error("one TTFT value: want its CDF; E2E of zeros: want a note")
	}
	if err := Write(&page, Input{}); !errors.Is(err, ErrNoCells) {
		t.Errorf("no cells: %v, want ErrNoCells", err)
	}
	if err := Write(&page, Input{Cells: []report.Cell{{}}}); !errors.Is(err, ErrNoCells) {
		t.Errorf("a cell without runs: %v, want ErrNoCells", err)
	}
}

// The page of a 6-policy × 3-fleet sweep of 3 seeds each stays under
// 2 MB at the timelines' bound (report.MaxTimelineSamples samples whose
// every worker changes every sample, so nothing simplifies), and a fleet
// of 1,000 workers adds no more than one of 17.
func TestPageSizeIsBounded(t *testing.T) {
	size := func(fleets []int) int {
		var cells []report.Cell
		for _, workers := range fleets {
			for p := range 6 {
				var c report.Cell
				for seed := range 3 {
					c.Runs = append(c.Runs, syntheticReport(fmt.Sprintf("policy-%d", p), workers, uint64(seed)))
				}
				cells = append(cells, c)
			}
		}
		var page bytes.Buffer
		if err := Write(&page, Input{Cells: cells, Comparison: report.Comparison{Baseline: "policy-0"}, SLO: "ttft=1s"}); err != nil {
			t.Fatal(err)
		}
		return page.Len()
	}
	sweep := size([]int{4, 8, 16})
	t.Logf("6 policies × 4, 8, 16 workers × 3 seeds: %d bytes", sweep)
	if sweep > 2<<20 {
		t.Errorf("the sweep's page is %d bytes, want under 2 MB", sweep)
	}
	small, large := size([]int{4, 8, 17}), size([]int{4, 8, 1000})
	t.Logf("with 17 workers: %d bytes; with 1,000: %d", small, large)
	if large > small*11/10 {
		t.Errorf("1,000 workers: %d bytes, 17: %d; want about the same (the band)", large, small)
	}
}

// syntheticReport is a report with a full timeline of noisy counts and
// full distributions, for the size bound.
func syntheticReport(policy string, workers int, seed uint64) *report.Report {
	rng := rand.New(rand.NewPCG(seed, uint64(workers)))
	r := &report.Report{Policy: policy, Workers: workers, Requests: 1000, Completed: 1000, Prefix: "approximate",
		TTFT: report.Summary{P50: 100 + rng.Float64(), P90: 300, P99: 900}, Goodput: &report.Goodput{Share: 0.9, PerS: 3},
		KVHitRatio: 0.3, OutputTokensPerS: 900 + 10*rng.Float64()}
	tl := &report.Timeline{IntervalS: 0.4}
	for k := range report.MaxTimelineSamples {
		row := make([]int32, workers)
		for w := range row {
			row[w] = int32((k + w) % 7)
		}
		tl.InFlight = append(tl.InFlight, row)
		tl.RouterQueue = append(tl.RouterQueue, int32(k%5))
		tl.EngineQueue = append(tl.EngineQueue, int32(k%9))
		tl.PromptTokens = append(tl.PromptTokens, 1000)
		tl.CachedTokens = append(tl.CachedTokens, int64(rng.IntN(1000)))
		tl.ReferencePromptTokens = append(tl.ReferencePromptTokens, 1000)
		tl.ReferenceHitTokens = append(tl.ReferenceHitTokens, int64(rng.IntN(1000)))
	}
	r.Timeline = tl
	d := &report.Distributions{}
	for k := range report.DistributionPoints + 1 {
		d.TTFT = append(d.TTFT, 10+float64(k*k)+rng.Float64())
		d.E2E = append(d.E2E, 100+float64(k*k*3)+rng.Float64())
	}
	r.Distributions = d
	return r
}

func equalXYs(a, b plotter.XYs) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A disaggregated sweep plots one line per policy against fleet size, not
// one lone point per (policy, pool sizes) row: the row labels carry the
// pool sizes (pd(2P+2D)), the lines do not. When both pools vary, two
// fleets can have the same total, so each prefill pool size gets a line
// of its own over the decode sizes.
func TestDisaggregatedSweepLines(t *testing.T) {
	cell := func(policy string, p, d int, defaults bool) report.Cell {
		r := syntheticReport(policy, p+d, uint64(p*10+d))
		r.PrefillWorkers, r.DecodeWorkers = p, d
		r.RolePolicies = map[string]string{"prefill": "pd", "decode": "pd"}
		if defaults {
			r.RolePolicies = map[string]string{"prefill": "default", "decode": "default"}
		}
		return report.Cell{Runs: []*report.Report{r}}
	}
	decodeSweep := []report.Cell{cell("pd", 2, 2, false), cell("rr", 2, 2, true), cell("pd", 2, 4, false), cell("rr", 2, 4, true)}
	if got, want := seriesNames(decodeSweep), []string{"pd", "rr(P:default+D:default)", "pd", "rr(P:default+D:default)"}; !slices.Equal(got, want) {
		t.Errorf("decode sweep: series %q, want %q", got, want)
	}
	crossed := []report.Cell{cell("pd", 2, 2, false), cell("pd", 2, 4, false), cell("pd", 4, 2, false), cell("pd", 4, 4, false)}
	if got, want := seriesNames(crossed), []string{"pd(2P+D)", "pd(2P+D)", "pd(4P+D)", "pd(4P+D)"}; !slices.Equal(got, want) {
		t.Errorf("crossed sweep: series %q, want %q", got, want)
	}
	figs, err := sweepFigures(decodeSweep, 0)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(figs[0].SVG)
	for _, s := range []string{">pd<", ">rr(P:default+D:default)<"} {
		if n := strings.Count(svg, s); n != 1 {
			t.Errorf("%d legend entries %s in the first sweep chart, want 1", n, s)
		}
	}
	if strings.Contains(svg, "2P+2D)<") {
		t.Error("a legend entry names one fleet's pool sizes")
	}
}

// With a goodput target the page states the verdict under the table, as
// the text table's last line does.
func TestVerdictUnderTheTable(t *testing.T) {
	a, b := syntheticReport("rr", 4, 1), syntheticReport("kv", 4, 2)
	a.Goodput, b.Goodput = &report.Goodput{Share: 0.9}, &report.Goodput{Share: 0.97}
	cells := []report.Cell{{Runs: []*report.Report{a}}, {Runs: []*report.Report{b}}}
	var page bytes.Buffer
	if err := Write(&page, Input{Cells: cells, SLO: "ttft=1s", Comparison: report.Comparison{GoodputTarget: 95}}); err != nil {
		t.Fatal(err)
	}
	want := `<p class="verdict"><strong>smallest fleet with goodput &gt;= 95.0%: rr on none (best 90.0%); kv from 4 workers (97.0%)</strong></p>`
	if !strings.Contains(page.String(), want) {
		t.Errorf("the page lacks the verdict %s", want)
	}
	page.Reset()
	if err := Write(&page, Input{Cells: cells}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page.String(), `class="verdict"`) {
		t.Error("a verdict without a goodput target")
	}
}

// On a sweep with a goodput target, the goodput chart draws the target
// as a line of its own, in its legend.
func TestGoodputTargetLine(t *testing.T) {
	var cells []report.Cell
	for _, w := range []int{2, 4} {
		r := syntheticReport("kv", w, uint64(w))
		r.Goodput = &report.Goodput{Share: float64(w) / 5}
		cells = append(cells, report.Cell{Runs: []*report.Report{r}})
	}
	figs, err := sweepFigures(cells, 70)
	if err != nil {
		t.Fatal(err)
	}
	with := 0
	for _, f := range figs {
		if strings.Contains(string(f.SVG), "target 70.0%") {
			with++
		}
	}
	if with != 1 {
		t.Errorf("%d sweep charts show the target, want the goodput chart alone", with)
	}
	if figs, _ = sweepFigures(cells, 0); slices.ContainsFunc(figs, func(f figure) bool { return strings.Contains(string(f.SVG), "target ") }) {
		t.Error("a target line without a target")
	}
}

// The page opens with the verdict, before the table: per fleet, the best
// row on each headline metric with its margin and the seeds that agree
// (report.Bests), the goodput target's line, and a sentence over them;
// the table marks each column's best cells in bold with a star.
func TestPageOpensWithTheVerdict(t *testing.T) {
	cells := mustCells(t)
	var page bytes.Buffer
	in := Input{Cells: cells, SLO: fixtureSLO.String(), Comparison: report.Comparison{GoodputTarget: 90, Baseline: "power-of-two"}}
	if err := Write(&page, in); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	verdict, table := strings.Index(s, `<h2 id="verdict">`), strings.Index(s, `<h2 id="comparison">`)
	if verdict < 0 || table < verdict {
		t.Fatalf("verdict at %d, table at %d: want the verdict first", verdict, table)
	}
	head := html.UnescapeString(s[verdict:table])
	var ms []report.Metric
	for _, n := range report.HeadlineMetrics {
		m, _ := report.MetricByName(n)
		ms = append(ms, m)
	}
	bests := report.Bests(cells, ms)
	if len(bests) != len(fixtureFleets)*len(report.HeadlineMetrics) {
		t.Fatalf("%d verdicts, want one per fleet and headline metric", len(bests))
	}
	for _, b := range bests {
		for _, want := range []string{"best " + b.Metric.Header, b.MarginText(),
			fmt.Sprintf("%d of %d seeds agree", b.SeedsAgree, b.Seeds)} {
			if !strings.Contains(head, want) {
				t.Errorf("%s on %s: the verdict lacks %q", b.Metric.Name, b.Fleet, want)
			}
		}
	}
	for _, want := range []string{`<p class="summary">`, "smallest fleet with goodput >= 90.0%"} {
		if !strings.Contains(head, want) {
			t.Errorf("the verdict lacks %q", want)
		}
	}
	marks := 0
	for _, m := range report.TableColumns(cells, in.Comparison) {
		for _, b := range report.BestMarks(cells, m) {
			if b {
				marks++
			}
		}
	}
	if got := strings.Count(s[table:], `<td class="best"><strong>`); marks == 0 || got != marks {
		t.Errorf("%d cells marked best, want %d (report.BestMarks), some", got, marks)
	}
}

// A run with engine failures gets the failures section: the text
// section's lines (report.MigrationLines); a page without has none.
func TestFailuresSection(t *testing.T) {
	r := syntheticReport("kv", 8, 1)
	r.Migration = &report.MigrationReport{Failures: 2, Restarts: 1, Cut: 5, Outcomes: map[string]int{"migrated": 4, "over_limit": 1},
		Requests: 4, Completed: 4, ExtraPrefillTokens: 1000}
	var page bytes.Buffer
	if err := Write(&page, Input{Trace: "t", Requests: 1, Cells: []report.Cell{{Runs: []*report.Report{r}}}}); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	for _, w := range []string{`<h2 id="failures">Engine failures</h2>`,
		"<li>kv on 8 workers: 2 failures, 1 restart; 5 cuts: 4 migrated, 1 failed (over_limit 1)</li>",
		"4 migrated requests, 4 completed:", "extra prefill 1000 tokens (0% from cache)"} {
		if !strings.Contains(s, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	r.Migration = nil
	page.Reset()
	if err := Write(&page, Input{Trace: "t", Requests: 1, Cells: []report.Cell{{Runs: []*report.Report{r}}}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page.String(), `id="failures"`) {
		t.Error("a page without failures has the failures section")
	}
}
