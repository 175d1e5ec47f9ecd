package supervisor

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/shared"
)

// TestStoppedAndCheckHealth: Options.Stopped reports a plugin that exits
// when asked to as Exited, one that lingers as killed after StopGrace, and
// CheckHealth answers for a running plugin only.
func TestStoppedAndCheckHealth(t *testing.T) {
	var (
		mu      sync.Mutex
		reports = map[string]StopReport{}
	)
	const grace = 1900 * time.Millisecond // generous, under go-plugin's own 2 s
	h := NewHost(Options{Logger: testLogger(), StopGrace: grace, Stopped: func(r StopReport) {
		mu.Lock()
		reports[r.Plugin] = r
		mu.Unlock()
	}})
	t.Cleanup(func() { assertNoLeftovers(t) })
	ctx := context.Background()
	for _, name := range []string{"good", "linger"} {
		if _, err := h.Start(ctx, block(name, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"good", "linger"} {
		if err := h.CheckHealth(ctx, name); err != nil {
			t.Errorf("CheckHealth(%s): %v", name, err)
		}
	}
	if err := h.CheckHealth(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `plugin "nope" is not running`) {
		t.Errorf("CheckHealth(nope): %v", err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	good, linger := reports["good"], reports["linger"]
	if !good.WasRunning || !good.Exited || good.PID <= 0 || good.After <= 0 || good.After > grace {
		t.Errorf("good plugin: %+v, want running, exited within %v", good, grace)
	}
	if !linger.WasRunning || linger.Exited || linger.After != grace {
		t.Errorf("lingering plugin: %+v, want running, not exited, After %v", linger, grace)
	}
	if err := h.CheckHealth(ctx, "good"); err == nil {
		t.Error("CheckHealth after Shutdown: no error")
	}
}

// TestStopReportSaysHowItWent: a process that exits on its own is
// reported with its exit status, one the host killed with the reason and
// the signal; neither is restarted under a negative MaxRestarts.
func TestStopReportSaysHowItWent(t *testing.T) {
	reports := make(chan StopReport, 4)
	const stall = time.Second
	h, _ := faultHost(t, Options{
		Restart: RestartPolicy{MaxRestarts: -1},
		Health:  HealthPolicy{ProbeInterval: 10 * time.Millisecond, ProbeTimeout: 10 * time.Second, StallTimeout: stall},
		Breaker: BreakerPolicy{Disabled: true},
		Stopped: func(r StopReport) { reports <- r },
	})
	next := func() StopReport {
		t.Helper()
		select {
		case r := <-reports:
			return r
		case <-time.After(time.Minute):
			t.Fatal("no stop reported within a minute")
			return StopReport{}
		}
	}

	types, err := h.Start(context.Background(), block("crash", "boundcrash"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ti := typeByName(t, types, "t-max-active")
	if _, err := ti.New(shared.InstanceInfo{Name: "agg/p/keep", Role: shared.RoleAggregated, BlockSize: 16}, shared.Params{"max": int64(math.MinInt64)}); err == nil {
		t.Fatal("configuring the crashing value: no error")
	}
	if r := next(); r.Plugin != "crash" || r.WasRunning || r.Status != "exit status 3" || r.KillReason != "" {
		t.Errorf("crashed plugin: %+v, want exited with exit status 3, no kill reason", r)
	}

	b := block("stuck", "freeze") // every scorer call blocks forever
	b.CallTimeout = 30 * time.Millisecond
	types, err = h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	picker := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	// An answered pick first: the stall rule counts from the last answer.
	if !testkit.Poll(time.Minute, func() bool {
		_, err := picker.Pick(context.Background(), request, candidates())
		return err == nil
	}) {
		t.Fatal("the plugin answered no pick within a minute")
	}
	// Calls time out until one finds no answer for StallTimeout: the host
	// kills the process.
	if !testkit.Poll(time.Minute, func() bool {
		_ = s.Score(context.Background(), request, candidates(), make([]float64, 4))
		return len(reports) > 0
	}) {
		t.Fatal("the stuck plugin was not killed within a minute")
	}
	want := "no answer to any decision call for " + stall.String()
	if r := next(); r.Plugin != "stuck" || r.Status != "signal: killed" || r.KillReason != want {
		t.Errorf("stuck plugin: %+v, want killed (signal: killed) because %q", r, want)
	}
}
