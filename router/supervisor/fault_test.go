package supervisor

// The fault matrix: real plugin processes killed, frozen, crash-looping,
// leaking a grandchild, answering too much. The long ones (a few seconds
// each) say so in their name (Long) and are skipped under -short.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/shared"
)

// faultHost returns a host with metrics on a fresh registry, shut down and
// checked for leftovers at the end of the test.
func faultHost(t *testing.T, o Options) (*Host, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Logger = testLogger()
	o.Registerer = reg
	h := NewHost(o)
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		assertNoLeftovers(t)
	})
	return h, reg
}

// counterValue is the value of a series of name with the label pairs
// labels; -1 when there is none (testkit.MetricValue).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	return testkit.MetricValue(t, reg, name, labels...)
}

// runningProc is the process serving the named plugin, or nil.
func runningProc(h *Host, name string) *proc {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.cur.Load()
}

func currentPID(h *Host, name string) int {
	if p := runningProc(h, name); p != nil {
		return p.pid
	}
	return 0
}

// fallbackable reports whether the router would let the policy's
// fallback decide after err (router.fallbackAllowed), for a caller whose
// context is live, as every caller's here is. Stricter than the router:
// an error wrapping a context error is refused too, since no caller here
// gives up, so such an error would be a plugin failure worded as the
// caller's.
func fallbackable(err error) bool {
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, shared.ErrAllFiltered) && !errors.Is(err, shared.ErrNoWorkers)
}

// stopProcess sends SIGSTOP to pid and waits until every thread of it is
// stopped: kill returns once the signal is queued, and on a starved
// machine the process can answer a call or two before its threads get the
// CPU to stop.
func stopProcess(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := func() bool {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*/stat", pid))
		if err != nil || len(stats) == 0 {
			return false
		}
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			// tid (comm) state ...; comm may hold spaces and parens.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) || b[i+2] != 'T' && b[i+2] != 't' {
				return false
			}
		}
		return true
	}
	if !testkit.Poll(time.Minute, stopped) {
		t.Fatalf("process %d is not stopped a minute after SIGSTOP", pid)
	}
}

// loadPace is the pause between two decisions of one load goroutine: 50
// goroutines then make at most 50k decisions a second.
const loadPace = time.Millisecond

// loadResult is what runLoad's goroutines saw.
type loadResult struct {
	mu        sync.Mutex
	latencies []time.Duration
	ends      []time.Time // when each decision returned
	oks       []time.Time // when each plugin-answered decision returned
	fallbacks int
	// lastFallback is when the last decision that fell back returned.
	lastFallback time.Time
	err          error // the first failure a fallback could not cover
	done         chan struct{}
}

// runLoad runs decisions on cp from n goroutines until stop, each answered
// by the plugin or, when its error lets the router fall back, by the
// policy's fallback (counted). lr.done is closed once all have reported.
func runLoad(cp *pipeline.Compiled, n int, stop <-chan struct{}) *loadResult {
	lr := &loadResult{done: make(chan struct{})}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			s := &pipeline.Scratch{}
			var lat []time.Duration
			var ends, oks []time.Time
			fallbacks := 0
			var lastFallback time.Time
			var bad error
			defer func() {
				lr.mu.Lock()
				lr.latencies = append(lr.latencies, lat...)
				lr.ends = append(lr.ends, ends...)
				lr.oks = append(lr.oks, oks...)
				lr.fallbacks += fallbacks
				if lastFallback.After(lr.lastFallback) {
					lr.lastFallback = lastFallback
				}
				if lr.err == nil {
					lr.err = bad
				}
				lr.mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := candidates()
				start := time.Now()
				row, err := pipeline.Execute(context.Background(), cp, request, c, s)
				end := time.Now()
				lat = append(lat, end.Sub(start))
				ends = append(ends, end)
				switch {
				case err == nil && c.IDs[row] == 11:
					oks = append(oks, end)
				case err == nil:
					bad = fmt.Errorf("picked worker %d, want 11", c.IDs[row])
				case fallbackable(err):
					fallbacks++ // the fallback policy decides
					lastFallback = end
				default:
					bad = fmt.Errorf("a decision failed with no fallback: %w", err)
				}
				// Paced: a failing plugin fails fast, and 50 goroutines
				// spinning on fast failures would only measure how the
				// restart fares on a starved CPU.
				time.Sleep(loadPace)
			}
		})
	}
	go func() { wg.Wait(); close(lr.done) }()
	return lr
}

func maxLatency(l []time.Duration) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return slices.Max(l)
}

