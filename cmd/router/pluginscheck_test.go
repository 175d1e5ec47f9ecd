package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/plugincheck"
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
			`PASS configure "queue-depth" boundaries of "waiting_weight" (of 5 values 3 accepted, 2 refused naming it)`,
			"PASS decide batch (6 tasks in one DecideBatch, answered ",
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
			`PASS configure "min-overlap" boundaries of "min_device_overlap_blocks" (of 5 values 3 accepted, 2 refused naming it)`,
			"PASS decide batch (21 tasks in one DecideBatch, answered ",
			"PASS health",
		}},
		{"soft-pin-repin", []string{"--config", "max_active_requests=4"}, []string{
			"PASS handshake (2 component types)", "PASS schema",
			`PASS configure "soft-pin"`, `PASS configure "soft-pin" wrong type`, `PASS decide "soft-pin" rows=4096`,
			`PASS configure "sticky-session"`,
			`PASS configure "sticky-session" boundaries of "ttl" (of 5 values 2 accepted, 3 refused naming it)`,
			`PASS configure "sticky-session" boundaries of "max_sessions" (of 5 values 1 accepted, 4 refused naming it)`,
			`PASS classify "sticky-session" (19 calls, 16 at once)`,
			`PASS events "sticky-session" (3 batches acknowledged in order)`,
			`PASS events "sticky-session" events_through (waits for the events it names)`,
			"PASS decide batch (6 tasks in one DecideBatch, answered ",
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
				// A loaded machine may make a call slower than
				// call_timeout, or a health check than the probe's
				// deadline: a warning, never a failure.
				if !strings.HasPrefix(l, "PASS ") && !strings.HasPrefix(l, "WARNING latency ") && !strings.HasPrefix(l, "WARNING health: ") {
					t.Errorf("line %q is not a PASS", l)
				}
			}
			for _, w := range append(tc.want, "PASS stdout (as relayed by go-plugin's stdio service)",
				"PASS decide streams=4 (4 streams at once, 8 messages each)") {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, re := range []*regexp.Regexp{shutdownPass, parentDeathPass, latencyPass} {
				if !re.MatchString(out) {
					t.Errorf("output lacks a line matching %v:\n%s", re, out)
				}
			}
		})
	}
}

// shutdownPass is the line of a passed shutdown check.
var shutdownPass = regexp.MustCompile(`(?m)^PASS shutdown \(exited [0-9.]+[µm]?s after the stop began\)$`)

