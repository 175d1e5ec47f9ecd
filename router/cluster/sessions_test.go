package cluster

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// sessNode is one replica's Sessions over a router with workers named
// names (their ids from idBase on, so that replicas do not share ids).
type sessNode struct {
	r   *router.Router
	s   *Sessions
	reg *prometheus.Registry
	ids map[string]shared.WorkerID
}

func startSessions(t testing.TB, url, replica string, idBase int, names []string, o func(*SessionsOptions)) *sessNode {
	t.Helper()
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	n := &sessNode{r: r, reg: prometheus.NewRegistry(), ids: map[string]shared.WorkerID{}}
	for i, w := range names {
		n.ids[w] = shared.WorkerID(idBase + i)
		if _, err := r.AddWorker(fleet.Spec{ID: n.ids[w], Name: w, Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	so := SessionsOptions{Config: config.Cluster{NATS: url, Replica: replica, Name: "test", SessionTTL: time.Hour}, Router: r, Registerer: n.reg}
	if o != nil {
		o(&so)
	}
	if n.s, err = NewSessions(so); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", replica, err)
		}
	})
	testkit.Eventually(t, replica+" joins the sessions bucket", func() bool { return n.s.kv.Load() != nil })
	return n
}

// store is the node's aggregated partition's SessionStore.
func (n *sessNode) store() shared.SessionStore { return n.s.For("", shared.RoleAggregated) }

// bindUntilSeen binds session to worker w on from (again while it is
// dropped: a watch or a connection not yet live) until every node in to
// sees it, by name, at at.
func bindUntilSeen(t *testing.T, from *sessNode, session, w string, at time.Time, to ...*sessNode) {
	t.Helper()
	testkit.Eventually(t, session+" -> "+w+" shared", func() bool {
		from.store().Bind(session, from.ids[w], at)
		for k := 0; k < 20; k++ {
			ok := true
			for _, n := range to {
				id, got, found := n.store().Binding(session)
				ok = ok && found && id == n.ids[w] && got.Equal(at)
			}
			if ok {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	})
}

// TestSessionsShared: a binding written on one replica is followed on the
// other by worker name (the ids differ); a rebinding on either replaces it
// everywhere (the last write wins); a binding naming a worker a replica
// does not have is ignored there.
func TestSessionsShared(t *testing.T) {
	_, url := startNATS(t, 0)
	a := startSessions(t, url, "a", 1, []string{"w0", "w1", "w2", "only-a"}, nil)
	b := startSessions(t, url, "b", 101, []string{"w0", "w1", "w2"}, nil)
	t0 := time.Unix(1_700_000_000, 0)
	bindUntilSeen(t, a, "conv-1", "w1", t0, a, b)
	if id, _, _ := b.store().Binding("conv-1"); id != 102 {
		t.Fatalf("b resolves w1 to %d, want its own id 102", id)
	}
	bindUntilSeen(t, a, "conv-1", "w2", t0.Add(time.Second), a, b)
	bindUntilSeen(t, b, "conv-1", "w0", t0.Add(2*time.Second), a, b)

	// only-a exists on a alone: a sees the binding, b ignores it.
	bindUntilSeen(t, a, "conv-2", "only-a", t0, a)
	testkit.Eventually(t, "b mirrors conv-2", func() bool { return b.s.Len() == 2 })
	if id, _, ok := b.store().Binding("conv-2"); ok {
		t.Errorf("b follows a binding to a worker it does not have: %d", id)
	}
	// Another partition (model) does not see the session.
	if _, _, ok := b.s.For("other-model", shared.RoleAggregated).Binding("conv-1"); ok {
		t.Error("a binding crossed partitions")
	}
	if got := counterValue(t, a.reg, "switchyard_cluster_session_bindings_published_total"); got < 3 {
		t.Errorf("a published %v bindings, want >= 3", got)
	}
	if got := counterValue(t, b.reg, "switchyard_cluster_session_bindings"); got != 2 {
		t.Errorf("b's mirror gauge %v, want 2", got)
	}
}

// TestSessionsMalformedDropped: values that do not decode, or whose key
// is not the binding's, are dropped and counted; the watch goes on.
func TestSessionsMalformedDropped(t *testing.T) {
	_, url := startNATS(t, 0)
	b := startSessions(t, url, "b", 101, []string{"w0"}, nil)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "test-sessions")
	if err != nil {
		t.Fatal(err)
	}
	good := sessionKey{model: "", role: shared.RoleAggregated, session: "s"}
	val := appendSessionValue(nil, &good, sessionEntry{worker: "w0", at: 42, replica: "x"})
	for key, v := range map[string][]byte{
		"s.garbage":             []byte("not a binding"),
		"s.truncated":           val[:len(val)-1],
		"s.wrong-key":           val,
		sessionBucketKey(&good): val,
	} {
		if _, err := kv.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "the good binding applied", func() bool { return b.s.Len() == 1 })
	testkit.Eventually(t, "three dropped", func() bool {
		return counterValue(t, b.reg, "switchyard_cluster_session_bindings_dropped_total") == 3
	})
	if id, at, ok := b.store().Binding("s"); !ok || id != 101 || at.UnixNano() != 42 {
		t.Errorf("binding %d %v %v, want w0 (101) at 42 ns", id, at, ok)
	}
	// An oversized value: NATS refuses it (the bucket's max value size),
	// and the decoder refuses it too.
	if _, err := kv.Put(ctx, "s.big", bytes.Repeat([]byte{1}, maxSessionValue+1)); err == nil {
		t.Error("NATS took an oversized value")
	}
	if _, _, err := decodeSessionValue(bytes.Repeat([]byte{1}, maxSessionValue+1)); !errors.Is(err, errSessionValue) {
		t.Errorf("oversized value decoded: %v", err)
	}
	// A session id too long to share is not written.
	b.store().Bind(strings.Repeat("x", maxSessionValue), 101, time.Now())
	testkit.Eventually(t, "too_long counted", func() bool {
		return counterValue(t, b.reg, "switchyard_cluster_session_bindings_dropped_total") == 4
	})
}

// TestSessionValueCodec: values round-trip; every truncation and a
// trailing byte are refused.
func TestSessionValueCodec(t *testing.T) {
	k := sessionKey{model: "llama", role: shared.RolePrefill, session: "conv-é"}
	e := sessionEntry{worker: "gpu-3", at: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC).UnixNano(), replica: "router-1"}
	v := appendSessionValue(nil, &k, e)
	gk, ge, err := decodeSessionValue(v)
	if err != nil || gk != k || ge != e {
		t.Fatalf("round trip: %+v %+v %v", gk, ge, err)
	}
	for i := range len(v) {
		if _, _, err := decodeSessionValue(v[:i]); !errors.Is(err, errSessionValue) {
			t.Errorf("truncated at %d: %v", i, err)
		}
	}
	if _, _, err := decodeSessionValue(append(v, 0)); !errors.Is(err, errSessionValue) {
		t.Errorf("trailing byte: %v", err)
	}
	key := sessionBucketKey(&k)
	if len(key) != 26 || !strings.HasPrefix(key, "s.") || key == sessionBucketKey(&sessionKey{model: "llama", role: shared.RolePrefill, session: "conv-e"}) {
		t.Errorf("bucket key %q", key)
	}
}