// TestLongKillUnderLoad: kill -9 while 50 goroutines decide. Every
// decision completes (by the plugin, or by fallback while it is gone: the
// calls in flight fail as closed, later ones are refused as restarting),
// the plugin is restarted once and decides again.
func TestLongKillUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	h, reg := faultHost(t, Options{})
	b := block("victim", "")
	b.CallTimeout = 200 * time.Millisecond
	cp := startPolicy(t, h, b)
	oldPID := currentPID(h, "victim")
	answered := func() int64 { s := h.Stats("victim"); return s.Calls - s.Fallbacks }
	stop := make(chan struct{})
	lr := runLoad(cp, 50, stop)
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			<-lr.done
		}
	}()
	if !testkit.Poll(time.Minute, func() bool { return answered() >= 50 }) {
		t.Fatalf("the plugin answered %d decisions before the kill, want 50", answered())
	}
	killed := time.Now()
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(time.Minute, func() bool { pid := currentPID(h, "victim"); return pid != 0 && pid != oldPID }) {
		t.Fatalf("the plugin was not restarted within a minute (status %v)", h.Status("victim"))
	}
	restarted := time.Now()
	base := answered()
	if !testkit.Poll(time.Minute, func() bool { return answered() >= base+50 }) {
		t.Fatalf("the restarted plugin answered %d decisions within a minute, want 50", answered()-base)
	}
	close(stop)
	<-lr.done
	stopped = true

	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.err != nil {
		t.Fatal(lr.err)
	}
	after := 0 // decisions the new process answered
	for _, ok := range lr.oks {
		if ok.After(restarted) {
			after++
		}
	}
	t.Logf("%d decisions, %d by fallback, restarted %v after kill -9, %d answered by the new process, max latency %v",
		len(lr.latencies), lr.fallbacks, restarted.Sub(killed), after, maxLatency(lr.latencies))
	if after == 0 {
		t.Error("no decision returned by the plugin after its restart")
	}
	if lr.fallbacks == 0 {
		t.Error("no decision fell back")
	}
	closed := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "victim", "code", codeClosed)
	refused := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "victim", "code", codeRestarting)
	if closed+refused < 1 {
		t.Errorf("call_errors_total{code=closed} = %v, {code=restarting} = %v; want the kill to fail calls", closed, refused)
	}
	if s := h.Stats("victim"); s.Restarts != 1 || s.Fallbacks != int64(lr.fallbacks) {
		t.Errorf("Stats = %+v, want 1 restart and %d fallbacks", s, lr.fallbacks)
	}
	if v := counterValue(t, reg, "switchyard_plugin_restarts_total", "plugin", "victim"); v != 1 {
		t.Errorf("switchyard_plugin_restarts_total = %v, want 1", v)
	}
	if v := counterValue(t, reg, "switchyard_plugin_up", "plugin", "victim"); v != 1 {
		t.Errorf("switchyard_plugin_up = %v, want 1", v)
	}
}

// TestLongFrozenUnderLoad: SIGSTOP under load, with the default health
// policy. Decisions keep completing (by fallback) while the plugin is
// stopped; the health probe, not the missed deadlines, kills its group and
// it is restarted once.
func TestLongFrozenUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	h, reg := faultHost(t, Options{})
	b := block("frozen", "")
	b.CallTimeout = 50 * time.Millisecond
	cp := startPolicy(t, h, b)
	old := procOf(t, h, "frozen")
	stop := make(chan struct{})
	lr := runLoad(cp, 20, stop)
	time.Sleep(300 * time.Millisecond)
	stopProcess(t, old.pid)
	stopped := time.Now()
	restarted := testkit.Poll(time.Minute, func() bool {
		pid := currentPID(h, "frozen")
		return pid != 0 && pid != old.pid
	})
	back := time.Now()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-lr.done

	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.err != nil {
		t.Fatal(lr.err)
	}
	if !restarted {
		t.Fatalf("the frozen plugin was not restarted within a minute (status %v)", h.Status("frozen"))
	}
	// The decisions did not wait for the frozen plugin: they kept
	// completing, by fallback, until the restart.
	during := 0
	for _, end := range lr.ends {
		if end.After(stopped) && end.Before(back) {
			during++
		}
	}
	t.Logf("%d decisions, %d by fallback, %d while frozen; restarted after %v, max latency %v",
		len(lr.latencies), lr.fallbacks, during, back.Sub(stopped), maxLatency(lr.latencies))
	if during < 20 {
		t.Errorf("%d decisions completed while the plugin was frozen, want at least one per load goroutine", during)
	}
	if r := old.killReason.Load(); r == nil || !strings.Contains(*r, fmt.Sprintf("%d failed health checks", DefaultProbeFailures)) {
		t.Errorf("kill reason %v, want %d failed health checks", r, DefaultProbeFailures)
	}
	if !groupGone(old.pid) {
		t.Errorf("the frozen process group %d is still alive", old.pid)
	}
	if s := h.Stats("frozen"); s.Restarts != 1 || s.Timeouts == 0 {
		t.Errorf("Stats = %+v, want 1 restart and timeouts", s)
	}
	if v := counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "frozen", "result", "failed"); v < DefaultProbeFailures {
		t.Errorf("health_checks_total{result=failed} = %v, want at least %d", v, DefaultProbeFailures)
	}

	// Shutdown with a frozen plugin ends, and kills it.
	frozen := currentPID(h, "frozen")
	stopProcess(t, frozen)
	start := time.Now()
	if err := h.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	t.Logf("Shutdown with a frozen plugin took %v", time.Since(start))
	if !groupGone(frozen) {
		t.Errorf("the frozen process group %d survived Shutdown", frozen)
	}
}

