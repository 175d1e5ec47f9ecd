package workers

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// calls records the Manager's KVSources and EngineRestarted calls, in
// order, as "sources a [tcp://...]" or "restarted a".
type calls struct {
	mu  sync.Mutex
	got []string
}

func (c *calls) sources(worker string, s []KVSource) {
	eps := make([]string, len(s))
	for i, k := range s {
		eps[i] = fmt.Sprintf("%d=%s", k.Rank, k.Endpoint)
		if k.ReplayEndpoint != "" {
			eps[i] += "+replay=" + k.ReplayEndpoint
		}
	}
	c.mu.Lock()
	c.got = append(c.got, fmt.Sprintf("sources %s %v", worker, eps))
	c.mu.Unlock()
}

func (c *calls) restarted(worker string) {
	c.mu.Lock()
	c.got = append(c.got, "restarted "+worker)
	c.mu.Unlock()
}

func (c *calls) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func (c *calls) are(want ...string) func() bool {
	return func() bool { return slices.Equal(c.list(), want) }
}

// TestKVSourcesDiscovered: a URL-only worker's KV-event publishers are
// read from the engine (vLLM's /kv_event_sources, SGLang's /server_info),
// resolved against the worker's host, and handed to Options.KVSources in
// order with the engine's restarts; a kv_events block overrides
// discovery, and a worker that leaves the configuration withdraws its
// sources. Before, nothing was discovered: every worker needed a
// kv_events block.
func TestKVSourcesDiscovered(t *testing.T) {
	r := newRouter(t)
	var c calls
	m, logs := newManager(t, r, Options{ScrapeInterval: fast, ModelsInterval: 5 * fast, KVSources: c.sources, EngineRestarted: c.restarted})
	v := newDiscoveryEngine(t, map[string]route{
		"/metrics":          {body: vllmCapacityMetrics},
		"/v1/models":        {body: modelList("llama")},
		"/kv_event_sources": {body: vllmSourcesEnvelope},
	})
	sgl := newDiscoveryEngine(t, map[string]route{
		"/health":      {},
		"/v1/models":   {body: modelList("qwen")},
		"/server_info": {body: sglangInfoBody},
	})
	if err := m.Sync([]config.Worker{urlOnly("a", v.srv.URL), urlOnly("b", sgl.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	wantA := "sources a [0=tcp://127.0.0.1:41001+replay=tcp://127.0.0.1:41003 1=tcp://127.0.0.1:41002]"
	wantB := "sources b [0=tcp://127.0.0.1:5557 1=tcp://127.0.0.1:5558]"
	testkit.Eventually(t, "both discovered", func() bool { return len(c.list()) == 2 })
	if got := c.list(); !slices.Contains(got, wantA) || !slices.Contains(got, wantB) {
		t.Fatalf("calls %q, want %q and %q", got, wantA, wantB)
	}
	st, _ := m.StatusOf("a")
	if len(st.KVSources) != 2 || st.KVSourcesFrom != v.srv.URL+"/kv_event_sources" {
		t.Errorf("status: %+v from %q", st.KVSources, st.KVSourcesFrom)
	}
	// Asked again every ModelsInterval: unchanged sources are no call.
	n := v.hitsOf("/kv_event_sources")
	testkit.Eventually(t, "read again", func() bool { return v.hitsOf("/kv_event_sources") >= n+2 })
	if got := c.list(); len(got) != 2 {
		t.Errorf("unchanged sources reported again: %q", got)
	}

	// The engine restarts (its counters go back) with other publishers:
	// the restart, then the new sources, in that order.
	base := slices.Clone(c.list())
	v.set("/kv_event_sources", route{body: vllmSourcesArray})
	v.set("/metrics", route{body: strings.Replace(vllmCapacityMetrics, "12345.0", "3.0", 1)})
	testkit.Eventually(t, "restart and new sources", c.are(append(base, "restarted a", "sources a [0=tcp://10.0.0.1:5557]")...))
	if lines := logLines(logs, "worker engine restarted", "a"); len(lines) != 1 ||
		!strings.Contains(lines[0], `counter vllm:prompt_tokens_total{engine=\"0\",model_name=\"llama\"} went back from 12345 to 3`) {
		t.Errorf("restart logged %d times, want once with the counter:\n%s", len(lines), logs)
	}
	if st, _ := m.StatusOf("a"); st.EngineRestarts != 1 || st.LastRestart.IsZero() {
		t.Errorf("EngineRestarts %d, LastRestart %v", st.EngineRestarts, st.LastRestart)
	}

	// A kv_events block overrides discovery: the discovered sources are
	// withdrawn and the engine is not asked again.
	withBlock := urlOnly("a", v.srv.URL)
	withBlock.KVEvents = &config.KVEvents{Endpoint: "tcp://127.0.0.1:6000"}
	if err := m.Sync([]config.Worker{withBlock, urlOnly("b", sgl.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	base = append(base, "restarted a", "sources a [0=tcp://10.0.0.1:5557]")
	testkit.Eventually(t, "withdrawn", c.are(append(base, "sources a []")...))
	n = v.hitsOf("/kv_event_sources")
	probes := v.hitsOf("/metrics")
	testkit.Eventually(t, "more probes", func() bool { return v.hitsOf("/metrics") >= probes+10 })
	if got := v.hitsOf("/kv_event_sources"); got > n+1 { // one ask may have been in flight
		t.Errorf("a worker with a kv_events block was asked for its sources %d more times", got-n)
	}

	// A worker that leaves the configuration withdraws its sources.
	if err := m.Sync([]config.Worker{withBlock}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "b withdrawn", c.are(append(base, "sources a []", "sources b []")...))
}

// TestRestartWhileDown: an engine that restarts while its probes fail is
// seen restarted at its first probe after, by its start time.
func TestRestartWhileDown(t *testing.T) {
	r := newRouter(t)
	var c calls
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, EngineRestarted: c.restarted})
	v := newDiscoveryEngine(t, map[string]route{
		"/metrics":   {body: vllmCapacityMetrics},
		"/v1/models": {body: modelList("llama")},
	})
	if err := m.Sync([]config.Worker{urlOnly("a", v.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "ready", func() bool { return member(r, "a") != nil })
	v.set("/metrics", route{code: 503})
	testkit.Eventually(t, "not ready", func() bool { return member(r, "a") == nil })
	later := strings.Replace(vllmCapacityMetrics, "1.71234567e+09", "1.71239999e+09", 1)
	v.set("/metrics", route{body: later})
	testkit.Eventually(t, "restart seen", c.are("restarted a"))
	testkit.Eventually(t, "ready again", func() bool { return member(r, "a") != nil })
	probes := v.hitsOf("/metrics")
	testkit.Eventually(t, "more probes", func() bool { return v.hitsOf("/metrics") >= probes+5 })
	if got := c.list(); len(got) != 1 {
		t.Errorf("calls %q, want one restart", got)
	}
}

// TestRestartWhileReady: an engine restarted between two probes (its
// process start time moved, no probe failed) leaves at once, taking the
// router's record of what it sent there (its approximate prefix list),
// and rejoins as a new generation.
func TestRestartWhileReady(t *testing.T) {
	r := newRouter(t)
	var c calls
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, EngineRestarted: c.restarted})
	v := newDiscoveryEngine(t, map[string]route{
		"/metrics":   {body: vllmCapacityMetrics},
		"/v1/models": {body: modelList("llama")},
	})
	if err := m.Sync([]config.Worker{urlOnly("a", v.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "ready", func() bool { return member(r, "a") != nil })
	w := member(r, "a")
	r.Prefix().Record(prefix.Candidate{ID: w.ID}, []uint64{1, 2, 3})
	if n := r.Prefix().Len(prefix.Candidate{ID: w.ID}); n != 3 {
		t.Fatalf("approximate list %d blocks, want 3", n)
	}
	later := strings.Replace(vllmCapacityMetrics, "1.71234567e+09", "1.71239999e+09", 1)
	v.set("/metrics", route{body: later})
	testkit.Eventually(t, "restart seen", c.are("restarted a"))
	testkit.Eventually(t, "a new generation", func() bool { n := member(r, "a"); return n != nil && n.Generation > w.Generation })
	if n := r.Prefix().Len(prefix.Candidate{ID: member(r, "a").ID}); n != 0 {
		t.Errorf("after the engine's restart the approximate list holds %d blocks, want 0", n)
	}
}

// TestBlockSizeParentAndCards: the Manager's per-model view of what the
// engines report: the block size of a model's ready workers (the smallest
// when they disagree, warned once), its LoRA adapters' parent, and its
// model cards; an SGLang engine without metrics gives its block size in
// /server_info.
func TestBlockSizeParentAndCards(t *testing.T) {
	r := newRouter(t)
	// Probes a second apart (each within a second): the warnings are
	// counted, and a worker flapping on a loaded machine would rightly
	// warn again as it rejoins.
	m, logs := newManager(t, r, Options{ScrapeInterval: time.Second})
	// vLLM's GET /v1/models (vllm/entrypoints/openai/models/serving.py
	// show_available_models): a base model with its path as root and
	// max_model_len, a LoRA adapter with its path as root, the base
	// model as parent, and no max_model_len.
	models := `{"object": "list", "data": [
  {"id": "llama", "object": "model", "created": 1, "owned_by": "vllm", "root": "/models/llama", "parent": null, "max_model_len": 8192, "permission": []},
  {"id": "llama-lora", "object": "model", "created": 1, "owned_by": "vllm", "root": "/adapters/sql", "parent": "llama", "permission": []}]}`
	v16 := newDiscoveryEngine(t, map[string]route{"/metrics": {body: vllmCapacityMetrics}, "/v1/models": {body: models}})
	v32 := newDiscoveryEngine(t, map[string]route{
		"/metrics":   {body: strings.Replace(vllmCapacityMetrics, `block_size="16"`, `block_size="32"`, 1)},
		"/v1/models": {body: modelList("llama")},
	})
	sgl := newDiscoveryEngine(t, map[string]route{
		"/health": {}, "/v1/models": {body: modelList("qwen")}, "/server_info": {body: sglangServerInfoNoEvents},
	})
	if _, ok := m.BlockSize("llama"); ok {
		t.Error("a block size before any worker")
	}
	if err := m.Sync([]config.Worker{urlOnly("a16", v16.srv.URL), urlOnly("b32", v32.srv.URL), urlOnly("sgl", sgl.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "all ready", func() bool { return member(r, "a16") != nil && member(r, "b32") != nil && member(r, "sgl") != nil })
	for model, want := range map[string]int{"llama": 16, "llama-lora": 16, "qwen": 64} {
		if got, ok := m.BlockSize(model); !ok || got != want {
			t.Errorf("BlockSize(%q) = %d, %v; want %d", model, got, ok, want)
		}
	}
	if got, ok := m.BlockSize("nobody"); ok {
		t.Errorf("BlockSize of an unknown model = %d", got)
	}
	for model, want := range map[string]string{"llama-lora": "llama", "llama": "", "qwen": "", "nobody": ""} {
		if got := m.Parent(model); got != want {
			t.Errorf("Parent(%q) = %q, want %q", model, got, want)
		}
	}
	wantCards := []ModelCard{
		{ID: "llama", Root: "/models/llama", MaxModelLen: 8192}, // a16's card: the first ready worker by name
		{ID: "llama-lora", Root: "/adapters/sql", Parent: "llama"},
		{ID: "qwen", Root: "qwen", MaxModelLen: 4096},
	}
	// Each card keeps its engine's own object (Raw), as listed.
	if diff := cmp.Diff(wantCards, m.ModelCards(), cmpopts.IgnoreFields(ModelCard{}, "Raw")); diff != "" {
		t.Errorf("ModelCards (-want +got):\n%s", diff)
	}
	// More probes change nothing, and log nothing again.
	probes := v16.hitsOf("/metrics")
	testkit.Eventually(t, "more probes", func() bool { return v16.hitsOf("/metrics") >= probes+2 })
	// Each warning once (workers join in any order, so llama may first
	// have been warned at 32, b32's size, before a16 joined).
	text := logs.String()
	for _, tt := range []struct {
		line string
		want int
	}{
		{"the engines serving a model report different block sizes; its prefix keys use the smallest: model=llama block_sizes=[16, 32] block_size=16", 1},
		{"report different block sizes; its prefix keys use the smallest: model=llama-lora", 0},
		{"report different block sizes; its prefix keys use the smallest: model=qwen", 0},
	} {
		if n := strings.Count(text, tt.line); n != tt.want {
			t.Errorf("%q logged %d times, want %d:\n%s", tt.line, n, tt.want, text)
		}
	}
	// The 16-token worker leaves: the model's size is the other's.
	if err := m.Sync([]config.Worker{urlOnly("b32", v32.srv.URL), urlOnly("sgl", sgl.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	if got, ok := m.BlockSize("llama"); !ok || got != 32 {
		t.Errorf("after a16 left: BlockSize(llama) = %d, %v; want 32", got, ok)
	}
	if got := m.Parent("llama-lora"); got != "" {
		t.Errorf("Parent of a model no worker serves = %q", got)
	}
	if got := m.ModelCards()[0]; got.Raw == "" || !strings.Contains(got.Raw, `"max_model_len":4096`) {
		t.Errorf("llama's card after a16 left keeps no engine object: %+v", got)
	}
	if got := m.ModelCards()[0]; got != (ModelCard{ID: "llama", Root: "llama", MaxModelLen: 4096, Raw: got.Raw}) {
		t.Errorf("llama's card after a16 left = %+v", got)
	}
}

// TestConfiguredModelsGetCards: a block that sets its models still has its
// engine's cards read (a LoRA adapter's parent), and an engine without a
// model list keeps such a worker ready.
func TestConfiguredModelsGetCards(t *testing.T) {
	r := newRouter(t)
	m, logs := newManager(t, r, Options{ScrapeInterval: fast})
	v := newDiscoveryEngine(t, map[string]route{"/metrics": {body: vllmCapacityMetrics}, "/v1/models": {body: modelList("base", "adapter")}})
	bare := newDiscoveryEngine(t, map[string]route{"/metrics": {body: vllmMetrics}})
	a, b := urlOnly("a", v.srv.URL), urlOnly("b", bare.srv.URL)
	a.Models, b.Models = []string{"adapter", "alias"}, []string{"other"}
	if err := m.Sync([]config.Worker{a, b}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "ready", func() bool { return member(r, "a") != nil && member(r, "b") != nil })
	testkit.Eventually(t, "cards read", func() bool { return m.Parent("adapter") == "base" })
	want := []ModelCard{{ID: "adapter", Root: "adapter", Parent: "base", MaxModelLen: 4096,
		Raw: `{"id":"adapter","object":"model","created":1,"owned_by":"vllm","root":"adapter","parent":"base","max_model_len":4096}`},
		{ID: "alias"}, {ID: "other"}}
	if diff := cmp.Diff(want, m.ModelCards()); diff != "" {
		t.Errorf("ModelCards (-want +got):\n%s", diff)
	}
	if strings.Contains(logs.String(), "models not re-read") {
		t.Errorf("a configured worker's model list failure was reported:\n%s", logs)
	}
}

// TestNormalisedURLLogged: a worker whose url the loader normalised logs
// both forms when it is added.
func TestNormalisedURLLogged(t *testing.T) {
	m, logs := infoManager(t, Options{ScrapeInterval: time.Hour})
	ws, diags := config.ParseWorkers("w.hcl", []byte("worker \"a\" {\n  url = \"http://127.0.0.1:1/v1\"\n}\n"))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := m.Sync(ws); err != nil {
		t.Fatal(err)
	}
	lines := logLines(logs, "worker url normalised to the engine's base URL: the router appends /v1/chat/completions, /v1/models, /metrics and the other paths itself", "a")
	if len(lines) != 1 || !strings.Contains(lines[0], "given=http://127.0.0.1:1/v1 url=http://127.0.0.1:1") {
		t.Errorf("logged:\n%s", logs)
	}
}
