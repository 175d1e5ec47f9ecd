package plugincheck

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// The answers the Go SDK never sends (it refuses them in the plugin) are
// checked too, for plugins written without it: fake components stand in
// for the plugin's instances.
type nanScorer struct{}

func (nanScorer) Inputs() shared.Inputs { return 0 }
func (nanScorer) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	costs[c.Len()-1] = math.NaN()
	return nil
}

type rowPicker struct{ row int }

func (rowPicker) Inputs() shared.Inputs { return 0 }
func (p rowPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return p.row, nil
}

type idFilter struct {
	mu  sync.Mutex
	ids []shared.WorkerID
}

func (*idFilter) Inputs() shared.Inputs { return 0 }
func (f *idFilter) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	f.mu.Lock()
	f.ids = append(f.ids, c.IDs...)
	f.mu.Unlock()
	if c.Len() == 8 {
		return errors.New("kept rows not ascending")
	}
	return nil
}

// accepts and fellBack are what a decide check says of an answer the
// router would not accept: what routing would do with it.
const (
	accepts  = "an answer the router accepts"
	fellBack = "the router would fall back on this decision because "
)

func TestCheckDecideAnswers(t *testing.T) {
	ctx := context.Background()
	got := checkDecide(ctx, shared.TypeInfo{Name: "nan", Kind: shared.KindScorer}, nanScorer{}, shared.RoleAggregated)
	if want := (Result{Name: `decide "nan" rows=4096`, Expected: accepts, Got: fellBack + "scorer nan wrote non-finite cost NaN at row 4095"}); len(got) != 4 || got[2] != want {
		t.Errorf("NaN scorer: %+v, want 4 results, the third %+v", got, want)
	}
	if want := (Result{Name: `decide "nan" concurrent=32`, Expected: accepts + " for the call of 1 rows", Got: fellBack + "scorer nan wrote non-finite cost NaN at row 0"}); got[3] != want {
		t.Errorf("NaN scorer, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 1}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" rows=1`, Expected: accepts, Got: fellBack + "picker \"p\": row 1 out of range [0, 1)"}); len(got) != 4 || got[0] != want || !got[1].Pass || !got[2].Pass {
		t.Errorf("picker of row 1: %+v, want %+v then two passes", got, want)
	}
	if want := (Result{Name: `decide "p" concurrent=32`, Expected: accepts + " for the call of 1 rows", Got: fellBack + "picker \"p\": row 1 out of range [0, 1)"}); got[3] != want {
		t.Errorf("picker of row 1, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 0}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" concurrent=32`, Pass: true, Note: "calls of 1 to 32 rows at once"}); len(got) != 4 || got[3] != want {
		t.Errorf("picker of row 0: %+v, want the last %+v", got, want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: -1}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" rows=8`, Expected: accepts, Got: fellBack + "picker \"p\": row -1 out of range [0, 8)"}); got[1] != want {
		t.Errorf("picker of row -1: %+v, want %+v", got, want)
	}
	f := &idFilter{}
	got = checkDecide(ctx, shared.TypeInfo{Name: "f", Kind: shared.KindFilter}, f, shared.RoleAggregated)
	if want := (Result{Name: `decide "f" rows=8`, Expected: accepts, Got: fellBack + "filter \"f\": kept rows not ascending"}); got[1] != want || !got[0].Pass || !got[2].Pass {
		t.Errorf("filter: %+v, want the rows=8 failure %+v", got, want)
	}
	if want := (Result{Name: `decide "f" concurrent=32`, Expected: accepts + " for the call of 8 rows", Got: fellBack + "filter \"f\": kept rows not ascending"}); got[3] != want {
		t.Errorf("filter, concurrent: %+v, want %+v", got[3], want)
	}
	// The failing call of 8 rows is made again, then with every column
	// set, to tell whether an undeclared column is what it missed.
	if want := 1 + 8 + 8 + 8 + 4096 + 32*33/2; len(f.ids) != want {
		t.Fatalf("filter saw %d rows, want %d", len(f.ids), want)
	}
	for i, id := range f.ids {
		if uint64(id) <= 1<<53 {
			t.Fatalf("row %d: id %d not above 2^53", i, id)
		}
	}
}

