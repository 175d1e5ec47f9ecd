package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// vEngine is a fake vLLM engine: /metrics serves metrics, /v1/models
// serves models (an OpenAI list body), or answers modelsCode when set.
type vEngine struct {
	srv        *httptest.Server
	mu         sync.Mutex
	metrics    string
	models     string
	modelsCode int
}

func newVEngine(t *testing.T, metrics, models string) *vEngine {
	t.Helper()
	e := &vEngine{metrics: metrics, models: models}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		metrics, models, code := e.metrics, e.models, e.modelsCode
		e.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, metrics)
		case "/v1/models":
			if code != 0 {
				http.Error(w, "no", code)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, models)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *vEngine) set(f func(e *vEngine)) {
	e.mu.Lock()
	f(e)
	e.mu.Unlock()
}

// urlOnly is a worker block with a url only.
func urlOnly(name, url string) config.Worker {
	return config.Worker{Name: name, URL: url, MetricsURL: url + "/metrics", Role: shared.RoleAggregated}
}

// modelList is an OpenAI model list as vLLM serves it: a LoRA adapter
// names its base model in "parent".
func modelList(ids ...string) string {
	var parts []string
	for i, id := range ids {
		parent := "null"
		if i > 0 {
			parent = fmt.Sprintf("%q", ids[0])
		}
		parts = append(parts, fmt.Sprintf(`{"id":%q,"object":"model","created":1,"owned_by":"vllm","root":%q,"parent":%s,"max_model_len":4096}`, id, id, parent))
	}
	return `{"object":"list","data":[` + strings.Join(parts, ",") + `]}`
}

// ranksOf returns the fleet members of the worker called name, by rank.
func ranksOf(r *router.Router, name string) []*fleet.Worker {
	var out []*fleet.Worker
	for _, w := range r.Workers("", shared.RoleAggregated) {
		if w.Name == name {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b *fleet.Worker) int { return int(a.DPRank) - int(b.DPRank) })
	return out
}

