package report

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// FitOrder ranks the table's columns by importance, most important
// first: when the default columns do not fit Comparison.Width, the
// table leaves out the last of them first. Columns not listed go after
// these.
var FitOrder = []string{"ttft_p90", "goodput", "kv_hit", "e2e_p99", "tpot_p90", "ttft_p50", "rejected", "fallbacks",
	"completed", "queue_p99", "ttft_p99", "itl_p99", "output_tok_s", "of_ref", "goodput_per_s", "belief", "shadow_agree",
	"preemptions", "requests"}

// foldable are the count columns that, when one value is on every row,
// move from the table to one line under it when the table does not fit.
var foldable = []string{"requests", "completed", "rejected", "fallbacks", "preemptions"}

// textTable is the text table's layout: its cells, whether it has the
// workers column, and the delta column's baseline ("" for none) and
// metric.
type textTable struct {
	cells    []Cell
	fleets   bool
	baseline string
	delta    Metric
}

// rows are the table's header then one line per cell, a field per
// column.
func (t textTable) rows(cols []Metric) [][]string {
	head := []string{"policy"}
	if t.fleets {
		head = append(head, "workers")
	}
	for _, m := range cols {
		head = append(head, m.Header)
	}
	if t.baseline != "" {
		head = append(head, "Δ "+t.delta.Header)
	}
	out := [][]string{head}
	for _, c := range t.cells {
		row := []string{c.Label()}
		if t.fleets {
			row = append(row, c.Fleet())
		}
		for _, m := range cols {
			row = append(row, c.Text(m))
		}
		if t.baseline != "" {
			row = append(row, deltaText(t.cells, c, t.baseline, t.delta))
		}
		out = append(out, row)
	}
	return out
}

// width is the widest line of the table of cols as WriteComparison's
// tabwriter writes it: each column as wide as its widest field plus a
// padding of 2, in runes.
func (t textTable) width(cols []Metric) int {
	rows := t.rows(cols)
	total := 0
	for j := range rows[0] {
		w := 0
		for _, r := range rows {
			w = max(w, utf8.RuneCountInString(r[j]))
		}
		total += w + 2
	}
	return total
}

// fit is cols fitted to width: the foldable columns of one value on
// every row moved out (folded) when the table is too wide, then the
// columns last in FitOrder left out (dropped, in table order) until it
// fits or one metric column is left.
func (t textTable) fit(cols []Metric, width int) (kept, folded, dropped []Metric) {
	if t.width(cols) <= width {
		return cols, nil, nil
	}
	for _, m := range cols {
		if slices.Contains(foldable, m.Name) && t.same(m) {
			folded = append(folded, m)
		} else {
			kept = append(kept, m)
		}
	}
	rank := func(m Metric) int {
		if i := slices.Index(FitOrder, m.Name); i >= 0 {
			return i
		}
		return len(FitOrder)
	}
	for len(kept) > 1 && t.width(kept) > width {
		worst := 0
		for i, m := range kept {
			if rank(m) >= rank(kept[worst]) {
				worst = i
			}
		}
		dropped = append(dropped, kept[worst])
		kept = slices.Delete(kept, worst, worst+1)
	}
	slices.SortStableFunc(dropped, func(a, b Metric) int {
		return slices.IndexFunc(cols, func(m Metric) bool { return m.Name == a.Name }) -
			slices.IndexFunc(cols, func(m Metric) bool { return m.Name == b.Name })
	})
	return kept, folded, dropped
}

// same is true when every cell shows one text in column m.
func (t textTable) same(m Metric) bool {
	for _, c := range t.cells[1:] {
		if c.Text(m) != t.cells[0].Text(m) {
			return false
		}
	}
	return true
}

// Wrap breaks s at spaces into lines of at most width runes, each line
// after the first indented by two spaces; a word longer than a line
// stays whole on its own. width 0 or less leaves s as it is.
func Wrap(s string, width int) string {
	if width <= 0 || utf8.RuneCountInString(s) <= width {
		return s
	}
	var b strings.Builder
	n := 0 // runes on the current line
	for i, word := range strings.Fields(s) {
		wn := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case n+1+wn > width:
			b.WriteString("\n  ")
			n = 2
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += wn
	}
	return b.String()
}
