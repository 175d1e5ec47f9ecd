package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/migrate"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/trace"
)

// failureScenario is the hand-built 2-worker scenario: every request
// arrives at 0 and round-robin alternates the workers, so A serves r0 (a
// 1,024-token prompt of hashes 1, 2; one token) and r2 (100 tokens, one
// token), B serves r1 (the same 1,024-token prompt, 100 tokens) and r3
// (200 tokens, hash 3, 5 tokens), which waits in B's engine queue
// (MaxNumSeqs 1). B fails between r1's tokens 10 and 11.
func failureScenario() ([]trace.Record, sim.Config) {
	cfg := sim.DefaultConfig()
	cfg.MaxNumSeqs = 1
	return []trace.Record{
		{InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{InputLength: 1024, OutputLength: 100, HashIDs: []uint64{1, 2}},
		{InputLength: 100, OutputLength: 1},
		{InputLength: 200, OutputLength: 5, HashIDs: []uint64{3}},
	}, cfg
}

// simRequest is record r as replay submits it to an engine (Mooncake
// hashes chained, 512-token blocks), id i, after generated tokens.
func simRequest(i int, r trace.Record, generated int) *sim.Request {
	s := &sim.Request{ID: i, InputLength: r.InputLength, OutputLength: r.OutputLength, Generated: generated}
	if len(r.HashIDs) > 0 {
		s.PrefixHashes, s.PrefixBlockTokens = prefix.ChainHashes(nil, r.HashIDs), trace.MooncakeBlockTokens
	}
	return s
}

// runFailures replays recs on workers with o's failures and returns the
// report and the per-request lines by index.
func runFailures(t *testing.T, recs []trace.Record, cfg sim.Config, workers int, f *Failures) (*report.Report, []Outcome) {
	t.Helper()
	b := loadPolicy(t, roundRobin)
	var lines bytes.Buffer
	o := Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: workers,
		Sim: cfg, PerRequest: &lines, Failures: f}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]Outcome, 0, len(recs))
	for _, l := range strings.Split(strings.TrimSpace(lines.String()), "\n") {
		var out Outcome
		if err := json.Unmarshal([]byte(l), &out); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	// No request lost: every trace request ends exactly once, in order.
	if len(outs) != len(recs) {
		t.Fatalf("%d per-request lines for %d requests", len(outs), len(recs))
	}
	for i, out := range outs {
		if out.Index != i || (out.Status != "ok" && !strings.HasPrefix(out.Status, "rejected: ")) {
			t.Fatalf("line %d: index %d status %q", i, out.Index, out.Status)
		}
	}
	if rep.Completed+rep.Rejected != len(recs) {
		t.Fatalf("completed %d + rejected %d != %d requests", rep.Completed, rep.Rejected, len(recs))
	}
	return rep, outs
}