// TestFrozenDetectedByProbe: with no traffic, the health probe finds a
// stopped plugin and kills its group after ProbeFailures failed checks.
func TestFrozenDetectedByProbe(t *testing.T) {
	h, reg := faultHost(t, Options{Health: HealthPolicy{ProbeInterval: 50 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond}})
	if _, err := h.Start(context.Background(), block("idle", "")); err != nil {
		t.Fatalf("Start: %v", err)
	}
	old := procOf(t, h, "idle")
	stopped := time.Now()
	stopProcess(t, old.pid)
	if !testkit.Poll(time.Minute, func() bool { pid := currentPID(h, "idle"); return pid != 0 && pid != old.pid }) {
		t.Fatalf("the stopped plugin was not restarted within a minute (status %v)", h.Status("idle"))
	}
	t.Logf("stopped plugin restarted after %v", time.Since(stopped))
	if !groupGone(old.pid) {
		t.Errorf("the stopped process group %d is still alive", old.pid)
	}
	if r := old.killReason.Load(); r == nil || !strings.Contains(*r, fmt.Sprintf("%d failed health checks", DefaultProbeFailures)) {
		t.Errorf("kill reason %v, want %d failed health checks", r, DefaultProbeFailures)
	}
	if v := counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "idle", "result", "failed"); v < DefaultProbeFailures {
		t.Errorf("health_checks_total{result=failed} = %v, want at least %d", v, DefaultProbeFailures)
	}
}

// TestDeadlineMissChecksAtOnce: a missed call deadline makes the probe
// check at once. With a probe interval of an hour, only the checks that
// missed deadlines set off can find the stopped plugin.
func TestDeadlineMissChecksAtOnce(t *testing.T) {
	h, reg := faultHost(t, Options{Health: HealthPolicy{ProbeInterval: time.Hour, ProbeTimeout: 100 * time.Millisecond}})
	b := block("late", "")
	b.CallTimeout = 50 * time.Millisecond
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	old := procOf(t, h, "late")
	stopProcess(t, old.pid)
	calls := 0
	restarted := testkit.Poll(time.Minute, func() bool {
		if pid := currentPID(h, "late"); pid != 0 && pid != old.pid {
			return true
		}
		// Each call fails (timeout, or refused by the open breaker),
		// unless the restart finished since the check above.
		err := s.Score(context.Background(), request, candidates(), make([]float64, 4))
		if err == nil {
			if pid := currentPID(h, "late"); pid != 0 && pid != old.pid {
				return true
			}
		}
		if err == nil || !fallbackable(err) {
			t.Fatalf("Score on a stopped plugin: %v, want an error the fallback covers", err)
		}
		calls++
		time.Sleep(10 * time.Millisecond)
		return false
	})
	if !restarted {
		t.Fatalf("the stopped plugin was not restarted within a minute (status %v)", h.Status("late"))
	}
	if r := old.killReason.Load(); r == nil || !strings.Contains(*r, "failed health checks") {
		t.Errorf("kill reason %v, want failed health checks", r)
	}
	t.Logf("killed after %d calls", calls)
	if v := counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "late", "result", "failed"); v != DefaultProbeFailures {
		t.Errorf("health_checks_total{result=failed} = %v, want %d", v, DefaultProbeFailures)
	}
	// The restarted plugin answers again. Its first calls may still miss
	// the 50 ms deadline on a busy machine (the breaker may be open from
	// the misses before the restart), so the test waits for an answer
	// rather than expecting the very next call to make it.
	var last error
	if !testkit.Poll(time.Minute, func() bool {
		last = s.Score(context.Background(), request, candidates(), make([]float64, 4))
		return last == nil
	}) {
		t.Errorf("Score after the restart: no answer within a minute, last error %v", last)
	}
}

