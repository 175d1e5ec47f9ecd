package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

const policiesDir = "../../examples/policies/"

var (
	rrPolicy   = policiesDir + "round-robin.hcl"
	kvPolicy   = policiesDir + "kv.hcl"
	kvAffinity = policiesDir + "kv-affinity.hcl"
	arxivTrace = tracesDir + "mooncake_arxiv_trace_first1000.jsonl"
)

// errNotLoaded is sweepLoad's error: the diagnostics went to warnings.
var errNotLoaded = errors.New("policy file has errors")

// sweepLoad is a Sweep's Load as router replay's: router.LoadBundle, the
// diagnostics formatted on warnings.
func sweepLoad(ctx context.Context, path string, o loader.LoadOptions, warnings io.Writer) (*loader.Bundle, error) {
	b, diags := loader.LoadBundle(ctx, path, o)
	if len(diags) > 0 {
		fmt.Fprint(warnings, config.FormatDiagnostics(diags))
	}
	if diags.HasErrors() || b == nil {
		return nil, errNotLoaded
	}
	return b, nil
}

// openTrace opens the trace at path with limit (trace.Open, router
// replay's hold).
func openTrace(t testing.TB, path string, limit int) *trace.Opened {
	t.Helper()
	tr, err := trace.Open(path, "", nil, limit, trace.DefaultHold)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// runSweep runs s with sweepLoad, failing the test on an error.
func runSweep(t testing.TB, s *Sweep) *SweepResult {
	t.Helper()
	s.Load = sweepLoad
	res, err := s.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// tableOf is the table of res's cells as router replay prints it.
func tableOf(t testing.TB, res *SweepResult, cmp report.Comparison) string {
	t.Helper()
	var b strings.Builder
	if err := report.WriteComparison(&b, res.Cells, cmp); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// reportJSON is rep as router replay's --report writes it, decoded.
func reportJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSweepDeterministic replays 300 requests round-robin twice and checks
// the per-request lines are byte-identical and the report is complete.
func TestSweepDeterministic(t *testing.T) {
	var perReq [2][]byte
	var summary map[string]any
	for i := range perReq {
		var buf bytes.Buffer
		res := runSweep(t, &Sweep{Trace: openTrace(t, arxivTrace, 300), Policies: []string{rrPolicy},
			Fleets: []Fleet{{Workers: 4}}, PerRequest: &buf})
		if len(res.Reports) != 1 || len(res.Cells) != 1 {
			t.Fatalf("run %d: %d reports, %d cells; want 1 and 1", i+1, len(res.Reports), len(res.Cells))
		}
		if table := tableOf(t, res, report.Comparison{}); !strings.Contains(table, "round-robin") {
			t.Errorf("run %d: table %q", i+1, table)
		}
		perReq[i] = buf.Bytes()
		summary = nil
		if err := json.Unmarshal(reportJSON(t, res.Reports[0]), &summary); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(perReq[0], perReq[1]) {
		t.Errorf("per-request output differs between two identical runs")
	}
	for _, k := range []string{"policy", "ttft_ms", "e2e_ms", "kv_hit_ratio", "imbalance",
		"sim_duration_s", "wall_s", "decisions_per_s"} {
		if _, ok := summary[k]; !ok {
			t.Errorf("report lacks %q", k)
		}
	}
	if summary["policy"] != "round-robin" {
		t.Errorf("policy %v, want round-robin", summary["policy"])
	}
	if summary["requests"] != 300.0 || summary["completed"] != 300.0 {
		t.Errorf("requests %v completed %v, want 300 and 300", summary["requests"], summary["completed"])
	}
	for _, k := range []string{"ttft_ms", "e2e_ms"} {
		s, _ := summary[k].(map[string]any)
		for _, q := range []string{"p50", "p90", "p99", "mean"} {
			if _, ok := s[q].(float64); !ok {
				t.Errorf("%s.%s missing or not a number: %v", k, q, summary[k])
			}
		}
	}
	perWorker, _ := summary["requests_per_worker"].([]any)
	if len(perWorker) != 4 {
		t.Fatalf("requests_per_worker %v, want 4 entries", summary["requests_per_worker"])
	}
	for w, n := range perWorker {
		if n != 75.0 {
			t.Errorf("worker %d got %v requests, want 75 (round-robin over 300)", w, n)
		}
	}
	lines := strings.Split(strings.TrimSuffix(string(perReq[0]), "\n"), "\n")
	if len(lines) != 300 {
		t.Fatalf("%d per-request lines, want 300", len(lines))
	}
	keys := []string{"index", "arrival_ms", "worker", "input_length", "output_length",
		"overlap_blocks", "cached_tokens", "queue_ms", "ttft_ms", "e2e_ms", "status"}
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, l)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Fatalf("line %d lacks %q: %s", i+1, k, l)
			}
		}
		if m["index"] != float64(i) {
			t.Fatalf("line %d: index %v", i+1, m["index"])
		}
	}
}