func TestFailureMigratesHandBuilt(t *testing.T) {
	recs, cfg := failureScenario()
	// B's timeline: r1 alone (r3 waits), as on a lone engine.
	lone, err := sim.NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := lone.Submit(0, simRequest(1, recs[1], 0)); err != nil {
		t.Fatal(err)
	}
	var tokens []time.Duration // r1's token times: first token, then one per step
	var ttft time.Duration
	for len(tokens) < 11 {
		at, _ := lone.NextEvent()
		for _, e := range lone.Advance(at, nil) {
			if e.Kind == sim.FirstToken {
				ttft = e.At
			}
		}
		tokens = append(tokens, at)
	}
	if tokens[0] != ttft {
		t.Fatalf("first step ends at %v, first token at %v", tokens[0], ttft)
	}
	failAt := (tokens[9] + tokens[10]) / 2 // after token 10, before token 11

	// A's timeline: r0 and r2, then at failAt the continuations of r1
	// (prompt 1,024 + 10 = 1,034 tokens, 90 more to sample, the prompt's
	// blocks cached by r0) and r3 (never started: 200 tokens, 5 to
	// sample), in that order.
	a, err := sim.NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		if err := a.Submit(0, simRequest(i, recs[i], 0)); err != nil {
			t.Fatal(err)
		}
	}
	a.Drain(nil)
	for _, c := range []*sim.Request{simRequest(1, recs[1], 10), simRequest(3, recs[3], 0)} {
		if err := a.Submit(failAt, c); err != nil {
			t.Fatal(err)
		}
	}
	want := map[int]map[sim.EventKind]sim.Event{1: {}, 3: {}}
	for _, e := range a.Drain(nil) {
		want[e.RequestID][e.Kind] = e
	}
	if c := want[1][sim.FirstToken].CachedTokens; c != 1024 {
		t.Fatalf("reference: r1's continuation hits %d tokens, want 1024", c)
	}

	// Round-robin's order is the fleet's (by worker id): learn B.
	_, outs := runFailures(t, recs, cfg, 2, nil)
	wb := outs[1].Worker
	if outs[0].Worker != 1-wb || outs[2].Worker != 1-wb || outs[3].Worker != wb {
		t.Fatalf("workers %d %d %d %d, want A B A B", outs[0].Worker, outs[1].Worker, outs[2].Worker, outs[3].Worker)
	}
	f := &Failures{At: []Failure{{Worker: wb, At: failAt}}, Migration: migrate.DefaultPolicy()}
	rep, outs := runFailures(t, recs, cfg, 2, f)
	if outs[1].Worker != 1-wb || outs[3].Worker != 1-wb {
		t.Fatalf("continuations on workers %d and %d, want %d (sim-%d failed)", outs[1].Worker, outs[3].Worker, 1-wb, wb)
	}
	r1, r3 := outs[1], outs[3]
	if r1.Status != "ok" || r1.Migrations != 1 || r1.ExtraPrefillTokens != 1034 {
		t.Errorf("r1: status %q migrations %d extra prefill %d, want ok, 1, 1034", r1.Status, r1.Migrations, r1.ExtraPrefillTokens)
	}
	if r1.TTFTMs != report.Millis(ttft) {
		t.Errorf("r1 TTFT %v ms, want the original attempt's %v", r1.TTFTMs, report.Millis(ttft))
	}
	if e2e := report.Millis(want[1][sim.Completed].At); r1.E2EMs != e2e {
		t.Errorf("r1 E2E %v ms, want %v (the continuation's last token)", r1.E2EMs, e2e)
	}
	if r3.Status != "ok" || r3.Migrations != 1 || r3.ExtraPrefillTokens != 200 {
		t.Errorf("r3: status %q migrations %d extra prefill %d, want ok, 1, 200", r3.Status, r3.Migrations, r3.ExtraPrefillTokens)
	}
	if ttft3 := report.Millis(want[3][sim.FirstToken].At); r3.TTFTMs != ttft3 {
		t.Errorf("r3 TTFT %v ms, want its continuation's first token %v", r3.TTFTMs, ttft3)
	}
	m := rep.Migration
	if m == nil {
		t.Fatal("no migration report")
	}
	// The restart, 60 s on, comes after the last request: it is not run.
	if m.Failures != 1 || m.Restarts != 0 || m.Cut != 2 || m.Causes["failure"] != 2 || m.Outcomes["migrated"] != 2 ||
		m.Requests != 2 || m.Completed != 2 || m.Limit != migrate.DefaultLimit || m.RestartAfterMs != 60000 {
		t.Errorf("migration report %+v", m)
	}
	if m.ExtraPrefillTokens != 1034+200 || m.ExtraPrefillCachedTokens != 1024 {
		t.Errorf("extra prefill %d tokens, %d cached; want 1234 and 1024", m.ExtraPrefillTokens, m.ExtraPrefillCachedTokens)
	}
	gaps := []float64{report.Millis(want[1][sim.FirstToken].At - failAt), report.Millis(want[3][sim.FirstToken].At - failAt)}
	if m.Gap.P50 != gaps[0] || m.Gap.P90 != gaps[1] {
		t.Errorf("gap p50 %v p90 %v, want %v and %v", m.Gap.P50, m.Gap.P90, gaps[0], gaps[1])
	}
	if rep.Completed != 4 || rep.Rejected != 0 {
		t.Errorf("completed %d rejected %d, want 4 and 0", rep.Completed, rep.Rejected)
	}

	// Without migration the cut requests fail.
	f.Migration.Limit = 0
	rep, outs = runFailures(t, recs, cfg, 2, f)
	wantStatus := "rejected: " + FailedReason + ": over_limit"
	if outs[1].Status != wantStatus || outs[3].Status != wantStatus || outs[0].Status != "ok" || outs[2].Status != "ok" {
		t.Errorf("statuses %q %q %q %q, want r1 and r3 %q", outs[0].Status, outs[1].Status, outs[2].Status, outs[3].Status, wantStatus)
	}
	if rep.Rejected != 2 || rep.RejectionReasons[FailedReason+": over_limit"] != 2 || rep.Migration.Outcomes["over_limit"] != 2 ||
		rep.Migration.Requests != 0 {
		t.Errorf("limit 0: rejected %d reasons %v outcomes %v", rep.Rejected, rep.RejectionReasons, rep.Migration.Outcomes)
	}
}

