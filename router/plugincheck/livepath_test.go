package plugincheck

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
)

// runFaulty runs every check on t-active, the faulty plugin's scorer, in
// SY_TEST_MODE mode with env added.
func runFaulty(t *testing.T, bin, mode string, env map[string]string) []Result {
	t.Helper()
	e := map[string]string{"SY_TEST_MODE": mode}
	for k, v := range env {
		e[k] = v
	}
	return Run(context.Background(), Options{Plugin: config.Plugin{Name: "faulty", Command: bin, Env: e}, Type: "t-active"})
}

// TestKeptFromScorer: a scorer answering kept rows descending and out of
// range fails every decide check with the reason routing falls back for
// (the supervisor's pluginclient.CheckResult inside the router's
// pipeline), and the batch and streams checks with the same words; a
// scorer answering every row, ascending, as kept passes them all: the
// router accepts it (issue #29).
func TestKeptFromScorer(t *testing.T) {
	bin := buildFaulty(t)
	byName := func(rs []Result) map[string]Result {
		m := map[string]Result{}
		for _, r := range rs {
			m[r.Name] = r
		}
		return m
	}
	bad := byName(runFaulty(t, bin, "invalid", map[string]string{"SY_INVALID": "kept-descending"}))
	for name, want := range map[string]string{
		`decide "t-active" rows=1`:    `the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: invalid answer (kept_out_of_range): kept rows [1] not strictly ascending in [0, 1)`,
		`decide "t-active" rows=8`:    `the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: invalid answer (kept_out_of_range): kept rows [8 7 6 5 4 3 2 1] not strictly ascending in [0, 8)`,
		`decide "t-active" rows=4096`: `the router would fall back on this decision because scorer "t-active": plugin "faulty": plugin decide: invalid answer (kept_out_of_range): kept rows [4096 4095 4094 4093 4092 4091 4090 4089] not strictly ascending in [0, 4096)`,
	} {
		r, ok := bad[name]
		if !ok || r.Pass || r.Expected != "an answer the router accepts" || !strings.HasPrefix(r.Got, want) {
			t.Errorf("kept descending, %s: %+v\nwant got %q", name, r, want)
		}
	}
	for _, name := range []string{"decide batch", "decide streams=4"} {
		r := bad[name]
		if r.Pass || !strings.Contains(r.Got, "the router would fall back on this decision because invalid answer (kept_out_of_range): kept rows [") {
			t.Errorf("kept descending, %s: %+v", name, r)
		}
	}
	good := runFaulty(t, bin, "invalid", map[string]string{"SY_INVALID": "kept-all"})
	if Failed(good) {
		for _, r := range good {
			if !r.Pass && !r.Skipped {
				t.Errorf("kept every row: %s", r.Line())
			}
		}
	}
	if g := byName(good); !g[`decide "t-active" rows=4096`].Pass || !g["decide batch"].Pass {
		t.Errorf("kept every row: the decide checks did not run: %+v", good)
	}
}

// TestLatencyOverCallTimeout: a scorer that sleeps 5ms on every call, with
// call_timeout 1ms, gets the latency warning naming the p99 under load;
// a plugin declaring a 50ms p99 gets it naming the declaration. Only the
// warning is asserted, never a time.
func TestLatencyOverCallTimeout(t *testing.T) {
	bin := buildFaulty(t)
	latency := func(rs []Result) Result {
		for _, r := range rs {
			if r.Name == `latency "t-active"` {
				return r
			}
		}
		t.Fatalf("no latency check in %+v", rs)
		return Result{}
	}
	slow := latency(Run(context.Background(), Options{
		Plugin:      config.Plugin{Name: "slow", Command: bin, Env: map[string]string{"SY_TEST_MODE": "slow", "SY_SLOW": "5ms"}},
		Type:        "t-active",
		CallTimeout: time.Millisecond,
	}))
	if !slow.Pass || !strings.Contains(slow.Warning, "rows=64 x16 at once p99 ") || !strings.Contains(slow.Warning, " over call_timeout 1ms: ") {
		t.Errorf("a 5ms scorer with call_timeout 1ms: %+v", slow)
	}
	declared := latency(Run(context.Background(), Options{
		Plugin:      config.Plugin{Name: "declared", Command: bin, Env: map[string]string{"SY_EXPECTED_P99": "50ms"}},
		Type:        "t-active",
		CallTimeout: 20 * time.Millisecond,
	}))
	if !declared.Pass || !strings.Contains(declared.Warning, "the declared p99 (expected_decide_p99_nanos) 50.00ms over call_timeout 20ms: ") ||
		!strings.Contains(declared.Note, "declared p99 50.00ms") {
		t.Errorf("a plugin declaring a 50ms p99, call_timeout 20ms: %+v", declared)
	}
}

// TestReplay: with Options.Replay, each decision type is replayed on the
// bundled trace with router replay's --fail-on-fallback rule: the good
// plugin's scorer replays with no fallback; the scorer answering kept rows
// descending fails, with router replay's line naming the plugin, the cause
// (invalid_answer) and the first error. Routing, replay's Router, refuses
// the answer the decide checks refused; the scorer answering every row as
// kept replays with no fallback, as the decide checks accept it.
func TestReplay(t *testing.T) {
	bin := buildFaulty(t)
	replayed := func(env map[string]string) Result {
		t.Helper()
		rs := Run(context.Background(), Options{Plugin: config.Plugin{Name: "faulty", Command: bin, Env: env}, Type: "t-active",
			Replay: BundledTrace, ReplayLimit: 40})
		last := rs[len(rs)-1]
		if last.Name != `replay "t-active"` {
			t.Fatalf("last check %+v, want the replay", last)
		}
		return last
	}
	if r := replayed(map[string]string{"SY_TEST_MODE": ""}); !r.Pass || !strings.HasPrefix(r.Note, "40 requests of ") || !strings.HasSuffix(r.Note, " on 8 workers, none fell back") {
		t.Errorf("good plugin: %+v", r)
	}
	if r := replayed(map[string]string{"SY_TEST_MODE": "invalid", "SY_INVALID": "kept-all"}); !r.Pass {
		t.Errorf("every row kept: %+v", r)
	}
	r := replayed(map[string]string{"SY_TEST_MODE": "invalid", "SY_INVALID": "kept-descending"})
	if r.Pass || r.Expected != "no selection decided by the fallback (router replay --fail-on-fallback)" ||
		!strings.Contains(r.Got, ` plugin "faulty" made 40 of 40 selections fall back (100.0%): invalid_answer 40; first error: `) ||
		!strings.Contains(r.Got, "invalid answer (kept_out_of_range): kept rows [") {
		t.Errorf("kept descending: %+v", r)
	}
}
