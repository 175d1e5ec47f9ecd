package report

import (
	"fmt"
	"math"
	"slices"
)

// HeadlineMetrics are the metrics the HTML report's verdict decides on,
// per fleet: the latencies a user feels first, the cache's effect, and
// goodput when an SLO was given (a metric no cell has is left out).
var HeadlineMetrics = []string{"ttft_p90", "tpot_p90", "e2e_p99", "kv_hit", "goodput"}

// The noise rule of a verdict: a margin under NoiseRelative percent (for
// absolute quantities such as latencies) or under NoisePP percentage
// points (for Ratio metrics) is a tie.
const (
	NoiseRelative = 1.0
	NoisePP       = 0.5
)

// Best is one fleet's verdict on one metric: which row is best, by how
// much over the runner-up, and whether the seeds agree.
type Best struct {
	Metric Metric
	// Fleet is the cells' fleet (Cell.Fleet).
	Fleet string
	// Label is the best row's label, Value its median in display units;
	// RunnerUp and RunnerUpValue the next best row's.
	Label, RunnerUp      string
	Value, RunnerUpValue float64
	// Margin is the best's lead over the runner-up: in percentage points
	// for a Ratio metric, else in percent of the runner-up's value; never
	// negative.
	Margin float64
	// Tie is true when Margin is within the noise (NoiseRelative,
	// NoisePP): the verdict names no winner.
	Tie bool
	// Seeds is how many seeds every row of the fleet has (the fewest);
	// SeedsAgree on how many of them the best row is also best (or level)
	// on that seed's own runs. Both 1 for single runs.
	Seeds, SeedsAgree int
}

// MarginText words the margin: "42.1% lower than round-robin (1645 ms)",
// "+9.1 pp over round-robin (6.0%)", or "within noise of round-robin
// (1161 tok/s)".
func (b Best) MarginText() string {
	other := b.Metric.Format(b.RunnerUpValue)
	if u := b.Metric.Unit; u != "" && u != "%" {
		other += " " + u
	}
	switch {
	case b.Tie:
		return fmt.Sprintf("within noise of %s (%s)", b.RunnerUp, other)
	case b.Metric.Ratio():
		return fmt.Sprintf("+%.1f pp over %s (%s)", b.Margin, b.RunnerUp, other)
	case b.Metric.Lower:
		return fmt.Sprintf("%.1f%% lower than %s (%s)", b.Margin, b.RunnerUp, other)
	}
	return fmt.Sprintf("%.1f%% higher than %s (%s)", b.Margin, b.RunnerUp, other)
}

// better is true when a is better than b in m's direction.
func better(m Metric, a, b float64) bool {
	if m.Lower {
		return a < b
	}
	return a > b
}

// Bests is the verdict of cells on each of metrics that has a direction
// (Lower or Higher), fleet by fleet in first order: for each fleet of
// two rows or more that have the metric, the row of the best median,
// its margin over the next (Best). Metrics are left out where fewer
// than two rows have them.
func Bests(cells []Cell, metrics []Metric) []Best {
	var out []Best
	for _, f := range distinctFleets(cells) {
		for _, m := range metrics {
			if !m.Lower && !m.Higher() {
				continue
			}
			type row struct {
				c  Cell
				st Stat
			}
			var rows []row
			for _, c := range cells {
				if st, ok := c.Stat(m); ok && c.Fleet() == f {
					rows = append(rows, row{c, st})
				}
			}
			if len(rows) < 2 {
				continue
			}
			slices.SortStableFunc(rows, func(a, b row) int {
				switch {
				case better(m, a.st.Median, b.st.Median):
					return -1
				case better(m, b.st.Median, a.st.Median):
					return 1
				}
				return 0
			})
			top, next := rows[0], rows[1]
			b := Best{Metric: m, Fleet: f, Label: top.c.Label(), RunnerUp: next.c.Label(),
				Value: top.st.Median, RunnerUpValue: next.st.Median}
			b.Margin, b.Tie = lead(m, top.st.Median, next.st.Median)
			b.Seeds = len(rows[0].c.Runs)
			for _, r := range rows {
				b.Seeds = min(b.Seeds, len(r.c.Runs))
			}
			for k := range b.Seeds {
				mine, ok := m.Value(top.c.Runs[k])
				agree := ok
				for _, r := range rows[1:] {
					if v, ok := m.Value(r.c.Runs[k]); ok && better(m, v, mine) {
						agree = false
					}
				}
				if agree {
					b.SeedsAgree++
				}
			}
			out = append(out, b)
		}
	}
	return out
}

// lead is top's margin over next on m (in percentage points for a Ratio
// metric, else in percent of next's value; never negative), and whether
// it is within the noise (NoisePP, NoiseRelative): the rule of Bests and
// BestMarks alike.
func lead(m Metric, top, next float64) (margin float64, tie bool) {
	if m.Ratio() {
		margin = math.Abs(top - next)
		return margin, margin < NoisePP
	}
	if next != 0 {
		margin = math.Abs(top-next) / math.Abs(next) * 100
	}
	return margin, margin < NoiseRelative
}

// BestMarks marks, for column m, the cell whose median is the best of its
// fleet when it beats the next best by more than the noise, the rule of
// the verdict (Bests: a Best that is no Tie): true at its index. No mark
// where the best is within noise of the next (under NoisePP percentage
// points for a Ratio metric, under NoiseRelative percent otherwise), on a
// fleet of one row with m, or for a metric without a direction.
func BestMarks(cells []Cell, m Metric) []bool {
	marks := make([]bool, len(cells))
	if !m.Lower && !m.Higher() {
		return marks
	}
	for _, b := range Bests(cells, []Metric{m}) {
		if b.Tie {
			continue
		}
		for i, c := range cells {
			if c.Fleet() == b.Fleet && c.Label() == b.Label {
				if _, ok := c.Stat(m); ok {
					marks[i] = true
				}
			}
		}
	}
	return marks
}

// distinctFleets is the cells' fleets in first order.
func distinctFleets(cells []Cell) []string {
	var out []string
	for _, c := range cells {
		if f := c.Fleet(); !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}