// With one worker the continuation has nowhere to go: no_worker.
func TestFailureNoOtherWorker(t *testing.T) {
	recs, cfg := failureScenario()
	rep, outs := runFailures(t, recs[:2], cfg, 1, &Failures{At: []Failure{{Worker: 0, At: 30 * time.Millisecond}}, Migration: migrate.DefaultPolicy()})
	if outs[1].Status != "rejected: "+FailedReason+": no_worker" || rep.Migration.Outcomes["no_worker"] != 1 {
		t.Errorf("r1 %q, outcomes %v", outs[1].Status, rep.Migration.Outcomes)
	}
}

// TestFailureAfterTheEnd: a --fail failure timed after the run's last
// request ended does nothing, and the report says so.
func TestFailureAfterTheEnd(t *testing.T) {
	recs, cfg := failureScenario()
	rep, outs := runFailures(t, recs[:2], cfg, 2, &Failures{At: []Failure{{Worker: 0, At: 30 * time.Millisecond}, {Worker: 1, At: 1000 * time.Hour}},
		Migration: migrate.DefaultPolicy()})
	if rep.Migration.Failures != 1 || rep.Migration.NotReached != 1 || outs[0].Status != "ok" {
		t.Errorf("failures %d, not reached %d, r0 %q", rep.Migration.Failures, rep.Migration.NotReached, outs[0].Status)
	}
}

