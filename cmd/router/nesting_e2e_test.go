//go:build linux

package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Files nested 100,000 deep (200 KB), which HCL's recursive parser used to
// follow to Go's stack limit: the router died with "fatal error: stack
// overflow" (exit 2) on startup, on a reload of its policy file and on a
// change of its watched workers file. Now they are refused before the parse
// (config.CheckNesting), at the file:line:col of the first bracket past the
// limit, and a running router keeps its configuration.

// deepWorkers is a workers file whose worker's url nests 100,000 deep;
// the 256th [ (line 2, column 264) is the first past the limit.
var deepWorkers = "worker \"c\" {\n  url = " + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "\n}\n"

// deepPolicy is a policy file whose block_size nests 100,000 deep; the
// 256th ( (line 2, column 271) is the first past the limit.
var deepPolicy = "router {\n  block_size = " + strings.Repeat("(", 100_000) + "16" + strings.Repeat(")", 100_000) + "\n}\n"

// TestDeepFilesAreRefused: every command that reads a policy or workers
// file exits 1 with the nesting error of a deep one, at its position.
func TestDeepFilesAreRefused(t *testing.T) {
	bin, _ := e2eBinaries(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "deep-policy.hcl")
	workers := filepath.Join(dir, "deep-workers.hcl")
	for p, src := range map[string]string{policy: deepPolicy, workers: deepWorkers} {
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const detail = "error: Nesting too deep; The file nests deeper than 256 levels here, so it is not loaded."
	atPolicy := policy + ":2:271: " + detail
	atWorkers := workers + ":2:264: " + detail
	for _, tt := range []struct {
		name string
		args []string
		want string // a line of stderr
	}{
		{"validate", []string{"validate", policy}, atPolicy},
		{"validate workers file", []string{"validate", workers}, atWorkers},
		{"replay", []string{"replay", "--policy", policy}, atPolicy},
		{"replay compare", []string{"replay", "--compare", rrPolicy + "," + policy}, atPolicy},
		{"serve", []string{"serve", "--policy", policy, "--listen", "127.0.0.1:0"}, atPolicy},
		{"serve workers file", []string{"serve", "--policy", rrPolicy, "--listen", "127.0.0.1:0", "--workers-file", workers}, atWorkers},
		{"epp", []string{"epp", "--policy", policy, "--listen", "127.0.0.1:0"}, atPolicy},
		{"epp workers file", []string{"epp", "--policy", rrPolicy, "--listen", "127.0.0.1:0", "--workers-file", workers}, atWorkers},
		{"kv-relay", []string{"kv-relay", "--policy", policy}, atPolicy},
		{"plugins describe", []string{"plugins", "describe", "--policy", policy, "--plugin", "p"}, atPolicy},
		{"plugins check", []string{"plugins", "check", "--policy", policy, "--plugin", "p"}, atPolicy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr := runBinary(t, bin, tt.args...)
			if code != 1 || !hasLinePrefix(stderr, tt.want) {
				t.Errorf("exit %d, stderr\n%.2000s\nwant exit 1 and a line starting\n%s", code, stderr, tt.want)
			}
		})
	}
}

// hasLinePrefix reports whether a line of s starts with prefix.
func hasLinePrefix(s, prefix string) bool {
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// TestServeE2EDeepFilesChangeNothing: a running `router serve` (round
// robin over two mock workers, the policy file watched with --watch) whose
// workers file, then policy file, become files nested 100,000 deep — the
// policy file reloaded by the watch and again by SIGHUP — keeps running on
// its configuration: both workers still serve, each failure is logged at
// the file's line and column, and the failed policy reloads are counted.
func TestServeE2EDeepFilesChangeNothing(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mocks := startMocks(t, routerBin, 2, "50")
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	src, err := os.ReadFile(rrPolicy)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, policy, strings.Replace(string(src), "block_size = 512", "block_size = 16", 1))
	workersFile := filepath.Join(dir, "workers.hcl")
	writeAtomic(t, workersFile, workerBlocks([]string{"a", "b"}, map[string]string{"a": mocks[0].url, "b": mocks[1].url}))
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile, "--watch")
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "both workers ready", allReady("a", "b"))

	// routesToBoth: the router is alive, and round robin over a and b
	// answers four requests, two on each.
	routesToBoth := func(when string) {
		t.Helper()
		select {
		case <-router.done:
			t.Fatalf("%s: the router exited (%v); stderr:\n%.4000s", when, router.cmd.ProcessState, router.stderr.String())
		default:
		}
		got := map[string]int{}
		for range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			r, err := doChat(ctx, c, router.url, chatJSON(false, 2, "hello"))
			cancel()
			if err != nil || r.status != http.StatusOK {
				t.Fatalf("%s: %v, status %d %s; stderr:\n%.4000s", when, err, r.status, r.body, router.stderr.String())
			}
			got[r.worker]++
		}
		if got["a"] != 2 || got["b"] != 2 {
			t.Errorf("%s: requests per worker %v, want a:2 b:2", when, got)
		}
	}
	routesToBoth("before")

	// waitLogs waits (a minute at most) for n stderr lines holding want:
	// a line reaches the test's buffer through a pipe, after the metric
	// that counts its cause.
	waitLogs := func(want string, n int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for strings.Count(router.stderr.String(), want) < n {
			select {
			case <-router.done:
				t.Fatalf("the router exited (%v) before logging %q; stderr:\n%.4000s", router.cmd.ProcessState, want, router.stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q logged %d times within a minute, want %d (one per reload); stderr:\n%.4000s", want, strings.Count(router.stderr.String(), want), n, router.stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	const failures = `switchyard_policy_reloads_total{result="failure"}`
	failed := func(n float64) func(map[string]float64) bool {
		return func(m map[string]float64) bool { return m[failures] >= n }
	}

	writeAtomic(t, workersFile, deepWorkers)
	waitLogs(workersFile+":2:264: error: Nesting too deep", 1)
	routesToBoth("after the workers file became a deep one")

	writeAtomic(t, policy, deepPolicy)
	waitMetrics(t, c, router, time.Minute, "the watch's reload failed", failed(1))
	waitLogs(policy+":2:271: error: Nesting too deep", 1)
	routesToBoth("after the policy file became a deep one")

	if err := router.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	m := waitMetrics(t, c, router, time.Minute, "the SIGHUP's reload failed", failed(2))
	if s := m[`switchyard_policy_reloads_total{result="success"}`]; s != 0 {
		t.Errorf("%v successful reloads, want 0", s)
	}
	waitLogs(policy+":2:271: error: Nesting too deep", 2)
	routesToBoth("after SIGHUP")
}