// TestSweepCompareTable checks two policy files give one table with one
// row per policy, in the order given.
func TestSweepCompareTable(t *testing.T) {
	res := runSweep(t, &Sweep{Trace: openTrace(t, "", 200), Policies: []string{rrPolicy, kvPolicy},
		Fleets: []Fleet{{Workers: DefaultWorkers}}})
	out := tableOf(t, res, report.Comparison{})
	if n := strings.Count(out, "TTFT p50"); n != 1 {
		t.Errorf("%d table headers, want 1:\n%s", n, out)
	}
	row := regexp.MustCompile(`(?m)^\s*(\S+)\s+200\s+200\s`)
	var names []string
	for _, m := range row.FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	if want := []string{"round-robin", "kv"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("rows %q, want %q:\n%s", names, want, out)
	}
}

// A sweep of the default policy with no seed anywhere still repeats
// exactly (DefaultSeed), and Seed changes the draws.
func TestSweepReproducibleByDefault(t *testing.T) {
	tr := openTrace(t, "", 400)
	out := func(seed *int64) []byte {
		t.Helper()
		var buf bytes.Buffer
		runSweep(t, &Sweep{Trace: tr, Policies: []string{""}, Fleets: []Fleet{{Workers: 4}}, Seed: seed, PerRequest: &buf})
		return buf.Bytes()
	}
	a, b := out(nil), out(nil)
	if !bytes.Equal(a, b) {
		t.Fatal("two unseeded default-policy sweeps differ")
	}
	seed := int64(99)
	if bytes.Equal(a, out(&seed)) {
		t.Fatal("Seed 99 gave the same draws as the default seed")
	}
}

// TestSweepDefaultRoleWarning checks the warning and the row label when a
// role falls back to the built-in default policy, and that neither appears
// when the file's policies run.
func TestSweepDefaultRoleWarning(t *testing.T) {
	dir := t.TempDir()
	prefillOnly := filepath.Join(dir, "prefill-only.hcl")
	both := filepath.Join(dir, "pd.hcl")
	for path, src := range map[string]string{
		prefillOnly: "policy \"rr\" {\n  picker \"rr\" { type = \"round-robin\" }\n}\nworker_selection { prefill = \"rr\" }\n",
		both:        "policy \"rr\" {\n  picker \"rr\" { type = \"round-robin\" }\n}\nworker_selection {\n  prefill = \"rr\"\n  decode  = \"rr\"\n}\n",
	} {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disagg := Fleet{Prefill: 1, Decode: 2}
	agg := Fleet{Workers: DefaultWorkers}
	tr := openTrace(t, arxivTrace, 20)
	for _, tt := range []struct {
		name    string
		policy  string
		fleet   Fleet
		warning string // "" for none
		row     string
	}{
		{"disaggregated, neither set", rrPolicy, disagg,
			"router: warning: " + rrPolicy + `: roles prefill and decode run the built-in default policy "default"`, "round-robin(1P:default+2D:default)"},
		{"disaggregated, decode unset", prefillOnly, disagg,
			"router: warning: " + prefillOnly + `: role decode runs the built-in default policy "default"`, "prefill-only(1P+2D:default)"},
		{"aggregated unset", prefillOnly, agg,
			"router: warning: " + prefillOnly + `: role aggregated runs the built-in default policy "default"`, "prefill-only(default)"},
		{"disaggregated, both set", both, disagg, "", "pd(1P+2D)"},
		{"no policy file", "", disagg, "", "default(1P+2D)"},
		{"aggregated set", rrPolicy, agg, "", "round-robin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var warnings strings.Builder
			res := runSweep(t, &Sweep{Trace: tr, Policies: []string{tt.policy}, Fleets: []Fleet{tt.fleet}, Warnings: &warnings})
			errOut := warnings.String()
			if tt.warning == "" && errOut != "" {
				t.Errorf("warnings %q, want nothing", errOut)
			}
			if tt.warning != "" && (!strings.HasPrefix(errOut, tt.warning) || strings.Count(errOut, "\n") != 1) {
				t.Errorf("warnings %q, want one line starting %q", errOut, tt.warning)
			}
			if out := tableOf(t, res, report.Comparison{}); !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(tt.row) + `\s+20\s+20\s+0\s`).MatchString(out) {
				t.Errorf("no table row %q:\n%s", tt.row, out)
			}
		})
	}
}