// TestFailureWhileDown: a --fail failure timed while its worker is down
// (failed, not yet restarted) does nothing, and the report counts it
// apart from those past the end; a failure listed twice is refused.
func TestFailureWhileDown(t *testing.T) {
	recs, cfg := failureScenario()
	rep, outs := runFailures(t, recs[:2], cfg, 2, &Failures{At: []Failure{{Worker: 0, At: 30 * time.Millisecond},
		{Worker: 0, At: 40 * time.Millisecond}, {Worker: 1, At: 1000 * time.Hour}}, Migration: migrate.DefaultPolicy()})
	m := rep.Migration
	if m.Failures != 1 || m.Restarts != 0 || m.WhileDown != 1 || m.NotReached != 1 || outs[1].Status != "ok" {
		t.Fatalf("failures %d, restarts %d, while down %d, not reached %d, r1 %q; want 1, 0, 1, 1, ok",
			m.Failures, m.Restarts, m.WhileDown, m.NotReached, outs[1].Status)
	}
	b, err := json.Marshal(m)
	if err != nil || !bytes.Contains(b, []byte(`"not_reached":1,"while_down":1,`)) {
		t.Errorf("JSON %s, %v: want not_reached 1 and while_down 1", b, err)
	}
	lines := report.MigrationLines([]report.Cell{{Runs: []*report.Report{rep}}})
	want := []string{"rr on 2 workers: 1 failure, 0 restarts; 1 cut: 1 migrated, 0 failed",
		"  1 --fail failure timed after the run's last request ended: not applied",
		"  1 --fail failure timed while its worker was down (failed, not yet restarted): not applied"}
	if len(lines) < 3 || !slices.Equal(lines[:3], want) {
		t.Errorf("lines\n%s\nwant them to start\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	b2 := loadPolicy(t, roundRobin)
	_, err = Run(context.Background(), Options{PolicyName: "rr", Roles: b2.Roles, BlockSize: b2.BlockSize, TraceName: "t", Records: recs, Workers: 2,
		Sim: cfg, Failures: &Failures{At: []Failure{{Worker: 1, At: time.Second}, {Worker: 1, At: time.Second}}, Migration: migrate.DefaultPolicy()}})
	if err == nil || err.Error() != "replay: failure of worker sim-1 at 1s is listed twice" {
		t.Errorf("a failure listed twice: %v", err)
	}
}

func TestFailureRateReproducible(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:400]
	run := func(seed int64) (*report.Report, []Outcome) {
		return runFailures(t, recs, sim.Config{}, 8, &Failures{Rate: 60, Seed: seed, RestartAfter: 5 * time.Second, Migration: migrate.DefaultPolicy()})
	}
	a, oa := run(1)
	b, ob := run(1)
	c, oc := run(2)
	if a.Migration.Failures == 0 || a.Migration.Outcomes["migrated"] == 0 {
		t.Fatalf("seed 1: %d failures, %v; want some of each", a.Migration.Failures, a.Migration.Outcomes)
	}
	ja, _ := json.Marshal(a.Migration)
	jb, _ := json.Marshal(b.Migration)
	jc, _ := json.Marshal(c.Migration)
	if !bytes.Equal(ja, jb) {
		t.Errorf("same seed, other failures:\n%s\n%s", ja, jb)
	}
	if bytes.Equal(ja, jc) {
		t.Errorf("seeds 1 and 2 drew the same failures: %s", ja)
	}
	for i := range oa {
		if oa[i] != ob[i] {
			t.Fatalf("same seed, request %d differs: %+v vs %+v", i, oa[i], ob[i])
		}
	}
	differ := false
	for i := range oa {
		differ = differ || oa[i] != oc[i]
	}
	if !differ {
		t.Error("seeds 1 and 2 gave the same per-request lines")
	}
}

// A failure mid-trace costs: mean E2E and goodput are worse than the
// same run's without it, and the migrated requests paid extra prefill.
func TestFailureCostsE2EAndGoodput(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:500]
	b := loadPolicy(t, "")
	slo, err := report.ParseSLO("ttft=2s,tpot=100ms")
	if err != nil {
		t.Fatal(err)
	}
	mid := recs[len(recs)/2].Arrival
	runOne := func(f *Failures) *report.Report {
		o := Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: 2,
			SLO: slo, Failures: f}
		rep, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	base := runOne(nil)
	failed := runOne(&Failures{At: []Failure{{Worker: 0, At: mid}}, Migration: migrate.DefaultPolicy()})
	if base.Migration != nil {
		t.Fatal("a run without failures has a migration report")
	}
	m := failed.Migration
	if m.Failures != 1 || m.Cut == 0 || m.Outcomes["migrated"] != m.Cut || m.ExtraPrefillTokens == 0 {
		t.Fatalf("migration report %+v", m)
	}
	if failed.Completed != base.Completed {
		t.Errorf("completed %d with the failure, %d without: every cut request should migrate", failed.Completed, base.Completed)
	}
	if failed.E2E.Mean <= base.E2E.Mean {
		t.Errorf("mean E2E %v ms with a failure, %v without: want worse", failed.E2E.Mean, base.E2E.Mean)
	}
	if failed.Goodput.Met >= base.Goodput.Met {
		t.Errorf("goodput %d with a failure, %d without: want worse", failed.Goodput.Met, base.Goodput.Met)
	}
}

