//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
)

// TestKVRelayE2E: a `router kv-relay` process, a `router serve` with the
// same cluster block and a mock engine publishing KV events. The relay
// takes the engine's lease first (serve starts once it holds it), so it
// alone subscribes to the engine; serve's precise index goes live from
// the relay's stream (/debug/workers says "live", with blocks), serve
// relays nothing itself. SIGTERM stops the relay cleanly (exit 0, lease
// given up): serve takes the lease and relays from then on.
func TestKVRelayE2E(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	ns := natskit.Start(t, 0)

	engine := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50", "--engine-block-size", "16",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0")
	kv := engine.waitStdout(t, mockKVEvents)
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`router {
  block_size = 16
}

worker "w" {
  url = %q
  kv_events {
    endpoint        = %q
    replay_endpoint = %q
  }
}

cluster {
  nats        = %q
  replica     = "r0"
  name        = "relaye2e"
  heartbeat   = "200ms"
  booking_ttl = "3s"
}
`, engine.url, kv[1], kv[2], ns.ClientURL())), 0o644); err != nil {
		t.Fatal(err)
	}
	c := e2eClient(t)
	relay := startProc(t, routerBin, "kv-relay", "--policy", policy, "--metrics-listen", "127.0.0.1:0")
	waitMetrics(t, c, relay, time.Minute, "the relay holds the engine's lease", func(m map[string]float64) bool {
		return m["switchyard_cluster_leases_held"] == 1
	})
	serve := startProc(t, routerBin, "serve", "--policy", policy, "--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0")
	debugAddr := serve.waitStdout(t, serveProfiler)[1]
	waitMetrics(t, c, serve, time.Minute, "the worker ready", func(m map[string]float64) bool { return m[readyOf("w")] == 1 })

	// stream returns serve's view of the worker's rank 0 (/debug/workers).
	type rankView struct {
		PrefixIndexBlocks *int64 `json:"prefix_index_blocks"`
		Events            *struct {
			State    string `json:"state"`
			Received uint64 `json:"events_received"`
		} `json:"kv_events"`
	}
	stream := func() rankView {
		resp, err := c.Get("http://" + debugAddr + "/debug/workers")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var v struct {
			Workers []struct {
				Ranks []rankView `json:"ranks"`
			} `json:"workers"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || len(v.Workers) != 1 || len(v.Workers[0].Ranks) != 1 {
			t.Fatalf("/debug/workers: %v %+v", err, v)
		}
		return v.Workers[0].Ranks[0]
	}
	// send posts one completion of two blocks of token ids (the engine's
	// events carry them) through serve.
	sent := 0
	send := func() {
		ids := make([]string, 33)
		for j := range ids {
			ids[j] = fmt.Sprint(1000*sent + j)
		}
		sent++
		resp, err := c.Post(serve.url+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"mock","max_tokens":1,"prompt":[%s]}`, strings.Join(ids, ","))))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s", resp.Status)
		}
	}
	live := func() bool {
		v := stream()
		return v.Events != nil && v.Events.State == "live" && v.Events.Received > 0 && v.PrefixIndexBlocks != nil && *v.PrefixIndexBlocks > 0
	}
	deadline := time.Now().Add(time.Minute)
	for !live() {
		if time.Now().After(deadline) {
			t.Fatalf("serve's index of w not live within a minute: %+v\nrelay:\n%s\nserve:\n%s", stream(), relay.stderr, serve.stderr)
		}
		send()
		time.Sleep(20 * time.Millisecond)
	}
	rm, err := scrape(c, relay.url)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := scrape(c, serve.url)
	if err != nil {
		t.Fatal(err)
	}
	if rm[`switchyard_cluster_kv_relayed_total{op="apply"}`] < 1 || sm[`switchyard_cluster_kv_relayed_total{op="apply"}`] != 0 {
		t.Errorf("batches relayed: by kv-relay %v, by serve %v; want some, none", rm[`switchyard_cluster_kv_relayed_total{op="apply"}`], sm[`switchyard_cluster_kv_relayed_total{op="apply"}`])
	}
	if sm["switchyard_cluster_leases_held"] != 0 || sm[`switchyard_cluster_kv_consumed_total{op="apply"}`] < 1 {
		t.Errorf("serve: leases held %v, batches consumed %v; want 0 and some", sm["switchyard_cluster_leases_held"], sm[`switchyard_cluster_kv_consumed_total{op="apply"}`])
	}

	// SIGTERM: the relay gives its lease up and exits 0; serve takes it.
	relay.stop(t)
	if code := relay.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("kv-relay exited %d on SIGTERM, want 0\n%s", code, relay.stderr)
	}
	if !strings.Contains(relay.stderr.String(), "lease given up") {
		t.Errorf("kv-relay's logs do not say it gave its lease up:\n%s", relay.stderr)
	}
	waitMetrics(t, c, serve, time.Minute, "serve takes the lease and relays", func(m map[string]float64) bool {
		if m["switchyard_cluster_leases_held"] == 1 && m[`switchyard_cluster_kv_relayed_total{op="apply"}`] > 0 {
			return true
		}
		send()
		return false
	})
	deadline = time.Now().Add(time.Minute)
	for !live() {
		if time.Now().After(deadline) {
			t.Fatalf("serve's index of w not live after the handover: %+v\nserve:\n%s", stream(), serve.stderr)
		}
		send()
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKVRelayKilledE2E: two `router kv-relay` processes compete for one
// engine's lease; the holder is SIGKILLed (it never gives the lease up):
// once the lease expired the other takes it and relays the engine.
func TestKVRelayKilledE2E(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	ns := natskit.Start(t, 0)
	engine := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50", "--engine-block-size", "16",
		"--kv-events-endpoint", "tcp://127.0.0.1:0")
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`worker "w" {
  url = %q
  kv_events {
    endpoint = %q
  }
}

cluster {
  nats      = %q
  replica   = "sidecar"
  name      = "killed"
  heartbeat = "200ms"
}
`, engine.url, engine.waitStdout(t, mockKVEvents)[1], ns.ClientURL())), 0o644); err != nil {
		t.Fatal(err)
	}
	c := e2eClient(t)
	relays := []*e2eProc{
		startProc(t, routerBin, "kv-relay", "--policy", policy, "--metrics-listen", "127.0.0.1:0"),
		startProc(t, routerBin, "kv-relay", "--policy", policy, "--metrics-listen", "127.0.0.1:0"),
	}
	held := func(p *e2eProc) float64 {
		m, err := scrape(c, p.url)
		if err != nil {
			return -1
		}
		return m["switchyard_cluster_leases_held"]
	}
	var holder, waiting *e2eProc
	deadline := time.Now().Add(time.Minute)
	for holder == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no relay holds the lease within a minute\n%s\n%s", relays[0].stderr, relays[1].stderr)
		}
		switch a, b := held(relays[0]), held(relays[1]); {
		case a == 1 && b == 0:
			holder, waiting = relays[0], relays[1]
		case b == 1 && a == 0:
			holder, waiting = relays[1], relays[0]
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	holder.kill()
	// The engine publishes when its cache changes: requests sent to it
	// directly until the other relay has published a batch.
	sent := 0
	waitMetrics(t, c, waiting, time.Minute, "the other relay takes the expired lease and relays", func(m map[string]float64) bool {
		if m["switchyard_cluster_leases_held"] == 1 && m[`switchyard_cluster_kv_relayed_total{op="apply"}`] > 0 {
			return true
		}
		ids := make([]string, 33) // two blocks of 16 tokens
		for j := range ids {
			ids[j] = fmt.Sprint(1000*sent + j)
		}
		sent++
		resp, err := c.Post(engine.url+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"mock","max_tokens":1,"prompt":[%s]}`, strings.Join(ids, ","))))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return false
	})
	if strings.Contains(waiting.stderr.String(), "lease given up") {
		t.Errorf("the waiting relay gave a lease up:\n%s", waiting.stderr)
	}
}
