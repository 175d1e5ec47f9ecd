//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// TestServeE2EMalformedKVEventsLogOncePerInterval: `router serve` follows
// a worker's KV events from a publisher (a real ZeroMQ PUB socket in this
// test process) that sends 1,000 payloads that do not decode, some
// quoting a 10 KiB map key with terminal escapes. The router counts each
// (switchyard_worker_kv_event_malformed_total) and logs at most one
// warning per 10 s, bounded and control-escaped; before, it logged one
// 10 KiB warning per payload.
func TestServeE2EMalformedKVEventsLogOncePerInterval(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	pub, err := kvevents.NewPublisher("tcp://127.0.0.1:0", "", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	mock := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50", "--engine-block-size", "16")
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	if err := os.WriteFile(policy, []byte("router {\n  block_size = 16\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	workersFile := filepath.Join(dir, "workers.hcl")
	writeAtomic(t, workersFile, fmt.Sprintf("worker \"w\" {\n  url = %q\n  models = [\"mock\"]\n  total_kv_blocks = 1000\n  kv_events {\n    endpoint = \"tcp://%s\"\n  }\n}\n",
		mock.url, pub.Addr()))
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "w ready", allReady("w"))

	// A SUB socket misses what is published before it subscribed: good
	// batches until one arrived.
	var enc kvevents.Encoder
	good, err := enc.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	if err != nil {
		t.Fatal(err)
	}
	good = bytes.Clone(good)
	const events = `switchyard_worker_kv_events_total{rank="0",worker="w"}`
	const malformed = `switchyard_worker_kv_event_malformed_total{rank="0",worker="w"}`
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := pub.Publish(good); err != nil {
			t.Fatal(err)
		}
		if m, err := scrape(c, router.url); err == nil && m[events] >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no KV event reached the router in a minute; stderr:\n%s", router.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	key := append([]byte("\x1b]0;owned\x07\x1b[2J\nlevel=ERROR "), bytes.Repeat([]byte("K"), 10<<10)...)
	bad := [][]byte{
		// A map envelope whose one key's value is an array of 2^32-1
		// elements in no bytes.
		append(append([]byte{0x81, 0xda, byte(len(key) >> 8), byte(len(key))}, key...), 0xdd, 0xff, 0xff, 0xff, 0xff),
		[]byte("hello"),
	}
	const n = 1000
	start := time.Now()
	for i := range n {
		if _, err := pub.Publish(bad[i%len(bad)]); err != nil {
			t.Fatal(err)
		}
	}
	waitMetrics(t, c, router, time.Minute, "every bad payload counted", func(m map[string]float64) bool { return m[malformed] == n })
	elapsed := time.Since(start)
	out := router.stderr.String()
	lines := strings.Count(out, "batch not applied")
	if max := 2 + int(elapsed/kvevents.DefaultLogInterval); lines < 1 || lines > max {
		t.Fatalf("%d warnings for %d bad payloads in %v, want 1 to %d (one per %v):\n%.4000s", lines, n, elapsed, max, kvevents.DefaultLogInterval, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 1024 {
			t.Errorf("a log line of %d bytes: %.300s...", len(line), line)
		}
		if strings.ContainsAny(line, "\x1b\x07") {
			t.Errorf("a control byte in a log line: %q", line)
		}
	}
}