// parentDeathPass and latencyPass are lines of a passed parent-death and
// latency check.
var (
	parentDeathPass = regexp.MustCompile(`(?m)^PASS parent death \(gone, its socket directory removed, [0-9.]+m?s after its parent's SIGKILL\)$`)
	latencyPass     = regexp.MustCompile(`(?m)^PASS latency "[a-z-]+" \(cold [0-9.]+ms; rows=8 warm p50 [0-9.]+ms p99 [0-9.]+ms max [0-9.]+ms; rows=64 warm p50 [0-9.]+ms p99 [0-9.]+ms max [0-9.]+ms; rows=64 x16 at once warm p50 [0-9.]+ms p99 [0-9.]+ms max [0-9.]+ms\)$`)
)

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
			`FAIL handshake stdout: expected the handshake line first on stdout (log to stderr), got 1 lines before it, the first "hello from the plugin": ` +
				`the router would not start this plugin (it reads the first line as the handshake, and this one is not); the other checks ran with those lines skipped` + "\n",
			// The rest is checked.
			"PASS handshake (3 component types)", "PASS schema\n", `PASS decide "t-active" rows=4096`, "PASS decide batch", "PASS health (", "PASS parent death",
		}},
		{"bad schema", []string{faulty, "--env", "SY_TEST_MODE=badschema"}, []string{
			`FAIL schema type "t-max-active": expected a doc, got none`,
			`FAIL schema type "t-max-active" parameter "max": expected parameter names unique within the type, got a second parameter of that name`,
			`FAIL schema type "t-max-active" parameter "bad name": expected a name of letters, digits, '_' and '-', not starting with a digit, got "bad name"`,
			"PASS health",
		}},
		{"decide error", []string{faulty, "--env", "SY_TEST_MODE=fail", "--env", "SY_FAIL=ok,error,ok,ok", "--type", "t-active"}, []string{
			`PASS decide "t-active" rows=1`,
			// Call 3 makes the failed call again, and it passes: no
			// hint of an undeclared column.
			`FAIL decide "t-active" rows=8: expected an answer the router accepts, got the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: scorer "check/t-active": injected error on call 2` + "\n",
			`PASS decide "t-active" rows=4096`,
		}},
		{"reads a column it did not declare", []string{faulty, "--env", "SY_TEST_MODE=undeclared", "--type", "t-active"}, []string{
			`FAIL decide "t-active" rows=8: expected an answer the router accepts, got the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: scorer "check/t-active" panicked: runtime error: index out of range [0] with length 0 (sent only the columns it declared, ACTIVE_REQUESTS, as the router does; with every column set it answers well: it may be reading a column it did not declare)` + "\n",
			"PASS decide batch",
		}},
		{"stdout after the handshake", []string{faulty, "--env", "SY_TEST_MODE=stdout-after", "--type", "t-max-active"}, []string{
			`PASS health`,
			`FAIL stdout: expected nothing on stdout after the handshake (log to stderr), got 192 bytes, starting "configured t-max-active\nconfigured t-max-active\nconfigured t-max-active\nconfigur"`,
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
			`FAIL type nope: expected one of the types the plugin declares ("t-max-active", "t-active", "t-lowest"), got "nope"`,
		}},
		{"config for no type", []string{faulty, "--config", "nope=1"}, []string{
			`FAIL config nope: expected a parameter of a checked type, got no checked type declares "nope"`,
		}},
		{"boundary refused naming no parameter", []string{faulty, "--env", "SY_TEST_MODE=badbound", "--type", "t-max-active"}, []string{
			`FAIL configure "t-max-active" boundaries of "max": expected -1 accepted, or refused with a Diagnostic naming "max", got a refusal naming "": negative`,
			`PASS decide "t-max-active" rows=4096`,
		}},
		{"boundary crashes the plugin", []string{faulty, "--env", "SY_TEST_MODE=boundcrash", "--type", "t-max-active"}, []string{
			`PASS configure "t-max-active" inputs (ACTIVE_REQUESTS, a subset of its type's)`,
			`FAIL configure "t-max-active" boundaries of "max": expected -9223372036854775808 accepted, or refused with a Diagnostic naming "max", got the plugin exited (exit status 3)` + "\n",
			`SKIP decide "t-max-active": not run: the plugin exited (exit status 3)` + "\n",
			`SKIP latency "t-max-active": not run: the plugin exited (exit status 3)` + "\n",
			`SKIP decide batch: not run: the plugin exited (exit status 3)` + "\n",
			`SKIP health: not run: the plugin exited (exit status 3)` + "\n",
			`SKIP shutdown: not run: the plugin exited (exit status 3)` + "\n",
			"PASS stdout",
		}},
		{"crash in Configure", []string{faulty, "--env", "SY_TEST_MODE=crash", "--env", "SY_STARTS=" + startedOnce(t)}, []string{
			`FAIL configure "t-max-active": expected the instance configured with its defaults, got the plugin exited (exit status 3)` + "\n",
			`SKIP configure "t-active": not run: the plugin exited (exit status 3)` + "\n",
			`SKIP configure "t-lowest": not run: the plugin exited (exit status 3)` + "\n",
			`SKIP health: not run: the plugin exited (exit status 3)` + "\n",
		}},
		{"type names the loader refuses", []string{faulty, "--env", "SY_TEST_MODE=names", "--env", "SY_TYPE_NAMES=my.type,min-cost,default", "--type", "my.type"}, []string{
			`FAIL schema type "min-cost": expected a name no built-in type has, got the name of the built-in picker type: the router refuses the plugin (Duplicate component type)` + "\n",
			`FAIL schema type "default": expected a name of letters, digits, '_', '.' and '-', not "default", got name "default" is reserved` + "\n",
			`PASS configure "my.type"` + "\n",
		}},
		{"no types", []string{faulty, "--env", "SY_TEST_MODE=no-types"}, []string{
			"FAIL handshake: expected a Describe answer declaring at least one component type, got none: nothing to check\n",
		}},
		{"instance inputs beyond the type's", []string{faulty, "--env", "SY_TEST_MODE=extra-inputs", "--type", "t-lowest"}, []string{
			`FAIL configure "t-lowest" inputs: expected the instance's inputs a subset of its type's (none), got ACTIVE_REQUESTS|OCCUPANCY|LOAD|CACHE|CAPACITY|LABELS (0x3f), of which ACTIVE_REQUESTS|OCCUPANCY|LOAD|CACHE|CAPACITY|LABELS (0x3f) beyond its type's` + "\n",
		}},
		{"filtered_by with kept rows", []string{faulty, "--env", "SY_TEST_MODE=filtered-kept", "--type", "t-max-active"}, []string{
			`FAIL decide batch: expected exactly one well-formed result per task, matched by task_id, got for task 4611686018427387905 (4096 rows): the router would fall back on this decision because invalid answer (filtered_by): filtered_by "check/t-max-active" with 1 kept rows (filtered_by means no row was kept)` + "\n",
		}},
		{"config refused", []string{faulty, "--type", "t-active", "--config", "factor=-1"}, []string{
			`FAIL configure "t-active": expected the instance configured with its defaults and --config values, got parameter "factor": must be a finite number >= 0, got -1` + "\n",
		}},
		{"duplicate result", []string{faulty, "--env", "SY_TEST_MODE=decide-dup", "--type", "t-lowest"}, []string{
			`FAIL decide batch: expected exactly one well-formed result per task, matched by task_id, got a second result for task 4611686018427387905`,
			"PASS decide streams=4",
			"PASS parent death",
		}},
		{"result for a task not sent", []string{faulty, "--env", "SY_TEST_MODE=decide-extra", "--type", "t-active"}, []string{
			`FAIL decide batch: expected exactly one well-formed result per task, matched by task_id, got a result for task 7, which was not sent on this stream`,
		}},
		{"events_through not awaited", []string{faulty, "--env", "SY_TEST_MODE=nowait", "--type", "t-classify"}, []string{
			`PASS classify "t-classify" (19 calls, 16 at once)`,
			`PASS events "t-classify" (3 batches acknowledged in order)`,
			`FAIL events "t-classify" events_through: expected DEADLINE_EXCEEDED with events_through 5, never sent, got an answer`,
		}},
		{"config of the wrong type", []string{faulty, "--type", "t-max-active", "--config", "max=lots"}, []string{
			`FAIL configure "t-max-active": expected --config max=VALUE an int, got "lots": strconv.ParseInt: parsing "lots": invalid syntax`,
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

// TestPluginsCheckEscapesPluginText: a plugin whose answers are errors
// of 64 KiB starting with a terminal escape fails the decide checks, and
// what `plugins check` prints of them is escaped and bounded, as text and
// as JSON; a NaN cost fails them as the router's own check of an answer
// words it.
func TestPluginsCheckEscapesPluginText(t *testing.T) {
	faulty := examplePlugin(t, "faulty")
	for _, asJSON := range []bool{false, true} {
		args := []string{"plugins", "check", faulty, "--env", "SY_TEST_MODE=invalid", "--env", "SY_INVALID=error", "--env", "SY_INVALID_BYTES=65536", "--type", "t-active"}
		if asJSON {
			args = append(args, "--json")
		}
		code, out, errOut := routerRun(t, args...)
		if code != 1 {
			t.Fatalf("json %v: exit %d, want 1\nstdout:\n%.4000s\nstderr:\n%.4000s", asJSON, code, out, errOut)
		}
		if strings.Contains(out, "\x1b") {
			t.Errorf("json %v: the output holds a raw escape: %.2000q", asJSON, out)
		}
		want := `FAIL decide "t-active" rows=1: expected an answer the router accepts, got the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: \x1b[31mredeee`
		if asJSON {
			want = `"got": "the router would fall back on this decision because scorer \"t-active\": plugin \"faulty\": plugin decide: \\x1b[31mredeee`
		}
		if !strings.Contains(out, want) {
			t.Errorf("json %v: output lacks %q:\n%.4000s", asJSON, want, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if len(line) > 8<<10 {
				t.Errorf("json %v: a line of %d bytes: %.200q", asJSON, len(line), line)
			}
		}
	}
	code, out, errOut := routerRun(t, "plugins", "check", faulty, "--env", "SY_TEST_MODE=invalid", "--env", "SY_INVALID=nan", "--type", "t-active")
	want := `FAIL decide "t-active" rows=8: expected an answer the router accepts, got the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: invalid answer (non_finite_cost): cost NaN for row 0` + "\n"
	if code != 1 || !strings.Contains(out, want) {
		t.Errorf("a NaN cost: exit %d, want 1 and %q\nstdout:\n%s\nstderr:\n%s", code, want, out, errOut)
	}
}

// startedOnce returns a file holding one start line, as the faulty
// plugin's SY_STARTS after one start: its crash mode then crashes on
// every Configure.
func startedOnce(t *testing.T) string {
	t.Helper()
	return writeFile(t, "starts", "1 1\n")
}

// TestPluginsCheckDuplicateType: a type declared twice fails the schema
// check and is configured and decided once.
func TestPluginsCheckDuplicateType(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=dup-type")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if want := `FAIL schema type "t-classify": expected type names unique, got a second type of that name` + "\n"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	for _, line := range []string{`PASS configure "t-classify"` + "\n", `PASS classify "t-classify" (19 calls, 16 at once)` + "\n"} {
		if n := strings.Count(out, line); n != 1 {
			t.Errorf("%d lines %q, want 1:\n%s", n, line, out)
		}
	}
}

// TestPluginsCheckOrphan: a plugin that ignores its parent's death (no
// SIGTERM handling, no watch of its parent pid) fails the parent-death
// check, which then kills it and removes its socket directory.
func TestPluginsCheckOrphan(t *testing.T) {
	private := privateSocketDirs(t)
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=orphan", "--type", "t-lowest")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	re := regexp.MustCompile(`(?m)^FAIL parent death: expected the plugin gone and its socket directory removed within 10s of its parent's SIGKILL, got process ([0-9]+) still running, socket directory (/\S+) still there after 10s$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output lacks %v:\n%s", re, out)
	}
	if _, err := os.Stat(m[2]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket directory %s left behind: %v", m[2], err)
	}
	if !strings.HasPrefix(m[2], private+"/") {
		t.Errorf("socket directory %s outside the test's own %s", m[2], private)
	}
	pid, _ := strconv.Atoi(m[1])
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && !zombie(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin %d still running 30s after the check", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zombie reports whether pid has exited and awaits reaping.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(b, ')')
	return err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// TestPluginsCheckLatencyWarning: calls slower than --call-timeout (a
// scorer sleeping 5ms a call, against 1ns) pass with a warning saying
// what the router would do, and the exit status is 0.
func TestPluginsCheckLatencyWarning(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--type", "t-active", "--config", "delay=5ms", "--call-timeout", "1ns")
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	want := `WARNING latency "t-active": cold [0-9.]+ms, rows=8 p99 [0-9.]+ms, rows=64 p99 [0-9.]+ms, rows=64 x16 at once p99 [0-9.]+ms over call_timeout 1ns: ` +
		`the router answers each call over call_timeout by the policy's fallback, and 5 failed calls in a row open the plugin's circuit breaker; ` +
		`it kills the plugin only when frozen \(5 health checks in a row unanswered within 2s\) or stuck \(no Decide answer for 30s\); ` +
		`raise the plugin block's call_timeout above the p99 under load \(docs/plugin-protocol.md, "Deadlines by language"\)\n`
	if !latencyPass.MatchString(out) || !regexp.MustCompile(`(?m)^`+want).MatchString(out) {
		t.Errorf("output lacks the latency line and %q:\n%s", want, out)
	}
}

// TestPluginsCheckJSON: --json prints one object whose checks say which
// failed, with what was expected and what came back.
func TestPluginsCheckJSON(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=badschema", "--type", "t-lowest", "--json")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var got struct{ Checks []plugincheck.Result }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var failed []plugincheck.Result
	passed := map[string]bool{}
	for _, c := range got.Checks {
		if c.Pass {
			passed[c.Name] = true
		} else {
			failed = append(failed, c)
		}
	}
	if len(failed) != 3 || failed[0] != (plugincheck.Result{Name: `schema type "t-max-active"`, Expected: "a doc", Got: "none"}) {
		t.Errorf("failed checks %+v, want the 3 schema problems, first the missing doc", failed)
	}
	for _, name := range []string{"handshake", `configure "t-lowest"`, `decide "t-lowest" rows=4096`, "health", "shutdown", "stdout"} {
		if !passed[name] {
			t.Errorf("check %q did not pass: %s", name, out)
		}
	}
}

// stdoutSkip is the stdout check's line for a plugin that serves no
// go-plugin stdio service.
const stdoutSkip = "SKIP stdout: not observable: the plugin serves no plugin.GRPCStdio service, and what it writes to stdout after the handshake is read and dropped unseen"

// TestPluginsCheckStdoutNotObservable: a plugin whose gRPC server does not
// list go-plugin's stdio service (here: refusing reflection) gets the
// stdout check skipped, saying why, and passes (exit 0).
func TestPluginsCheckStdoutNotObservable(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=no-reflection", "--type", "t-lowest")
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "\n"+stdoutSkip+"\n") || strings.Contains(out, "PASS stdout") {
		t.Errorf("output lacks %q:\n%s", stdoutSkip, out)
	}
}

// TestPluginsCheckPolicy: --policy FILE --plugin NAME starts the plugin as
// its block says: the command looked up on PATH, its args, env and
// pass_env.
func TestPluginsCheckPolicy(t *testing.T) {
	faulty := examplePlugin(t, "faulty")
	t.Setenv("PATH", filepath.Dir(faulty)+string(filepath.ListSeparator)+os.Getenv("PATH"))
	t.Setenv("SY_PASSED", "passed-on")
	argsOut := filepath.Join(t.TempDir(), "args")
	envOut := filepath.Join(t.TempDir(), "env")
	file := writeFile(t, "p.hcl", fmt.Sprintf(`plugin "f" {
  command  = %q
  args     = ["--log-level", "debug"]
  env      = { SY_TEST_MODE = "badschema", SY_ARGS_OUT = %q, SY_ENV_OUT = %q }
  pass_env = ["SY_PASSED"]
}
`, filepath.Base(faulty), argsOut, envOut))
	code, out, errOut := routerRun(t, "plugins", "check", "--policy", file, "--plugin", "f", "--type", "t-lowest")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if want := `FAIL schema type "t-max-active": expected a doc, got none` + "\n"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q (env not applied?):\n%s", want, out)
	}
	if b, err := os.ReadFile(argsOut); err != nil || string(b) != "--log-level\ndebug\n" {
		t.Errorf("plugin arguments %q (%v), want --log-level debug", b, err)
	}
	if b, err := os.ReadFile(envOut); err != nil || !strings.Contains(string(b), "\nSY_PASSED=passed-on\n") {
		t.Errorf("plugin environment lacks SY_PASSED=passed-on (%v):\n%s", err, b)
	}
	code, out, errOut = routerRun(t, "plugins", "check", "--policy", file, "--plugin", "nope")
	if want := fmt.Sprintf(`--plugin "nope": %s has no plugin block of that name (it declares "f")`, file); code != 1 || out != "" || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, stdout %q, stderr %q for an unknown block, want 1, no checks and %q", code, out, errOut, want)
	}
}