// TestHandlerNeverReturns: a scorer that blocks forever while the health
// service still answers is not killed by the probe, which keeps finding
// the process healthy; its calls time out, the circuit breaker opens and
// its policies decide by fallback. Once its calls have had no answer for
// StallTimeout, the stall rule kills it at the next call that times out
// (a half-open trial of the breaker), and it is restarted.
func TestHandlerNeverReturns(t *testing.T) {
	const stall = time.Second
	// The breaker stays open 3 s: the call right after the one that opened
	// it is refused however busy the machine.
	h, reg := faultHost(t, Options{
		Health:  HealthPolicy{ProbeInterval: 10 * time.Millisecond, ProbeTimeout: 10 * time.Second, StallTimeout: stall},
		Breaker: BreakerPolicy{OpenTimeout: 3 * time.Second},
	})
	b := block("stuck", "freeze") // every scorer call blocks forever; the picker answers
	b.CallTimeout = 30 * time.Millisecond
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	picker := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	old := procOf(t, h, "stuck")
	score := func() error { return s.Score(context.Background(), request, candidates(), make([]float64, 4)) }
	// The plugin answers a pick (retried: a busy machine may make one
	// late), so its stream has answered before the scorer's calls.
	if !testkit.Poll(time.Minute, func() bool {
		c := candidates()
		c.Costs = []float64{3, 2, 1, 4}
		row, err := picker.Pick(context.Background(), request, c)
		return err == nil && row == 2
	}) {
		t.Fatal("the plugin answered no pick within a minute")
	}
	if old.rc.LastAnswer().IsZero() {
		t.Fatal("LastAnswer is zero after an answered pick")
	}
	base := h.Stats("stuck")
	var errs []error
	for range DefaultBreakerConsecutiveFailures + 1 {
		errs = append(errs, score())
	}
	for i, err := range errs {
		want := ErrCallTimeout
		if i >= DefaultBreakerConsecutiveFailures {
			want = ErrBreakerOpen
		}
		if !errors.Is(err, want) {
			t.Errorf("call %d: %v, want %v", i, err, want)
		}
	}
	// No call is made now, so nothing can evaluate the stall rule: the
	// probe keeps finding the process healthy, past StallTimeout.
	ss := old.stallSince.Load()
	if ss == nil {
		t.Fatal("no stall recorded after the timeouts")
	}
	stuckSince := *ss
	okBefore := counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "stuck", "result", "ok")
	if !testkit.Poll(time.Minute, func() bool {
		return time.Since(stuckSince) > stall &&
			counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "stuck", "result", "ok") >= okBefore+3
	}) {
		t.Fatal("no health checks after the timeouts")
	}
	if v := counterValue(t, reg, "switchyard_plugin_health_checks_total", "plugin", "stuck", "result", "failed"); v > 0 {
		t.Errorf("health_checks_total{result=failed} = %v before the kill, want none", v)
	}
	if p, st := runningProc(h, "stuck"), h.Status("stuck"); p != old || st != StatusUp || old.killReason.Load() != nil {
		t.Fatalf("status %v, kill reason %v; want up with the same process (not killed before a call finds the stall)", st, old.killReason.Load())
	}
	if st := h.Stats("stuck"); st.Restarts != 0 || st.Timeouts-base.Timeouts != DefaultBreakerConsecutiveFailures {
		t.Errorf("Stats = %+v (before the scorer's calls %+v), want no restart and %d more timeouts", st, base, DefaultBreakerConsecutiveFailures)
	}
	// Open, or half-open once OpenTimeout has passed (the probe refreshes
	// the gauge): no call has gone through since it opened.
	if v := counterValue(t, reg, "switchyard_plugin_breaker_state", "plugin", "stuck"); v != 2 && v != 1 {
		t.Errorf("breaker_state = %v, want 2 (open) or 1 (half-open)", v)
	}

	// Calls again: refused by the open breaker, until its half-open trial
	// call times out too and finds the stream silent for StallTimeout.
	calls := 0
	if !testkit.Poll(time.Minute, func() bool {
		if p := runningProc(h, "stuck"); p != nil && p != old {
			return true
		}
		if err := score(); err != nil && !fallbackable(err) {
			t.Fatalf("Score on a stuck plugin: %v, want an error the fallback covers", err)
		}
		calls++
		time.Sleep(10 * time.Millisecond)
		return false
	}) {
		t.Fatalf("the stuck plugin was not restarted within a minute (status %v, kill reason %v)", h.Status("stuck"), old.killReason.Load())
	}
	t.Logf("killed %v after its first unanswered call, %d calls later", time.Since(stuckSince), calls)
	if r := old.killReason.Load(); r == nil || *r != "no answer to any decision call for 1s" {
		t.Errorf("kill reason %v, want no answer to any decision call for 1s", r)
	}
	if !groupGone(old.pid) {
		t.Errorf("the stuck process group %d is still alive", old.pid)
	}
	if st := h.Stats("stuck"); st.Restarts != 1 || st.Timeouts-base.Timeouts != DefaultBreakerConsecutiveFailures+1 {
		t.Errorf("Stats = %+v (before the scorer's calls %+v), want 1 restart and %d more timeouts (the last one the breaker's trial)",
			st, base, DefaultBreakerConsecutiveFailures+1)
	}
	if v := counterValue(t, reg, "switchyard_plugin_up", "plugin", "stuck"); v != 1 {
		t.Errorf("switchyard_plugin_up = %v after the restart, want 1", v)
	}
}