// TestSessionsMirrorBound: past MaxBindings a new binding is dropped and
// counted unless expired ones make room; updates of a held one apply.
func TestSessionsMirrorBound(t *testing.T) {
	var now time.Time
	clock := func() time.Time { return now }
	s, err := NewSessions(SessionsOptions{Config: config.Cluster{NATS: "nats://127.0.0.1:1", Replica: "a", Name: "t", SessionTTL: time.Minute},
		Router: &router.Router{}, MaxBindings: 2, now: clock})
	if err != nil {
		t.Fatal(err)
	}
	now = time.Unix(1_700_000_000, 0)
	put := func(session string, at time.Time) {
		k := sessionKey{role: shared.RoleAggregated, session: session}
		s.apply(sessionBucketKey(&k), jetstream.KeyValuePut, appendSessionValue(nil, &k, sessionEntry{worker: "w", at: at.UnixNano(), replica: "b"}))
	}
	put("s1", now.Add(-50*time.Second))
	put("s2", now)
	put("s3", now)
	if s.Len() != 2 {
		t.Fatalf("mirror holds %d, want 2", s.Len())
	}
	put("s2", now.Add(time.Second)) // an update of a held binding
	now = now.Add(20 * time.Second) // s1 is 70 s old: expired
	put("s3", now)                  // swept: s1 makes room
	held := func(session string) bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		_, ok := s.mirror[sessionKey{role: shared.RoleAggregated, session: session}]
		return ok
	}
	if held("s1") || !held("s2") || !held("s3") {
		t.Fatalf("after the sweep: s1 %v, s2 %v, s3 %v", held("s1"), held("s2"), held("s3"))
	}
	put("s2", now.Add(-time.Hour)) // an update that makes s2 expired
	put("s4", now)                 // full, swept a moment ago: not swept again
	if held("s4") || !held("s2") {
		t.Fatalf("a full mirror swept twice within session_ttl/16: s4 %v, s2 %v", held("s4"), held("s2"))
	}
	now = now.Add(4 * time.Second) // past session_ttl/16
	put("s4", now)
	if !held("s4") || held("s2") {
		t.Fatalf("after the next sweep: s4 %v, s2 %v", held("s4"), held("s2"))
	}
	if got := testutil.ToFloat64(s.m.dropped.WithLabelValues("too_many")); got != 2 {
		t.Errorf("too_many %v, want 2 (s3, then s4)", got)
	}
}