// TestPluginsCheckDashDash: after "--" every argument, flag-like or not, is
// the plugin's, and flags before it are the check's.
func TestPluginsCheckDashDash(t *testing.T) {
	argsOut := filepath.Join(t.TempDir(), "args")
	code, out, errOut := routerRun(t, "plugins", "check", "--type", "t-lowest", "--env", "SY_ARGS_OUT="+argsOut,
		"--", examplePlugin(t, "faulty"), "--log-level", "debug", "--type", "x")
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if b, err := os.ReadFile(argsOut); err != nil || string(b) != "--log-level\ndebug\n--type\nx\n" {
		t.Errorf("plugin arguments %q (%v), want --log-level debug --type x", b, err)
	}
	if !strings.Contains(out, `PASS configure "t-lowest"`+"\n") || strings.Contains(out, `configure "t-active"`) {
		t.Errorf("--type before -- not applied:\n%s", out)
	}
}

// firstWrite records every write to it, and whether the plugin whose pid
// the file starts names was running at the first.
type firstWrite struct {
	starts         string
	writes         []string
	runningAtFirst bool
}

func (w *firstWrite) Write(b []byte) (int, error) {
	if len(w.writes) == 0 {
		s, _ := os.ReadFile(w.starts)
		pidText, _, _ := strings.Cut(string(s), " ")
		pid, err := strconv.Atoi(pidText)
		w.runningAtFirst = err == nil && syscall.Kill(pid, 0) == nil && !zombie(pid)
	}
	w.writes = append(w.writes, string(b))
	return len(b), nil
}