// TestSweepRejections replays five simultaneous requests on one worker
// that admits one at a time: four are rejected, the sweep still succeeds,
// the table counts them and the report names the reason.
func TestSweepRejections(t *testing.T) {
	dir := t.TempDir()
	busy, tracePath := filepath.Join(dir, "busy.hcl"), filepath.Join(dir, "burst.jsonl")
	line := `{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}` + "\n"
	for path, src := range map[string]string{
		busy: `
policy "busy" {
  filter "b" {
    type                = "busy"
    max_active_requests = 1
  }
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "busy" }
`,
		tracePath: strings.Repeat(line, 5),
	} {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := runSweep(t, &Sweep{Trace: openTrace(t, tracePath, 0), Policies: []string{busy}, Fleets: []Fleet{{Workers: 1}}})
	if out := tableOf(t, res, report.Comparison{}); !regexp.MustCompile(`(?m)^\s*busy\s+5\s+1\s+4\s`).MatchString(out) {
		t.Errorf("no row with 5 requests, 1 completed, 4 rejected:\n%s", out)
	}
	rep := res.Reports[0]
	reason, n := rep.TopRejection()
	if rep.Label() != "busy" || rep.Requests != 5 || rep.Rejected != 4 || n != 4 ||
		reason != `policy "busy": filter "b": all candidates filtered out` {
		t.Errorf("%s: %d of %d requests rejected; most common reason (%d): %s", rep.Label(), rep.Rejected, rep.Requests, n, reason)
	}
}

// Both prefix modes replay each policy twice, NAME then NAME+precise, in
// one table with a belief column; the reports name each run's mode and
// the precise run's delay. The table of approximate runs alone has no
// belief column.
func TestSweepPrefixBoth(t *testing.T) {
	tr := openTrace(t, arxivTrace, 200)
	res := runSweep(t, &Sweep{Trace: tr, Policies: []string{""}, Fleets: []Fleet{{Workers: 4}},
		Modes: []PrefixMode{PrefixApproximate, PrefixPrecise}, KVEventDelay: 5 * time.Millisecond})
	out := tableOf(t, res, report.Comparison{})
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[0], " of ref  belief ") {
		t.Errorf("header %q lacks the belief column", lines[0])
	}
	if f1, f2 := strings.Fields(lines[1]), strings.Fields(lines[2]); len(f1) == 0 || f1[0] != "default" || len(f2) == 0 || f2[0] != "default+precise" {
		t.Errorf("rows %q, %q; want default then default+precise", lines[1], lines[2])
	}
	if !strings.Contains(out, "NAME+precise rows") {
		t.Errorf("legend lacks the precise rows' note:\n%s", out)
	}
	var reps []struct {
		Policy         string
		Prefix         string
		BeliefAccuracy float64 `json:"belief_accuracy"`
		KVEvents       *struct {
			DelayMs float64 `json:"delay_ms"`
			Events  int64
		} `json:"kv_events"`
	}
	b := reportJSON(t, res.Reports)
	if json.Unmarshal(b, &reps) != nil || len(reps) != 2 {
		t.Fatalf("report %s; want an array of two", b)
	}
	if reps[0].Prefix != "approximate" || reps[0].KVEvents != nil || reps[1].Prefix != "precise" ||
		reps[1].KVEvents == nil || reps[1].KVEvents.DelayMs != 5 || reps[1].KVEvents.Events == 0 || reps[1].BeliefAccuracy <= 0 {
		t.Errorf("report %s", b)
	}

	res = runSweep(t, &Sweep{Trace: openTrace(t, arxivTrace, 20), Policies: []string{""}, Fleets: []Fleet{{Workers: 4}}})
	if out := tableOf(t, res, report.Comparison{}); strings.Contains(out, "belief") {
		t.Errorf("approximate sweep: the table mentions belief:\n%s", out)
	}
}