func TestParseFailures(t *testing.T) {
	got, err := ParseFailures("sim-3@90s, 1@1m30s")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (Failure{Worker: 3, At: 90 * time.Second}) || got[1] != (Failure{Worker: 1, At: 90 * time.Second}) {
		t.Fatalf("got %+v", got)
	}
	for _, bad := range []string{"sim-3", "x@1s", "sim-3@-1s", "3@soon", "-1@1s", ""} {
		if _, err := ParseFailures(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestFailuresChecked(t *testing.T) {
	recs, _ := failureScenario()
	b := loadPolicy(t, roundRobin)
	for _, tc := range []struct {
		f    Failures
		want string
	}{
		{Failures{At: []Failure{{Worker: 2, At: time.Second}}, Migration: migrate.DefaultPolicy()}, "sim-0 to sim-1"},
		{Failures{Rate: -1, Migration: migrate.DefaultPolicy()}, "failure rate"},
		{Failures{Rate: 1}, "migration max tokens"},
		{Failures{RestartAfter: -time.Second, Migration: migrate.DefaultPolicy()}, "restart after"},
	} {
		o := Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize, Records: recs, Workers: 2, Failures: &tc.f}
		if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
	}
}

// With every other worker at capacity the continuation waits in the
// router's queue (admission) and runs once a request ends there.
func TestFailureContinuationQueues(t *testing.T) {
	recs := []trace.Record{
		{InputLength: 1000, OutputLength: 200},
		{InputLength: 1000, OutputLength: 200},
	}
	b := loadPolicy(t, "") // load-aware: the two requests on two workers
	q := config.DefaultQueue()
	q.MaxActiveRequests = 1
	var lines bytes.Buffer
	failAt := 500 * time.Millisecond
	o := Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: 2, Queue: q,
		PerRequest: &lines, Failures: &Failures{At: []Failure{{Worker: 0, At: failAt}, {Worker: 1, At: failAt}}, Migration: migrate.DefaultPolicy()}}
	// Fail one worker of the two: a run without shows they are apart.
	o.Failures = nil
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var first [2]Outcome
	for _, l := range strings.Split(strings.TrimSpace(lines.String()), "\n") {
		var out Outcome
		if err := json.Unmarshal([]byte(l), &out); err != nil {
			t.Fatal(err)
		}
		first[out.Index] = out
	}
	if first[0].Worker == first[1].Worker {
		t.Fatalf("both requests on worker %d", first[0].Worker)
	}
	// The two requests tie on every worker (the picker breaks the tie at
	// random), so which one the failure cuts is read from the run: the
	// one it cut waits for the other's end, the other is unchanged.
	lines.Reset()
	o.Failures = &Failures{At: []Failure{{Worker: first[1].Worker, At: failAt}}, Migration: migrate.DefaultPolicy()}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var outs [2]Outcome
	for _, l := range strings.Split(strings.TrimSpace(lines.String()), "\n") {
		var out Outcome
		if err := json.Unmarshal([]byte(l), &out); err != nil {
			t.Fatal(err)
		}
		outs[out.Index] = out
	}
	m := 0 // the migrated request
	if outs[1].Migrations == 1 {
		m = 1
	}
	other := 1 - m
	if outs[m].Migrations != 1 || outs[other].Migrations != 0 {
		t.Fatalf("migrations %d and %d, want one request migrated once", outs[0].Migrations, outs[1].Migrations)
	}
	kept, was := outs[other], first[other]
	kept.Priority, was.Priority, kept.Worker, was.Worker = nil, nil, 0, 0
	if kept != was {
		t.Errorf("request %d changed: %+v, was %+v", other, kept, was)
	}
	r := outs[m]
	if r.Status != "ok" || r.Worker != outs[other].Worker || r.TTFTMs != first[m].TTFTMs {
		t.Fatalf("request %d: %+v", m, r)
	}
	// It waited for the other's end, then prefilled and decoded the rest.
	if r.E2EMs <= outs[other].E2EMs {
		t.Errorf("request %d ended at %v ms, request %d at %v: want after", m, r.E2EMs, other, outs[other].E2EMs)
	}
	if g := rep.Migration.Gap.P50; g < outs[other].E2EMs-report.Millis(failAt) {
		t.Errorf("gap %v ms, want at least the wait for the other's end, %v", g, outs[other].E2EMs-report.Millis(failAt))
	}
	if rep.Completed != 2 || rep.Migration.Outcomes["migrated"] != 1 {
		t.Errorf("completed %d, outcomes %v", rep.Completed, rep.Migration.Outcomes)
	}
}
