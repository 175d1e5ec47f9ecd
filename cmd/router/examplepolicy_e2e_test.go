//go:build linux

package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeE2EExampleServePolicyWarnsNothing: the quick start of README.md,
// docs/serve.md and docs/epp.md — examples/policies/serve.hcl over three
// `router mock-worker` engines (its worker URLs pointed at them) — logs no
// warning on the happy path: the file used to set router.block_size = 512,
// and every start logged "router.block_size overrides the engines' KV block
// size" against the engines' 16. The block size and the capacity are the
// engines' (27,500 blocks of 16 tokens each), and a chat is answered 200.
func TestServeE2EExampleServePolicyWarnsNothing(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	src, err := os.ReadFile(filepath.Join(policyDir, "serve.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	policy := string(src)
	names := []string{"a", "b", "c"}
	for i, m := range startProcs(t, routerBin, 3) {
		old := "http://127.0.0.1:800" + string(rune('1'+i))
		if !strings.Contains(policy, old) {
			t.Fatalf("serve.hcl has no worker at %s; update this test", old)
		}
		policy = strings.Replace(policy, old, m, 1)
	}
	path := filepath.Join(t.TempDir(), "serve.hcl")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", path)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "every worker ready", allReady(names...))
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r, err := doChat(ctx, c, router.url, strings.Replace(chatJSON(false, 8, "hi"), `"mock"`, `"llama"`, 1))
		cancel()
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("chat %d: %v, status %d %s", i, err, r.status, r.body)
		}
	}
	m := waitMetrics(t, c, router, time.Minute, "three requests counted", func(m map[string]float64) bool {
		return requestsCounted(m) == 3
	})
	for _, n := range names {
		if got := m[`switchyard_worker_capacity_blocks{rank="0",worker="`+n+`"}`]; got != 27500 {
			t.Errorf("worker %s: capacity %v blocks, want the engine's 27500", n, got)
		}
	}
	if s := router.stderr.String(); strings.Contains(s, "[WARN]") || strings.Contains(s, "[ERROR]") {
		t.Errorf("the quick start logged a warning or an error:\n%s", s)
	}
}

// startProcs starts n `router mock-worker` engines of model "llama" (the
// quick start's) and returns their URLs.
func startProcs(t *testing.T, routerBin string, n int) []string {
	t.Helper()
	urls := make([]string, n)
	for i := range urls {
		urls[i] = startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "llama", "--speedup", "50").url
	}
	return urls
}
