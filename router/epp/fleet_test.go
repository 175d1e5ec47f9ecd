package epp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// policyWorker is one worker block of kvPolicy: the engine's base URL,
// the one model it lists and its total_kv_blocks.
type policyWorker struct {
	url, model string
	kvBlocks   int
}

// kvPolicy is a KV-aware policy file (kv-cost scored, the cheapest picked,
// no randomness) over block_size 16, with queue (a queue block or "")
// and a worker block for each of ws, named w0, w1, ...
func kvPolicy(queue string, ws ...policyWorker) string {
	var sb strings.Builder
	sb.WriteString(`router {
  block_size = 16
}

policy "kv" {
  scorer "cost" {
    type = "kv-cost"
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

worker_selection {
  aggregated = "kv"
}
`)
	sb.WriteString(queue)
	for i, w := range ws {
		fmt.Fprintf(&sb, "\nworker \"w%d\" {\n  url             = %q\n  models          = [%q]\n  total_kv_blocks = %d\n}\n", i, w.url, w.model, w.kvBlocks)
	}
	return sb.String()
}

// Fleet is the fixture this package's end-to-end tests share: mock
// engines (router/mockworker, 50x speed-up, 16-token blocks) on loopback,
// listed as the worker blocks w0, w1, ... of a kvPolicy file; the Router
// loaded from it; a workers.Manager probing them every 250ms; a
// live.Runtime over them with its dispatcher running (every 5ms); and a
// RouterPicker over that runtime, for the EPP. NewFleet returns once every
// engine is an aggregated worker of its model; t's cleanups stop it all.
//
// It is exported, in a _test.go file (so only in this package's test
// binary), for the external tests (gateway_test.go, multipart_test.go),
// which serve the EPP on a real gRPC listener behind the Envoy stand-in;
// the internal ones (picker_test.go, routes_test.go) serve it in memory.
type Fleet struct {
	Router   *router.Router
	Manager  *workers.Manager
	Runtime  *live.Runtime
	Registry *prometheus.Registry // the runtime's metrics
	Picker   *RouterPicker        // over Runtime, set up by FleetOptions.SetPicker
	Specs    []config.Worker      // the policy file's worker blocks, w0 first
	URLs     []string             // the engines' base URLs ("http://host:port"), w0 first
}

// FleetOptions is what differs between the fleets of the tests.
type FleetOptions struct {
	// Models has one entry per engine, w0 first: the model its worker
	// block lists, which its mock engine is pinned to
	// (mockworker.Config.Model).
	Models []string
	// Engines, when Models is nil, is the number of engines, each listed
	// as serving "m" with a mock engine that answers any model.
	Engines int
	// Queue is a queue block for the policy file, or "".
	Queue string
	// KVBlocks is each worker block's total_kv_blocks; 0 means 1000.
	KVBlocks int
	// Wrap, when set, returns the handler the engine at ep (host:port)
	// serving model is served through, given the mock engine's own.
	Wrap func(ep, model string, engine http.Handler) http.Handler
	// SetPicker, when set, sets up the Fleet's RouterPicker.
	SetPicker func(*RouterPicker)
}

// NewFleet starts the fleet o describes; it fails t when any part does
// not start or the workers are not ready after a minute.
func NewFleet(t *testing.T, o FleetOptions) *Fleet {
	t.Helper()
	pinned := o.Models != nil
	models := o.Models
	if !pinned {
		for range o.Engines {
			models = append(models, "m")
		}
	}
	kvBlocks := o.KVBlocks
	if kvBlocks == 0 {
		kvBlocks = 1000
	}
	f := &Fleet{}
	var ws []policyWorker
	for _, model := range models {
		cfg := mockworker.Config{Speedup: 50, BlockTokens: 16}
		if pinned {
			cfg.Model = model
		}
		m, err := mockworker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewUnstartedServer(m)
		if o.Wrap != nil {
			hs.Config.Handler = o.Wrap(hs.Listener.Addr().String(), model, m)
		}
		hs.Start()
		t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); m.Close() })
		f.URLs = append(f.URLs, hs.URL)
		ws = append(ws, policyWorker{url: hs.URL, model: model, kvBlocks: kvBlocks})
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(kvPolicy(o.Queue, ws...)), 0o644); err != nil {
		t.Fatal(err)
	}
	b, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	f.Specs = b.Workers()
	r, err := router.New(router.Options{Bundle: b.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	f.Router = r
	mgr, err := workers.NewManager(r, workers.Options{ScrapeInterval: 250 * time.Millisecond, BlockSize: r.BlockSize()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	f.Manager = mgr
	if err := mgr.Sync(f.Specs); err != nil {
		t.Fatal(err)
	}
	f.Registry = prometheus.NewRegistry()
	rt, err := live.New(live.Options{Router: r, Queue: b.Queue(), Workers: mgr, DispatchInterval: 5 * time.Millisecond, Registry: f.Registry})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rt.Dispatcher(ctx) }()
	t.Cleanup(func() { cancel(); <-done; rt.Close() })
	f.Runtime = rt
	f.Picker = &RouterPicker{Runtime: rt}
	if o.SetPicker != nil {
		o.SetPicker(f.Picker)
	}
	want := map[string]int{}
	for _, model := range models {
		want[model]++
	}
	deadline := time.Now().Add(time.Minute)
	for model, n := range want {
		for len(r.Workers(model, shared.RoleAggregated)) < n {
			if time.Now().After(deadline) {
				t.Fatalf("workers not ready after a minute: %+v", mgr.Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return f
}
