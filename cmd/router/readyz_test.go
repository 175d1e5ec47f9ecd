package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// readyz GETs base's /readyz and decodes it.
func readyz(t *testing.T, base string) (int, live.Readiness) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var a live.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, a
}

// waitReadyz polls /readyz until ok holds of its answer (30 s at most).
func waitReadyz(t *testing.T, base string, stderr *serveStderr, what string, ok func(int, live.Readiness) bool) (int, live.Readiness) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, a := readyz(t, base)
		if ok(code, a) {
			return code, a
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /readyz after 30s: %d %+v\nstderr:\n%s", what, code, a, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeReadyzExplains runs `router serve` with the queue-depth plugin
// policy over a mock engine without metrics (SGLang without
// --enable-metrics) and a port nothing listens on. The mock is ready with
// its load unavailable and one warning; the dead worker's connection
// refused is logged once; /readyz says so per worker. When the plugin is
// killed (max_restarts = 0), /readyz stays 200 and calls it degraded, and
// requests are served by the fallback.
func TestServeReadyzExplains(t *testing.T) {
	bin := examplePlugin(t, "plugin-example")
	mw, err := mockworker.New(mockworker.Config{Model: "mock", Speedup: 50, BlockTokens: 16, NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	var healths atomic.Int64
	sgl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			healths.Add(1)
		}
		mw.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		sgl.CloseClientConnections()
		sgl.Close()
		mw.Close()
	})
	down := closedPort(t)
	policy := queueDepthPolicy(t, bin, fmt.Sprintf(`
worker "down" {
  url             = %q
  models          = ["mock"]
  total_kv_blocks = 1000
}
worker "sgl" {
  url             = %q
  models          = ["mock"]
  total_kv_blocks = 1000
}
`, down, sgl.URL))
	// The plugin is never restarted once killed.
	src, err := os.ReadFile(policy)
	if err != nil {
		t.Fatal(err)
	}
	patched := strings.Replace(string(src), fmt.Sprintf("command = %q", bin),
		fmt.Sprintf("command = %q\n  restart {\n    max_restarts = 0\n    backoff_min  = \"30s\"\n    backoff_max  = \"30s\"\n  }", bin), 1)
	if patched == string(src) {
		t.Fatal("the policy's plugin block changed; update the test")
	}
	policy = writeFile(t, "policy.hcl", patched)
	base, stderr, stop := startServe(t, "--policy", policy)

	_, a := waitReadyz(t, base, stderr, "sgl ready, down refused", func(code int, a live.Readiness) bool {
		return code == http.StatusOK && len(a.Workers) == 2 && a.Workers[1].Ready &&
			strings.HasPrefix(a.Workers[0].Reason, "connection refused")
	})
	wantWorkers := []live.WorkerReadiness{
		{Name: "down", URL: down, Role: "aggregated", Load: "unavailable", Reason: "connection refused by " + down + "/metrics"},
		{Name: "sgl", URL: sgl.URL, Role: "aggregated", Ready: true, Load: "unavailable",
			Reason: fmt.Sprintf("%s/metrics answers 404 (SGLang serves metrics only with --enable-metrics); ready by %s/health", sgl.URL, sgl.URL)},
	}
	if fmt.Sprint(a.Workers) != fmt.Sprint(wantWorkers) || !a.Ready || a.Policy.File != policy ||
		len(a.Plugins) != 1 || a.Plugins[0].Name != "example" || a.Plugins[0].State != "up" || a.Plugins[0].Status != "up" ||
		a.Plugins[0].Version != "0.1.0" || len(a.Plugins[0].SHA256) != 64 || a.Plugins[0].Started == "" {
		t.Errorf("/readyz %+v\nwant workers %+v and the plugin up", a, wantWorkers)
	}

	// Three more probes: the warning and the refusal are each logged once.
	n := healths.Load()
	deadline := time.Now().Add(30 * time.Second)
	for healths.Load() < n+3 {
		if time.Now().After(deadline) {
			t.Fatal("sgl not probed 3 more times in 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	logs := stderr.String()
	if n := strings.Count(logs, "[WARN]  router: worker engine load unknown: LOAD is unavailable, not idle: worker=sgl reason="); n != 1 {
		t.Errorf("%d load-unknown warnings for sgl, want 1:\n%s", n, logs)
	}
	refused := fmt.Sprintf(`[INFO]  router: worker probe failed: worker=down reason="connection refused by %s/metrics" ready=false consecutive_failures=1`, down)
	if n := strings.Count(logs, "worker probe failed: worker=down "); n != 1 || !strings.Contains(logs, refused) {
		t.Errorf("%d probe failures logged for down, want 1: %s\n%s", n, refused, logs)
	}
	if n := strings.Count(logs, "worker ready: worker=sgl "); n != 1 {
		t.Errorf("%d 'worker ready' lines for sgl, want 1:\n%s", n, logs)
	}

	// The plugin dies and is not restarted: degraded, still ready, and
	// the fallback serves.
	pids := procsOf(bin)
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want 1", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, a := waitReadyz(t, base, stderr, "plugin not up", func(_ int, a live.Readiness) bool {
		return len(a.Plugins) == 1 && a.Plugins[0].Status != "up"
	})
	if code != http.StatusOK || !a.Ready || a.Plugins[0].State != "degraded: serving by fallback" || a.Plugins[0].Status == "" {
		t.Errorf("plugin killed: %d %+v, want 200 with the plugin degraded", code, a)
	}
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"mock","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "sgl" {
		t.Errorf("with the plugin down: %d %s, want 200 from sgl", resp.StatusCode, body)
	}
	stop()
}