// TestURLOnlyWorkerDiscovery: a worker block with only a url joins with
// the engine's models and capacity, one candidate per data-parallel rank
// with its own load; model changes, rank changes and the block's
// overrides rejoin it.
func TestURLOnlyWorkerDiscovery(t *testing.T) {
	r := newRouter(t) // block size 16
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, ModelsInterval: 50 * time.Millisecond, BlockSize: 16})
	e := newVEngine(t, vllmDP, modelList("llama", "llama-lora"))
	if err := m.Sync([]config.Worker{urlOnly("w", e.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two ranks", func() bool { return len(ranksOf(r, "w")) == 2 })
	ws := ranksOf(r, "w")
	for i, want := range []fleet.Spec{
		{ID: shared.WorkerIDOf("w"), DPRank: 0, Role: shared.RoleAggregated, TotalKVBlocks: 2048, Name: "w", Models: []string{"llama", "llama-lora"}, EngineBlockSize: 16, DataParallel: true},
		{ID: shared.WorkerIDOf("w"), DPRank: 1, Role: shared.RoleAggregated, TotalKVBlocks: 1024, Name: "w", Models: []string{"llama", "llama-lora"}, EngineBlockSize: 16, DataParallel: true},
	} {
		if !sameSpec(ws[i].Spec, want) {
			t.Errorf("rank %d spec = %+v, want %+v", i, ws[i].Spec, want)
		}
	}
	// Each rank has its own load: rank 1 full with 9 waiting, rank 0 idle.
	if l := ws[0].Load(false); !l.Available || l.KVUsage != 0.1 || l.Waiting != 0 {
		t.Errorf("rank 0 load = %+v", l)
	}
	if l := ws[1].Load(false); !l.Available || l.KVUsage != 1 || l.Waiting != 9 {
		t.Errorf("rank 1 load = %+v", l)
	}
	st, _ := m.StatusOf("w")
	if !st.Ready || !st.Ranked || st.ModelsSource != "engine" || !slices.Equal(st.Models, []string{"llama", "llama-lora"}) || len(st.Ranks) != 2 {
		t.Fatalf("status = %+v", st)
	}
	for i, r := range st.Ranks {
		if r.CapacitySource != "engine" || r.EngineBlockSize != 16 || !r.HasRunning || r.Member != ws[i] {
			t.Errorf("rank %d status = %+v", i, r)
		}
	}
	if st.Ranks[1].Running != 12 || st.Ranks[0].Running != 1 {
		t.Errorf("running = %d, %d; want 1, 12", st.Ranks[0].Running, st.Ranks[1].Running)
	}
	if !m.Serves("llama-lora") || m.Serves("qwen") {
		t.Error("Serves does not follow the engine's models")
	}

	// The engine's models change: both ranks rejoin with the new list.
	gen := ws[1].Generation
	e.set(func(e *vEngine) { e.models = modelList("qwen") })
	testkit.Eventually(t, "models re-read", func() bool {
		ws := ranksOf(r, "w")
		return len(ws) == 2 && slices.Equal(ws[0].Models, []string{"qwen"}) && slices.Equal(ws[1].Models, []string{"qwen"})
	})
	if ranksOf(r, "w")[1].Generation <= gen {
		t.Error("a model change did not make a new generation")
	}
	if !slices.Equal(names(r, "qwen", shared.RoleAggregated), []string{"w", "w"}) || names(r, "llama", shared.RoleAggregated) != nil {
		t.Errorf("model partitions: qwen %v, llama %v", names(r, "qwen", shared.RoleAggregated), names(r, "llama", shared.RoleAggregated))
	}

	// A re-read that fails keeps the last list, and says why.
	e.set(func(e *vEngine) { e.modelsCode = http.StatusInternalServerError })
	testkit.Eventually(t, "re-read failure reported", func() bool {
		st, _ := m.StatusOf("w")
		return strings.Contains(st.Reason, "models not re-read") && st.Ready
	})
	if ws := ranksOf(r, "w"); len(ws) != 2 || !slices.Equal(ws[0].Models, []string{"qwen"}) {
		t.Fatalf("after a failed re-read: %v", ws)
	}
	e.set(func(e *vEngine) { e.modelsCode = 0 })

	// The engine drops to one engine: rank 1 leaves, rank 0 stays.
	r0 := ranksOf(r, "w")[0]
	e.set(func(e *vEngine) {
		e.metrics = `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1
vllm:num_requests_waiting{engine="0"} 2
`
	})
	testkit.Eventually(t, "one rank", func() bool { return len(ranksOf(r, "w")) == 1 })
	// Rank 0 rejoins: requests to it no longer name a rank.
	testkit.Eventually(t, "rank 0 not data-parallel", func() bool { ws := ranksOf(r, "w"); return len(ws) == 1 && !ws[0].DataParallel })
	if ws := ranksOf(r, "w"); ws[0].Generation <= r0.Generation || ws[0].DPRank != 0 {
		t.Errorf("rank 0 generation %d, was %d", ws[0].Generation, r0.Generation)
	}
	testkit.Eventually(t, "not ranked", func() bool { st, _ := m.StatusOf("w"); return !st.Ranked && len(st.Ranks) == 1 })

	// The block's values override the engine's.
	over := urlOnly("w", e.srv.URL)
	over.Models, over.TotalKVBlocks = []string{"x"}, 7
	if err := m.Sync([]config.Worker{over}); err != nil {
		t.Fatal(err)
	}
	ws = ranksOf(r, "w")
	if len(ws) != 1 || ws[0].TotalKVBlocks != 7 || !slices.Equal(ws[0].Models, []string{"x"}) {
		t.Fatalf("overridden: %+v", ws[0].Spec)
	}
	st, _ = m.StatusOf("w")
	if st.ModelsSource != "config" || st.Ranks[0].CapacitySource != "config" || st.Ranks[0].TotalKVBlocks != 7 {
		t.Errorf("sources = %q, %q", st.ModelsSource, st.Ranks[0].CapacitySource)
	}
}

// TestUnknownCapacity: an engine that does not report its capacity is
// routable with TotalKVBlocks 0 until it does; then the worker rejoins
// with it.
func TestUnknownCapacity(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, BlockSize: 16})
	e := newVEngine(t, "vllm:num_requests_waiting 1\n", modelList("llama"))
	if err := m.Sync([]config.Worker{urlOnly("w", e.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "ready", func() bool { return member(r, "w") != nil })
	w := member(r, "w")
	if w.TotalKVBlocks != 0 || w.EngineBlockSize != 0 {
		t.Fatalf("unknown capacity joined as %+v", w.Spec)
	}
	if d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, Model: "llama", PromptTokens: 1}, router.Placement{}); err != nil || d.Worker != w {
		t.Fatalf("unknown-capacity worker not routable: %v", err)
	} else {
		d.Booking.Release()
	}
	st, _ := m.StatusOf("w")
	if st.Ranks[0].CapacitySource != "" || st.Ranks[0].TotalKVBlocks != 0 {
		t.Errorf("capacity status = %+v", st.Ranks[0])
	}
	e.set(func(e *vEngine) {
		e.metrics = "vllm:num_requests_waiting 1\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n"
	})
	testkit.Eventually(t, "capacity", func() bool { w := member(r, "w"); return w != nil && w.TotalKVBlocks == 100 })
	if member(r, "w").Generation <= w.Generation || member(r, "w").EngineBlockSize != 16 {
		t.Error("a reported capacity did not rejoin the worker")
	}
}