// TestSlowPluginNotStuck: a plugin that answers every call, each well
// after call_timeout, is slow, not stuck: its late answers are counted
// (LastAnswer advances), and the stall rule does not kill it while its
// calls time out for several times StallTimeout.
func TestSlowPluginNotStuck(t *testing.T) {
	const stall = time.Second
	h, reg := faultHost(t, Options{Health: HealthPolicy{StallTimeout: stall}, Breaker: BreakerPolicy{Disabled: true}})
	b := block("slow", "slow")
	b.CallTimeout = 50 * time.Millisecond
	b.Env["SY_SLOW"] = (3 * b.CallTimeout).String()
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	p := procOf(t, h, "slow")
	start := time.Now()
	answers := 0 // times LastAnswer was seen to advance
	last := p.rc.LastAnswer()
	calls, timeouts := 0, 0
	for time.Since(start) < 4*stall {
		// A timeout, or a success when the caller, starved, got the CPU
		// back only after the late answer was in.
		err := s.Score(context.Background(), request, candidates(), make([]float64, 4))
		if err != nil && !errors.Is(err, ErrCallTimeout) {
			t.Fatalf("call %d: %v, want a timeout (each answer comes 3 x call_timeout late)", calls, err)
		}
		calls++
		if err != nil {
			timeouts++
		}
		if a := p.rc.LastAnswer(); a.After(last) {
			answers++
			last = a
		}
	}
	t.Logf("%d calls, %d timeouts, LastAnswer advanced %d times", calls, timeouts, answers)
	if timeouts == 0 {
		t.Fatal("no call timed out")
	}
	if answers == 0 || !last.After(start) {
		t.Errorf("LastAnswer %v never advanced after the calls began at %v: the late answers were not counted", last, start)
	}
	if cur, st := runningProc(h, "slow"), h.Status("slow"); cur != p || st != StatusUp || p.killReason.Load() != nil {
		t.Errorf("status %v, kill reason %v; want up with the same process", st, p.killReason.Load())
	}
	if st := h.Stats("slow"); st.Restarts != 0 || st.Timeouts != int64(timeouts) {
		t.Errorf("Stats = %+v, want no restart and %d timeouts", st, timeouts)
	}
	if v := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "slow", "code", "timeout"); v != float64(timeouts) {
		t.Errorf("call_errors_total{code=timeout} = %v, want %d", v, timeouts)
	}
}

