//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestReplicaFailover runs three `router serve` replicas with a cluster
// block over one NATS server (in the test process) and two mock engines.
// A long answer is in flight through replica 0, counted on the others;
// replica 0 is SIGKILLed. Every request sent to the survivors meanwhile
// gets a whole answer; replica 0's booking expires on them within the
// booking TTL (they count 0 again, and say so in
// switchyard_cluster_expired_bookings_total). Replica 0, started again,
// joins and counts the survivors' bookings in flight.
func TestReplicaFailover(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	port := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		return ln.Addr().(*net.TCPAddr).Port
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port(), JetStream: true, JetStreamMaxMemory: 1 << 30, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	mocks := startMocks(t, routerBin, 2, "5")
	names := []string{"a", "b"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url}
	dir := t.TempDir()
	listens := []string{}
	policies := []string{}
	for i := range 3 {
		listens = append(listens, "127.0.0.1:"+strconv.Itoa(port()))
		p := filepath.Join(dir, fmt.Sprintf("policy%d.hcl", i))
		body := workerBlocks(names, urls) + fmt.Sprintf("\ncluster {\n  nats        = %q\n  replica     = \"r%d\"\n  name        = \"failover\"\n  heartbeat   = \"200ms\"\n  booking_ttl = \"3s\"\n}\n", ns.ClientURL(), i)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		policies = append(policies, p)
	}
	start := func(i int) *e2eProc {
		return startProc(t, routerBin, "serve", "--policy", policies[i], "--listen", listens[i])
	}
	c := e2eClient(t)
	ready := func(m map[string]float64) bool {
		return m[readyOf("a")] == 1 && m[readyOf("b")] == 1 && m["switchyard_cluster_peers"] == 2
	}
	reps := []*e2eProc{start(0), start(1), start(2)}
	for _, r := range reps {
		waitMetrics(t, c, r, time.Minute, "every worker ready and both peers heard", ready)
	}
	remote := func(m map[string]float64) float64 { return m["switchyard_cluster_remote_bookings"] }

	// hold sends a long streamed answer through r and returns once its
	// first event arrived; cancel ends it.
	hold := func(r *e2eProc) (stop func(), worker string) {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions",
			strings.NewReader(chatJSON(true, 2000, "a very long answer, please")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: c.Transport}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		return func() { cancel(); _ = resp.Body.Close() }, resp.Header.Get("X-Switchyard-Worker")
	}
	// The replicas' consumers are live once a hold on one is counted on
	// the others.
	stop0, _ := hold(reps[0])
	for _, r := range reps[1:] {
		waitMetrics(t, c, r, time.Minute, "replica 0's request counted", func(m map[string]float64) bool { return remote(m) == 1 })
	}

	reps[0].kill() // SIGKILL: no reset, no release
	stop0()
	for i := range 20 {
		r := reps[1+i%2]
		a, err := harnessChat(context.Background(), c, r.url, chatJSON(i%2 == 0, 8, fmt.Sprintf("after the kill %d", i)), nil, nil)
		if err != nil || a.status != http.StatusOK || !a.complete {
			t.Fatalf("request %d through a survivor: %v %d complete %v %q", i, err, a.status, a.complete, a.body)
		}
	}
	for _, r := range reps[1:] {
		m := waitMetrics(t, c, r, time.Minute, "the dead replica's booking expired", func(m map[string]float64) bool {
			return remote(m) == 0 && m[activeOf("a")] == 0 && m[activeOf("b")] == 0
		})
		if m["switchyard_cluster_expired_bookings_total"] != 1 {
			t.Errorf("expired bookings %v, want 1 (replica 0's)", m["switchyard_cluster_expired_bookings_total"])
		}
	}

	// Replica 0 again: it joins and counts a booking of replica 1 in
	// flight (the snapshot answering its hello).
	reps[0] = start(0)
	waitMetrics(t, c, reps[0], time.Minute, "replica 0 ready again", ready)
	stop1, worker := hold(reps[1])
	defer stop1()
	waitMetrics(t, c, reps[0], time.Minute, "replica 0 counts replica 1's request", func(m map[string]float64) bool {
		return remote(m) == 1 && m[activeOf(worker)] == 1
	})
}