// TestModelsUnknownNotReady: a URL-only worker whose engine's model list
// cannot be read is not ready, and says why; it joins once the list is
// readable.
func TestModelsUnknownNotReady(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	e := newVEngine(t, vllmMetrics, "")
	e.set(func(e *vEngine) { e.modelsCode = http.StatusNotFound })
	if err := m.Sync([]config.Worker{urlOnly("w", e.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	want := "HTTP status 404 from " + e.srv.URL + "/v1/models"
	testkit.Eventually(t, "reason", func() bool { st, _ := m.StatusOf("w"); return st.Reason == want })
	if st, _ := m.StatusOf("w"); st.Ready || st.Models != nil || member(r, "w") != nil {
		t.Fatalf("ready without models: %+v", st)
	}
	e.set(func(e *vEngine) { e.modelsCode, e.models = 0, `{"data":[]}` })
	testkit.Eventually(t, "no model reason", func() bool {
		st, _ := m.StatusOf("w")
		return strings.Contains(st.Reason, "lists no model")
	})
	e.set(func(e *vEngine) { e.models = modelList("llama") })
	testkit.Eventually(t, "ready", func() bool { return member(r, "w") != nil })
	if got := member(r, "w").Models; !slices.Equal(got, []string{"llama"}) {
		t.Errorf("models = %v", got)
	}
}

func TestFetchModelsBounds(t *testing.T) {
	many := make([]string, MaxModels+1)
	for i := range many {
		many[i] = fmt.Sprintf("m%d", i)
	}
	for _, tt := range []struct{ name, body, want string }{
		{"not json", "<html>", "does not answer an OpenAI model list"},
		{"wrong shape", `{"data":{"id":"x"}}`, "does not answer an OpenAI model list"},
		{"empty", `{"object":"list","data":[]}`, "lists no model"},
		{"blank ids", `{"data":[{"id":" "}]}`, "lists no model"},
		{"too many", modelList(many...), fmt.Sprintf("lists %d models, more than %d", MaxModels+1, MaxModels)},
		{"long id", modelList(strings.Repeat("x", MaxModelBytes+1)), "a model id of 513 bytes"},
		{"too large", `{"data":[{"id":"` + strings.Repeat("x", maxModelsBytes) + `"}]}`, "is over 4 MiB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newVEngine(t, "", tt.body)
			_, err := fetchModels(context.Background(), http.DefaultClient, e.srv.URL+"/v1/models", time.Minute)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrModels) {
				t.Errorf("error = %v, want ErrModels with %q", err, tt.want)
			}
		})
	}
	e := newVEngine(t, "", `{"data":[{"id":"b"},{"id":"a"},{"id":"b","parent":"a"}]}`)
	got, err := fetchModels(context.Background(), http.DefaultClient, e.srv.URL+"/v1/models", time.Minute)
	if want := []ModelCard{{ID: "a", Raw: `{"id":"a"}`}, {ID: "b", Raw: `{"id":"b"}`}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("models = %v, %v; want %v (the first card of an id listed twice)", got, err, want)
	}
	// A model's object over MaxCardBytes is not kept whole: its card
	// still is.
	e = newVEngine(t, "", `{"data":[{"id":"big","owned_by":"`+strings.Repeat("o", MaxCardBytes)+`"},{"id":"small","max_model_len":8}]}`)
	got, err = fetchModels(context.Background(), http.DefaultClient, e.srv.URL+"/v1/models", time.Minute)
	if want := []ModelCard{{ID: "big"}, {ID: "small", MaxModelLen: 8, Raw: `{"id":"small","max_model_len":8}`}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("models = %v, %v; want %v (an object over MaxCardBytes not kept)", got, err, want)
	}
	for _, tt := range []struct{ name, body, want string }{
		{"long parent", `{"data":[{"id":"a","parent":"` + strings.Repeat("p", MaxModelBytes+1) + `"}]}`, "a model parent of 513 bytes"},
		{"long root", `{"data":[{"id":"a","root":"` + strings.Repeat("r", MaxRootBytes+1) + `"}]}`, "a model root of 4097 bytes"},
	} {
		e := newVEngine(t, "", tt.body)
		if _, err := fetchModels(context.Background(), http.DefaultClient, e.srv.URL+"/v1/models", time.Minute); err == nil ||
			!strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrModels) {
			t.Errorf("%s: error = %v, want ErrModels with %q", tt.name, err, tt.want)
		}
	}
}

