package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeE2ESGLangDataParallel: a `router mock-worker --engine sglang`
// process with two data-parallel ranks, each with its own KV cache and
// KV-event publisher (port base + rank; given port 0, the mock takes a
// free base for rank 0 and rank 1 on base + 1), SGLang's dp_rank-labelled
// metrics and SGLang's choice of rank (the X-Data-Parallel-Rank header,
// else round-robin), given to the router by its URL only. The router
// reads each rank's load from its own series, subscribes to both ranks'
// KV events (from /server_info), and routes prompts whose prefix rank 1
// cached (sent to the engine directly, past the router) to rank 1. Before,
// dp_rank was not read: the server was one candidate of rank 0, only rank
// 0's events were followed, and SGLang spread the requests round-robin.
func TestServeE2ESGLangDataParallel(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	tokDir, err := filepath.Abs("../../router/tokenizer/testdata")
	if err != nil {
		t.Fatal(err)
	}
	mock := startProc(t, routerBin, "mock-worker", "--engine", "sglang", "--listen", "127.0.0.1:0", "--model", "mock",
		"--speedup", "1", "--engine-block-size", "16", "--kv-blocks", "300", "--data-parallel-size", "2",
		"--tokenizer", filepath.Join(tokDir, "bytebpe.json"), "--tokenizer-config", filepath.Join(tokDir, "chatml_config.json"),
		"--kv-events-endpoint", "tcp://127.0.0.1:0")
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf("worker \"s\" {\n  url = %q\n}\n", mock.url)), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	series := func(name, rank string, more ...string) string {
		return name + `{rank="` + rank + `",` + strings.Join(append(more, `worker="s"`), ",") + "}"
	}
	waitMetrics(t, c, router, time.Minute, "both ranks ready, their loads read, their KV events subscribed", func(m map[string]float64) bool {
		for _, r := range []string{"0", "1"} {
			if m[series("switchyard_worker_engine_load_available", r)] != 1 || m[series("switchyard_worker_capacity_blocks", r)] != 300 {
				return false
			}
			if _, ok := m[series("switchyard_worker_kv_state", r, `state="live"`)]; !ok {
				return false
			}
		}
		return m[readyOf("s")] == 1
	})

	// direct sends a completion to the engine, past the router, on rank.
	direct := func(ctx context.Context, rank, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, mock.url+"/v1/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Data-Parallel-Rank", rank)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Header.Get("x-mock-dp-rank"); resp.StatusCode != http.StatusOK || got != rank {
			t.Fatalf("direct request to rank %s: status %d, served by rank %q", rank, resp.StatusCode, got)
		}
		return resp
	}

	// Each rank's load is its own: a stream running on rank 0 shows there
	// only.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := direct(ctx, "0", `{"model":"mock","prompt":"a long answer","max_tokens":4000,"stream":true}`)
	defer stream.Body.Close()
	waitMetrics(t, c, router, time.Minute, "rank 0 running one request, rank 1 none", func(m map[string]float64) bool {
		return m[series("switchyard_worker_engine_running_requests", "0")] == 1 && m[series("switchyard_worker_engine_running_requests", "1")] == 0
	})
	cancel()

	// A prefix cached on rank 1 only; another prompt on rank 0, so that
	// both ranks' streams carry events.
	prefix := strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 8)
	for rank, prompt := range map[string]string{"1": prefix, "0": strings.Repeat("Another text entirely, cached on rank zero. ", 8)} {
		resp := direct(context.Background(), rank, fmt.Sprintf(`{"model":"mock","prompt":%q,"max_tokens":1}`, prompt))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitMetrics(t, c, router, time.Minute, "both ranks' events received, both streams live", func(m map[string]float64) bool {
		for _, r := range []string{"0", "1"} {
			if m[series("switchyard_worker_kv_events_total", r)] < 1 || m[series("switchyard_worker_kv_state", r, `state="live"`)] != 1 {
				return false
			}
		}
		return true
	})

	// Through the router: every prompt that starts with rank 1's prefix
	// goes to rank 1 (SGLang alone would alternate the ranks).
	for i := range 4 {
		body := fmt.Sprintf(`{"model":"mock","prompt":%q,"max_tokens":2}`, prefix+fmt.Sprintf("Question %d: what next?", i))
		req, err := http.NewRequest(http.MethodPost, router.url+"/v1/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != "s" || resp.Header.Get("x-mock-dp-rank") != "1" {
			t.Fatalf("request %d: status %d, worker %q, rank %q, want rank 1 (which holds the prefix): %s", i, resp.StatusCode,
				resp.Header.Get("X-Switchyard-Worker"), resp.Header.Get("x-mock-dp-rank"), b)
		}
	}
	m, err := scrape(c, router.url)
	if err != nil {
		t.Fatal(err)
	}
	if got := m[`switchyard_prefix_belief_total{mode="precise",result="exact"}`]; got < 1 {
		t.Errorf("precise beliefs exact: %v, want the routed requests believed from rank 1's events", got)
	}
}
