package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// TestPluginsCheckExamples: the template and both example plugins pass
// every check (the disaggregated one for the prefill role, each with its
// required parameters given by --config), and every check they run is
// listed.
func TestPluginsCheckExamples(t *testing.T) {
	for _, tc := range []struct {
		bin   string
		flags []string
		want  []string
	}{
		{"plugin-example", nil, []string{
			"PASS handshake (1 component types)", "PASS schema",
			`PASS configure "queue-depth"`, `PASS configure "queue-depth" wrong type`,
			`PASS decide "queue-depth" rows=1`, `PASS decide "queue-depth" rows=8`, `PASS decide "queue-depth" rows=4096`,
			`PASS decide "queue-depth" concurrent=32 (calls of 1 to 32 rows at once)`,
			"PASS health",
		}},
		{"disagg-filter-score-pick", []string{"--role", "prefill", "--config", "min_device_overlap_blocks=0"}, []string{
			"PASS handshake (4 component types)", "PASS schema",
			`PASS configure "min-overlap"`, `PASS configure "min-overlap" wrong type`,
			`PASS decide "min-overlap" rows=1`, `PASS decide "min-overlap" rows=8`, `PASS decide "min-overlap" rows=4096`,
			`PASS configure "prefill-cost"`, `PASS decide "prefill-cost" rows=4096`,
			`PASS configure "decode-cost"`, `PASS decide "decode-cost" rows=4096`,
			`PASS configure "lowest-cost"`, `PASS decide "lowest-cost" rows=1`, `PASS decide "lowest-cost" rows=4096`,
			`PASS decide "min-overlap" concurrent=32 (calls of 1 to 32 rows at once)`,
			`PASS decide "prefill-cost" concurrent=32 (calls of 1 to 32 rows at once)`,
			`PASS decide "lowest-cost" concurrent=32 (calls of 1 to 32 rows at once)`,
			"PASS health",
		}},
		{"soft-pin-repin", []string{"--config", "max_active_requests=4"}, []string{
			"PASS handshake (2 component types)", "PASS schema",
			`PASS configure "soft-pin"`, `PASS configure "soft-pin" wrong type`, `PASS decide "soft-pin" rows=4096`,
			`PASS configure "sticky-session"`, `PASS decide "sticky-session" (not checked: a classifier makes no decision)`,
			"PASS health",
		}},
	} {
		t.Run(tc.bin, func(t *testing.T) {
			args := append([]string{"plugins", "check", examplePlugin(t, tc.bin)}, tc.flags...)
			code, out, errOut := routerRun(t, args...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			for _, l := range lines {
				if !strings.HasPrefix(l, "PASS ") {
					t.Errorf("line %q is not a PASS", l)
				}
			}
			for _, w := range append(tc.want, "PASS stdout (as relayed by go-plugin's stdio service)") {
				if !strings.Contains(out, w+"\n") {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if !shutdownPass.MatchString(out) {
				t.Errorf("output lacks a passed shutdown check:\n%s", out)
			}
		})
	}
}

// shutdownPass is the line of a passed shutdown check.
var shutdownPass = regexp.MustCompile(`(?m)^PASS shutdown \(exited [0-9.]+[µm]?s after the stop began\)$`)

// TestPluginsCheckFailures: a broken plugin (modes of the supervisor's
// test plugin) or a missing required parameter fails with a named check
// saying what was expected and what came back, and exit status 1.
func TestPluginsCheckFailures(t *testing.T) {
	faulty := examplePlugin(t, "faulty")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"stdout before the handshake", []string{faulty, "--env", "SY_TEST_MODE=stdout"}, []string{
			`FAIL handshake: expected the handshake line, then a usable Describe answer, got plugin "faulty": handshake failed: the plugin printed "hello from the plugin" on stdout`,
		}},
		{"bad schema", []string{faulty, "--env", "SY_TEST_MODE=badschema"}, []string{
			`FAIL schema type "t-max-active": expected a doc, got none`,
			`FAIL schema type "t-max-active" parameter "max": expected parameter names unique within the type, got a second parameter of that name`,
			`FAIL schema type "t-max-active" parameter "bad name": expected a name of letters, digits, '_' and '-', not starting with a digit, got "bad name"`,
			"PASS health",
		}},
		{"decide error", []string{faulty, "--env", "SY_TEST_MODE=fail", "--env", "SY_FAIL=ok,error", "--type", "t-active"}, []string{
			`PASS decide "t-active" rows=1`,
			`FAIL decide "t-active" rows=8: expected a well-formed answer, got plugin "faulty": plugin decide: scorer "check/t-active": injected error on call 2`,
			`PASS decide "t-active" rows=4096`,
		}},
		{"stdout after the handshake", []string{faulty, "--env", "SY_TEST_MODE=stdout-after", "--type", "t-max-active"}, []string{
			`PASS health`,
			`FAIL stdout: expected nothing on stdout after the handshake (log to stderr), got 24 bytes, starting "configured t-max-active\n"`,
		}},
		{"no exit at shutdown", []string{faulty, "--env", "SY_TEST_MODE=linger", "--type", "t-lowest"}, []string{
			`PASS decide "t-lowest" rows=4096`,
			`FAIL shutdown: expected an exit within 1.5s of plugin.GRPCController/Shutdown, got still running after 1.5s; its process group was killed`,
			"PASS stdout",
		}},
		{"required parameter", []string{examplePlugin(t, "soft-pin-repin")}, []string{
			`FAIL configure "soft-pin": expected a value for required parameter "max_active_requests", got none (give --config max_active_requests=VALUE)`,
			`PASS configure "sticky-session"`,
		}},
		{"role refused", []string{examplePlugin(t, "disagg-filter-score-pick"), "--type", "lowest-cost"}, []string{
			`FAIL configure "lowest-cost": expected the instance configured with its defaults, got lowest-cost: role not supported: configured for "aggregated"`,
		}},
		{"unknown type", []string{faulty, "--type", "nope"}, []string{
			`FAIL type nope: expected a type the plugin declares, got "t-max-active", "t-active", "t-lowest"`,
		}},
		{"config for no type", []string{faulty, "--config", "nope=1"}, []string{
			`FAIL config nope: expected a parameter of a checked type, got no checked type declares "nope"`,
		}},
		{"config of the wrong type", []string{faulty, "--type", "t-max-active", "--config", "max=lots"}, []string{
			`FAIL configure "t-max-active": expected --config max=VALUE a int, got "lots": strconv.ParseInt: parsing "lots": invalid syntax`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := routerRun(t, append([]string{"plugins", "check"}, tc.args...)...)
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestPluginsCheckJSON: --json prints one object whose checks say which
// failed, with what was expected and what came back.
func TestPluginsCheckJSON(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=badschema", "--type", "t-lowest", "--json")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var got struct{ Checks []checkResult }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var failed []checkResult
	passed := map[string]bool{}
	for _, c := range got.Checks {
		if c.Pass {
			passed[c.Name] = true
		} else {
			failed = append(failed, c)
		}
	}
	if len(failed) != 3 || failed[0] != (checkResult{Name: `schema type "t-max-active"`, Expected: "a doc", Got: "none"}) {
		t.Errorf("failed checks %+v, want the 3 schema problems, first the missing doc", failed)
	}
	for _, name := range []string{"handshake", `configure "t-lowest"`, `decide "t-lowest" rows=4096`, "health", "shutdown", "stdout"} {
		if !passed[name] {
			t.Errorf("check %q did not pass: %s", name, out)
		}
	}
}

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

func TestCheckDecideAnswers(t *testing.T) {
	ctx := context.Background()
	got := checkDecide(ctx, shared.TypeInfo{Name: "nan", Kind: shared.KindScorer}, nanScorer{}, shared.RoleAggregated)
	if want := (checkResult{Name: `decide "nan" rows=4096`, Expected: "finite costs", Got: "cost NaN for row 4095"}); len(got) != 4 || got[2] != want {
		t.Errorf("NaN scorer: %+v, want 4 results, the third %+v", got, want)
	}
	if want := (checkResult{Name: `decide "nan" concurrent=32`, Expected: "finite costs for the call of 1 rows", Got: "cost NaN for row 0"}); got[3] != want {
		t.Errorf("NaN scorer, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 1}, shared.RoleAggregated)
	if want := (checkResult{Name: `decide "p" rows=1`, Expected: "a picked row in [0, 1)", Got: "1"}); len(got) != 4 || got[0] != want || !got[1].Pass || !got[2].Pass {
		t.Errorf("picker of row 1: %+v, want %+v then two passes", got, want)
	}
	if want := (checkResult{Name: `decide "p" concurrent=32`, Expected: "a picked row in [0, 1) for the call of 1 rows", Got: "1"}); got[3] != want {
		t.Errorf("picker of row 1, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 0}, shared.RoleAggregated)
	if want := (checkResult{Name: `decide "p" concurrent=32`, Pass: true, Note: "calls of 1 to 32 rows at once"}); len(got) != 4 || got[3] != want {
		t.Errorf("picker of row 0: %+v, want the last %+v", got, want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: -1}, shared.RoleAggregated)
	if want := (checkResult{Name: `decide "p" rows=8`, Expected: "a picked row in [0, 8)", Got: "-1"}); got[1] != want {
		t.Errorf("picker of row -1: %+v, want %+v", got, want)
	}
	f := &idFilter{}
	got = checkDecide(ctx, shared.TypeInfo{Name: "f", Kind: shared.KindFilter}, f, shared.RoleAggregated)
	if want := (checkResult{Name: `decide "f" rows=8`, Expected: "a well-formed answer", Got: "kept rows not ascending"}); got[1] != want || !got[0].Pass || !got[2].Pass {
		t.Errorf("filter: %+v, want the rows=8 failure %+v", got, want)
	}
	if want := (checkResult{Name: `decide "f" concurrent=32`, Expected: "a well-formed answer for the call of 8 rows", Got: "kept rows not ascending"}); got[3] != want {
		t.Errorf("filter, concurrent: %+v, want %+v", got[3], want)
	}
	if want := 1 + 8 + 4096 + 32*33/2; len(f.ids) != want {
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
	want := []checkResult{
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
