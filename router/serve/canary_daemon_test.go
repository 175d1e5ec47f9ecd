//go:build linux

package serve

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/live"
)

// canaryPluginPID returns the one live process whose executable is bin.
func canaryPluginPID(t *testing.T, bin string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == bin {
			pid, _ := strconv.Atoi(e.Name())
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("processes of %s: %v, want one", bin, pids)
	}
	return pids[0]
}

// canaryStatus is the one canary /readyz shows.
func canaryStatus(t *testing.T, rd *runningDaemon) router.CanaryStatus {
	t.Helper()
	_, a := getReadyz(t, rd.base)
	if len(a.Canaries) != 1 {
		t.Fatalf("/readyz canaries %+v, want one", a.Canaries)
	}
	return a.Canaries[0]
}

// TestDaemonCanaryPluginRollsBack runs `router serve`'s face over a policy
// whose canary is cmd/plugin-example's queue-depth scorer, a real plugin
// process, on half the sessions. While the plugin serves, the candidate
// decides its share with no fallback and a session's turns stay on one
// side; once the plugin is stopped (SIGSTOP: each call runs into its
// call_timeout and the candidate's fallback decides), the canary rolls
// itself back on its fallback share: /readyz, /metrics and the log say
// so, and from then on the live policy decides every request, until a
// reload of the policy file starts the canary afresh. It reports (t.Log)
// the candidate decisions and the wall time from the stop to the
// rollback, not asserting either.
func TestDaemonCanaryPluginRollsBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a plugin process")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "canary-plugin-example")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/plugin-example").CombinedOutput(); err != nil {
		t.Fatalf("building cmd/plugin-example: %v\n%s", err, out)
	}
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf(`plugin "example" {
  command      = %q
  call_timeout = "100ms"
}

policy "live" {
  picker "rr" { type = "round-robin" }
  canary {
    policy = "trial"
    weight = 0.5
    rollback {
      max_fallback_share = 0.05
      max_ttft_p90       = "0s"
      window             = "60s"
      min_requests       = 10
    }
  }
}

policy "trial" {
  scorer "depth" { type = "queue-depth" }
  picker "pick" { type = "min-cost" }
}

worker_selection { aggregated = "live" }

worker "a" {
  url    = %q
  models = ["m"]
}
worker "b" {
  url    = %q
  models = ["m"]
}
`, bin, a.URL, b.URL))
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy, Registry: reg})
	rd.waitWorkers(t, "a", "b")

	sent := 0
	// send sends n requests of sessions "s<i mod 40>"; it returns how many
	// the candidate decided, by /readyz.
	send := func(n int) int64 {
		t.Helper()
		before := canaryStatus(t, rd).CandidateDecisions
		for range n {
			body := chatBody("m", sent%2 == 0, fmt.Sprintf("hello %d", sent))
			req, err := http.NewRequest(http.MethodPost, rd.base+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", fmt.Sprintf("s%d", sent%40))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: status %d: %s", sent, resp.StatusCode, out)
			}
			sent++
		}
		return canaryStatus(t, rd).CandidateDecisions - before
	}

	// Healthy: each session on its side, so 40 sessions twice put twice
	// the first round's count on the candidate.
	first := send(40)
	second := send(40)
	st := canaryStatus(t, rd)
	if first == 0 || first == 40 || second != first || st.Fallbacks != 0 || !st.Active || st.Window.Decisions != 2*first {
		t.Fatalf("healthy: candidate decided %d then %d of 40; status %+v", first, second, st)
	}
	if st.Policy != "live" || st.Candidate != "trial" || st.Role != "aggregated" || st.LiveDecisions != 80-2*first {
		t.Fatalf("status %+v", st)
	}

	pid := canaryPluginPID(t, bin)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin not stopped after a minute: %s", stat)
		}
	}
	stopped := time.Now()
	atStop := canaryStatus(t, rd).CandidateDecisions
	// One request at a time until the canary rolls back (every request
	// is answered meanwhile: the fallback decides).
	for i := 0; canaryStatus(t, rd).Active; i++ {
		if i == 400 {
			t.Fatalf("not rolled back after 400 requests: %+v\nlogs:\n%s", canaryStatus(t, rd), rd.logs)
		}
		send(1)
	}
	elapsed := time.Since(stopped)
	st = canaryStatus(t, rd)
	rb := st.RolledBack
	if rb == nil || rb.Reason != router.CanaryReasonFallbackShare || rb.Window.Fallbacks == 0 ||
		float64(rb.Window.Fallbacks) <= 0.05*float64(rb.Window.Decisions) {
		t.Fatalf("rollback %+v", rb)
	}
	t.Logf("rolled back after %d candidate decisions (%d fallbacks in a window of %d) and %v from the plugin's stop",
		rb.CandidateDecisions-atStop, rb.Window.Fallbacks, rb.Window.Decisions, elapsed.Round(time.Millisecond))
	if !strings.Contains(rd.logs.String(), "canary rolled back") {
		t.Errorf("no rollback in the log:\n%s", rd.logs)
	}
	if v := testutil.ToFloat64(mustCounter(t, reg, "switchyard_canary_rollbacks_total")); v != 1 {
		t.Errorf("switchyard_canary_rollbacks_total = %v", v)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP switchyard_canary_state 1 while a policy's canary sends its share of requests to the candidate, 0 once it rolled back (until the policy file is loaded again).
# TYPE switchyard_canary_state gauge
switchyard_canary_state{candidate="trial",policy="live",role="aggregated"} 0
`), "switchyard_canary_state"); err != nil {
		t.Error(err)
	}

	// Rolled back: the candidate decides nothing more.
	if n := send(40); n != 0 {
		t.Fatalf("the candidate decided %d requests after its rollback", n)
	}

	// A reload starts the canary afresh, with a new plugin process.
	if err := rd.d.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := canaryStatus(t, rd); !st.Active || st.CandidateDecisions != 0 || st.RolledBack != nil {
		t.Fatalf("after the reload: %+v", st)
	}
	if n := send(40); n != first {
		t.Fatalf("after the reload the candidate decided %d of 40, want %d as before", n, first)
	}
}

// mustCounter returns the one series of the counter family name in reg.
func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			v := mf.GetMetric()[0].GetCounter().GetValue()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
			c.Add(v)
			return c
		}
	}
	t.Fatalf("no single series of %s", name)
	return nil
}