// A precise sweep repeats byte for byte (scripts/replay-repeat-under-load.sh
// checks the default's the same way).
func TestSweepPrecisePerRequestRepeats(t *testing.T) {
	tr := openTrace(t, arxivTrace, 300)
	var sums [2]string
	for i := range sums {
		var buf bytes.Buffer
		runSweep(t, &Sweep{Trace: tr, Policies: []string{""}, Fleets: []Fleet{{Workers: 4}},
			Modes: []PrefixMode{PrefixPrecise}, KVEventDelay: DefaultKVEventDelay, PerRequest: &buf})
		if buf.Len() == 0 {
			t.Fatal("no per-request lines")
		}
		sums[i] = buf.String()
	}
	if sums[0] != sums[1] {
		t.Fatal("two precise sweeps wrote different per-request lines")
	}
}

// A sweep over fleet sizes crossed with two policies and two seeds gives
// one row per (policy, fleet), each the median of its seeds, with the
// baseline's delta, the SLO's goodput, and the columns chosen; the
// reports hold every run with its fleet and seed.
func TestSweepSeedsBaselineSLO(t *testing.T) {
	slo, err := report.ParseSLO("ttft=2s,tpot=40ms")
	if err != nil {
		t.Fatal(err)
	}
	columns, err := report.ParseColumns("ttft_p90,goodput,itl_p99")
	if err != nil {
		t.Fatal(err)
	}
	goodput, _ := report.MetricByName("goodput")
	s := &Sweep{Trace: openTrace(t, arxivTrace, 300), Policies: []string{rrPolicy, kvAffinity},
		Fleets: []Fleet{{Workers: 2}, {Workers: 4}}, Seeds: 2, SLO: slo}
	var labels []string
	s.StartRun = func(i int, label string) {
		if i != len(labels) {
			t.Errorf("run %d started as run %d", len(labels), i)
		}
		labels = append(labels, label)
	}
	res := runSweep(t, s)
	if want := []string{"round-robin on 2 workers seed +0", "round-robin on 2 workers seed +1", "kv-affinity on 2 workers seed +0", "kv-affinity on 2 workers seed +1",
		"round-robin on 4 workers seed +0", "round-robin on 4 workers seed +1", "kv-affinity on 4 workers seed +0", "kv-affinity on 4 workers seed +1"}; !slices.Equal(labels, want) {
		t.Errorf("runs %q, want %q", labels, want)
	}
	out := tableOf(t, res, report.Comparison{Columns: columns, Baseline: "round-robin", BaselineMetric: goodput, GoodputTarget: 50})
	lines := strings.Split(out, "\n")
	fields := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	if got, want := fields(lines[0]), "policy workers TTFT p90 goodput ITL p99 Δ goodput"; got != want {
		t.Errorf("columns %q, want %q", got, want)
	}
	for i, prefix := range []string{"round-robin 2 ", "kv-affinity 2 ", "round-robin 4 ", "kv-affinity 4 "} {
		if !strings.HasPrefix(fields(lines[1+i]), prefix) {
			t.Errorf("row %d %q, want it to start %q", i, lines[1+i], prefix)
		}
	}
	if !strings.Contains(out, "\nsmallest fleet with goodput >= 50.0%: round-robin ") {
		t.Errorf("no verdict line for the goodput target:\n%s", out)
	}
	if !strings.HasSuffix(fields(lines[1]), " base") || strings.HasSuffix(fields(lines[2]), " base") {
		t.Errorf("baseline rows:\n%s\n%s", lines[1], lines[2])
	}
	var runs []struct {
		Policy  string `json:"policy"`
		Workers int    `json:"workers"`
		Seed    *int64 `json:"seed"`
		Goodput *struct {
			SLO  string  `json:"slo"`
			Met  int     `json:"met"`
			PerS float64 `json:"per_s"`
		} `json:"goodput"`
		ITL struct {
			P99 float64 `json:"p99"`
		} `json:"itl_ms"`
	}
	if err := json.Unmarshal(reportJSON(t, res.Reports), &runs); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 8 || len(res.Cells) != 4 {
		t.Fatalf("%d runs in %d cells, want 2 policies x 2 fleets x 2 seeds in 4 cells", len(runs), len(res.Cells))
	}
	// round-robin.hcl sets no router.seed (replay's default is 1),
	// kv-affinity.hcl sets 7: the runs add 0 and 1.
	for i, r := range runs {
		wantWorkers := []int{2, 4}[i/4]
		wantSeed := int64([]int{1, 7}[i/2%2] + i%2)
		if r.Workers != wantWorkers || r.Seed == nil || *r.Seed != wantSeed || r.Goodput == nil ||
			r.Goodput.SLO != "ttft=2s,tpot=40ms" || r.ITL.P99 <= 0 {
			t.Errorf("run %d: %s on %d workers, seed %v, goodput %+v, ITL p99 %v; want %d workers, seed %d, goodput under the SLO, a positive ITL",
				i, r.Policy, r.Workers, r.Seed, r.Goodput, r.ITL.P99, wantWorkers, wantSeed)
		}
	}
}