func TestCheckSchemaDefaults(t *testing.T) {
	got := checkSchema([]shared.TypeInfo{{Name: "t", Doc: "d", Params: []shared.ParamSpec{
		{Name: "n", Type: shared.Number, Default: 1.5, Doc: "ok"},
		{Name: "d", Type: shared.Duration, Default: int64(5), Doc: "int, not a duration"},
		{Name: "9lives", Type: shared.Bool, Default: time.Second, Doc: "bad name, bad default"},
	}}, {Name: "t", Doc: "again"}})
	want := []Result{
		{Name: `schema type "t" parameter "d"`, Expected: "a default of the declared type duration", Got: "int64 5"},
		{Name: `schema type "t" parameter "9lives"`, Expected: "a name of letters, digits, '_' and '-', not starting with a digit", Got: `"9lives"`},
		{Name: `schema type "t" parameter "9lives"`, Expected: "a default of the declared type bool", Got: "time.Duration 1s"},
		{Name: `schema type "t"`, Expected: "type names unique", Got: "a second type of that name"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := checkSchema([]shared.TypeInfo{{Name: "ok-type_1", Doc: "d"}}); len(got) != 1 || !got[0].Pass {
		t.Errorf("a valid schema: %+v", got)
	}
}

// TestCheckSchemaReservedParams: a parameter the policy file's block takes
// for itself ("type"; "weight" in a scorer) and a non-finite NUMBER default
// fail, as the router refuses such a plugin; "weight" in a filter passes.
func TestCheckSchemaReservedParams(t *testing.T) {
	got := checkSchema([]shared.TypeInfo{
		{Name: "s", Kind: shared.KindScorer, Doc: "d", Params: []shared.ParamSpec{
			{Name: "weight", Type: shared.Number, Default: 1.0, Doc: "w"},
			{Name: "type", Type: shared.String, Doc: "t"},
			{Name: "inf", Type: shared.Number, Default: math.Inf(1), Doc: "i"},
		}},
		{Name: "f", Kind: shared.KindFilter, Doc: "d", Params: []shared.ParamSpec{
			{Name: "weight", Type: shared.Number, Default: math.NaN(), Doc: "w"},
		}},
	})
	const refused = ": the router refuses the plugin (Invalid plugin type)"
	want := []Result{
		{Name: `schema type "s" parameter "weight"`, Expected: "a name the policy file's block does not take for itself",
			Got: `parameter "weight": reserved parameter name: a scorer block's "weight" attribute is the block's own, so the parameter could never be set` + refused},
		{Name: `schema type "s" parameter "type"`, Expected: "a name the policy file's block does not take for itself",
			Got: `parameter "type": reserved parameter name: a scorer block's "type" attribute is the block's own, so the parameter could never be set` + refused},
		{Name: `schema type "s" parameter "inf"`, Expected: "a finite default", Got: `parameter "inf": non-finite default +Inf: a NUMBER default must be finite` + refused},
		{Name: `schema type "f" parameter "weight"`, Expected: "a finite default", Got: `parameter "weight": non-finite default NaN: a NUMBER default must be finite` + refused},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestCheckSchemaTypeNames: type names follow the policy loader's rule
// (catalog.ValidName), and a built-in type's name fails.
func TestCheckSchemaTypeNames(t *testing.T) {
	for _, name := range []string{"my.type", "9abc", "ok-type_1"} {
		if got := checkSchema([]shared.TypeInfo{{Name: name, Doc: "d"}}); len(got) != 1 || !got[0].Pass {
			t.Errorf("type %q: %+v, want a pass", name, got)
		}
	}
	for name, want := range map[string]Result{
		"default":  {Name: `schema type "default"`, Expected: typeNameRule, Got: `name "default" is reserved`},
		"a b":      {Name: `schema type "a b"`, Expected: typeNameRule, Got: `invalid name: use letters, digits, '_', '.' and '-': "a b"`},
		"":         {Name: `schema type ""`, Expected: typeNameRule, Got: "empty type name"},
		"kv-cost":  {Name: `schema type "kv-cost"`, Expected: "a name no built-in type has", Got: "the name of the built-in scorer type: the router refuses the plugin (Duplicate component type)"},
		"min-cost": {Name: `schema type "min-cost"`, Expected: "a name no built-in type has", Got: "the name of the built-in picker type: the router refuses the plugin (Duplicate component type)"},
	} {
		if got := checkSchema([]shared.TypeInfo{{Name: name, Doc: "d"}}); len(got) != 1 || got[0] != want {
			t.Errorf("type %q: %+v, want %+v", name, got, want)
		}
	}
}

// buildFaulty builds the supervisor tests' plugin into a temporary
// directory.
func buildFaulty(t *testing.T) string {
	t.Helper()
	return testkit.Build(t, "../supervisor/testdata/plugin")
}

// TestBatchMissingAnswer: a plugin that never answers one task of the
// batch fails the batch check, naming the task, once answerWait (10 s
// here, 30 s in use) passed; the other checks pass.
func TestBatchMissingAnswer(t *testing.T) {
	old := answerWait
	answerWait = 10 * time.Second
	t.Cleanup(func() { answerWait = old })
	results := Run(context.Background(), Options{
		Plugin: config.Plugin{Name: "faulty", Command: buildFaulty(t), Env: map[string]string{"SY_TEST_MODE": "decide-drop"}},
		Type:   "t-lowest",
	})
	var failed []Result
	for _, r := range results {
		if !r.Pass {
			failed = append(failed, r)
		}
	}
	// The dropped task comes first in the batch, so it is named first
	// whatever else a starved machine made late.
	const got = "no result for task 4611686018427387905: no result within 10s"
	if len(failed) != 1 || failed[0].Name != "decide batch" || failed[0].Expected != oneResultPerTask || !strings.HasPrefix(failed[0].Got, got) {
		t.Errorf("failed checks %+v, want only the decide batch, got %q", failed, got)
	}
}

// TestLatencyWarning: times over the call timeout make a warning naming
// them; one past the stall timeout says the router would kill the plugin.
func TestLatencyWarning(t *testing.T) {
	ms := time.Millisecond
	stats := []latencyStats{{rows: 8, p50: ms, p99: 2 * ms, max: 30 * ms}, {rows: 64, p50: ms, p99: 25 * ms, max: 26 * ms}}
	if w := latencyWarning(5*ms, stats, 20*ms, 0); !strings.HasPrefix(w, "rows=8 max 30.00ms, rows=64 p99 25.00ms over call_timeout 20ms: ") ||
		strings.Contains(w, "killed as stuck") {
		t.Errorf("warning %q", w)
	}
	if w := latencyWarning(5*ms, stats, 40*ms, 0); w != "" {
		t.Errorf("all under the timeout: warning %q", w)
	}
	if w := latencyWarning(5*ms, stats, 40*ms, 50*ms); !strings.HasPrefix(w, "the declared p99 (expected_decide_p99_nanos) 50.00ms over call_timeout 40ms: ") {
		t.Errorf("declared p99 over the timeout: warning %q", w)
	}
	load := append(stats, latencyStats{rows: 64, load: true, p50: ms, p99: 45 * ms, max: 46 * ms})
	if w := latencyWarning(5*ms, load, 40*ms, 0); !strings.HasPrefix(w, "rows=64 x16 at once p99 45.00ms over call_timeout 40ms: ") {
		t.Errorf("p99 under load over the timeout: warning %q", w)
	}
	if w := latencyWarning(31*time.Second, stats, 40*ms, 0); !strings.HasPrefix(w, "cold 31000.00ms over call_timeout 40ms: ") ||
		!strings.HasSuffix(w, "; a call of 31000.00ms would get it killed as stuck") {
		t.Errorf("a 31s cold call: warning %q", w)
	}
}

// TestHealthWarning: a health check slower than the probe's deadline is a
// warning naming the frozen rule; one within it is none.
func TestHealthWarning(t *testing.T) {
	if w := healthWarning(2 * time.Second); w != "" {
		t.Errorf("2s: warning %q", w)
	}
	want := "a check took 2500.00ms, over the 2s the router's probe gives one: 5 such in a row and the router kills the plugin as frozen"
	if w := healthWarning(2500 * time.Millisecond); w != want {
		t.Errorf("2.5s: warning %q, want %q", w, want)
	}
}

// TestCheckResult: each way a DecideResult can be malformed for its task
// is named.
func TestCheckResult(t *testing.T) {
	f, s, p := shared.KindFilter, shared.KindScorer, shared.KindPicker
	const fb = fellBack + "invalid answer "
	for _, tc := range []struct {
		r    *pluginv1.DecideResult
		w    want
		want string
	}{
		{&pluginv1.DecideResult{Kept: []uint32{0, 2}, Picked: -1}, want{kind: f, n: 3}, ""},
		{&pluginv1.DecideResult{FilteredBy: "x", Picked: -1}, want{kind: f, instance: "x", n: 3}, ""},
		{&pluginv1.DecideResult{FilteredBy: "x", Kept: []uint32{1}, Picked: -1}, want{kind: f, instance: "x", n: 3}, fb + `(filtered_by): filtered_by "x" with 1 kept rows (filtered_by means no row was kept)`},
		{&pluginv1.DecideResult{FilteredBy: "y\x1b", Picked: -1}, want{kind: f, instance: "x", n: 3}, fb + `(filtered_by): filtered_by "y\x1b" names no filter of the task`},
		{&pluginv1.DecideResult{FilteredBy: "x", Picked: -1}, want{kind: s, instance: "x", n: 3}, fb + `(filtered_by): filtered_by "x" from a task without a filter`},
		{&pluginv1.DecideResult{Kept: []uint32{1}, Picked: 0}, want{kind: p, n: 2}, fb + "(kept_out_of_range): 1 kept rows of 2 from a task without a filter (send no kept rows, or every row)"},
		{&pluginv1.DecideResult{Kept: []uint32{2, 1}, Picked: -1}, want{kind: f, n: 3}, fb + "(kept_out_of_range): kept rows [2 1] not strictly ascending in [0, 3)"},
		{&pluginv1.DecideResult{Kept: []uint32{0, 3}, Picked: -1}, want{kind: f, n: 3}, fb + "(kept_out_of_range): kept rows [0 3] not strictly ascending in [0, 3)"},
		// Every row, ascending, from a scorer: the router accepts it (issue #29).
		{&pluginv1.DecideResult{Kept: []uint32{0}, Costs: []float64{1}, Picked: -1}, want{kind: s, n: 1}, ""},
		{&pluginv1.DecideResult{Kept: []uint32{0, 1, 2}, Costs: []float64{1, 2, 3}, Picked: -1}, want{kind: s, n: 3}, ""},
		{&pluginv1.DecideResult{Kept: []uint32{2, 1, 0}, Costs: []float64{1, 2, 3}, Picked: -1}, want{kind: s, n: 3}, fb + "(kept_out_of_range): kept rows [2 1 0] not strictly ascending in [0, 3)"},
		{&pluginv1.DecideResult{Costs: []float64{1, 2}, Picked: -1}, want{kind: s, n: 2}, ""},
		{&pluginv1.DecideResult{Costs: []float64{1}, Picked: -1}, want{kind: s, n: 2}, fb + "(row_count): 1 costs for 2 rows"},
		{&pluginv1.DecideResult{Costs: []float64{1, math.Inf(1)}, Picked: -1}, want{kind: s, n: 2}, fb + "(non_finite_cost): cost +Inf for row 1"},
		// What the router ignores is accepted.
		{&pluginv1.DecideResult{Costs: []float64{1, 2}}, want{kind: s, n: 2}, ""},
		{&pluginv1.DecideResult{Costs: []float64{1}, Picked: 0}, want{kind: p, n: 2}, ""},
		{&pluginv1.DecideResult{Picked: 1}, want{kind: p, n: 2}, ""},
		{&pluginv1.DecideResult{Picked: 2}, want{kind: p, n: 2}, fb + "(picked_out_of_range): picked row 2, not in [0, 2)"},
		{&pluginv1.DecideResult{Picked: -1}, want{kind: p, n: 2}, fb + "(picked_out_of_range): picked row -1, not in [0, 2)"},
		{&pluginv1.DecideResult{Error: "boom", Picked: -1}, want{kind: p, n: 2}, `the error "boom": the router would fall back on this decision`},
		{&pluginv1.DecideResult{Error: "\x1b[31m" + strings.Repeat("e", 1<<20), Picked: -1}, want{kind: p, n: 2}, `the error "\x1b[31m` + strings.Repeat("e", 256-len(`\x1b[31m`)) + `...(1048581 bytes)": the router would fall back on this decision`},
		{&pluginv1.DecideResult{Error: "unknown instance", Picked: -1}, want{n: 1, wantErr: true}, ""},
		{&pluginv1.DecideResult{Picked: 0}, want{n: 1, wantErr: true}, "no error for a task naming an instance never configured"},
	} {
		if got := checkResult(tc.r, tc.w); got != tc.want {
			t.Errorf("checkResult(%v, %+v) = %q, want %q", tc.r, tc.w, got, tc.want)
		}
	}
}

// TestCandidatesDeclaredOnly: the Decide checks' rows carry only the
// declared columns, as the router's pipeline allocates them, and every
// column with shared.AllInputs.
func TestCandidatesDeclaredOnly(t *testing.T) {
	c := candidates(5, shared.InputActiveRequests|shared.InputCapacity)
	if len(c.IDs) != 5 || len(c.ActiveRequests) != 5 || len(c.TotalKVBlocks) != 5 || len(c.Costs) != 5 {
		t.Fatalf("declared columns: %d ids, %d active, %d capacity, %d costs; want 5 each", len(c.IDs), len(c.ActiveRequests), len(c.TotalKVBlocks), len(c.Costs))
	}
	if c.Load != nil || c.OverlapBlocks != nil || c.DPRanks != nil {
		t.Fatalf("undeclared columns set: load %v, overlap %v, ranks %v", c.Load, c.OverlapBlocks, c.DPRanks)
	}
	if c.ActiveRequests[4] != 4 || c.TotalKVBlocks[4] != 10000 {
		t.Fatalf("row 4: active %d, capacity %d; want 4, 10000", c.ActiveRequests[4], c.TotalKVBlocks[4])
	}
	all := candidates(5, shared.AllInputs)
	if len(all.Load) != 5 || len(all.OverlapBlocks) != 5 || all.Load[4].Waiting != 1 {
		t.Fatalf("every column: %d load, %d overlap, waiting %v", len(all.Load), len(all.OverlapBlocks), all.Load)
	}
}