// TestRankMetricsAndHooks: /metrics has each rank's engine view, and the
// KV-event and prefix-index hooks reach Status and /metrics.
func TestRankMetricsAndHooks(t *testing.T) {
	r := newRouter(t)
	reg := prometheus.NewRegistry()
	m, _ := newManager(t, r, Options{
		ScrapeInterval: fast, BlockSize: 16, Registerer: reg,
		Streams: func(id shared.WorkerID, rank uint32) (EventStream, bool) {
			if rank != 1 {
				return EventStream{}, false
			}
			return EventStream{State: "live", Received: 42, Gaps: 3, Malformed: 5}, true
		},
		IndexBlocks: func(id shared.WorkerID, rank uint32) (int64, bool) {
			return int64(rank) + 10, id == shared.WorkerIDOf("w")
		},
	})
	e := newVEngine(t, vllmDP, modelList("llama"))
	if err := m.Sync([]config.Worker{urlOnly("w", e.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two ranks", func() bool { return len(ranksOf(r, "w")) == 2 })
	st, _ := m.StatusOf("w")
	if st.Ranks[0].Events != nil || st.Ranks[1].Events == nil || *st.Ranks[1].Events != (EventStream{State: "live", Received: 42, Gaps: 3, Malformed: 5}) {
		t.Errorf("events = %v, %v", st.Ranks[0].Events, st.Ranks[1].Events)
	}
	if !st.Ranks[1].HasIndexBlocks || st.Ranks[1].IndexBlocks != 11 {
		t.Errorf("index blocks = %d, %v", st.Ranks[1].IndexBlocks, st.Ranks[1].HasIndexBlocks)
	}
	want := map[string]float64{
		`switchyard_worker_engine_kv_usage{rank="0",worker="w"}`:           0.1,
		`switchyard_worker_engine_kv_usage{rank="1",worker="w"}`:           1,
		`switchyard_worker_engine_waiting_requests{rank="1",worker="w"}`:   9,
		`switchyard_worker_engine_running_requests{rank="1",worker="w"}`:   12,
		`switchyard_worker_capacity_blocks{rank="0",worker="w"}`:           2048,
		`switchyard_worker_capacity_blocks{rank="1",worker="w"}`:           1024,
		`switchyard_worker_engine_load_available{rank="0",worker="w"}`:     1,
		`switchyard_worker_kv_events_total{rank="1",worker="w"}`:           42,
		`switchyard_worker_kv_event_gaps_total{rank="1",worker="w"}`:       3,
		`switchyard_worker_kv_event_malformed_total{rank="1",worker="w"}`:  5,
		`switchyard_worker_ready{worker="w"}`:                              1,
		`switchyard_worker_engine_report_age_seconds{rank="0",worker="w"}`: -1, // present, >= 0
	}
	got := gathered(t, reg)
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s missing", k)
		case v < 0 && g < 0:
			t.Errorf("%s = %v, want >= 0", k, g)
		case v >= 0 && g != v:
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
	if _, ok := got[`switchyard_worker_kv_events_total{rank="0",worker="w"}`]; ok {
		t.Error("kv events of a rank without a stream")
	}
	// The engine stops reporting: the load becomes unavailable, the age
	// grows, capacity stays.
	e.set(func(e *vEngine) { e.metrics = "" })
	testkit.Eventually(t, "load unavailable", func() bool {
		return gathered(t, reg)[`switchyard_worker_engine_load_available{rank="1",worker="w"}`] == 0
	})
	got = gathered(t, reg)
	if _, ok := got[`switchyard_worker_engine_waiting_requests{rank="1",worker="w"}`]; ok {
		t.Error("stale waiting still exported")
	}
	if got[`switchyard_worker_capacity_blocks{rank="1",worker="w"}`] != 1024 || got[`switchyard_worker_engine_report_age_seconds{rank="1",worker="w"}`] <= 0 {
		t.Errorf("after the reports stopped: %v", got)
	}
}

// gathered returns reg's gauge and counter samples by
// name{label="value",...} (labels in name order).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// Without router.block_size (Options.BlockSize 0) an engine's capacity is
// in its own blocks: the DP engine reports 2048 and 1024 blocks of 16
// tokens, which stay 2048 and 1024 (converted to the old default of 512
// they were 64 and 32).
func TestCapacityInTheEnginesBlocks(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	e := newVEngine(t, vllmDP, modelList("llama"))
	if err := m.Sync([]config.Worker{urlOnly("w", e.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two ranks", func() bool { return len(ranksOf(r, "w")) == 2 })
	ws := ranksOf(r, "w")
	if ws[0].TotalKVBlocks != 2048 || ws[1].TotalKVBlocks != 1024 || ws[0].EngineBlockSize != 16 {
		t.Errorf("capacities %d, %d blocks at E=%d; want 2048 and 1024 blocks of 16", ws[0].TotalKVBlocks, ws[1].TotalKVBlocks, ws[0].EngineBlockSize)
	}
}

// TestSGLangDataParallelRanks: an SGLang server with two data-parallel
// ranks is two candidates, as a vLLM one is: with --enable-metrics each
// rank's load is its own dp_rank series (SGLang's own exposition), and
// without metrics the ranks are those of the KV-event sources its
// /server_info names (kv_events.dp_size), without load. Before, dp_rank
// was not read: the server was one candidate whose load summed both
// ranks, and without metrics one candidate of rank 0 whose requests
// SGLang spread round-robin over its ranks.
func TestSGLangDataParallelRanks(t *testing.T) {
	r := newRouter(t)
	reg := prometheus.NewRegistry()
	var c calls
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, Registerer: reg, KVSources: c.sources})
	metrics := newDiscoveryEngine(t, map[string]route{
		"/metrics":     {body: sglangDP},
		"/v1/models":   {body: modelList("qwen")},
		"/server_info": {body: sglangInfoBody},
	})
	noMetrics := newDiscoveryEngine(t, map[string]route{
		"/health":      {},
		"/v1/models":   {body: modelList("qwen")},
		"/server_info": {body: sglangInfoBody},
	})
	if err := m.Sync([]config.Worker{urlOnly("s", metrics.srv.URL), urlOnly("n", noMetrics.srv.URL)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two ranks each", func() bool { return len(ranksOf(r, "s")) == 2 && len(ranksOf(r, "n")) == 2 })
	for _, name := range []string{"s", "n"} {
		st, _ := m.StatusOf(name)
		if !st.Ranked || len(st.Ranks) != 2 || st.Ranks[1].Rank != 1 {
			t.Fatalf("%s: ranked %v, ranks %+v; want two ranks", name, st.Ranked, st.Ranks)
		}
		for _, w := range ranksOf(r, name) {
			if !w.DataParallel || w.EngineBlockSize != 16 {
				t.Errorf("%s rank %d: data parallel %v, engine block size %d; want requests naming their rank, /server_info's 16",
					name, w.DPRank, w.DataParallel, w.EngineBlockSize)
			}
		}
	}
	got := gathered(t, reg)
	for k, v := range map[string]float64{
		`switchyard_worker_engine_waiting_requests{rank="0",worker="s"}`: 2,
		`switchyard_worker_engine_waiting_requests{rank="1",worker="s"}`: 9,
		`switchyard_worker_engine_running_requests{rank="1",worker="s"}`: 7,
		`switchyard_worker_engine_kv_usage{rank="1",worker="s"}`:         0.9,
		`switchyard_worker_engine_load_available{rank="1",worker="n"}`:   0,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if ws := ranksOf(r, "s"); ws[0].Load(false).Waiting != 2 || ws[1].Load(false).Waiting != 9 || ws[1].Load(false).KVUsage != 0.9 {
		t.Errorf("rank loads %+v, %+v; want each rank's own", ws[0].Load(false), ws[1].Load(false))
	}
	// Both reported their two ranks' publishers, port base + rank.
	testkit.Eventually(t, "sources", func() bool { return len(c.list()) == 2 })
	for _, name := range []string{"s", "n"} {
		if want := "sources " + name + " [0=tcp://127.0.0.1:5557 1=tcp://127.0.0.1:5558]"; !slices.Contains(c.list(), want) {
			t.Errorf("calls %q, want %q", c.list(), want)
		}
	}
}