// Router replicas with two sync delays sweep the delays, crossed with the
// policies and fleets: one row per (fleet, policy, delay), each labelled
// NAME/N@D, and the reports name the replicas and the delay of every run.
func TestSweepReplicas(t *testing.T) {
	columns, err := report.ParseColumns("kv_hit,ttft_p90")
	if err != nil {
		t.Fatal(err)
	}
	ttft, _ := report.MetricByName("ttft_p90")
	res := runSweep(t, &Sweep{Trace: openTrace(t, arxivTrace, 200), Policies: []string{rrPolicy, kvAffinity},
		Fleets: []Fleet{{Workers: 2}, {Workers: 4}}, Replicas: 3, Delays: []time.Duration{0, time.Second}})
	out := tableOf(t, res, report.Comparison{Columns: columns, Baseline: "round-robin", BaselineMetric: ttft})
	lines := strings.Split(out, "\n")
	fields := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	labels := []string{"round-robin/3@0s 2 ", "round-robin/3@1s 2 ", "kv-affinity/3@0s 2 ", "kv-affinity/3@1s 2 ",
		"round-robin/3@0s 4 ", "round-robin/3@1s 4 ", "kv-affinity/3@0s 4 ", "kv-affinity/3@1s 4 "}
	for i, prefix := range labels {
		row := fields(lines[1+i])
		if !strings.HasPrefix(row, prefix) {
			t.Errorf("row %d %q, want it to start %q", i, lines[1+i], prefix)
		}
		// Each row's baseline is round-robin's with the same fleet and delay.
		if base := strings.HasSuffix(row, " base"); base != strings.HasPrefix(row, "round-robin") {
			t.Errorf("row %d %q: baseline mark %v", i, row, base)
		}
	}
	if !strings.Contains(out, "\nNAME/N@D = routed by N router replicas") {
		t.Errorf("no legend for the replicas' labels:\n%s", out)
	}
	if len(res.Reports) != 8 {
		t.Fatalf("%d runs, want 2 fleets x 2 policies x 2 delays", len(res.Reports))
	}
	for i, r := range res.Reports {
		if r.Sync == nil || r.Sync.Replicas != 3 || r.Sync.DelayMs != []float64{0, 1000}[i%2] || r.Sync.Mirrored != 400 {
			t.Errorf("run %d (%s): sync %+v, want 3 replicas, delay %v ms, 400 mirrored bookings", i, r.Policy, r.Sync, []float64{0, 1000}[i%2])
		}
	}
}

