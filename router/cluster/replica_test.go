package cluster

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// TestMain checks for leaked goroutines; zmq4's PUB writer (the test
// engines' publisher) outlives its socket's Close by design, and
// nats-server's access-time ticker (ats.Register, one for the process,
// reference-counted by its file stores) may stop only after the last
// server's shutdown returned. Two library races are left to their
// libraries (seen under stress-ng): zmq4's reader (qreader.listen) sends a
// message it read to its socket's channel without watching the socket's
// end, and blocks for good when the socket closed meanwhile (a relay's
// subscriber started again); nats.go's jetstream publisher
// (resetPendingAcksOnReconnect) reads its status channel after
// cleanupReplySub may have set it to nil (an object store Put that
// returned first), and waits on the nil channel.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
		goleak.IgnoreTopFunction("github.com/go-zeromq/zmq4.(*qreader).listen"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// startNATS runs a NATS server with JetStream on 127.0.0.1:port (0: any)
// until the test ends, and returns it and its URL.
func startNATS(t testing.TB, port int) (*server.Server, string) {
	t.Helper()
	s := natskit.Start(t, port)
	return s, s.ClientURL()
}

// client connects to url for the test's own publishing and reading,
// with a JetStream handle; closed when the test ends.
func client(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// Acks of asynchronous publishes (the object store's chunks) and
	// answers may be slow on a loaded machine: waited for a minute.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Minute), jetstream.WithPublishAsyncTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// node is one replica: a router with workers w0..w(n-1) (their ids
// offset by idBase, so that replicas do not share ids), its admission
// with the Replica as Observer, and the Replica running.
type node struct {
	r   *router.Router
	adm *admission.Controller
	rep *Replica
	ids map[string]shared.WorkerID
	reg *prometheus.Registry

	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop stops the replica (Run returns); idempotent.
func (n *node) stop(t testing.TB) {
	t.Helper()
	n.once.Do(func() {
		n.cancel()
		if err := <-n.done; err != nil {
			t.Errorf("%s: Run: %v", n.rep.self, err)
		}
	})
}

func kvPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	kv, err := builtin.NewKVCost(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Policy{Name: "kv", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
}

func startNode(t testing.TB, url, name string, workers, idBase int, cfg func(*config.Cluster)) *node {
	t.Helper()
	return startNodeWith(t, url, name, workers, idBase, cfg, nil)
}

// startNodeWith is startNode with before, when set, called with the node
// once its router, workers and Replica are made, before the Replica runs.
func startNodeWith(t testing.TB, url, name string, workers, idBase int, cfg func(*config.Cluster), before func(*node)) *node {
	t.Helper()
	return startNodeOpts(t, url, name, workers, idBase, nodeOpts{cfg: cfg, before: before})
}

// nodeOpts are startNodeOpts's options: cfg changes the cluster block,
// before is called as startNodeWith says, capacity is the queue's
// max_active_requests (0: none), logger the replica's logger (nil:
// none).
type nodeOpts struct {
	cfg      func(*config.Cluster)
	before   func(*node)
	capacity int
	logger   hclog.Logger
}

func startNodeOpts(t testing.TB, url, name string, workers, idBase int, o nodeOpts) *node {
	t.Helper()
	cfg, before := o.cfg, o.before
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	n := &node{r: r, ids: map[string]shared.WorkerID{}, reg: prometheus.NewRegistry()}
	for i := range workers {
		w := "w" + strconv.Itoa(i)
		n.ids[w] = shared.WorkerID(idBase + i)
		if _, err := r.AddWorker(fleet.Spec{ID: n.ids[w], Name: w, Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	c := config.Cluster{NATS: url, Replica: name, Name: "test", BookingTTL: 5 * time.Second, Heartbeat: 100 * time.Millisecond}
	if cfg != nil {
		cfg(&c)
	}
	n.rep, err = New(Options{Config: c, Router: r, Registerer: n.reg, Capacity: int64(o.capacity), Logger: o.logger, Resolve: func(w string) (shared.WorkerID, bool) {
		id, ok := n.ids[w]
		return id, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := config.DefaultQueue()
	q.MaxActiveRequests = o.capacity
	if n.adm, err = admission.New(r, admission.Options{Observer: n.rep, Queue: q}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.adm.Close)
	if before != nil {
		before(n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- n.rep.Run(ctx) }()
	t.Cleanup(func() { n.stop(t) })
	return n
}

// active is every worker's requests in flight, by name.
func (n *node) active() map[string]int64 {
	out := map[string]int64{}
	for _, w := range n.r.Workers("", shared.RoleAggregated) {
		out[w.Name] = w.ActiveRequests()
	}
	return out
}

// joined waits until each node has heard every other (a hello answered
// by a snapshot, even an empty one, proves the consumer is live).
func joined(t testing.TB, ns ...*node) {
	t.Helper()
	for _, n := range ns {
		testkit.Eventually(t, n.rep.self+" hears its peers", func() bool {
			n.rep.mu.Lock()
			defer n.rep.mu.Unlock()
			return len(n.rep.peers) == len(ns)-1
		})
	}
	// A probe booking from each node reaches every other: the consumers
	// are live.
	for i, n := range ns {
		h := admitPrompt(t, n, fmt.Sprintf("probe-%d", i), 900+uint64(i))
		for _, o := range ns {
			if o != n {
				testkit.Eventually(t, "a probe reaches "+o.rep.self, func() bool { return o.remoteCount() == 1 })
			}
		}
		h.End(admission.Completed(1))
		for _, o := range ns {
			testkit.Eventually(t, "a probe's release reaches "+o.rep.self, func() bool { return o.remoteCount() == 0 })
		}
	}
}

// soloNode starts NATS and replica "b" alone, with a plain NATS
// connection to publish as other replicas would, once b consumes.
func soloNode(t *testing.T) (string, *node, *nats.Conn) {
	t.Helper()
	_, url := startNATS(t, 0)
	b := startNode(t, url, "b", 3, 101, nil)
	joined(t, b)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	consuming(t, b, nc)
	return url, b, nc
}

// consuming waits until n's consumer is live: a reset record published
// on nc, from "probe", again until n has heard the probe.
func consuming(t testing.TB, n *node, nc *nats.Conn) {
	t.Helper()
	testkit.Eventually(t, n.rep.self+" consumes", func() bool {
		if err := nc.Publish("switchyard."+n.rep.o.Config.Name+".d.probe", []byte{wireVersion, byte(KindReset)}); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		time.Sleep(20 * time.Millisecond)
		n.rep.mu.Lock()
		defer n.rep.mu.Unlock()
		return n.rep.peers["probe"] != nil
	})
}

func (n *node) remoteCount() int {
	n.rep.mu.Lock()
	defer n.rep.mu.Unlock()
	return n.rep.remote
}

// admitPrompt admits a request of 10 blocks starting at block id first.
func admitPrompt(t testing.TB, n *node, id string, first uint64) *admission.Handle {
	t.Helper()
	ids := make([]uint64, 10)
	for i := range ids {
		ids[i] = first + uint64(i)
	}
	h, err := n.adm.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 40, BlockSize: 4,
		BlockHashes: prefix.ChainHashes(nil, ids)})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestReplicasShareBookings: a booking on one replica is counted on the
// other (by worker name; the ids differ), its first token and its release
// too; the other replica's KV-aware policy follows the prefix the first
// sent, though it never routed it.
func TestReplicasShareBookings(t *testing.T) {
	_, url := startNATS(t, 0)
	a := startNode(t, url, "a", 3, 1, nil)
	b := startNode(t, url, "b", 3, 101, nil)
	joined(t, a, b)

	h := admitPrompt(t, a, "r1", 1)
	w := h.Decision().Worker.Name
	testkit.Eventually(t, "b counts a's booking", func() bool { return b.active()[w] == 1 })
	if got := b.active(); got["w0"]+got["w1"]+got["w2"] != 1 {
		t.Fatalf("b's counts %v, want a's one booking on %s alone", got, w)
	}
	var bw *fleet.Worker
	for _, x := range b.r.Workers("", shared.RoleAggregated) {
		if x.Name == w {
			bw = x
		}
	}
	if l := bw.Load(true); l.ActivePrefillTokens != 40 {
		t.Fatalf("b's load of %s: %+v, want 40 prefill tokens", w, l)
	}
	h.FirstToken()
	testkit.Eventually(t, "b hears the first token", func() bool { return bw.Load(true).ActivePrefillTokens == 0 })
	h.End(admission.Completed(50))
	testkit.Eventually(t, "b hears the release", func() bool { return b.active()[w] == 0 })

	// b routes a prompt extending r1's: its index holds a's record.
	h2 := admitPrompt(t, b, "r2", 1)
	if got := h2.Decision().Worker.Name; got != w || h2.Decision().OverlapBlocks != 10 {
		t.Fatalf("b placed the prefix on %s with overlap %d, want %s (where a sent it) with 10", got, h2.Decision().OverlapBlocks, w)
	}
	h2.End(admission.Completed(50))
	testkit.Eventually(t, "a hears b's release", func() bool { return a.active()[w] == 0 })
}

// TestSilentReplicaExpires: a replica that books and then falls silent
// (no heartbeat, no release: it died) has its bookings released on the
// others once the booking TTL passes; one that stops cleanly has them
// released at once (a reset record).
func TestSilentReplicaExpires(t *testing.T) {
	url, b, nc := soloNode(t)
	// "ghost" books w2 and never speaks again.
	msg := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "x", At: time.Now().UnixNano(), Worker: "w2", Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4})
	if err := nc.Publish("switchyard.test.d.ghost", msg); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the ghost's booking applied", func() bool { return b.active()["w2"] == 1 })
	testkit.Eventually(t, "the ghost's booking expires", func() bool { return b.active()["w2"] == 0 })
	if got := counterValue(t, b.reg, "switchyard_cluster_expired_bookings_total"); got < 1 {
		t.Fatalf("expired bookings counted %v, want at least 1", got)
	}

	// A clean stop: released at once, though the TTL is an hour.
	long := func(c *config.Cluster) { c.BookingTTL, c.Name = time.Hour, "other" }
	c := startNode(t, url, "c", 3, 201, long)
	d := startNode(t, url, "d", 3, 301, long)
	joined(t, c, d)
	h := admitPrompt(t, c, "r", 1)
	w := h.Decision().Worker.Name
	testkit.Eventually(t, "d counts c's booking", func() bool { return d.active()[w] == 1 })
	c.stop(t)
	testkit.Eventually(t, "d releases c's booking at c's reset", func() bool { return d.active()[w] == 0 })
	h.End(admission.Aborted("test over"))
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := 0.0
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
			return v
		}
	}
	return 0
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestNATSRestart: NATS goes away under two replicas with bookings, for
// longer than the booking TTL: each keeps routing on its own state
// (connected 0) and the other's bookings expire; a booking made during the
// outage stays local. NATS comes back (a new server on the same port, its
// memory stream empty): both reconnect by themselves and, through hello and
// snapshots, each counts the other's live bookings again, those made
// during the outage included.
func TestNATSRestart(t *testing.T) {
	port := freePort(t)
	s, url := startNATS(t, port)
	a := startNode(t, url, "a", 3, 1, nil)
	b := startNode(t, url, "b", 3, 101, nil)
	joined(t, a, b)
	before := admitPrompt(t, a, "before", 1)
	testkit.Eventually(t, "b counts a's booking", func() bool { return b.remoteCount() == 1 })

	s.Shutdown()
	s.WaitForShutdown()
	testkit.Eventually(t, "both see NATS gone", func() bool { return !a.rep.Connected() && !b.rep.Connected() })
	during := admitPrompt(t, a, "during", 500) // routed on a's own state
	testkit.Eventually(t, "a's bookings expire on b", func() bool { return b.remoteCount() == 0 })
	if got := counterValue(t, b.reg, "switchyard_cluster_connected"); got != 0 {
		t.Fatalf("b's connected gauge %v during the outage, want 0", got)
	}

	startNATS(t, port)
	testkit.Eventually(t, "both reconnect", func() bool { return a.rep.Connected() && b.rep.Connected() })
	testkit.Eventually(t, "b counts a's two live bookings again", func() bool { return b.remoteCount() == 2 })
	want := map[string]int64{}
	want[before.Decision().Worker.Name]++
	want[during.Decision().Worker.Name]++
	for w, n := range want {
		if got := b.active()[w]; got != n {
			t.Errorf("b counts %d on %s, want %d", got, w, n)
		}
	}
	before.End(admission.Completed(1))
	during.End(admission.Completed(1))
	testkit.Eventually(t, "the releases reach b", func() bool { return b.remoteCount() == 0 })
	if got := counterValue(t, b.reg, "switchyard_cluster_connected"); got != 1 {
		t.Fatalf("b's connected gauge %v after NATS returned, want 1", got)
	}
}

// TestMalformedMessagesAreDropped: garbage on a replica's subject is
// counted and dropped; the records before the fault apply; the replica
// goes on.
func TestMalformedMessagesAreDropped(t *testing.T) {
	_, b, nc := soloNode(t)
	good := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "ok", Worker: "w1", Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4})
	for _, m := range [][]byte{
		{},
		{9},                                   // a version that does not exist
		{wireVersion, 77},                     // a kind that does not exist
		append(good, byte(KindReleased), 200), // a string longer than the message
		append(good[:len(good):len(good)], byte(KindBooked), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
	} {
		if err := nc.Publish("switchyard.test.d.noisy", m); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	testkit.Eventually(t, "five malformed messages counted", func() bool {
		return counterValue(t, b.reg, "switchyard_cluster_dropped_total") == 5
	})
	// The good booked record before each fault applied, once (duplicates
	// of one id are one booking).
	testkit.Eventually(t, "the good record applied once", func() bool { return b.active()["w1"] == 1 })
	if err := nc.Publish("switchyard.test.d.noisy", append([]byte{wireVersion}, appendRecord(nil, &Record{Kind: KindReleased, ID: "ok"})...)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	testkit.Eventually(t, "its release applies", func() bool { return b.active()["w1"] == 0 })
}

// TestPeersBounded: heartbeats and messages on the cluster's subjects
// from names that are not replica names are dropped and counted
// (malformed), their records not applied; past maxPeers replicas heard a
// new one is dropped and counted (too_many), so a flood of made-up names
// cannot grow the peers (and /readyz) without bound.
func TestPeersBounded(t *testing.T) {
	_, b, nc := soloNode(t)
	booked := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "x", Worker: "w1", Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4})
	long := strings.Repeat("x", 65)
	for _, name := range []string{long, "bad#name"} {
		if err := nc.Publish("switchyard.test.hb."+name, nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("switchyard.test.d."+name, booked); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	dropped := func(reason string) float64 { return testutil.ToFloat64(b.rep.m.dropped.WithLabelValues(reason)) }
	testkit.Eventually(t, "four messages from bad names dropped", func() bool { return dropped("malformed") == 4 })
	if got := b.rep.State().Peers; !slices.Equal(got, []string{"probe"}) {
		t.Errorf("peers %v, want [probe] (soloNode's)", got)
	}
	if got := b.active()["w1"]; got != 0 {
		t.Errorf("w1 has %d bookings, want 0 (the bad names' records not applied)", got)
	}

	const extra = 10 // past the bound: probe holds one place
	for i := range maxPeers + extra - 1 {
		if err := nc.Publish(fmt.Sprintf("switchyard.test.hb.p%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	testkit.Eventually(t, "the peers past the bound dropped", func() bool { return dropped("too_many") == extra })
	if got := len(b.rep.State().Peers); got != maxPeers {
		t.Errorf("%d peers, want %d", got, maxPeers)
	}
}

// TestHelloFloodBounded: hellos (which anyone on the bus may publish)
// are answered with snapshots of the replica's bookings at most once per
// resyncGap, and the last of a flood is still answered.
func TestHelloFloodBounded(t *testing.T) {
	_, b, nc := soloNode(t)
	snapshots := func() float64 { return testutil.ToFloat64(b.rep.m.snapshots) }
	testkit.Eventually(t, "b's own join snapshot sent", func() bool { return snapshots() >= 1 })
	time.Sleep(2 * resyncGap)
	before := snapshots()
	start := time.Now()
	const hellos = 500
	for range hellos {
		if err := nc.Publish("switchyard.test.hello", []byte("intruder")); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	testkit.Eventually(t, "the flood answered", func() bool { return snapshots() > before })
	time.Sleep(3 * resyncGap) // a snapshot pending at the gap's end is sent
	elapsed := time.Since(start)
	sent := snapshots() - before
	most := 2 + float64(elapsed/resyncGap) // one at once, then one per gap passed
	if sent > most {
		t.Errorf("%v snapshots for %d hellos in %v, want at most %v (one per %v)", sent, hellos, elapsed, most, resyncGap)
	}
}

// TestMalformedLogLimited: a flood of malformed deltas and kv messages
// (garbage on the cluster's subjects) is counted message by message but
// logged at most once per malformedLogInterval each.
func TestMalformedLogLimited(t *testing.T) {
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	if _, err := r.AddWorker(fleet.Spec{ID: 1, Name: "w0", Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	var mu sync.Mutex
	log := hclog.New(&hclog.LoggerOptions{Output: writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), Level: hclog.Warn})
	reg := prometheus.NewRegistry()
	rep, err := New(Options{Config: config.Cluster{NATS: "nats://127.0.0.1:1", Replica: "b", Name: "test"}, Router: r, Registerer: reg, Logger: log,
		Resolve: func(string) (shared.WorkerID, bool) { return 1, true }})
	if err != nil {
		t.Fatal(err)
	}
	f := &follow{worker: "w0", sink: r.Prefix().Precise(prefix.Candidate{ID: 1}), fence: fence{token: "t", synced: true}}
	const n = 1000
	start := time.Now()
	for range n {
		rep.receive("noisy", []byte{9}, time.Now(), false)
		rep.kv.receive(f, []byte{9}, "t", 1)
	}
	elapsed := time.Since(start)
	if got := testutil.ToFloat64(rep.m.dropped.WithLabelValues("malformed")); got != n {
		t.Errorf("%v malformed deltas messages counted, want %d", got, n)
	}
	if got := testutil.ToFloat64(rep.kv.m.kvDropped.WithLabelValues("malformed")); got != n {
		t.Errorf("%v malformed kv messages counted, want %d", got, n)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	most := 1 + int(elapsed/malformedLogInterval) // the first, then one per interval passed
	deltas, kv := strings.Count(out, "a replica's message does not decode"), strings.Count(out, "a KV events message does not decode")
	if deltas < 1 || deltas > most || kv < 1 || kv > most {
		t.Errorf("%d deltas and %d kv lines logged for %d messages each in %v; want 1 to %d each", deltas, kv, n, elapsed, most)
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// TestRemoteBookingKeepsItsRank: another replica's booking of a
// data-parallel rank lands on that rank here; one of a version 1 replica
// (no rank) on the lowest.
func TestRemoteBookingKeepsItsRank(t *testing.T) {
	_, b, nc := soloNode(t)
	for rank := range uint32(4) {
		if _, err := b.r.AddWorker(fleet.Spec{ID: 500, DPRank: rank, DataParallel: true, Name: "dp", Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	b.ids["dp"] = 500
	ranks := func() [4]int64 {
		var out [4]int64
		for _, w := range b.r.Workers("", shared.RoleAggregated) {
			if w.Name == "dp" {
				out[w.DPRank] = w.ActiveRequests()
			}
		}
		return out
	}
	v2 := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "r2", Worker: "dp", Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4, Rank: 2})
	v1 := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "r0", Worker: "dp", Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4})
	v1 = append([]byte{wireVersionV1}, v1[1:len(v1)-1]...)
	for _, m := range [][]byte{v2, v1} {
		if err := nc.Publish("switchyard.test.d.other", m); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "both bookings applied", func() bool { return ranks() == [4]int64{1, 0, 1, 0} })
}

// TestSnapshotKeepsHeldBookings: a snapshot (a reset and the live
// bookings) that repeats a booking already held keeps it as it is: its
// prefill charge (not re-placed against an index that holds its blocks by
// now, which would charge 0 tokens) and its first token; a booking it does
// not repeat is released, one it repeats on another worker moves there.
func TestSnapshotKeepsHeldBookings(t *testing.T) {
	_, b, nc := soloNode(t)
	// "other" is alive throughout (heartbeats), however slow the test:
	// its bookings do not expire.
	stop := make(chan struct{})
	var hbs sync.WaitGroup
	hbs.Go(func() {
		for {
			_ = nc.Publish("switchyard.test.hb.other", nil)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	defer hbs.Wait()
	defer close(stop)
	hashes := make([]uint64, 10)
	for i := range hashes {
		hashes[i] = 7000 + uint64(i)
	}
	booked := func(id, worker string) *Record {
		return &Record{Kind: KindBooked, ID: id, At: time.Now().UnixNano(), Worker: worker, Role: shared.RoleAggregated,
			PromptTokens: 40, BlockSize: 4, BlockHashes: prefix.ChainHashes(nil, hashes), HasRank: true}
	}
	send := func(recs ...*Record) {
		t.Helper()
		msg := []byte{wireVersion}
		for _, rec := range recs {
			msg = appendRecord(msg, rec)
		}
		if err := nc.Publish("switchyard.test.d.other", msg); err != nil {
			t.Fatal(err)
		}
	}
	type state struct{ active, prefill [3]int64 }
	now := func() state {
		var s state
		for _, w := range b.r.Workers("", shared.RoleAggregated) {
			i := int(w.ID - 101)
			s.active[i], s.prefill[i] = w.ActiveRequests(), w.Load(true).ActivePrefillTokens
		}
		return s
	}
	received := func() float64 { return testutil.ToFloat64(b.rep.m.received.WithLabelValues("reset")) }
	wantState := func(what string, want state) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for now() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v a minute on, want %+v", what, now(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if b.remoteCount() != int(want.active[0]+want.active[1]+want.active[2]) {
			t.Fatalf("%s: %d remote bookings held, want %v", what, b.remoteCount(), want.active)
		}
	}

	send(booked("r1", "w1"))
	wantState("r1 booked on w1 with its 40 prefill tokens", state{active: [3]int64{0, 1, 0}, prefill: [3]int64{0, 40, 0}})
	// A snapshot repeating r1, with r2 new (on w2, which holds none of
	// its blocks): r1 keeps its charge.
	resets := received()
	send(&Record{Kind: KindReset}, booked("r1", "w1"), booked("r2", "w2"))
	testkit.Eventually(t, "the snapshot applied", func() bool { return received() > resets })
	wantState("r1 kept as it was, r2 booked", state{active: [3]int64{0, 1, 1}, prefill: [3]int64{0, 40, 40}})
	// r1's first token, then a snapshot of r1 alone: its prefill stays
	// done; r2, not repeated, is released.
	send(&Record{Kind: KindFirstToken, ID: "r1"})
	wantState("r1's first token", state{active: [3]int64{0, 1, 1}, prefill: [3]int64{0, 0, 40}})
	resets = received()
	send(&Record{Kind: KindReset}, booked("r1", "w1"))
	testkit.Eventually(t, "the second snapshot applied", func() bool { return received() > resets })
	wantState("r1 kept past its first token, r2 released", state{active: [3]int64{0, 1, 0}, prefill: [3]int64{0, 0, 0}})
	// A snapshot naming r1 on w0 (it moved, the records between lost):
	// it moves, charged anew there (w0 holds none of its blocks).
	send(&Record{Kind: KindReset}, booked("r1", "w0"))
	wantState("r1 moved to w0", state{active: [3]int64{1, 0, 0}, prefill: [3]int64{40, 0, 0}})
	// A reset alone (the peer stopped) releases everything.
	send(&Record{Kind: KindReset})
	wantState("all released", state{})
}
