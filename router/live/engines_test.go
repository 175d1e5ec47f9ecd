package live

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// fakeVLLM is an engine speaking what the router reads of vLLM: GET
// /v1/models, GET /metrics (metrics), and completions answered with a
// fixed usage (100 prompt tokens, 64 of them cached, 5 completion
// tokens), streamed with the usage in the last event when asked. It
// records the X-Data-Parallel-Rank header of each completion ("-" when
// absent).
type fakeVLLM struct {
	srv     *httptest.Server
	metrics string
	mu      sync.Mutex
	ranks   []string
}

const fakeUsage = `{"prompt_tokens":100,"total_tokens":105,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}`

func newFakeVLLM(t *testing.T, metrics string) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{metrics: metrics}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, f.metrics)
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"id":"llama","object":"model","parent":null},{"id":"llama-sql","object":"model","parent":"llama"}]}`)
		case "/v1/chat/completions":
			body, _ := io.ReadAll(r.Body)
			rank := r.Header.Get("x-data-parallel-rank")
			if _, ok := r.Header["X-Data-Parallel-Rank"]; !ok {
				rank = "-"
			}
			f.mu.Lock()
			f.ranks = append(f.ranks, rank)
			f.mu.Unlock()
			if strings.Contains(string(body), `"stream":true`) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
				fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", fakeUsage)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":%s}`, fakeUsage)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ranks)
}

// dpMetrics is a vLLM engine with two data-parallel ranks of 2048 and 1024
// blocks of 16 tokens; rank 1 is full.
const dpMetrics = `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1024"} 1
vllm:num_requests_waiting{engine="0",model_name="llama"} 0
vllm:num_requests_waiting{engine="1",model_name="llama"} 9
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.1
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 1
vllm:num_requests_running{engine="0",model_name="llama"} 1
vllm:num_requests_running{engine="1",model_name="llama"} 12
`

// TestDaemonURLOnlyWorkers: a workers file that gives only URLs. The
// router learns each engine's models and capacity, makes each
// data-parallel rank a candidate, names the rank to the engine (and only
// to a data-parallel engine), counts the answers' usage by model, and
// shows its view on /metrics and /debug/workers.
func TestDaemonURLOnlyWorkers(t *testing.T) {
	dp := newFakeVLLM(t, dpMetrics)
	single := newFakeVLLM(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 2\n") // capacity unknown
	dir := t.TempDir()
	policy, workersFile := filepath.Join(dir, "policy.hcl"), filepath.Join(dir, "workers.hcl")
	replaceFile(t, policy, daemonPolicy("rr")) // router.block_size 512
	replaceFile(t, workersFile, fmt.Sprintf("worker \"dp\" {\n  url = %q\n}\nworker \"single\" {\n  url = %q\n  kv_events {\n    endpoint = \"tcp://127.0.0.1:5557\"\n  }\n}\n", dp.srv.URL, single.srv.URL))
	dln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, WorkersFile: workersFile, DebugListener: dln})
	rd.waitWorkers(t, "dp", "single")
	debug := "http://" + dln.Addr().String() + "/debug/workers"
	var view DebugWorkers
	deadline := time.Now().Add(time.Minute)
	for {
		view = getDebugWorkers(t, debug)
		if len(view.Workers) == 2 && len(view.Workers[0].Ranks) == 2 && view.Workers[0].Ranks[1].Generation != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dp's two ranks never joined: %+v", view)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each rank shows the labels a plugin declaring LABELS sees for it.
	for r, rv := range view.Workers[0].Ranks {
		l := rv.Labels
		if l[shared.LabelRole] != "aggregated" || l[shared.LabelDPRank] != strconv.Itoa(r) || l[shared.LabelModel] == "" {
			t.Errorf("dp rank %d labels %v, want role aggregated, dp-rank %d and the engine's model", r, l, r)
		}
	}

	// Six requests, round robin over three candidates: dp rank 0, dp
	// rank 1, single.
	for i := range 6 {
		stream := i%2 == 1
		body := chatBody("llama", stream, "hello")
		if stream {
			body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
		}
		resp, err := post(t, context.Background(), rd.base+"/v1/chat/completions", body, "X-Data-Parallel-Rank", "7")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// Four to dp's two ranks, two to single (the rank each request names
	// is the HTTP face's business: router/serve's TestDataParallelRankHeader).
	if gotDP, gotSingle := dp.received(), single.received(); len(gotDP) != 4 || len(gotSingle) != 2 {
		t.Errorf("requests: dp %d, single %d; want 4 and 2", len(gotDP), len(gotSingle))
	}

	metrics := getText(t, rd.base+"/metrics")
	for _, want := range []string{
		// In the engine's own blocks of 16: the policy file leaves
		// router.block_size unset (converted to 512 they were 64 and 32).
		`switchyard_worker_capacity_blocks{rank="0",worker="dp"} 2048`,
		`switchyard_worker_capacity_blocks{rank="1",worker="dp"} 1024`,
		`switchyard_worker_capacity_blocks{rank="0",worker="single"} 0`,
		`switchyard_worker_engine_waiting_requests{rank="1",worker="dp"} 9`,
		`switchyard_worker_engine_kv_usage{rank="1",worker="dp"} 1`,
		`switchyard_worker_engine_running_requests{rank="1",worker="dp"} 12`,
		`switchyard_worker_engine_load_available{rank="0",worker="single"} 1`,
		`switchyard_worker_engine_report_age_seconds{rank="0",worker="dp"}`,
		`switchyard_prompt_tokens_total{model="llama"} 600`,
		`switchyard_cached_prompt_tokens_total{model="llama"} 384`,
		`switchyard_completion_tokens_total{model="llama"} 30`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	view = getDebugWorkers(t, debug)
	dpv, sv := view.Workers[0], view.Workers[1]
	if dpv.Name != "dp" || !dpv.Ready || !dpv.DataParallel || dpv.ModelsSource != "engine" ||
		!slices.Equal(dpv.Models, []string{"llama", "llama-sql"}) || dpv.URL != dp.srv.URL || dpv.KVEvents != nil {
		t.Errorf("dp view = %+v", dpv)
	}
	for i, want := range []struct {
		blocks  int64
		waiting int64
	}{{2048, 0}, {1024, 9}} {
		r := dpv.Ranks[i]
		if r.Rank != uint32(i) || r.CapacityBlocks != want.blocks || r.CapacitySource != "engine" || r.EngineBlockSize != 16 ||
			!r.Load.Available || r.Load.Waiting == nil || *r.Load.Waiting != want.waiting || r.Load.AgeSeconds == nil || *r.Load.AgeSeconds < 0 {
			t.Errorf("dp rank %d view = %+v", i, r)
		}
	}
	if sv.Name != "single" || sv.DataParallel || len(sv.Ranks) != 1 || sv.Ranks[0].CapacityBlocks != 0 || sv.Ranks[0].CapacitySource != "unknown" ||
		sv.Ranks[0].EngineBlockSize != 0 || sv.KVEvents == nil || sv.KVEvents.Endpoint != "tcp://127.0.0.1:5557" {
		t.Errorf("single view = %+v", sv)
	}
}

func getDebugWorkers(t *testing.T, url string) DebugWorkers {
	t.Helper()
	var v DebugWorkers
	if err := json.Unmarshal([]byte(getText(t, url)), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}