// TestLongCrashLoop: a plugin whose restarts exit while being configured
// is restarted max_restarts times within window with a growing backoff,
// then is crash-looping (StatusBackoff): its calls fail fast for the
// fallback while it is retried with a backoff that keeps doubling. Once it
// no longer crashes it serves again by itself; after it has stayed up for
// window, a new crash counts as a first restart again.
func TestLongCrashLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	h, reg := faultHost(t, Options{})
	rp := RestartPolicy{MaxRestarts: 3, Window: 5 * time.Second, BackoffMin: 40 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	h.SetRestartPolicy("looper", rp)
	b := block("looper", "crash")
	dir := t.TempDir()
	starts, crash := filepath.Join(dir, "starts"), filepath.Join(dir, "crash")
	b.Env["SY_STARTS"], b.Env["SY_CRASH"] = starts, crash
	if err := os.WriteFile(crash, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	picker := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	pick := func() (int, error) {
		c := candidates()
		c.Costs = []float64{3, 2, 1, 4}
		return picker.Pick(context.Background(), request, c)
	}
	if err := syscall.Kill(currentPID(h, "looper"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The gauges follow the status a moment later (setStatus).
	if !testkit.Poll(time.Minute, func() bool {
		return h.Status("looper") == StatusBackoff &&
			counterValue(t, reg, "switchyard_plugin_state", "plugin", "looper", "state", "backoff") == 1
	}) {
		t.Fatalf("status %v, want backoff", h.Status("looper"))
	}
	if n := len(readStarts(t, starts)); n < 1+rp.MaxRestarts {
		t.Errorf("crash-looping after %d starts, want 1 + max_restarts %d", n, rp.MaxRestarts)
	}
	if v := counterValue(t, reg, "switchyard_plugin_up", "plugin", "looper"); v != 0 {
		t.Errorf("switchyard_plugin_up = %v, want 0", v)
	}
	if _, err := pick(); !errors.Is(err, ErrBackoff) || !errors.Is(err, pluginclient.ErrPluginClosed) || !fallbackable(err) {
		t.Errorf("Pick on a crash-looping plugin: %v, want ErrBackoff", err)
	}
	// It keeps being retried, each delay at least the backoff's, which
	// doubles from backoff_min to backoff_max and, in the crash loop, on.
	const attempts = 3 // in the crash loop
	if !testkit.Poll(time.Minute, func() bool { return len(readStarts(t, starts)) >= 1+rp.MaxRestarts+attempts }) {
		t.Fatalf("%d starts, want %d retries in the crash loop", len(readStarts(t, starts)), attempts)
	}
	// times[i] is the start of restart i, which came backoff(i) (+-20%)
	// after restart i-1 crashed: 40ms, 80ms, 100ms, then 100ms, 200ms,
	// 400ms in the crash loop.
	times := readStarts(t, starts)
	backoff := []time.Duration{0}
	for cur, k := rp.BackoffMin, 1; k < len(times); k++ {
		backoff = append(backoff, cur)
		if k <= rp.MaxRestarts {
			cur = min(2*cur, rp.BackoffMax)
		} else {
			cur = min(2*cur, CrashLoopBackoffMax)
		}
	}
	var gaps []time.Duration
	for i := 2; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		gaps = append(gaps, gap.Round(time.Millisecond))
		if lo := time.Duration(float64(backoff[i]) * (1 - backoffJitter)); gap < lo {
			t.Errorf("gap before restart %d = %v, want at least its backoff %v (-20%%)", i, gap, backoff[i])
		}
	}
	t.Logf("backoffs %v; gaps between restarts (backoff, crash, restart): %v", backoff[2:], gaps)

	// It no longer crashes: an attempt brings it back, and it stays up
	// for window.
	if err := os.Remove(crash); err != nil {
		t.Fatal(err)
	}
	var up *proc
	if !testkit.Poll(time.Minute, func() bool { up = runningProc(h, "looper"); return up != nil }) {
		t.Fatalf("status %v, want up once it no longer crashes", h.Status("looper"))
	}
	time.Sleep(time.Until(up.upSince.Add(rp.Window + 500*time.Millisecond)))
	if p, st := runningProc(h, "looper"), h.Status("looper"); p != up || st != StatusUp {
		t.Fatalf("status %v, want up with the same process for window", st)
	}
	if row, err := pick(); err != nil || row != 2 {
		t.Errorf("Pick after the crash loop = %d, %v; want 2", row, err)
	}
	if v := counterValue(t, reg, "switchyard_plugin_state", "plugin", "looper", "state", "up"); v != 1 {
		t.Errorf("switchyard_plugin_state{state=up} = %v, want 1", v)
	}
	if v := counterValue(t, reg, "switchyard_plugin_state", "plugin", "looper", "state", "backoff"); v != 0 {
		t.Errorf("switchyard_plugin_state{state=backoff} = %v, want 0", v)
	}

	// Up for window: crashes again start from max_restarts quick restarts
	// before the next crash loop.
	before := len(readStarts(t, starts))
	if err := os.WriteFile(crash, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(currentPID(h, "looper"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(time.Minute, func() bool { return h.Status("looper") == StatusBackoff }) {
		t.Fatalf("status %v, want backoff", h.Status("looper"))
	}
	if n := len(readStarts(t, starts)) - before; n < rp.MaxRestarts {
		t.Errorf("crash-looping again after %d restarts, want max_restarts %d", n, rp.MaxRestarts)
	}
}

func readStarts(t *testing.T, file string) []time.Time {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("starts line %q", line)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, time.Unix(0, ns))
	}
	return out
}

// TestGrandchildHoldingStderr: the plugin's grandchild holds its stderr
// (and exit pipe) for an hour; kill -9 of the plugin alone is still seen
// (the process itself is watched) and the plugin restarted, and Shutdown,
// the restarted plugin's grandchild holding its stderr too, stops it
// within its bounds.
func TestGrandchildHoldingStderr(t *testing.T) {
	h, _ := faultHost(t, Options{})
	b := block("parent", "grandchild-stderr")
	childFile := filepath.Join(t.TempDir(), "child")
	b.Env["SY_CHILD"] = childFile
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatalf("Start: %v", err)
	}
	pid := currentPID(h, "parent")
	raw, err := os.ReadFile(childFile)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(string(raw))
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(time.Minute, func() bool { p := currentPID(h, "parent"); return p != 0 && p != pid }) {
		t.Fatalf("the plugin's death was not handled (status %v)", h.Status("parent"))
	}
	t.Logf("restarted %v after kill -9", time.Since(killed))
	if !groupGone(pid) {
		t.Errorf("the old group %d (grandchild %d) survived", pid, child)
	}
	// The grandchild holding the stderr pipe does not hold up Shutdown:
	// a stop step that ran out of killWait would make it return an error.
	restarted := currentPID(h, "parent")
	start := time.Now()
	if err := h.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	t.Logf("Shutdown took %v", time.Since(start))
	if !groupGone(restarted) {
		t.Errorf("the restarted plugin's group %d survived Shutdown", restarted)
	}
}

// TestLongStartKillCycles: 100 kill -9 and restart cycles, then Shutdown,
// leave goroutines, file descriptors and socket directories as they were.
func TestLongStartKillCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	before := goleak.IgnoreCurrent()
	fds := openFDs(t)
	dirs, _ := filepath.Glob(filepath.Join(tmpDir, "sy-*"))

	h := NewHost(Options{Logger: testLogger(), Restart: RestartPolicy{MaxRestarts: 1000, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond}})
	types, err := h.Start(context.Background(), block("cycled", ""))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	picker := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	const cycles = 100
	start := time.Now()
	for i := range cycles {
		pid := currentPID(h, "cycled")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if !testkit.Poll(time.Minute, func() bool { p := currentPID(h, "cycled"); return p != 0 && p != pid }) {
			t.Fatalf("cycle %d: not restarted (status %v)", i, h.Status("cycled"))
		}
	}
	c := candidates()
	c.Costs = []float64{3, 2, 1, 4}
	if row, err := picker.Pick(context.Background(), request, c); err != nil || row != 2 {
		t.Errorf("Pick after %d restarts = %d, %v", cycles, row, err)
	}
	t.Logf("%d kill/restart cycles in %v", cycles, time.Since(start))
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if s := h.Stats("cycled"); s.Restarts != cycles {
		t.Errorf("Restarts = %d, want %d", s.Restarts, cycles)
	}
	assertNoLeftovers(t)
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left: %v", err)
	}
	var after int
	testkit.Poll(time.Minute, func() bool { after = openFDs(t); return after <= fds })
	if after > fds {
		t.Errorf("open fds: %d before, %d after", fds, after)
	}
	if d, _ := filepath.Glob(filepath.Join(tmpDir, "sy-*")); len(d) != len(dirs) {
		t.Errorf("socket directories: %v before, %v after", dirs, d)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting open file descriptors: %v", err)
	}
	return len(ents)
}

