//go:build unix

package workers

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// TestProbeTimeoutsWhileHeldUpNotCounted: a ready worker's probes that
// time out while the router process itself is held up (stopped by
// SIGSTOP for 300 ms out of every 350 ms, as a process starved of CPU or
// throttled by a CPU limit is kept from running) are not counted against
// it: it stays ready, and the log says why. Once the hold-ups end, the
// same timeouts count and it leaves after 3.
func TestProbeTimeoutsWhileHeldUpNotCounted(t *testing.T) {
	r := newRouter(t)
	logs := &syncBuffer{}
	m, _ := newManager(t, r, Options{ScrapeInterval: every, Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	var hang atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if hang.Load() {
			<-req.Context().Done() // never answers within the probe's timeout
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, vllmMetrics)
	}))
	t.Cleanup(srv.Close)
	if err := m.Sync([]config.Worker{{Name: "w", URL: srv.URL, MetricsURL: srv.URL + "/metrics",
		Role: shared.RoleAggregated, Models: []string{"m"}, TotalKVBlocks: 100}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "w ready", membersAre(r, "m", shared.RoleAggregated, "w"))

	// A helper process stops and continues this one, ten times; it
	// continues it whatever happens to the helper.
	pid := strconv.Itoa(os.Getpid())
	stopper := exec.Command("sh", "-c", `trap 'kill -CONT `+pid+`' EXIT
for i in 1 2 3 4 5 6 7 8 9 10; do kill -STOP `+pid+`; sleep 0.3; kill -CONT `+pid+`; sleep 0.05; done`)
	if err := stopper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stopper.Process.Kill(); _ = stopper.Wait() })
	// The engine hangs once the first hold-up is seen, so that every
	// probe that times out has one.
	held := m.held.held()
	testkit.Eventually(t, "the first hold-up measured", func() bool { return m.held.held()-held >= 100*time.Millisecond })
	hang.Store(true)
	if err := stopper.Wait(); err != nil {
		t.Fatalf("the stopping helper: %v", err)
	}
	if got := names(r, "m", shared.RoleAggregated); len(got) != 1 {
		t.Errorf("members %v after the hold-ups, want w still ready; logs:\n%s", got, logs)
	}
	if st, _ := m.StatusOf("w"); !st.Ready || st.ScrapeFailures >= DefaultFailureThreshold {
		t.Errorf("w after the hold-ups: ready %v, %d consecutive failures, want ready; logs:\n%s", st.Ready, st.ScrapeFailures, logs)
	}
	if len(logLines(logs, "worker probe not counted", "w")) == 0 || strings.Contains(logs.String(), "worker not ready") {
		t.Errorf("the probes that timed out during the hold-ups are not logged as not counted, or w left:\n%s", logs)
	}

	// No hold-up any more: the timeouts count, and w leaves.
	testkit.Eventually(t, "w out once the router runs freely", membersAre(r, "m", shared.RoleAggregated))
	if l := logLines(logs, "worker not ready", "w"); len(l) != 1 || !strings.Contains(l[0], "3 consecutive probes failed: timeout: ") {
		t.Errorf("w's leaving logged as %q, want 3 timeouts", l)
	}
}