// TestSessionsNATSAway: NATS goes away: writes are dropped and counted,
// the mirror keeps answering; a new server on the same port (its memory
// bucket empty) and both replicas share again by themselves.
func TestSessionsNATSAway(t *testing.T) {
	port := freePort(t)
	srv, url := startNATS(t, port)
	a := startSessions(t, url, "a", 1, []string{"w0", "w1"}, nil)
	b := startSessions(t, url, "b", 101, []string{"w0", "w1"}, nil)
	t0 := time.Unix(1_700_000_000, 0)
	bindUntilSeen(t, a, "before", "w1", t0, a, b)

	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.Eventually(t, "a write dropped while NATS is away", func() bool {
		a.store().Bind("during", a.ids["w0"], t0)
		time.Sleep(10 * time.Millisecond)
		return testutil.ToFloat64(a.s.m.dropped.WithLabelValues("disconnected")) > 0
	})
	if id, _, ok := b.store().Binding("before"); !ok || id != b.ids["w1"] {
		t.Errorf("b's mirror lost 'before' while NATS is away: %d %v", id, ok)
	}

	startNATS(t, port)
	bindUntilSeen(t, a, "after", "w0", t0.Add(time.Second), a, b)
	bindUntilSeen(t, b, "after", "w1", t0.Add(2*time.Second), a, b)
	if _, _, ok := b.store().Binding("before"); !ok {
		t.Error("b's mirror forgot 'before' across the restart")
	}
}

// TestSessionsBindingNoAllocs: the classifier's lookup allocates nothing.
func TestSessionsBindingNoAllocs(t *testing.T) {
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	for i, w := range []string{"w0", "w1", "w2"} {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Name: w, Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewSessions(SessionsOptions{Config: config.Cluster{NATS: "nats://127.0.0.1:1", Replica: "a", Name: "t"}, Router: r})
	if err != nil {
		t.Fatal(err)
	}
	k := sessionKey{role: shared.RoleAggregated, session: "conv-1"}
	s.apply(sessionBucketKey(&k), jetstream.KeyValuePut, appendSessionValue(nil, &k, sessionEntry{worker: "w2", at: 7, replica: "b"}))
	store := s.For("", shared.RoleAggregated)
	n := testing.AllocsPerRun(100, func() {
		if id, _, ok := store.Binding("conv-1"); !ok || id != 3 {
			t.Fatalf("binding %d %v, want w2 (3)", id, ok)
		}
	})
	if n != 0 {
		t.Errorf("Binding allocates %v per call, want 0", n)
	}
}

// BenchmarkSessionsBinding: the classifier's lookup of a shared binding
// (a mirror of 100,000, a partition of 8 workers).
func BenchmarkSessionsBinding(b *testing.B) {
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(b)}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	for i := range 8 {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Name: "w" + string(rune('0'+i)), Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
			b.Fatal(err)
		}
	}
	s, err := NewSessions(SessionsOptions{Config: config.Cluster{NATS: "nats://127.0.0.1:1", Replica: "a", Name: "t"}, Router: r})
	if err != nil {
		b.Fatal(err)
	}
	sessions := make([]string, 100_000)
	for i := range sessions {
		sessions[i] = "conversation-" + strconv.Itoa(i)
		k := sessionKey{role: shared.RoleAggregated, session: sessions[i]}
		s.apply(sessionBucketKey(&k), jetstream.KeyValuePut, appendSessionValue(nil, &k, sessionEntry{worker: "w" + string(rune('0'+i%8)), at: 7, replica: "b"}))
	}
	store := s.For("", shared.RoleAggregated)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, ok := store.Binding(sessions[i%len(sessions)]); !ok {
			b.Fatal("miss")
		}
		i++
	}
}