// TestPluginsCheckPrintsAsItGoes: each check's line is written as the
// check completes: the first, the handshake's, while the plugin still
// runs; one write per line (and its warning).
func TestPluginsCheckPrintsAsItGoes(t *testing.T) {
	w := &firstWrite{starts: filepath.Join(t.TempDir(), "starts")}
	var errb bytes.Buffer
	code := runIO(context.Background(), []string{"plugins", "check", examplePlugin(t, "faulty"), "--type", "t-lowest",
		"--env", "SY_STARTS=" + w.starts}, nil, w, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, strings.Join(w.writes, ""), errb.String())
	}
	if len(w.writes) < 10 || w.writes[0] != "PASS handshake (3 component types)\n" || !strings.HasPrefix(w.writes[len(w.writes)-1], "PASS parent death ") {
		t.Fatalf("writes %q, want one per check, the handshake's first", w.writes)
	}
	if !w.runningAtFirst {
		t.Errorf("the plugin was not running when the first line was written: the lines were held back")
	}
}

// TestPluginsCheckJSONEveryOutcome: with --json, a binary not on PATH is a
// JSON handshake failure (as a path that does not exist), and an error
// that keeps the checks from starting a JSON document with "error".
func TestPluginsCheckJSONEveryOutcome(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		failed   string
		errorHas string
	}{
		{"not on PATH", []string{"nonexistent-xyz-plugin"}, 1, "handshake", `"nonexistent-xyz-plugin" has no slash, so it is looked up on the router's PATH`},
		{"no such path", []string{"/nonexistent/xyz-plugin"}, 1, "handshake", "/nonexistent/xyz-plugin"},
		{"bad role", []string{"/nonexistent/xyz-plugin", "--role", "both"}, 2, "", `--role "both": want aggregated, prefill or decode`},
		{"no binary", nil, 2, "", "takes a plugin binary to start"},
		{"unknown block", []string{"--policy", writeFile(t, "p.hcl", ""), "--plugin", "f"}, 1, "", `--plugin "f": `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := routerRun(t, append([]string{"plugins", "check", "--json"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			var rep plugincheck.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("stdout is not one JSON document: %v:\n%s", err, out)
			}
			if tc.failed != "" {
				if len(rep.Checks) != 1 || rep.Checks[0].Name != tc.failed || rep.Checks[0].Pass || !strings.Contains(rep.Checks[0].Got, tc.errorHas) || rep.Error != "" {
					t.Errorf("report %+v, want one failed %s check saying %q", rep, tc.failed, tc.errorHas)
				}
				return
			}
			if len(rep.Checks) != 0 || !strings.Contains(rep.Error, tc.errorHas) {
				t.Errorf("report %+v, want no checks and an error saying %q", rep, tc.errorHas)
			}
		})
	}
}

