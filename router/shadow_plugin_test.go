package router

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// shadowPluginHCL runs round-robin live with cmd/plugin-example's
// queue-depth scorer (min-cost picker) as its shadow.
func shadowPluginHCL() string {
	return fmt.Sprintf(`plugin "example" {
  command      = %q
  call_timeout = "2s"
}

policy "live" {
  picker "rr" { type = "round-robin" }
  shadow = "queue"
}

policy "queue" {
  scorer "depth" { type = "queue-depth" }
  picker "pick" { type = "min-cost" }
}

worker_selection { aggregated = "live" }
`, pluginBin)
}

// shadowTally counts a Router's shadow outcomes as Observe reports them.
type shadowTally struct {
	mu     sync.Mutex
	counts map[ShadowResult]int
	total  int
}

func (s *shadowTally) observe(o ShadowOutcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[o.Result]++
	s.total++
}

func (s *shadowTally) snapshot() (map[ShadowResult]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[ShadowResult]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out, s.total
}

// waitTally waits (60 s at most) until cond holds of the tally.
func waitTally(t *testing.T, s *shadowTally, what string, cond func(map[ShadowResult]int, int) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, n := s.snapshot()
		if cond(c, n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s, %s: shadow outcomes %v (total %d)", what, c, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitStopped waits (60 s at most) until process pid is stopped: a signal
// is delivered asynchronously.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin %d not stopped after 60s: %s", pid, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestShadowPluginHangsAndCrashes: a shadow served by a real plugin
// process. While the plugin is stopped (SIGSTOP) and then killed, every
// live decision is made by the live policy in its order, never by a
// fallback; the shadow's decisions are counted failed, dropped (a queue of
// 2) or sampled out, never more than MaxInFlight run at once, and once
// the plugin is restarted the shadow answers again. The metrics count what Observe saw; TestMain
// checks that no goroutine is left.
func TestShadowPluginHangsAndCrashes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("signals the plugin process found in /proc")
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, shadowPluginHCL())
	reg := prometheus.NewRegistry()
	b, host := loadFile(t, path, reg)
	tally := &shadowTally{counts: map[ShadowResult]int{}}
	const maxInFlight = 2
	r, err := New(Options{Bundle: b, BookingsAreLoad: true, Registerer: reg,
		Shadow: ShadowOptions{MaxInFlight: maxInFlight, QueueLen: 2, Observe: tally.observe}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = r.Close(context.Background())
		}
	})
	addWorkers(t, r)
	pids := pluginPIDs()
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want one", pids)
	}
	pid, _ := strconv.Atoi(pids[0])

	placed := 0
	place := func(n int) {
		t.Helper()
		for range n {
			d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8}, Placement{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Policy != "live" || d.Fallback || d.Worker.ID != shared.WorkerID(placed%workers+1) {
				t.Fatalf("decision %d: policy %q fallback %v worker %d", placed, d.Policy, d.Fallback, d.Worker.ID)
			}
			d.Booking.Release()
			placed++
			if n := r.shadowPool.running.Load(); n > maxInFlight {
				t.Fatalf("%d shadow decisions in flight, limit %d", n, maxInFlight)
			}
		}
	}

	// Healthy: every shadow decision answers (one at a time: the queue
	// is short so that the stopped plugin below holds few).
	for i := range 40 {
		place(1)
		waitTally(t, tally, "each shadow", func(_ map[ShadowResult]int, n int) bool { return n == i+1 })
	}
	healthy, _ := tally.snapshot()
	if healthy[ShadowAgree]+healthy[ShadowDisagree] != 40 {
		t.Fatalf("healthy plugin: outcomes %v", healthy)
	}

	// Hung: the plugin process is stopped. The live path is unaffected;
	// the shadow fails (its call_timeout, then the open breaker), or is
	// dropped while two hang and two wait, or sampled out once the rate
	// adapts.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, pid)
	place(60)
	waitTally(t, tally, "100 shadows", func(_ map[ShadowResult]int, n int) bool { return n == 100 })
	hung, _ := tally.snapshot()
	if hung[ShadowAgree]+hung[ShadowDisagree] != healthy[ShadowAgree]+healthy[ShadowDisagree] ||
		hung[ShadowFailed]+hung[ShadowDropped]+hung[ShadowSampledOut] != 60 || hung[ShadowFailed] == 0 {
		t.Fatalf("stopped plugin: outcomes %v after %v", hung, healthy)
	}

	// Crashed: the plugin is killed. Live decisions go on while it is
	// restarted; then the shadow answers again.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	answered := hung[ShadowAgree] + hung[ShadowDisagree]
	deadline := time.Now().Add(60 * time.Second)
	for {
		place(4)
		c, _ := tally.snapshot()
		if c[ShadowAgree]+c[ShadowDisagree] > answered && host.Status("example") == supervisor.StatusUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shadow did not answer again within 60s of the crash: outcomes %v, plugin %s", c, host.Status("example"))
		}
		time.Sleep(20 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	closed = true
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	final, total := tally.snapshot()
	if total != placed {
		t.Errorf("%d shadow outcomes for %d decisions", total, placed)
	}
	for _, res := range []ShadowResult{ShadowAgree, ShadowDisagree, ShadowFailed, ShadowDropped, ShadowNone, ShadowSampledOut} {
		got := testutil.ToFloat64(r.shadowMetrics.decisions.WithLabelValues("aggregated", "live", "queue", string(res)))
		if int(got) != final[res] {
			t.Errorf("switchyard_shadow_decisions_total{result=%q} = %v, Observe saw %d", res, got, final[res])
		}
	}
	if n := testutil.CollectAndCount(r.shadowMetrics.seconds); n != 1 {
		t.Errorf("switchyard_shadow_decision_seconds has %d series, want 1", n)
	}
	if got := pluginPIDs(); len(got) > 0 {
		t.Errorf("plugin processes %v left after Close", got)
	}
}