// Each replica loads the policy file itself, so its components are its
// own: with two replicas of round-robin that sync late, requests 0, 2, 4
// (replica 0) and 1, 3, 5 (replica 1) each go round the two workers from
// worker 0, and every worker gets one request of each replica.
func TestSweepReplicasOwnPolicies(t *testing.T) {
	var buf bytes.Buffer
	runSweep(t, &Sweep{Trace: openTrace(t, arxivTrace, 6), Policies: []string{rrPolicy}, Fleets: []Fleet{{Workers: 2}},
		Replicas: 2, Delays: []time.Duration{time.Hour}, PerRequest: &buf})
	var workers []int
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var line struct {
			Worker int `json:"worker"`
		}
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		workers = append(workers, line.Worker)
	}
	// Worker 0 of the comment is the lowest id: sim-1 (indexesByID).
	lo, hi := indexesByID("sim-", 0, 2)[0], indexesByID("sim-", 0, 2)[1]
	if got, want := workers, []int{lo, lo, hi, hi, lo, lo}; !slices.Equal(got, want) {
		t.Errorf("workers %v, want %v", got, want)
	}
}

// A broken policy file fails the sweep before any run, named, with its
// diagnostics on Warnings; an invalid sweep says what it lacks.
func TestSweepErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "p.hcl")
	if err := os.WriteFile(bad, []byte("policy {"), 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings strings.Builder
	started := 0
	s := &Sweep{Trace: openTrace(t, arxivTrace, 10), Policies: []string{rrPolicy, bad}, Fleets: []Fleet{{Workers: 2}},
		Warnings: &warnings, StartRun: func(int, string) { started++ }, Load: sweepLoad}
	_, err := s.Run(context.Background())
	if !errors.Is(err, errNotLoaded) || !strings.HasPrefix(err.Error(), bad+": ") || !strings.Contains(warnings.String(), "p.hcl:1:") || started != 0 {
		t.Errorf("error %v, warnings %q, %d runs started; want %s named, its diagnostics, no run", err, warnings.String(), started, bad)
	}
	for _, tt := range []struct {
		s    Sweep
		want string
	}{
		{Sweep{Policies: []string{""}, Fleets: []Fleet{{Workers: 1}}, Load: sweepLoad}, "replay sweep: no trace"},
		{Sweep{Trace: s.Trace, Policies: []string{""}, Fleets: []Fleet{{Workers: 1}}}, "replay sweep: no Load function"},
		{Sweep{Trace: s.Trace, Fleets: []Fleet{{Workers: 1}}, Load: sweepLoad}, "replay sweep: no policy file"},
		{Sweep{Trace: s.Trace, Policies: []string{""}, Load: sweepLoad}, "replay sweep: no fleet"},
		{Sweep{Trace: s.Trace, Policies: []string{""}, Fleets: []Fleet{{Workers: 1}, {Prefill: 1, Decode: 1}}, Load: sweepLoad},
			"replay sweep: fleets 1 and 1 prefill + 1 decode: want all aggregated or all disaggregated"},
	} {
		if _, err := tt.s.Run(context.Background()); err == nil || err.Error() != tt.want {
			t.Errorf("%v, want %q", err, tt.want)
		}
	}
}

// A disaggregated sweep routes every request to a prefill and a decode
// worker, and the report counts both pools.
func TestSweepDisaggregated(t *testing.T) {
	seed := int64(3)
	var perReq bytes.Buffer
	res := runSweep(t, &Sweep{Trace: openTrace(t, arxivTrace, 200), Policies: []string{""}, Fleets: []Fleet{{Prefill: 2, Decode: 3}},
		Seed: &seed, PerRequest: &perReq})
	if out := tableOf(t, res, report.Comparison{}); !strings.Contains(out, "default(2P+3D)") {
		t.Errorf("table lacks %q:\n%s", "default(2P+3D)", out)
	}
	b := reportJSON(t, res.Reports[0])
	var rep struct {
		Workers           int   `json:"workers"`
		PrefillWorkers    int   `json:"prefill_workers"`
		DecodeWorkers     int   `json:"decode_workers"`
		Completed         int   `json:"completed"`
		RequestsPerWorker []int `json:"requests_per_worker"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Workers != 5 || rep.PrefillWorkers != 2 || rep.DecodeWorkers != 3 || rep.Completed != 200 || len(rep.RequestsPerWorker) != 5 {
		t.Fatalf("report %s", b)
	}
	if n := bytes.Count(perReq.Bytes(), []byte(`"decode_worker":`)); n != 200 {
		t.Errorf("%d per-request lines name a decode worker, want 200", n)
	}
}