// TestPluginsCheckReplay: --replay alone replays the bundled trace's first
// --replay-limit requests through each checked type with router replay's
// --fail-on-fallback rule: a scorer answering kept rows descending makes
// every selection fall back, and the check fails naming the cause; the
// good scorer passes.
func TestPluginsCheckReplay(t *testing.T) {
	faulty := examplePlugin(t, "faulty")
	code, out, errOut := routerRun(t, "plugins", "check", faulty, "--type", "t-active", "--replay", "--replay-limit", "30")
	if want := `PASS replay "t-active" (30 requests of `; code != 0 || !strings.Contains(out, want) {
		t.Errorf("good scorer: exit %d, want 0 and %q\nstdout:\n%s\nstderr:\n%s", code, want, out, errOut)
	}
	code, out, errOut = routerRun(t, "plugins", "check", faulty, "--env", "SY_TEST_MODE=invalid", "--env", "SY_INVALID=kept-descending",
		"--type", "t-active", "--replay", "--replay-limit", "30")
	want := `FAIL replay "t-active": expected no selection decided by the fallback (router replay --fail-on-fallback), got 30 of 30 selections fell back: ` +
		`router: check-t-active: plugin "faulty" made 30 of 30 selections fall back (100.0%): invalid_answer 30; first error: scorer "checked": plugin "faulty": plugin decide: invalid answer (kept_out_of_range): kept rows [`
	if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, `plugin "faulty" made 30 of 30 selections fall back (100.0%): invalid_answer 30; first error: `) {
		t.Errorf("kept descending: exit %d, want 1 and %q\nstdout:\n%s\nstderr:\n%s", code, want, out, errOut)
	}
	if code, _, errOut := routerRun(t, "plugins", "check", faulty, "--replay-limit", "3"); code != 2 || !strings.Contains(errOut, "--replay-limit applies to --replay") {
		t.Errorf("--replay-limit without --replay: exit %d, want 2\nstderr:\n%s", code, errOut)
	}
	// A trace written after a space is not --replay's value: said before
	// anything runs, whichever side of the plugin it is on; so is a trace
	// that does not open.
	tr := filepath.Join("..", "..", "testdata", "traces", "synthetic_sessions.jsonl")
	for _, args := range [][]string{{"--replay", tr, faulty}, {faulty, "--replay", tr}} {
		code, out, errOut := routerRun(t, append([]string{"plugins", "check"}, args...)...)
		if want := "--replay takes its trace after '=': write --replay=" + tr; code != 2 || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("%q: exit %d, want 2 and %q\nstdout:\n%s\nstderr:\n%s", args, code, want, out, errOut)
		}
	}
	missing := filepath.Join(t.TempDir(), "none.jsonl")
	if code, out, errOut := routerRun(t, "plugins", "check", "--replay="+missing, faulty); code != 2 || out != "" || !strings.Contains(errOut, "--replay="+missing+": open ") {
		t.Errorf("a missing trace: exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
