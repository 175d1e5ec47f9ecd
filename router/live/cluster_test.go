package live

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// TestDaemonReplicasShareBookings: two daemons with the same workers and
// a cluster block each (replicas a and b over one NATS server): a request
// in flight through a is counted in b's fleet on the worker a chose, and
// leaves it when it ends.
func TestDaemonReplicasShareBookings(t *testing.T) {
	ns := natskit.Start(t, 0)

	var workers []string
	for i := range 2 {
		m, err := mockworker.New(mockworker.Config{Speedup: 5})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		workers = append(workers, fmt.Sprintf("w%d=%s", i, hs.URL))
	}
	start := func(replica string) *runningDaemon {
		path := filepath.Join(t.TempDir(), "policy.hcl")
		policy := daemonPolicy("rr", workers...) + fmt.Sprintf("\ncluster {\n  nats      = %q\n  replica   = %q\n  name      = \"t\"\n  heartbeat = \"100ms\"\n  booking_ttl = \"5s\"\n}\n", ns.ClientURL(), replica)
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		rd := startDaemon(t, DaemonOptions{PolicyFile: path})
		rd.waitWorkers(t, "w0", "w1")
		return rd
	}
	a, b := start("a"), start("b")
	active := func(rd *runningDaemon) map[string]int64 {
		out := map[string]int64{}
		for _, w := range rd.d.r.Workers("m", shared.RoleAggregated) {
			out[w.Name] += w.ActiveRequests()
		}
		return out
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute; a: %v, b: %v\nlogs a:\n%s\nlogs b:\n%s", what, active(a), active(b), a.logs, b.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The replicas hear each other once both consumers run: a request
	// through a, until b counts one.
	var worker string
	eventually("b counts a request of a's", func() bool {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := post(t, ctx, a.base+"/v1/chat/completions",
			`{"model":"m","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"a long answer"}]}`)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		worker = resp.Header.Get("X-Switchyard-Worker")
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			if active(b)[worker] == 1 {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false // b not joined yet: the request is cut, try again
	})
	// The request ended (its body closed): b lets it go.
	eventually("b releases it", func() bool { return active(b)[worker] == 0 })
	if got := active(a)[worker]; got != 0 {
		t.Fatalf("a still counts %d on %s", got, worker)
	}
	// /readyz shows the cluster: b's peer a, connected, nothing held.
	code, ready := getReadyz(t, b.base)
	if code != 200 || ready.Cluster == nil || ready.Cluster.Replica != "b" || ready.Cluster.Cluster != "t" || !ready.Cluster.Connected ||
		!slices.Equal(ready.Cluster.Peers, []string{"a"}) || ready.Cluster.RemoteBookings != 0 {
		t.Fatalf("b's /readyz: %d %+v", code, ready.Cluster)
	}
	if !strings.Contains(a.logs.String(), "joined the cluster") {
		t.Fatalf("a's logs do not say it joined:\n%s", a.logs)
	}
}

// TestDaemonReplicasShareKVEvents: two daemons with a cluster block and
// one worker whose engine publishes KV events: one relay (the lease
// holder's) subscribes to the engine, and both daemons' precise indexes
// of the worker go live from the cluster's stream and hold the same
// blocks; /debug/workers' event stream says "live" on both.
func TestDaemonReplicasShareKVEvents(t *testing.T) {
	ns := natskit.Start(t, 0)
	m, err := mockworker.New(mockworker.Config{Speedup: 5, BlockTokens: 16,
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m)
	t.Cleanup(func() { hs.Close(); m.Close() })
	pub, replay := m.KVEventsAddr(0)
	start := func(replica string) *runningDaemon {
		path := filepath.Join(t.TempDir(), "policy.hcl")
		policy := daemonPolicy("rr") + fmt.Sprintf(`
worker "w0" {
  url             = %q
  models          = ["m"]
  total_kv_blocks = 1000
  kv_events {
    endpoint        = "tcp://%s"
    replay_endpoint = "tcp://%s"
  }
}
cluster {
  nats        = %q
  replica     = %q
  name        = "t"
  heartbeat   = "100ms"
  booking_ttl = "5s"
}
`, hs.URL, pub, replay, ns.ClientURL(), replica)
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		rd := startDaemon(t, DaemonOptions{PolicyFile: path, Registry: reg})
		rd.waitWorkers(t, "w0")
		return rd
	}
	a, b := start("a"), start("b")
	id := shared.WorkerIDOf("w0")
	precise := func(rd *runningDaemon) prefix.PreciseStats {
		p := rd.d.r.Prefix().Precise(prefix.Candidate{ID: id})
		if p == nil {
			return prefix.PreciseStats{}
		}
		return p.Stats()
	}
	metric := func(rd *runningDaemon, name string) float64 {
		mfs, err := rd.d.o.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute; a: %+v, b: %+v\nlogs a:\n%s\nlogs b:\n%s", what, precise(a), precise(b), a.logs, b.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Requests through a until both indexes are live and hold blocks (the
	// relay subscribes some time after the lease; its first batch replays
	// the engine's from sequence 0).
	for i := 0; ; i++ {
		ids := make([]string, 33) // two blocks of 16 tokens, known by id (the engine's events carry them)
		for j := range ids {
			ids[j] = fmt.Sprint(1000*i + j)
		}
		resp, err := post(t, context.Background(), a.base+"/v1/completions",
			fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":[%s]}`, strings.Join(ids, ",")))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		pa, pb := precise(a), precise(b)
		if pa.Live && pb.Live && pa.Blocks > 0 && pb.Blocks > 0 {
			break
		}
		if i == 3000 {
			t.Fatalf("indexes not live after %d requests: a %+v, b %+v\nlogs a:\n%s\nlogs b:\n%s", i, pa, pb, a.logs, b.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	eventually("both indexes hold the same blocks", func() bool {
		pa, pb := precise(a), precise(b)
		return pa.Blocks == pb.Blocks && pa.Stored == pb.Stored && pa.Removed == pb.Removed
	})
	if got := metric(a, "switchyard_cluster_leases_held") + metric(b, "switchyard_cluster_leases_held"); got != 1 {
		t.Errorf("leases held by both daemons: %v, want 1", got)
	}
	for _, rd := range []*runningDaemon{a, b} {
		st, ok := rd.d.kvs.stream(id, 0)
		if !ok || st.State != "live" || st.Received == 0 {
			t.Errorf("event stream %+v (%v), want live with events", st, ok)
		}
		rd.d.kvs.mu.Lock()
		s := rd.d.kvs.subs[prefix.Candidate{ID: id}]
		rd.d.kvs.mu.Unlock()
		if s == nil || s.sub != nil || s.feed == nil {
			t.Errorf("the daemon's candidate %+v: want fed from the stream, not subscribed to the engine", s)
		}
	}
}

// TestDaemonReadyOnlyCaughtUp: a replica that cannot reach NATS is not
// ready (503, the reason says it catches up) while its warm_timeout runs,
// however ready its workers; with warm_timeout "0s" it is ready at once on
// its own state, saying it has not caught up.
func TestDaemonReadyOnlyCaughtUp(t *testing.T) {
	m, err := mockworker.New(mockworker.Config{Speedup: 5})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m)
	t.Cleanup(func() { hs.Close(); m.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := "nats://" + ln.Addr().String()
	_ = ln.Close()
	start := func(replica, warm string) *runningDaemon {
		path := filepath.Join(t.TempDir(), "policy.hcl")
		policy := daemonPolicy("rr", "w0="+hs.URL) + fmt.Sprintf("\ncluster {\n  nats = %q\n  replica = %q\n  warm_timeout = %q\n}\n", nowhere, replica, warm)
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		rd := startDaemon(t, DaemonOptions{PolicyFile: path})
		rd.waitWorkers(t, "w0")
		return rd
	}
	readyz := func(rd *runningDaemon) (int, Readiness) {
		resp, err := http.Get(rd.base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var a Readiness
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, a
	}
	waiting := start("a", "1h")
	code, a := readyz(waiting)
	if code != http.StatusServiceUnavailable || a.Ready || !strings.HasPrefix(a.Reason, "cluster: catching up") ||
		a.Cluster == nil || a.Cluster.CaughtUp || waiting.d.Runtime().ClusterReady() {
		t.Fatalf("a replica catching up: %d %+v %+v, want 503 catching up", code, a, a.Cluster)
	}
	alone := start("b", "0s")
	code, a = readyz(alone)
	if code != http.StatusOK || !a.Ready || a.Cluster == nil || a.Cluster.CaughtUp || a.Cluster.Connected || !alone.d.Runtime().ClusterReady() {
		t.Fatalf("a replica with warm_timeout 0s: %d %+v %+v, want 200, neither connected nor caught up", code, a, a.Cluster)
	}
}

// lateJoin is replica b of a two-replica cluster whose one worker w0
// answers no probe until up is set, started once it has loaded replica
// a's prefix-index snapshot (which holds w0's content: pending in b).
type lateJoin struct {
	b  *runningDaemon
	up *atomic.Bool
}

// startLateJoin starts a with w0 up, routes one request through it, waits
// for a snapshot that holds it, and starts b with w0 held down until b
// has loaded that snapshot.
func startLateJoin(t *testing.T) *lateJoin {
	t.Helper()
	ns := natskit.Start(t, 0)
	m, err := mockworker.New(mockworker.Config{Speedup: 5})
	if err != nil {
		t.Fatal(err)
	}
	open := httptest.NewServer(m)
	up := &atomic.Bool{}
	gated := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		m.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { open.Close(); gated.Close(); m.Close() })
	start := func(replica, url string, reg *prometheus.Registry) *runningDaemon {
		path := filepath.Join(t.TempDir(), "policy.hcl")
		policy := daemonPolicy("rr", "w0="+url) + fmt.Sprintf("\ncluster {\n  nats = %q\n  replica = %q\n  name = \"late\"\n  snapshot_interval = \"100ms\"\n  warm_timeout = \"1h\"\n}\n", ns.ClientURL(), replica)
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		return startDaemon(t, DaemonOptions{PolicyFile: path, Registry: reg})
	}
	regA := prometheus.NewRegistry()
	a := start("a", open.URL, regA)
	a.waitWorkers(t, "w0")
	resp, err := post(t, context.Background(), a.base+"/v1/chat/completions", chatBody("m", false, "a prompt a's index records"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	// Two snapshot writes after the request: the second holds it.
	writes := testkit.MetricValue(t, regA, "switchyard_cluster_index_snapshot_writes_total", "result", "written")
	testkit.Eventually(t, "a writes two snapshots", func() bool {
		return testkit.MetricValue(t, regA, "switchyard_cluster_index_snapshot_writes_total", "result", "written") >= writes+2
	})
	lj := &lateJoin{b: start("b", gated.URL, nil), up: up}
	testkit.Eventually(t, "b loaded a's snapshot, w0 pending", func() bool {
		_, r, err := lj.readyz()
		return err == nil && r.Cluster != nil && r.Cluster.Snapshot != nil
	})
	if _, r, _ := lj.readyz(); r.Ready || r.Cluster.Snapshot.Workers != 0 {
		t.Fatalf("b before w0 is up: ready %v, snapshot workers %d; want not ready, 0 imported", r.Ready, r.Cluster.Snapshot.Workers)
	}
	return lj
}

// readyz asks b's /readyz, giving up after 5 s.
func (lj *lateJoin) readyz() (int, Readiness, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(lj.b.base + "/readyz")
	if err != nil {
		return 0, Readiness{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	var r Readiness
	err = json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r, err
}

// waitImported waits until b is ready with w0's snapshot content imported.
func (lj *lateJoin) waitImported(t *testing.T) {
	t.Helper()
	var last string
	deadline := time.Now().Add(time.Minute)
	for {
		code, r, err := lj.readyz()
		if err == nil && code == http.StatusOK && r.Cluster.Snapshot.Workers == 1 {
			return
		}
		last = fmt.Sprintf("status %d, error %v, %+v", code, err, r)
		if time.Now().After(deadline) {
			t.Fatalf("b not ready with w0's content imported within a minute of w0 coming up; last /readyz: %s\nlogs:\n%s", last, lj.b.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDaemonReplicaImportsAWorkerThatJoinsLate: replica b starts while its
// worker w0 answers no probe, loads replica a's prefix-index snapshot
// (w0's content pending: not a member yet), and then w0 comes up. The
// worker manager joins w0 and the membership hands the snapshot's content
// to the replica (cluster.Replica.Joined): b becomes ready with w0's
// content imported and routes. Before, Joined resolved w0's name through
// the worker manager, whose lock the join held: the daemon deadlocked (no
// /readyz answer, every request stuck), seen as a restarted replica of
// bench/replicas' failover never ready on a loaded machine.
func TestDaemonReplicaImportsAWorkerThatJoinsLate(t *testing.T) {
	lj := startLateJoin(t)
	lj.up.Store(true)
	lj.waitImported(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := post(t, ctx, lj.b.base+"/v1/chat/completions", chatBody("m", false, "a prompt a's index records"))
	if err != nil {
		t.Fatalf("b routes no request: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("b answered %d", resp.StatusCode)
	}
}

// TestDaemonReplicaImportsOutsideTheWorkerLock: the warm-start import of a
// worker that joins late (a million blocks can take a second) runs after
// the join, not under the worker manager's lock: held in the middle, b's
// /readyz (the manager's Status) still answers, with w0 ready and its
// content not yet imported; let go, the import completes. Before, the
// membership imported inside the join, and every probe's outcome and
// /readyz waited for it.
func TestDaemonReplicaImportsOutsideTheWorkerLock(t *testing.T) {
	lj := startLateJoin(t)
	entered, release := make(chan struct{}), make(chan struct{})
	kvs := lj.b.d.kvs
	kvs.mu.Lock()
	kvs.beforeImport = func(prefix.Candidate) { close(entered); <-release }
	kvs.mu.Unlock()
	lj.up.Store(true)
	select {
	case <-entered:
	case <-time.After(time.Minute):
		close(release)
		t.Fatalf("no import of w0 within a minute of it coming up; logs:\n%s", lj.b.logs)
	}
	code, r, err := lj.readyz()
	close(release)
	if err != nil {
		t.Fatalf("/readyz while the import is held: %v", err)
	}
	if code != http.StatusOK || len(r.Workers) != 1 || !r.Workers[0].Ready || r.Cluster.Snapshot.Workers != 0 {
		t.Fatalf("/readyz while the import is held: %d, workers %+v, snapshot workers %d; want 200, w0 ready, 0 imported", code, r.Workers, r.Cluster.Snapshot.Workers)
	}
	lj.waitImported(t)
}