// TestAnswerTooLarge: an answer over the message-size limit is a clear
// error (not a timeout: call_timeout is block's 30 s), and the plugin keeps
// serving.
func TestAnswerTooLarge(t *testing.T) {
	h, reg := faultHost(t, Options{})
	b := block("big", "big")
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	p := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	err = s.Score(context.Background(), request, candidates(), make([]float64, 4))
	if !errors.Is(err, ErrTooLarge) || !fallbackable(err) {
		t.Errorf("Score: %v; want ErrTooLarge", err)
	}
	if v := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "big", "code", "too_large"); v != 1 {
		t.Errorf("call_errors_total{code=too_large} = %v, want 1", v)
	}
	if v := counterValue(t, reg, "switchyard_plugin_fallbacks_total", "plugin", "big", "reason", "too_large"); v != 1 {
		t.Errorf("fallbacks_total{reason=too_large} = %v, want 1", v)
	}
	c := candidates()
	c.Costs = []float64{3, 2, 1, 4}
	if row, err := p.Pick(context.Background(), request, c); err != nil || row != 2 {
		t.Errorf("Pick after the over-size answer = %d, %v", row, err)
	}
	if s := h.Stats("big"); s.Restarts != 0 {
		t.Errorf("Restarts = %d, want 0", s.Restarts)
	}
}

