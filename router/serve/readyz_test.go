package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// readyPolicy is a round-robin policy file with a plugin that cannot
// start, loaded under on_start_failure = "fallback".
const readyPolicy = `router {
  block_size = 16
}

plugin "gone" {
  command          = "/nonexistent/switchyard-plugin"
  on_start_failure = "fallback"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`

// getReadyz GETs url's /readyz and decodes the answer.
func getReadyz(t *testing.T, url string) (int, live.Readiness) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
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

// TestReadyzExplains runs a Server over a loaded policy file and a real
// workers.Manager probing four engines on loopback: a vLLM-like mock, an
// SGLang-like mock without metrics, a port nothing listens on and an engine
// whose metrics are 404 and /health 500. /readyz is 200 and says, per
// worker, ready or not and why; the plugin that did not start is degraded,
// not a reason to be unready. With no worker ready it is 503.
func TestReadyzExplains(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(readyPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	b, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	r, err := router.New(router.Options{Bundle: b.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	mgr, err := workers.NewManager(r, workers.Options{ScrapeInterval: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	rt, err := live.New(live.Options{Router: r, Workers: mgr})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(rt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)

	vllm := newMock(t, "", 50).URL
	noMetrics, err := mockworker.New(mockworker.Config{Speedup: 50, NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(noMetrics.Close)
	sgl := newRecorded(t, noMetrics).URL
	down := closedURL(t)
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(sick.Close)
	worker := func(name, url string, role shared.Role) config.Worker {
		return config.Worker{Name: name, URL: url, MetricsURL: url + "/metrics", Role: role, Models: []string{"m"}, TotalKVBlocks: 100}
	}
	ws := []config.Worker{worker("down", down, shared.RoleAggregated), worker("sgl", sgl, shared.RoleAggregated),
		worker("sick", sick.URL, shared.RoleAggregated), worker("vllm", vllm, shared.RoleDecode)}

	// No worker configured yet: not ready.
	code, a := getReadyz(t, hs.URL)
	if code != http.StatusServiceUnavailable || a.Reason != "no worker ready: none is configured" || len(a.Workers) != 0 {
		t.Errorf("no workers: %d %+v", code, a)
	}
	if err := mgr.Sync(ws); err != nil {
		t.Fatal(err)
	}
	want := []live.WorkerReadiness{
		{Name: "down", URL: down, Role: "aggregated", Load: "unavailable",
			Reason: "connection refused by " + down + "/metrics"},
		{Name: "sgl", URL: sgl, Role: "aggregated", Ready: true, Load: "unavailable",
			Reason: fmt.Sprintf("%s/metrics answers 404 (SGLang serves metrics only with --enable-metrics); ready by %s/health", sgl, sgl)},
		{Name: "sick", URL: sick.URL, Role: "aggregated", Load: "unavailable",
			Reason: fmt.Sprintf("HTTP status 500 from %s/health (and %s/metrics answers 404)", sick.URL, sick.URL)},
		{Name: "vllm", URL: vllm, Role: "decode", Ready: true, Load: "available"},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, a = getReadyz(t, hs.URL)
		if fmt.Sprint(a.Workers) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz workers after 30s:\n%+v\nwant\n%+v", a.Workers, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusOK || !a.Ready || a.Reason != "" {
		t.Errorf("two workers ready: %d ready %v reason %q, want 200", code, a.Ready, a.Reason)
	}
	if a.Policy != (live.PolicyReadiness{State: "loaded", File: path}) {
		t.Errorf("policy %+v", a.Policy)
	}
	if len(a.Plugins) != 1 || !reflect.DeepEqual(a.Plugins[0], live.PluginReadiness{Name: "gone", State: "degraded: serving by fallback", Status: "not started"}) {
		t.Errorf("plugins %+v, want gone degraded", a.Plugins)
	}

	// Only the failing workers: 503, each still saying why.
	if err := mgr.Sync([]config.Worker{ws[0], ws[2]}); err != nil {
		t.Fatal(err)
	}
	wantNone := fmt.Sprint([]live.WorkerReadiness{want[0], want[2]})
	deadline = time.Now().Add(30 * time.Second)
	for {
		code, a = getReadyz(t, hs.URL)
		if fmt.Sprint(a.Workers) == wantNone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz workers after 30s:\n%+v\nwant\n%s", a.Workers, wantNone)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || a.Ready || a.Reason != "no worker ready" {
		t.Errorf("no worker ready: %d ready %v reason %q, want 503", code, a.Ready, a.Reason)
	}

	// A closed router is not ready.
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, a := getReadyz(t, hs.URL); code != http.StatusServiceUnavailable || a.Reason != "router closed" || a.Policy.State != "router closed" {
		t.Errorf("closed: %d %+v", code, a)
	}
}
