package report

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestTopRejection(t *testing.T) {
	for _, tt := range []struct {
		name    string
		reasons map[string]int
		reason  string
		n       int
	}{
		{"none", nil, "", 0},
		{"one", map[string]int{"x": 4}, "x", 4},
		{"most common", map[string]int{"a": 1, "b": 7, "c": 2}, "b", 7},
		{"tie takes the first name", map[string]int{"zeta": 3, "alpha": 3, "mid": 1}, "alpha", 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, n := (&Report{RejectionReasons: tt.reasons}).TopRejection()
			if r != tt.reason || n != tt.n {
				t.Fatalf("TopRejection() = %q, %d; want %q, %d", r, n, tt.reason, tt.n)
			}
		})
	}
}

func TestReportLabel(t *testing.T) {
	agg := func(p string) map[string]string { return map[string]string{"aggregated": p} }
	pd := func(p, d string) map[string]string { return map[string]string{"prefill": p, "decode": d} }
	for _, tt := range []struct {
		name string
		rep  Report
		want string
	}{
		{"aggregated file", Report{Policy: "kv", RolePolicies: agg("kv")}, "kv"},
		{"aggregated no names", Report{Policy: "kv"}, "kv"},
		{"aggregated falls back", Report{Policy: "pd", RolePolicies: agg("default")}, "pd(default)"},
		{"aggregated built-in", Report{Policy: "default", RolePolicies: agg("default")}, "default"},
		{"disaggregated built-in", Report{Policy: "default", PrefillWorkers: 2, DecodeWorkers: 3, RolePolicies: pd("default", "default")}, "default(2P+3D)"},
		{"disaggregated file", Report{Policy: "pd", PrefillWorkers: 4, DecodeWorkers: 4, RolePolicies: pd("pre", "dec")}, "pd(4P+4D)"},
		{"both fall back", Report{Policy: "round-robin", PrefillWorkers: 2, DecodeWorkers: 6, RolePolicies: pd("default", "default")},
			"round-robin(2P:default+6D:default)"},
		{"decode falls back", Report{Policy: "p", PrefillWorkers: 1, DecodeWorkers: 7, RolePolicies: pd("fast", "default")}, "p(1P+7D:default)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rep.Label(); got != tt.want {
				t.Fatalf("Label() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestWriteTable pins the default columns' header, two rows, and the
// legend, which explains exactly the columns shown.
func TestWriteTable(t *testing.T) {
	rep := &Report{Policy: "kv", Requests: 300, Completed: 290, Rejected: 10, Selections: 290, Fallbacks: 12,
		TTFT: Summary{P50: 41.25, P90: 120, P99: 15000}, E2E: Summary{P50: 2000, P99: 9.5}, TPOT: Summary{P90: 12.5},
		ITL: Summary{P99: 31.25}, Queue: Summary{P99: 7}, Preemptions: 3, OutputTokensPerS: 1234.4,
		KVHitRatio: 0.4567, KVHitReference: 0.5, KVHitOfReference: 0.9134, Imbalance: 1.25, SimDurationS: 61.4, WallS: 0.1234, SimRequestsPerS: 2431}
	healthy := &Report{Policy: "rr", Requests: 300, Completed: 300, Selections: 300,
		TTFT: Summary{P50: 50, P90: 130, P99: 16000}, E2E: Summary{P50: 2100, P99: 9.5},
		KVHitRatio: 0.1, KVHitReference: 0.5, KVHitOfReference: 0.2, Imbalance: 1, SimDurationS: 62, WallS: 0.1, SimRequestsPerS: 3000}
	var buf bytes.Buffer
	if err := WriteTable(&buf, []*Report{rep, healthy}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	wantLines(t, buf.String(),
		"policy requests completed rejected fallbacks TTFT p50 TTFT p90 TTFT p99 TPOT p90 ITL p99 E2E p99 queue p99 KV hit of ref preempt out tok/s",
		"kv 300 290 10 12 (4.1%) 41.2 120 15000 12.5 31.2 9.5 7.0 45.7% 91% 3 1234",
		"rr 300 300 0 0 50.0 130 16000 - - 9.5 0.0 10.0% 20% 0 0",
	)
	// Columns stay aligned: every cell ends where its header does.
	if end := strings.Index(lines[0], "fallbacks") + len("fallbacks"); !strings.HasSuffix(lines[1][:end], " 12 (4.1%)") || !strings.HasSuffix(lines[2][:end], " 0") {
		t.Errorf("fallbacks column misaligned:\n%s\n%s\n%s", lines[0], lines[1], lines[2])
	}
	legend := strings.Join(lines[3:], "\n")
	for _, s := range []string{"latencies in ms of simulated time", "TPOT = time per output token", "ITL = inter-token latency",
		"fallbacks = selections a policy's fallback made", "of ref = KV hit / KV ref", "out tok/s = output tokens"} {
		if !strings.Contains(legend, s) {
			t.Errorf("legend lacks %q:\n%s", s, legend)
		}
	}
	for _, s := range []string{"imbalance", "wall s", "goodput", "belief", "Δ"} {
		if strings.Contains(legend, s) {
			t.Errorf("legend explains %q, a column not shown:\n%s", s, legend)
		}
	}
}

// A precise row adds the belief column, for every row, and its legend;
// --columns picks and orders columns; without a precise row belief is
// left out, even when asked for.
func TestWriteTableBelief(t *testing.T) {
	approx := &Report{Policy: "default", Prefix: "approximate", Requests: 10, Completed: 10, BeliefAccuracy: 0.9806, KVHitRatio: 0.3272, Imbalance: 1}
	precise := &Report{Policy: "default", Prefix: "precise", KVEvents: &KVEventsReport{DelayMs: 20}, Requests: 10, Completed: 10,
		BeliefAccuracy: 0.999, KVHitRatio: 0.332, Imbalance: 1}
	cols, err := ParseColumns("kv_hit,belief,imbalance,kv_hit")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cells := []Cell{{Runs: []*Report{approx}}, {Runs: []*Report{precise}}}
	if err := WriteComparison(&buf, cells, Comparison{Columns: cols}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, buf.String(),
		"policy KV hit belief imbalance",
		"default 32.7% 98.1% 1.000",
		"default+precise 33.2% 99.9% 1.000",
	)
	if !strings.Contains(buf.String(), "belief = requests whose router belief") {
		t.Errorf("no belief legend:\n%s", buf.String())
	}
	buf.Reset()
	if err := WriteComparison(&buf, cells[:1], Comparison{Columns: cols}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(strings.Split(buf.String(), "\n")[0]), " "); got != "policy KV hit imbalance" {
		t.Errorf("header without a precise row %q, want no belief column", got)
	}
}

// Cells of several seeds show the median with [least–greatest]; a sweep
// adds the workers column; --baseline adds the delta against the same
// fleet's baseline row.
func TestWriteComparisonSeedsSweepBaseline(t *testing.T) {
	rep := func(policy string, workers int, p90 float64) *Report {
		return &Report{Policy: policy, Workers: workers, Requests: 10, Completed: 10, TTFT: Summary{P90: p90}}
	}
	cells := []Cell{
		{Runs: []*Report{rep("rr", 4, 200), rep("rr", 4, 100), rep("rr", 4, 300)}},
		{Runs: []*Report{rep("kv", 4, 50), rep("kv", 4, 50), rep("kv", 4, 50)}},
		{Runs: []*Report{rep("rr", 8, 100), rep("rr", 8, 120)}},
		{Runs: []*Report{rep("kv", 8, 88), rep("kv", 8, 66)}},
	}
	p90, _ := MetricByName("ttft_p90")
	if s, ok := cells[0].Stat(p90); !ok || s != (Stat{Median: 200, Min: 100, Max: 300, N: 3}) {
		t.Errorf("stat %+v, want median 200 of 100..300", s)
	}
	if s, _ := cells[3].Stat(p90); s.Median != 77 {
		t.Errorf("median of two %v, want their mean 77", s.Median)
	}
	cols, _ := ParseColumns("ttft_p90")
	var buf bytes.Buffer
	if err := WriteComparison(&buf, cells, Comparison{Columns: cols, Baseline: "rr"}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, buf.String(),
		"policy workers TTFT p90 Δ TTFT p90",
		"rr 4 200 [100–300] base",
		"kv 4 50.0 -75.0%",
		"rr 8 110 [100–120] base",
		"kv 8 77.0 [66.0–88.0] -30.0%",
		"each cell: the median of 3 seeds, [least–greatest] when they differ",
	)
}

// With goodput the table ends with the best row of each fleet.
func TestBestGoodput(t *testing.T) {
	rep := goodputReport
	cells := []Cell{
		{Runs: []*Report{rep("rr", 4, 0.5)}}, {Runs: []*Report{rep("kv", 4, 0.8)}},
		{Runs: []*Report{rep("rr", 8, 0.9)}}, {Runs: []*Report{rep("kv", 8, 0.9)}},
	}
	if got, want := bestGoodput(cells), "highest goodput: kv on 4 workers (80.0%); rr and kv on 8 workers (90.0%)\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	zero := []Cell{{Runs: []*Report{rep("rr", 1, 0)}}, {Runs: []*Report{rep("kv", 1, 0)}}, {Runs: []*Report{rep("rr", 2, 0.1)}}, {Runs: []*Report{rep("kv", 2, 0)}}}
	if got, want := bestGoodput(zero), "highest goodput: none on 1 worker (0%); rr on 2 workers (10.0%)\n"; got != want {
		t.Errorf("no goodput on a fleet: %q, want %q", got, want)
	}
	if got := bestGoodput([]Cell{{Runs: []*Report{rep("rr", 4, 0.5)}}}); got != "" {
		t.Errorf("one row: %q, want nothing", got)
	}
}

func TestParseColumns(t *testing.T) {
	cols, err := ParseColumns("default,e2e_p50,ttft_p50")
	if err != nil {
		t.Fatal(err)
	}
	if len(cols) != len(DefaultColumns)+1 || cols[len(cols)-1].Name != "e2e_p50" {
		t.Errorf("default,e2e_p50,ttft_p50: %d columns ending %q; want the defaults then e2e_p50 once", len(cols), cols[len(cols)-1].Name)
	}
	if all, _ := ParseColumns("all"); len(all) != len(MetricNames()) {
		t.Errorf("all: %d columns, want %d", len(all), len(MetricNames()))
	}
	if _, err := ParseColumns("ttft_p90,ttft_p95"); err == nil || !strings.Contains(err.Error(), `unknown column "ttft_p95"`) || !strings.Contains(err.Error(), "itl_p99") {
		t.Errorf("unknown column: %v; want it named, with the list of names", err)
	}
}

// With a goodput target the table ends with each policy's smallest fleet
// that reaches it, by total workers whatever the order given, or none
// with its best.
func TestSmallestFleets(t *testing.T) {
	rep := goodputReport
	cells := []Cell{
		{Runs: []*Report{rep("rr", 16, 0.97)}}, {Runs: []*Report{rep("kv", 16, 0.99)}},
		{Runs: []*Report{rep("rr", 4, 0.5)}}, {Runs: []*Report{rep("kv", 4, 0.8)}},
		{Runs: []*Report{rep("rr", 8, 0.9)}}, {Runs: []*Report{rep("kv", 8, 0.96)}},
		{Runs: []*Report{rep("ll", 8, 0.91)}},
	}
	want := []FleetVerdict{{Policy: "rr", Fleet: "16", Goodput: 97, Best: 97}, {Policy: "kv", Fleet: "8", Goodput: 96, Best: 99},
		{Policy: "ll", Best: 91}}
	if got := SmallestFleets(cells, 95); !slices.Equal(got, want) {
		t.Errorf("SmallestFleets = %+v, want %+v", got, want)
	}
	var buf bytes.Buffer
	if err := WriteComparison(&buf, cells, Comparison{Columns: []Metric{mustMetric(t, "goodput")}, GoodputTarget: 95}); err != nil {
		t.Fatal(err)
	}
	if want := "smallest fleet with goodput >= 95.0%: rr from 16 workers (97.0%); kv from 8 workers (96.0%); ll on none (best 91.0%)\n"; !strings.HasSuffix(buf.String(), want) {
		t.Errorf("table ends %q, want %q", buf.String()[max(0, buf.Len()-200):], want)
	}
}

// A row whose requests were all rejected has no latency: its latency
// cells are "-", not 0 ms (which would read as the fastest row), and its
// delta against a baseline that completed requests is "-", not -100%.
func TestNoCompletedRequestsHaveNoLatency(t *testing.T) {
	served := &Report{Policy: "rr", Workers: 2, Requests: 3, Completed: 3, TTFT: Summary{P50: 100, P90: 200}, E2E: Summary{P99: 900}}
	refused := &Report{Policy: "busy", Workers: 2, Requests: 3, Rejected: 3}
	cells := []Cell{{Runs: []*Report{served}}, {Runs: []*Report{refused}}}
	cols, _ := ParseColumns("completed,rejected,ttft_p50,e2e_p99")
	var buf bytes.Buffer
	if err := WriteComparison(&buf, cells, Comparison{Columns: cols, Baseline: "rr"}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, buf.String(),
		"policy completed rejected TTFT p50 E2E p99 Δ TTFT p90",
		"rr 3 0 100 900 base",
		"busy 0 3 - - -",
	)
	p50, _ := MetricByName("ttft_p50")
	if v, ok := p50.Value(refused); ok {
		t.Errorf("TTFT p50 of a run without completed requests: %v, want none", v)
	}
}

func mustMetric(t *testing.T, name string) Metric {
	t.Helper()
	m, ok := MetricByName(name)
	if !ok {
		t.Fatalf("no metric %q", name)
	}
	return m
}

// goodputReport is a run of policy on workers whose goodput share is
// share.
func goodputReport(policy string, workers int, share float64) *Report {
	return &Report{Policy: policy, Workers: workers, Goodput: &Goodput{Share: share}}
}

// wantLines checks that the first lines of table, their fields joined by
// single spaces, are want.
func wantLines(t *testing.T, table string, want ...string) {
	t.Helper()
	lines := strings.Split(table, "\n")
	for i, w := range want {
		got := ""
		if i < len(lines) {
			got = strings.Join(strings.Fields(lines[i]), " ")
		}
		if got != w {
			t.Errorf("line %d %q, want %q", i, got, w)
		}
	}
}

// A Summary without samples is written as null (a run with no completed
// request has no latency, not 0 ms); one whose samples are all 0, or one
// built with values, as the object; the zero KVTransfer is left out.
func TestSummaryJSONNullWithoutSamples(t *testing.T) {
	for _, tt := range []struct {
		s    Summary
		want string
	}{
		{Summary{}, `null`},
		{Summary{N: 3}, `{"p50":0,"p90":0,"p99":0,"mean":0}`},
		{Summary{P50: 1.5, P90: 2, P99: 4, Mean: 2.25, N: 9}, `{"p50":1.5,"p90":2,"p99":4,"mean":2.25}`},
		{Summary{P90: 7}, `{"p50":0,"p90":7,"p99":0,"mean":0}`},
	} {
		b, err := json.Marshal(tt.s)
		if err != nil || string(b) != tt.want {
			t.Errorf("%+v: %s, %v; want %s", tt.s, b, err, tt.want)
		}
	}
	b, err := json.Marshal(&Report{Policy: "p", Requests: 2, Rejected: 2, Queue: Summary{N: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"ttft_ms":null,"e2e_ms":null,"queue_ms":{"p50":0,"p90":0,"p99":0,"mean":0}`, `"tpot_ms":null`, `"itl_ms":null`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("report %s lacks %s", b, want)
		}
	}
	if strings.Contains(string(b), "kv_transfer_ms") {
		t.Errorf("report %s has kv_transfer_ms", b)
	}
	// Read back, null is the zero Summary.
	var r Report
	if err := json.Unmarshal(b, &r); err != nil || r.TTFT != (Summary{}) || r.Queue != (Summary{}) {
		t.Errorf("read back: %+v, %v", r, err)
	}
}
