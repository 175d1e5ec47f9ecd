package mockworker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard-router/switchyard/router/sim"
)

// scrape parses the server's /metrics with Prometheus' text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// rankValue returns the value of family name's sample labelled
// engine=rank.
func rankValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, rank int) float64 {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		if label(m, "engine") == strconv.Itoa(rank) {
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s{engine=%q}", name, strconv.Itoa(rank))
	return 0
}

// TestCacheConfigInfo: vllm:cache_config_info parses as a gauge of value
// 1 per rank whose labels carry the simulated engine's block count and
// block size, as vLLM's CacheConfig.metrics_info does.
func TestCacheConfigInfo(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 1234
	_, url := startServer(t, Config{Model: testModel, Sim: cfg, DataParallelSize: 2})
	fams := scrape(t, url)
	f := fams["vllm:cache_config_info"]
	if f == nil || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 2 {
		t.Fatalf("vllm:cache_config_info: %v", f)
	}
	for i, m := range f.GetMetric() {
		if label(m, "engine") != strconv.Itoa(i) || label(m, "num_gpu_blocks") != "1234" || label(m, "block_size") != "16" ||
			label(m, "enable_prefix_caching") != "True" || m.GetGauge().GetValue() != 1 {
			t.Errorf("sample %d: %v", i, m)
		}
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		for r := range 2 {
			if got := rankValue(t, fams, name, r); got != 0 {
				t.Errorf("%s{engine=%d} = %v at rest", name, r, got)
			}
		}
	}
}

// TestDataParallelRanks: the X-data-parallel-rank header pins a request
// to its rank (that rank's series move, the other's do not); one out of
// range is a 400; without the header the least loaded rank serves.
func TestDataParallelRanks(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, DataParallelSize: 2})
	send := func(rank string, prompt string) *http.Response {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
		req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader(b))
		if rank != "" {
			req.Header.Set("x-data-parallel-rank", rank) // any case
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for range 3 {
		if resp := send("1", longText(1, 3000)); resp.StatusCode != 200 || resp.Header.Get("x-mock-dp-rank") != "1" {
			t.Fatalf("pinned to 1: status %d, rank %q", resp.StatusCode, resp.Header.Get("x-mock-dp-rank"))
		}
	}
	fams := scrape(t, url)
	for r, want := range []float64{0, 3} {
		if got := rankValue(t, fams, "vllm:request_success_total", r); got != want {
			t.Errorf("engine %d served %v requests, want %v", r, got, want)
		}
		// The same 3000-byte prompt three times on rank 1: 750 tokens each,
		// the second and third hit its 46 full 64-byte blocks (16 tokens).
		if got, want := rankValue(t, fams, "vllm:prefix_cache_hits_total", r), 2*736*want/3; got != want {
			t.Errorf("engine %d cache hits %v tokens, want %v", r, got, want)
		}
	}
	if resp := send("2", "hi"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("rank 2 of 2: status %d, want 400", resp.StatusCode)
	}
	if resp := send("one", "hi"); resp.StatusCode != 200 || resp.Header.Get("x-mock-dp-rank") != "0" {
		t.Errorf("a rank that is not a number is ignored, as vLLM does: status %d, rank %q", resp.StatusCode, resp.Header.Get("x-mock-dp-rank"))
	}

	// Rank 0 busy with a long stream: an unpinned request goes to rank 1.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"prompt": "long", "max_tokens": 100_000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("X-Data-Parallel-Rank", "0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") { // its first token: it runs
		t.Fatalf("stream pinned to rank 0: first line %q, %v", line, err)
	}
	if r := send("", "hi").Header.Get("x-mock-dp-rank"); r != "1" {
		t.Errorf("unpinned request with rank 0 running one: served by %q, want 1", r)
	}
	if got := rankValue(t, scrape(t, url), "vllm:num_requests_running", 0); got != 1 {
		t.Errorf("engine 0 running %v, want 1", got)
	}
	cancel()
}

func TestRankEndpoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		rank int
		want string
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557"},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560"},
		{"tcp://*:5557", 1, "tcp://*:5558"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"tcp://127.0.0.1:0", 0, "tcp://127.0.0.1:0"},
		{"tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"}, // vLLM PR 55844: port 0 is not offset
	} {
		if got, err := rankEndpoint(c.in, c.rank); err != nil || got != c.want {
			t.Errorf("rankEndpoint(%q, %d) = %q, %v; want %q", c.in, c.rank, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		rank int
	}{{"127.0.0.1:5557", 0}, {"ipc:///tmp/x", 0}, {"tcp://host", 0}, {"tcp://h:65535", 1}, {"tcp://h:1/x", 0}} {
		if got, err := rankEndpoint(c.in, c.rank); err == nil || !strings.Contains(err.Error(), c.in) {
			t.Errorf("rankEndpoint(%q, %d) = %q, %v; want an error naming it", c.in, c.rank, got, err)
		}
	}
}

// TestSGLangDataParallelRanks: an SGLang server's ranks are chosen as
// SGLang chooses them, after its own tests
// (sgl-project/sglang@007c0ab4
// test/registered/unit/managers/test_data_parallel_controller.py,
// TestRoundRobinScheduler: round-robin
// cycles through the ranks in order from rank 0; a routed_dp_rank goes
// to its rank and does not advance the round-robin counter) and
// serving_base.py's extract_routed_dp_rank_from_header (the header wins
// over the body; a header that is not an integer is a 400): X-Data-
// Parallel-Rank, else routed_dp_rank, else the deprecated
// data_parallel_rank; out of range is a 400.
func TestSGLangDataParallelRanks(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, Engine: EngineSGLang, DataParallelSize: 3})
	send := func(header string, body map[string]any) (int, string) {
		t.Helper()
		body["prompt"], body["max_tokens"] = "hi", 1
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader(b))
		if header != "" {
			req.Header.Set("x-data-parallel-rank", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("x-mock-dp-rank")
	}
	var got []string
	for range 4 {
		_, r := send("", map[string]any{})
		got = append(got, r)
	}
	if want := []string{"0", "1", "2", "0"}; !slices.Equal(got, want) {
		t.Fatalf("unpinned requests served by ranks %v, want round-robin %v", got, want)
	}
	// Pinned requests do not advance the counter: the next unpinned one
	// goes to rank 1.
	for _, tc := range []struct {
		header string
		body   map[string]any
		want   string
	}{
		{"2", map[string]any{}, "2"},
		{"", map[string]any{"routed_dp_rank": 2}, "2"},
		{"", map[string]any{"data_parallel_rank": 1}, "1"},
		{"", map[string]any{"routed_dp_rank": 0, "data_parallel_rank": 2}, "0"},
		{"1", map[string]any{"routed_dp_rank": 2}, "1"},
	} {
		if code, r := send(tc.header, tc.body); code != 200 || r != tc.want {
			t.Errorf("header %q body %v: status %d rank %q, want rank %s", tc.header, tc.body, code, r, tc.want)
		}
	}
	if _, r := send("", map[string]any{}); r != "1" {
		t.Errorf("unpinned after pinned ones: rank %q, want 1 (pinned requests do not advance the round robin)", r)
	}
	for _, tc := range []struct {
		header string
		body   map[string]any
	}{{"one", map[string]any{}}, {"3", map[string]any{}}, {"-1", map[string]any{}}, {"", map[string]any{"routed_dp_rank": 3}}} {
		if code, _ := send(tc.header, tc.body); code != http.StatusBadRequest {
			t.Errorf("header %q body %v: status %d, want 400", tc.header, tc.body, code)
		}
	}

	// Without data parallelism rank 0 is ignored, another is a 400.
	_, url = startServer(t, Config{Model: testModel, Engine: EngineSGLang})
	if code, r := send("0", map[string]any{}); code != 200 || r != "0" {
		t.Errorf("rank 0 of a server without data parallelism: status %d rank %q", code, r)
	}
	if code, _ := send("1", map[string]any{}); code != http.StatusBadRequest {
		t.Errorf("rank 1 of a server without data parallelism: status %d, want 400", code)
	}
}
