package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeE2EKVEvents: three `router mock-worker` processes that
// tokenize with a tokenizer.json and publish their KV-cache events over
// ZeroMQ (one in the map encoding), a policy file with the same tokenizer,
// and a workers file that gives only each worker's URL and its kv_events
// endpoint. The router learns models and capacity from the engines,
// follows their events, and routes multi-turn conversations on a cache
// small enough to evict; its precise belief of each request's cached
// prefix then equals what the engine reports it served, where its
// approximate belief (what it sent, by its own clock) is also counted.
func TestServeE2EKVEvents(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	tokDir, err := filepath.Abs("../../router/tokenizer/testdata")
	if err != nil {
		t.Fatal(err)
	}
	tok, tokCfg := filepath.Join(tokDir, "bytebpe.json"), filepath.Join(tokDir, "chatml_config.json")
	const kvBlocks = 300 // 16-token blocks: a few conversations' worth, so the engines evict
	names := []string{"a", "b", "c"}
	var workers strings.Builder
	var engines []string
	for i, n := range names {
		encoding := "array"
		if i == 2 {
			encoding = "map"
		}
		m := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50",
			"--engine-block-size", "16", "--kv-blocks", fmt.Sprint(kvBlocks), "--tokenizer", tok, "--tokenizer-config", tokCfg,
			"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0", "--kv-events-encoding", encoding)
		ep := m.waitStdout(t, mockKVEvents)
		fmt.Fprintf(&workers, "worker %q {\n  url = %q\n  kv_events {\n    endpoint        = %q\n    replay_endpoint = %q\n  }\n}\n", n, m.url, ep[1], ep[2])
		engines = append(engines, m.url)
	}
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`router {
  block_size = 16
}

tokenizer "mock" {
  source = "file"
  path   = %q
  config = %q
}
`, tok, tokCfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	workersFile := filepath.Join(dir, "workers.hcl")
	if err := os.WriteFile(workersFile, []byte(workers.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "every worker ready with the engine's capacity", func(m map[string]float64) bool {
		for _, n := range names {
			if m[readyOf(n)] != 1 || m[`switchyard_worker_capacity_blocks{rank="0",worker="`+n+`"}`] != kvBlocks {
				return false
			}
		}
		return true
	})

	// A stream is live from its first event (sequence 0), and an engine
	// publishes only when its cache changes: one request sent to each
	// engine directly, past the router, makes every stream live before
	// the run, so that every request of it is believed precisely too
	// (else a worker that no earlier turn reached is believed only
	// approximately, however many turns have passed). A subscription
	// reaches the engine's PUB socket a moment after the router connects
	// (ZeroMQ's slow joiner), so a first event can be missed: an engine
	// still unheard of gets another warm-up every 2 s, whose event the
	// router sees mid-stream and completes from the replay endpoint.
	warm := func(u string, k int) {
		body := fmt.Sprintf(`{"model":"mock","max_tokens":1,"prompt":%q}`, strings.Repeat(fmt.Sprintf("Warm-up prompt %d of a few blocks. ", k), 8))
		resp, err := c.Post(u+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	heard := func(m map[string]float64, n string) bool {
		return m[`switchyard_worker_kv_events_total{rank="0",worker="`+n+`"}`] >= 1
	}
	for i, n := range names {
		deadline := time.Now().Add(time.Minute)
	engine:
		for k := 0; time.Now().Before(deadline); k++ { // past it, waitMetrics below reports
			warm(engines[i], k)
			for again := time.Now().Add(2 * time.Second); time.Now().Before(again); time.Sleep(50 * time.Millisecond) {
				if m, err := scrape(c, router.url); err == nil && heard(m, n) {
					break engine
				}
			}
		}
	}
	waitMetrics(t, c, router, time.Minute, "an event from every engine", func(m map[string]float64) bool {
		for _, n := range names {
			if m[`switchyard_worker_kv_events_total{rank="0",worker="`+n+`"}`] < 1 {
				return false
			}
		}
		return true
	})

	// Conversations: a shared system prompt, then turns that each extend
	// the history; every request is sent once the previous answer ended.
	// Six conversations at once, each sending its next turn when the
	// previous answer ended, so the load spreads over the workers.
	const convs, turns = 6, 6
	requests := convs * turns
	type result struct {
		worker string
		err    error
	}
	results := make(chan result, requests)
	for conv := range convs {
		go func() {
			// The conversation's number comes first, so that no two
			// conversations share a block (a shared first block would be
			// served from a cache that a concurrent first turn filled after
			// this one's belief was taken).
			system := fmt.Sprintf("%d. ", conv) + strings.Repeat("You are a careful assistant who answers in full sentences. ", 8)
			msgs := []map[string]string{{"role": "system", "content": system}}
			for turn := range turns {
				msgs = append(msgs, map[string]string{"role": "user",
					"content": fmt.Sprintf("Question %d: %s", turn, strings.Repeat("tell me more about it. ", 4+turn))})
				body, _ := json.Marshal(map[string]any{"model": "mock", "max_tokens": 4, "messages": msgs})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				r, err := doChat(ctx, c, router.url, string(body))
				cancel()
				if err == nil && r.status != http.StatusOK {
					err = fmt.Errorf("status %d: %s", r.status, r.body)
				}
				results <- result{r.worker, err}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": "I will answer that at length in a moment."})
			}
		}()
	}
	served := map[string]int{}
	for range requests {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		served[r.worker]++
	}

	m, err := scrape(c, router.url)
	if err != nil {
		t.Fatal(err)
	}
	belief := func(mode, result string) float64 {
		return m[`switchyard_prefix_belief_total{mode="`+mode+`",result="`+result+`"}`]
	}
	precise := belief("precise", "exact") + belief("precise", "over") + belief("precise", "under")
	approx := belief("approximate", "exact") + belief("approximate", "over") + belief("approximate", "under")
	t.Logf("%d requests: precise belief exact %v over %v under %v; approximate exact %v over %v under %v",
		requests, belief("precise", "exact"), belief("precise", "over"), belief("precise", "under"),
		belief("approximate", "exact"), belief("approximate", "over"), belief("approximate", "under"))
	t.Logf("workers that served: %v", served)
	if approx != float64(requests) || precise != float64(requests) {
		t.Fatalf("belief counted for %v (precise) and %v (approximate) of %d requests", precise, approx, requests)
	}
	// Each answer came after the previous one ended, so its events had
	// long been applied: the precise belief is exact but for a rare
	// eviction racing a request.
	if exact := belief("precise", "exact"); exact < 0.9*precise {
		t.Errorf("precise belief exact for %v of %v requests, want >= 90%%", exact, precise)
	}
	if m[`switchyard_cached_prompt_tokens_total{model="mock"}`] == 0 {
		t.Error("the engines served nothing from cache: the run tests nothing")
	}
	for _, n := range names {
		if served[n] > 0 && m[`switchyard_worker_kv_events_total{rank="0",worker="`+n+`"}`] == 0 {
			t.Errorf("worker %s served requests, but no KV events were received from it", n)
		}
		if g := m[`switchyard_worker_kv_event_gaps_total{rank="0",worker="`+n+`"}`]; g != 0 {
			t.Errorf("worker %s: %v sequence gaps", n, g)
		}
	}
	// The engines' models were learned from /v1/models.
	resp, err := c.Get(router.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"mock"`) {
		t.Errorf("/v1/models: %s", b)
	}
}
