package report

import (
	"slices"
	"testing"
)

// Bests names, per fleet and metric with a direction, the row of the
// best median, its margin over the next (percentage points for shares,
// percent for others), a tie within the noise, and on how many seeds
// the best row is also best; BestMarks marks the best cell per fleet
// only where the verdict names it (beyond the noise).
func TestBestsAndMarks(t *testing.T) {
	rep := func(policy string, workers int, p90, hit float64) *Report {
		return &Report{Policy: policy, Workers: workers, Requests: 10, Completed: 10, TTFT: Summary{P90: p90}, KVHitRatio: hit, OutputTokensPerS: 100}
	}
	cells := []Cell{
		{Runs: []*Report{rep("rr", 4, 200, 0.10), rep("rr", 4, 100, 0.10), rep("rr", 4, 220, 0.10)}},
		{Runs: []*Report{rep("kv", 4, 150, 0.30), rep("kv", 4, 120, 0.40), rep("kv", 4, 130, 0.35)}},
		{Runs: []*Report{rep("rr", 8, 100, 0.10), rep("rr", 8, 100, 0.100)}},
		{Runs: []*Report{rep("kv", 8, 99.5, 0.104), rep("kv", 8, 99.5, 0.104)}},
	}
	var ms []Metric
	for _, n := range []string{"ttft_p90", "kv_hit", "requests", "output_tok_s"} {
		m, _ := MetricByName(n)
		ms = append(ms, m)
	}
	got := Bests(cells, ms)
	type short struct {
		fleet, metric, label, runnerUp string
		margin                         float64
		tie                            bool
		seeds, agree                   int
	}
	var s []short
	for _, b := range got {
		s = append(s, short{b.Fleet, b.Metric.Name, b.Label, b.RunnerUp, float64(int(b.Margin*100+0.5)) / 100, b.Tie, b.Seeds, b.SeedsAgree})
	}
	want := []short{
		// 4: kv's median 130 against rr's 200: 35% lower; seed 2 (100
		// against 120) disagrees.
		{"4", "ttft_p90", "kv", "rr", 35, false, 3, 2},
		// KV hit 35% against 10%: 25 pp.
		{"4", "kv_hit", "kv", "rr", 25, false, 3, 3},
		{"4", "output_tok_s", "rr", "kv", 0, true, 3, 3},
		// 8: 99.5 against 100 is 0.5%, under NoiseRelative: a tie.
		{"8", "ttft_p90", "kv", "rr", 0.5, true, 2, 2},
		{"8", "kv_hit", "kv", "rr", 0.4, true, 2, 2},
		{"8", "output_tok_s", "rr", "kv", 0, true, 2, 2},
	}
	if !slices.Equal(s, want) {
		t.Errorf("bests\n%v\nwant\n%v", s, want)
	}
	if txt := got[0].MarginText(); txt != "35.0% lower than rr (200 ms)" {
		t.Errorf("margin %q", txt)
	}
	if txt := got[1].MarginText(); txt != "+25.0 pp over rr (10.0%)" {
		t.Errorf("margin %q", txt)
	}
	if txt := got[3].MarginText(); txt != "within noise of rr (100 ms)" {
		t.Errorf("margin %q", txt)
	}
	p90, _ := MetricByName("ttft_p90")
	if got, want := BestMarks(cells, p90), []bool{false, true, false, false}; !slices.Equal(got, want) {
		t.Errorf("TTFT p90 marks %v, want %v (fleet 8: 99.5 against 100 is within noise, as in the verdict)", got, want)
	}
	tok, _ := MetricByName("output_tok_s")
	if got := BestMarks(cells, tok); slices.Contains(got, true) {
		t.Errorf("out tok/s equal on every row: marks %v, want none", got)
	}
	req, _ := MetricByName("requests")
	if got := BestMarks(cells, req); slices.Contains(got, true) {
		t.Errorf("requests, no direction: marks %v, want none", got)
	}
	if got := BestMarks(cells[:1], p90); slices.Contains(got, true) {
		t.Errorf("one row: marks %v, want none", got)
	}
}

// A ratio's change is in percentage points, any other's in percent.
func TestChange(t *testing.T) {
	a := Cell{Runs: []*Report{{Completed: 1, KVHitRatio: 0.091, TTFT: Summary{P90: 50}}}}
	b := Cell{Runs: []*Report{{Completed: 1, KVHitRatio: 0.06, TTFT: Summary{P90: 100}}}}
	hit, _ := MetricByName("kv_hit")
	p90, _ := MetricByName("ttft_p90")
	if d, text, ok := Change(a, b, hit); !ok || text != "+3.1 pp" || d < 3.09 || d > 3.11 {
		t.Errorf("KV hit: %v %q %v, want +3.1 pp", d, text, ok)
	}
	if d, text, ok := Change(a, b, p90); !ok || text != "-50.0%" || d != -50 {
		t.Errorf("TTFT p90: %v %q %v, want -50.0%%", d, text, ok)
	}
}

// BestMarks follows the verdict's noise rule: out tok/s of 1161 against
// 1160 (0.09%) and preemptions of 0 on several rows against 1 get no
// mark; a lead beyond the noise does.
func TestBestMarksNoise(t *testing.T) {
	rep := func(policy string, tok float64, preempt int64) *Report {
		return &Report{Policy: policy, Workers: 4, Requests: 10, Completed: 10, TTFT: Summary{P90: 100}, OutputTokensPerS: tok, Preemptions: preempt}
	}
	one := func(r *Report) Cell { return Cell{Runs: []*Report{r}} }
	tok, _ := MetricByName("output_tok_s")
	pre, _ := MetricByName("preemptions")
	cells := []Cell{one(rep("rr", 1160, 1)), one(rep("a", 1161, 0)), one(rep("b", 1161, 0)), one(rep("c", 1161, 0))}
	if got := BestMarks(cells, tok); slices.Contains(got, true) {
		t.Errorf("out tok/s 1161 against 1160: marks %v, want none", got)
	}
	if got := BestMarks(cells, pre); slices.Contains(got, true) {
		t.Errorf("preempt 0 on three rows against 1: marks %v, want none", got)
	}
	cells = []Cell{one(rep("rr", 1000, 2)), one(rep("a", 1200, 0)), one(rep("b", 1011, 1))}
	if got, want := BestMarks(cells, tok), []bool{false, true, false}; !slices.Equal(got, want) {
		t.Errorf("out tok/s 1200 against 1011: marks %v, want %v", got, want)
	}
	if got, want := BestMarks(cells, pre), []bool{false, true, false}; !slices.Equal(got, want) {
		t.Errorf("preempt 0 against 1: marks %v, want %v", got, want)
	}
}
