//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router/live"
)

// TestNATSRestartUnderLoad runs three `router serve` replicas with a
// cluster block and the session-affinity classifier over one NATS server
// (in the test process) and two mock engines, under a steady load of
// requests spread round-robin over the replicas. NATS is shut down: the
// load goes on and every request is answered 200 with a whole completion,
// each replica's /readyz says cluster.connected false, and no replica
// exits. A new NATS server on the same port (its memory stream and
// bucket empty): each replica reconnects by itself (connected true, its
// peers heard again), a request in flight on one replica is counted on
// the others again, and a session's turn through one replica is followed
// through another.
func TestNATSRestartUnderLoad(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	freePort := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		return ln.Addr().(*net.TCPAddr).Port
	}
	natsPort := freePort()
	startNATS := func() *server.Server {
		ns := natskit.Start(t, natsPort)
		return ns
	}
	ns := startNATS()

	mocks := startMocks(t, routerBin, 2, "20")
	names := []string{"a", "b"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url}
	dir := t.TempDir()
	var reps []*e2eProc
	for i := range 3 {
		p := filepath.Join(dir, fmt.Sprintf("policy%d.hcl", i))
		body := workerBlocks(names, urls) + "\nrequest_classifier {\n  type = \"session-affinity\"\n}\n" +
			fmt.Sprintf("\ncluster {\n  nats        = %q\n  replica     = \"r%d\"\n  name        = \"restart\"\n  heartbeat   = \"200ms\"\n  booking_ttl = \"3s\"\n}\n", ns.ClientURL(), i)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		reps = append(reps, startProc(t, routerBin, "serve", "--policy", p, "--listen", "127.0.0.1:"+strconv.Itoa(freePort())))
	}
	c := e2eClient(t)
	peered := func(m map[string]float64) bool {
		return m[readyOf("a")] == 1 && m[readyOf("b")] == 1 && m["switchyard_cluster_peers"] == 2 && m["switchyard_cluster_connected"] == 1
	}
	for _, r := range reps {
		waitMetrics(t, c, r, time.Minute, "every worker ready and both peers heard", peered)
	}
	alive := func(when string) {
		t.Helper()
		for i, r := range reps {
			select {
			case <-r.done:
				t.Fatalf("%s: replica %d exited: %v\n%s", when, i, r.cmd.ProcessState, r.stderr.String())
			default:
			}
		}
	}
	connected := func(r *e2eProc, want bool) func(int, live.Readiness) bool {
		return func(code int, a live.Readiness) bool { return a.Cluster != nil && a.Cluster.Connected == want }
	}
	// syncLive: a long answer in flight through reps[0] is counted on
	// the others (their consumers are live). It returns the request's
	// stop.
	syncLive := func(what string) func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			stop := hold(t, c, reps[0])
			for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
				ok := true
				for _, r := range reps[1:] {
					m, err := scrape(c, r.url)
					ok = ok && err == nil && m["switchyard_cluster_remote_bookings"] == 1
				}
				if ok {
					return stop
				}
			}
			stop() // a consumer not live yet: again
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute", what)
			}
		}
	}
	stop := syncLive("a request of replica 0 counted on the others")
	stop()

	// The load: one client sending short requests through the replicas
	// in turn, streamed and not, until told to stop.
	var sent, failed atomic.Int64
	var failMu sync.Mutex
	var failures []string
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			a, err := harnessChat(context.Background(), c, reps[i%3].url, chatJSON(i%2 == 0, 8, fmt.Sprintf("load %d", i)), nil, nil)
			sent.Add(1)
			if err != nil || a.status != http.StatusOK || !a.complete {
				failed.Add(1)
				failMu.Lock()
				failures = append(failures, fmt.Sprintf("request %d through replica %d: %v %d complete %v %q", i, i%3, err, a.status, a.complete, a.body))
				failMu.Unlock()
			}
		}
	})
	defer func() { stopLoad(); wg.Wait() }()
	waitSent := func(n int64) {
		t.Helper()
		target := sent.Load() + n
		deadline := time.Now().Add(time.Minute)
		for sent.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("the load sent %d requests, not %d, within a minute", sent.Load(), target)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSent(30)

	// NATS away.
	ns.Shutdown()
	ns.WaitForShutdown()
	for _, r := range reps {
		waitReadyz(t, r.url, r.stderr, "the replica sees NATS gone", connected(r, false))
	}
	waitSent(60) // routed on local state alone
	alive("NATS away")
	for _, r := range reps {
		m, err := scrape(c, r.url)
		if err != nil || m["switchyard_cluster_connected"] != 0 {
			t.Errorf("%s: switchyard_cluster_connected %v (%v) while NATS is away, want 0", r.url, m["switchyard_cluster_connected"], err)
		}
	}

	// NATS back, on the same port, empty.
	startNATS()
	for _, r := range reps {
		waitReadyz(t, r.url, r.stderr, "the replica reconnects", connected(r, true))
		waitMetrics(t, c, r, time.Minute, "both peers heard again", peered)
	}
	waitSent(30)
	stopLoad()
	wg.Wait()
	alive("NATS back")
	if n := failed.Load(); n > 0 {
		failMu.Lock()
		t.Fatalf("%d of %d requests failed across the NATS restart, first: %s", n, sent.Load(), failures[0])
	}
	t.Logf("%d requests, none failed, across the NATS restart", sent.Load())

	// Bookings sync again: a request in flight through replica 0 is
	// counted on the others.
	stop = syncLive("after the restart, a request of replica 0 counted on the others")
	stop()
	// Sessions sync again: a conversation's first turn through replica 0
	// reaches replica 1's mirror of the (new) bucket, and its next turn
	// through replica 1 lands on the same worker.
	var first string
	waitMetrics(t, c, reps[1], time.Minute, "replica 1 mirrors a session of replica 0's", func(m map[string]float64) bool {
		if m["switchyard_cluster_session_bindings"] >= 1 && first != "" {
			return true
		}
		first = sessionTurn(t, c, reps[0], "after-restart")
		return false
	})
	if got := sessionTurn(t, c, reps[1], "after-restart"); got != first {
		t.Errorf("after the restart: the session's turn through replica 1 went to %s, its turn through replica 0 to %s", got, first)
	}
	alive("the end")
}

// hold sends a long streamed answer through r and returns once its first
// event arrived; the returned func ends it.
func hold(t *testing.T, c *http.Client, r *e2eProc) func() {
	t.Helper()
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
	return func() { cancel(); _ = resp.Body.Close() }
}

// sessionTurn sends one short turn of session through r and returns the
// worker that served it.
func sessionTurn(t *testing.T, c *http.Client, r *e2eProc, session string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chatJSON(false, 4, "a turn of "+session)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s through %s: %d %v", session, r.url, resp.StatusCode, err)
	}
	return resp.Header.Get("X-Switchyard-Worker")
}