// TestBreaker: consecutive failures open the breaker, which then refuses
// a call without reaching the plugin (the plugin numbers the calls it
// gets, so the refused one would have shifted the numbers); after its
// timeout a trial call closes it.
func TestBreaker(t *testing.T) {
	h, reg := faultHost(t, Options{Breaker: BreakerPolicy{OpenTimeout: 100 * time.Millisecond}})
	b := block("flaky", "fail")
	// The plugin's calls 1-5 fail, 6 succeeds, 7 fails.
	b.Env["SY_FAIL"] = strings.Repeat("error,", DefaultBreakerConsecutiveFailures) + "ok,error"
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	score := func() error { return s.Score(context.Background(), request, candidates(), make([]float64, 4)) }
	var ce *CallError
	for i := range DefaultBreakerConsecutiveFailures {
		if err := score(); !errors.As(err, &ce) || ce.Cause != codeError {
			t.Fatalf("call %d: %v, want the plugin's error", i, err)
		}
	}
	if v := counterValue(t, reg, "switchyard_plugin_breaker_state", "plugin", "flaky"); v != 2 {
		t.Errorf("breaker_state = %v, want 2 (open)", v)
	}
	opened := time.Now()
	err = score()
	if !errors.Is(err, ErrBreakerOpen) || !errors.As(err, &ce) || ce.Cause != codeBreakerOpen || !fallbackable(err) {
		t.Errorf("a call while open: %v, want ErrBreakerOpen with cause breaker_open", err)
	}
	time.Sleep(time.Until(opened.Add(120 * time.Millisecond))) // past OpenTimeout: half-open
	// The trial call is the plugin's call 6, which succeeds: the refused
	// call never reached it.
	if err := score(); err != nil {
		t.Errorf("the half-open trial call: %v, want the plugin's 6th call (ok)", err)
	}
	want := `plugin "flaky": plugin decide: scorer "agg/p/cost": injected error on call 7`
	if err := score(); err == nil || err.Error() != want {
		t.Errorf("a call after the breaker closed: %v, want %s", err, want)
	}
	if v := counterValue(t, reg, "switchyard_plugin_breaker_state", "plugin", "flaky"); v != 0 {
		t.Errorf("breaker_state = %v, want 0 (closed)", v)
	}
	if v := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "flaky", "code", "breaker_open"); v != 1 {
		t.Errorf("call_errors_total{code=breaker_open} = %v, want 1", v)
	}
	if diff := cmp.Diff(Stats{Calls: 8, Errors: 7, Fallbacks: 7}, h.Stats("flaky")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// TestShadowCallsLeaveTheBreakerAlone: a shadow decision's failed calls
// (pipeline.WithShadow) never open the breaker that the live calls to the
// same plugin go through, and are not fallbacks; they are call errors.
func TestShadowCallsLeaveTheBreakerAlone(t *testing.T) {
	h, reg := faultHost(t, Options{Breaker: BreakerPolicy{OpenTimeout: time.Hour}})
	b := block("shared", "fail")
	n := DefaultBreakerConsecutiveFailures + 2
	b.Env["SY_FAIL"] = strings.Repeat("error,", n) + "ok"
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	shadowCtx := pipeline.WithShadow(context.Background())
	var ce *CallError
	for i := range n {
		if err := s.Score(shadowCtx, request, candidates(), make([]float64, 4)); !errors.As(err, &ce) || ce.Cause != codeError {
			t.Fatalf("shadow call %d: %v, want the plugin's error", i, err)
		}
	}
	if v := counterValue(t, reg, "switchyard_plugin_breaker_state", "plugin", "shared"); v != 0 {
		t.Errorf("breaker_state = %v after %d failed shadow calls, want 0 (closed)", v, n)
	}
	// The live call reaches the plugin (its call n+1, which succeeds).
	if err := s.Score(context.Background(), request, candidates(), make([]float64, 4)); err != nil {
		t.Errorf("the live call after the shadow's failures: %v", err)
	}
	if v := counterValue(t, reg, "switchyard_plugin_fallbacks_total", "plugin", "shared", "reason", "error"); v > 0 {
		t.Errorf("fallbacks_total{reason=error} = %v, want none (nothing falls back for a shadow)", v)
	}
	if v := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "shared", "code", "error"); v != float64(n) {
		t.Errorf("call_errors_total{code=error} = %v, want %d", v, n)
	}
	if diff := cmp.Diff(Stats{Calls: int64(n + 1), Errors: int64(n)}, h.Stats("shared")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// TestMetricsAcrossHosts: the old and new Host of a reload share one
// registry; the new one owns the gauges.
func TestMetricsAcrossHosts(t *testing.T) {
	reg := prometheus.NewRegistry()
	old := NewHost(Options{Logger: testLogger(), Registerer: reg})
	if _, err := old.Start(context.Background(), block("same", "")); err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(reg) // a second set on the same registry reuses the collectors
	if err != nil {
		t.Fatalf("NewMetrics on a registry that has them: %v", err)
	}
	cur := NewHost(Options{Logger: testLogger(), Metrics: m})
	if _, err := cur.Start(context.Background(), block("same", "")); err != nil {
		t.Fatal(err)
	}
	if err := old.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The gauges belong to the Host that started the plugin last.
	if v := counterValue(t, reg, "switchyard_plugin_up", "plugin", "same"); v != 1 {
		t.Errorf("switchyard_plugin_up = %v after the old host stopped", v)
	}
	if err := cur.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "switchyard_plugin_up"); err != nil {
		t.Errorf("switchyard_plugin_up after both hosts stopped: %v", err)
	}
	assertNoLeftovers(t)
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestCallErrorCauses: a component's error and its panic fail the call
// with a *CallError naming the plugin and the cause ("error", "panic"),
// and each failure is logged at warn, the first of each cause and then
// every FailureLog.Every-th.
func TestCallErrorCauses(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	h := NewHost(Options{
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "host", Output: &logs, Level: hclog.Warn}),
		Registerer: reg,
		FailureLog: FailureLogPolicy{Every: 2},
	})
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		assertNoLeftovers(t)
	})
	b := block("flaky", "fail")
	b.Env["SY_FAIL"] = "ok,error,panic"
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	for call := 1; call <= 9; call++ {
		err := s.Score(context.Background(), request, candidates(), make([]float64, 4))
		var ce *CallError
		switch call % 3 {
		case 1:
			if err != nil {
				t.Errorf("call %d: %v, want success", call, err)
			}
		case 2:
			want := fmt.Sprintf(`plugin "flaky": plugin decide: scorer "agg/p/cost": injected error on call %d`, call)
			if !errors.As(err, &ce) || ce.Plugin != "flaky" || ce.Cause != "error" || err.Error() != want || !fallbackable(err) {
				t.Errorf("call %d: %#v, want a CallError of cause error: %s", call, err, want)
			}
		case 0:
			want := fmt.Sprintf(`plugin "flaky": plugin decide: scorer "agg/p/cost" panicked: injected panic on call %d`, call)
			if !errors.As(err, &ce) || ce.Plugin != "flaky" || ce.Cause != "panic" || err.Error() != want ||
				!errors.Is(err, pluginclient.ErrComponentPanicked) || !fallbackable(err) {
				t.Errorf("call %d: %#v, want a CallError of cause panic: %s", call, err, want)
			}
		}
	}
	if diff := cmp.Diff(Stats{Calls: 9, Errors: 6, Fallbacks: 6}, h.Stats("flaky")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	for _, code := range []string{"error", "panic"} {
		if v := counterValue(t, reg, "switchyard_plugin_call_errors_total", "plugin", "flaky", "code", code); v != 3 {
			t.Errorf("call_errors_total{code=%s} = %v, want 3", code, v)
		}
	}
	// Failures 1 and 3 of each cause are logged: calls 2 and 8 (error),
	// 3 and 9 (panic); 5 and 6, the second of each, are not.
	var got []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "[WARN]  host.flaky: plugin call failed: ") {
			_, kv, _ := strings.Cut(line, "failed: ")
			got = append(got, kv)
		}
	}
	want := []string{
		`call=decide cause=error failures=1 error="plugin \"flaky\": plugin decide: scorer \"agg/p/cost\": injected error on call 2"`,
		`call=decide cause=panic failures=1 error="plugin \"flaky\": plugin decide: scorer \"agg/p/cost\" panicked: injected panic on call 3"`,
		`call=decide cause=error failures=3 error="plugin \"flaky\": plugin decide: scorer \"agg/p/cost\": injected error on call 8"`,
		`call=decide cause=panic failures=3 error="plugin \"flaky\": plugin decide: scorer \"agg/p/cost\" panicked: injected panic on call 9"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s\nlog:\n%s", diff, logs.String())
	}
}
