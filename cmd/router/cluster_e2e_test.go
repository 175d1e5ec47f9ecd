//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
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
	ns := natskit.Start(t, port())

	mocks := startMocks(t, routerBin, 2, "5")
	names := []string{"a", "b"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url}
	dir := t.TempDir()
	listens := []string{}
	policies := []string{}
	// A tokenizer: requests are keyed by their tokens' block hashes, what
	// the approximate index (and its snapshot) holds.
	tokDir, err := filepath.Abs("../../router/tokenizer/testdata")
	if err != nil {
		t.Fatal(err)
	}
	tokenizer := fmt.Sprintf("tokenizer \"mock\" {\n  source = \"file\"\n  path   = %q\n  config = %q\n}\n",
		filepath.Join(tokDir, "bytebpe.json"), filepath.Join(tokDir, "chatml_config.json"))
	for i := range 3 {
		listens = append(listens, "127.0.0.1:"+strconv.Itoa(port()))
		p := filepath.Join(dir, fmt.Sprintf("policy%d.hcl", i))
		body := tokenizer + workerBlocks(names, urls) + fmt.Sprintf("\ncluster {\n  nats        = %q\n  replica     = \"r%d\"\n  name        = \"failover\"\n  heartbeat   = \"200ms\"\n  booking_ttl = \"3s\"\n  snapshot_interval = \"200ms\"\n}\n", ns.ClientURL(), i)
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

	// Prompts placed through replica 1: their workers, which the
	// restarted replica 0 must find again (warm start).
	placed := map[string]string{}
	for i := range 4 {
		text := fmt.Sprintf("conversation %d: %s", i, strings.Repeat(fmt.Sprintf("the long shared context of conversation %d. ", i), 40))
		placed[text] = postWorker(t, c, reps[1].url, chatJSON(false, 4, text))
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
	// With replica 0 gone, a survivor holds the snapshot lease and writes
	// the snapshots.
	written := func(r *e2eProc) float64 {
		m, err := scrape(c, r.url)
		if err != nil {
			t.Fatal(err)
		}
		return m[`switchyard_cluster_index_snapshot_writes_total{result="written"}`]
	}
	before := written(reps[1]) + written(reps[2])
	deadline := time.Now().Add(time.Minute)
	for written(reps[1])+written(reps[2]) < before+2 {
		if time.Now().After(deadline) {
			t.Fatal("no survivor wrote the prefix-index snapshot within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	reps[0] = start(0)
	waitMetrics(t, c, reps[0], time.Minute, "replica 0 ready again", ready)
	// It started warm: ready only once caught up, with the snapshot a
	// survivor wrote, and it places each prompt on the
	// worker replica 1 placed it on.
	// Its workers and peers are known before it has caught up: /readyz
	// turns ready once it has (a minute at most on a loaded machine).
	var st struct {
		Ready   bool `json:"ready"`
		Cluster struct {
			CaughtUp bool `json:"caught_up"`
			Snapshot *struct {
				Writer  string `json:"writer"`
				Workers int    `json:"workers"`
			} `json:"snapshot"`
		} `json:"cluster"`
	}
	var rz []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		resp, err := c.Get(reps[0].url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		rz, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err := json.Unmarshal(rz, &st); err != nil {
			t.Fatalf("/readyz: %v: %s", err, rz)
		}
		if st.Ready || time.Now().After(deadline) {
			break
		}
	}
	if !st.Ready || !st.Cluster.CaughtUp || st.Cluster.Snapshot == nil || (st.Cluster.Snapshot.Writer != "r1" && st.Cluster.Snapshot.Writer != "r2") || st.Cluster.Snapshot.Workers != 2 {
		t.Fatalf("replica 0's /readyz after its restart: %s; want ready, caught up, a survivor's snapshot of 2 workers", rz)
	}
	for text, w := range placed {
		if got := postWorker(t, c, reps[0].url, chatJSON(false, 4, text)); got != w {
			t.Errorf("the restarted replica placed a prompt on %s, replica 1 had placed it on %s\n%s", got, w, reps[0].stderr.String())
		}
	}
	stop1, worker := hold(reps[1])
	defer stop1()
	waitMetrics(t, c, reps[0], time.Minute, "replica 0 counts replica 1's request", func(m map[string]float64) bool {
		return remote(m) == 1 && m[activeOf(worker)] == 1
	})
}

// postWorker posts a chat request to base and returns the worker that
// served it (X-Switchyard-Worker); anything but a 200 fails the test.
func postWorker(t *testing.T, c *http.Client, base, body string) string {
	t.Helper()
	resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", base, resp.StatusCode, b)
	}
	return resp.Header.Get("X-Switchyard-Worker")
}
