package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// holdsAll waits until every index holds every block e published, live.
// The engine publishes a batch at each try: a relay that started again
// (a clear) leaves the indexes cold until the engine's next batch has it
// replay the engine from its start.
func holdsAll(t *testing.T, what string, e *engine, ps ...*prefix.Precise) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		e.publish(t)
		want := e.published()
		settled := time.Now().Add(2 * time.Second)
		for time.Now().Before(settled) {
			all := true
			for _, p := range ps {
				if st := p.Stats(); !st.Live || st.Blocks != want {
					all = false
				}
			}
			if all {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			var got string
			for _, p := range ps {
				got += fmt.Sprintf(" %+v", p.Stats())
			}
			t.Fatalf("%s: the indexes do not hold every block (%d), live, within a minute:%s", what, want, got)
		}
	}
}

// TestRelayAfterLeaseBucketLost: the lease bucket alone is lost (deleted
// while the relay runs; the KV stream stays). The holder makes it again
// and takes its lease again, its revisions starting over low; both
// followers, the relay's own replica included, apply the new relay's
// messages: their indexes hold every block the engine published, live.
func TestRelayAfterLeaseBucketLost(t *testing.T) {
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	// The bucket has a history before the relay takes its lease (other
	// leases came and went): the relay's lease revision is not 1.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "test-leases", History: 1, TTL: time.Second, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := kv.Put(ctx, "other", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	e := startEngine(t)
	a := startNode(t, url, "a", 1, 1, nil)
	b := startNode(t, url, "b", 1, 101, nil)
	pa, pb := followW0(a), followW0(b)
	target := RelayTarget{Worker: "w0", KVEvents: e.kvEvents()}
	a.rep.RelayKV(target)
	b.rep.RelayKV(target)
	relaying(t, e, a, b)
	holdsAll(t, "before the bucket is lost", e, pa, pb)

	if err := js.DeleteKeyValue(ctx, "test-leases"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the lease bucket made again", func() bool {
		_, err := js.KeyValue(ctx, "test-leases")
		return err == nil
	})
	holdsAll(t, "after the lease bucket was lost", e, pa, pb)
}

// TestForgedRelayMessage: one message published on a candidate's KV
// subject by someone who is not its relay, claiming the highest lease
// revision there is, is dropped; the followers go on applying the relay's
// messages.
func TestForgedRelayMessage(t *testing.T) {
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	e := startEngine(t)
	a := startNode(t, url, "a", 1, 1, nil)
	b := startNode(t, url, "b", 1, 101, nil)
	pa, pb := followW0(a), followW0(b)
	a.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
	relaying(t, e, a)
	holdsAll(t, "before the forged message", e, pa, pb)

	// The highest lease revision there is (what the relays' messages
	// carried before their lease's token), and a token of its own.
	forged := &nats.Msg{Subject: kvSubject("switchyard.test.", "w0", 0), Data: []byte{opClear},
		Header: nats.Header{"Switchyard-Relay-Rev": []string{"18446744073709551615"}, relayHeader: []string{"ffffffffffffffff"}}}
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	holdsAll(t, "after the forged message", e, pa, pb)
	for _, n := range []*node{a, b} {
		if got := testutil.ToFloat64(n.rep.kv.m.kvDropped.WithLabelValues("stale_relay")); got < 1 {
			t.Errorf("%s dropped %v messages as not its relay's, want at least 1 (the forged one)", n.rep.self, got)
		}
	}
}

// TestStalledFeedLeavesLive: a follower whose feed stalls (its relay
// stopped and no other took the lease) leaves live: its precise index is
// not trusted any more.
func TestStalledFeedLeavesLive(t *testing.T) {
	_, url := startNATS(t, 0)
	e := startEngine(t)
	a := startNode(t, url, "a", 1, 1, nil)
	b := startNode(t, url, "b", 1, 101, nil)
	followW0(a)
	pb := followW0(b)
	stop := a.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
	relaying(t, e, a)
	holds(t, "b's index holds the engine's blocks", e, pb)

	stop()
	testkit.Eventually(t, "b's index leaves live", func() bool { return !pb.Stats().Live })
	if got := b.rep.State().StalledKVFeeds; len(got) != 1 || got[0] != "w0/0" {
		t.Errorf("b's stalled feeds %v, want [w0/0]", got)
	}
	if got := testutil.ToFloat64(b.rep.kv.m.kvStalled); got != 1 {
		t.Errorf("switchyard_cluster_kv_feeds_stalled %v, want 1", got)
	}

	// A relay takes the lease again: the feed resumes, the index holds
	// every block again, live.
	a.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
	holdsAll(t, "after the feed resumed", e, pb)
	if got := b.rep.State().StalledKVFeeds; len(got) != 0 {
		t.Errorf("b's stalled feeds %v after the relay came back, want none", got)
	}
}

// fakeRelay competes for candidate w0/0's relay lease (its own holder
// name, through Leases.Hold) and publishes kv messages as a relay does:
// with its lease's token, noting its run's start at its first message.
type fakeRelay struct {
	t       testing.TB
	js      jetstream.JetStream
	subject string
	runs    chan context.Context
	run     context.Context // the lease's run (waitRun)
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

func startFakeRelay(t testing.TB, url, holder string) *fakeRelay {
	t.Helper()
	_, js := client(t, url)
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, kvStreamConfig("test", "switchyard.test.")); err != nil {
		t.Fatal(err)
	}
	l, err := openLeases(ctx, js, config.Cluster{Name: "test", Heartbeat: 100 * time.Millisecond}, holder, nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRelay{t: t, js: js, subject: kvSubject("switchyard.test.", "w0", 0), runs: make(chan context.Context, 1), done: make(chan struct{})}
	hctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go func() {
		defer close(r.done)
		l.Hold(hctx, LeaseKey(relayLeaseKind, "w0", "0"), func(ctx context.Context) {
			select {
			case r.runs <- ctx:
			default:
			}
			<-ctx.Done()
		})
	}()
	t.Cleanup(r.stop)
	return r
}

// waitRun waits until r holds the lease.
func (r *fakeRelay) waitRun() *fakeRelay {
	r.t.Helper()
	select {
	case r.run = <-r.runs:
	case <-time.After(time.Minute):
		r.t.Fatal("the fake relay did not take the lease within a minute")
	}
	return r
}

// stop gives the lease up; idempotent.
func (r *fakeRelay) stop() {
	r.cancel()
	<-r.done
}

// send publishes data with the relay's token and returns its sequence.
func (r *fakeRelay) send(data []byte) uint64 {
	r.t.Helper()
	return r.sendAs(LeaseToken(r.run), data)
}

// sendAs publishes data with token (none when "") and returns its
// sequence; the relay's first message notes its start in the lease.
func (r *fakeRelay) sendAs(token string, data []byte) uint64 {
	r.t.Helper()
	ctx := context.Background()
	msg := &nats.Msg{Subject: r.subject, Data: data, Header: nats.Header{}}
	if token != "" {
		msg.Header.Set(relayHeader, token)
	}
	ack, err := r.js.PublishMsg(ctx, msg)
	if err != nil {
		r.t.Fatal(err)
	}
	if r.run != nil && !r.started && token == LeaseToken(r.run) {
		r.started = true
		st, err := r.js.Stream(ctx, "test-kv")
		if err != nil {
			r.t.Fatal(err)
		}
		noteLeaseStart(r.run, st.CachedInfo().Created.UnixNano(), ack.Sequence)
	}
	return ack.Sequence
}

// applyMsg is a kv apply message storing block hash h.
func applyMsg(t testing.TB, h uint64) []byte {
	t.Helper()
	var enc kvevents.Encoder
	payload, err := enc.Encode(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored,
		BlockHashes: []uint64{h}, TokenIDs: []int64{int64(h), 2, 3, 4}, BlockSize: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{opApply}, payload...)
}

// TestRelayFence: a follower applies the messages of the relay its
// candidate's lease names and no other: a message with a token no lease
// has, one with no token are dropped and counted (stale_relay), the index
// untouched; when the lease changes hands, the new relay's messages apply
// and the old one's late ones are dropped.
func TestRelayFence(t *testing.T) {
	_, url := startNATS(t, 0)
	r1 := startFakeRelay(t, url, "r1").waitRun()
	a := startNode(t, url, "a", 1, 1, nil)
	pa := followW0(a)
	stale := func() float64 { return testutil.ToFloat64(a.rep.kv.m.kvDropped.WithLabelValues("stale_relay")) }
	r1.send([]byte{opClear})
	r1.send(applyMsg(t, 7))
	r1.send([]byte{opLive})
	testkit.Eventually(t, "a applies the relay's messages", func() bool { st := pa.Stats(); return st.Live && st.Blocks == 1 })

	r1.sendAs("0123456789abcdef", []byte{opClear}) // no lease has this token
	r1.sendAs("", []byte{opClear})                 // no token
	testkit.Eventually(t, "two messages not of the relay dropped", func() bool { return stale() == 2 })
	if st := pa.Stats(); !st.Live || st.Blocks != 1 {
		t.Fatalf("after messages not of the relay: %+v; want live with the relay's block", st)
	}

	// The lease changes hands: r1 gives it up, r2 takes it and starts
	// its run; r1's late clear is dropped.
	old := LeaseToken(r1.run)
	r2 := startFakeRelay(t, url, "r2")
	r1.stop()
	r2.waitRun()
	r2.send([]byte{opClear})
	r2.send(applyMsg(t, 8))
	r2.send(applyMsg(t, 9))
	r2.send([]byte{opLive})
	testkit.Eventually(t, "a applies the new relay's run", func() bool { st := pa.Stats(); return st.Live && st.Blocks == 2 })
	before := stale() // r2's run may have been dropped once, read before the lease changed hands
	r2.sendAs(old, []byte{opClear})
	testkit.Eventually(t, "the old relay's late clear dropped", func() bool { return stale() == before+1 })
	if st := pa.Stats(); !st.Live || st.Blocks != 2 {
		t.Fatalf("after the old relay's late clear: %+v; want live with the new relay's two blocks", st)
	}
}

// TestNewRelaySeenLate: a follower reads a new relay's run before its
// lease watch says the lease changed hands (here the run is published
// before the lease names it): the messages are dropped then, and once the
// lease names the relay and its run's start, the follower reads the
// subject again from that start and holds what the run sent.
func TestNewRelaySeenLate(t *testing.T) {
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	st, err := js.CreateOrUpdateStream(ctx, kvStreamConfig("test", "switchyard.test."))
	if err != nil {
		t.Fatal(err)
	}
	l, err := openLeases(ctx, js, config.Cluster{Name: "test", Heartbeat: 100 * time.Millisecond}, "writer", nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	// The lease's value, written every 100 ms (as a holder renews it).
	var mu sync.Mutex
	value := leaseValue{Holder: "r1", Token: "1111111111111111"}
	key := LeaseKey(relayLeaseKind, "w0", "0")
	put := func() {
		mu.Lock()
		b, _ := json.Marshal(value)
		mu.Unlock()
		if _, err := l.kv.Put(ctx, key, b); err != nil {
			t.Error(err)
		}
	}
	put()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	wg.Go(func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
				put()
			}
		}
	})
	r := &fakeRelay{t: t, js: js, subject: kvSubject("switchyard.test.", "w0", 0)}

	a := startNode(t, url, "a", 1, 1, nil)
	pa := followW0(a)
	r.sendAs("1111111111111111", []byte{opClear})
	r.sendAs("1111111111111111", applyMsg(t, 7))
	r.sendAs("1111111111111111", []byte{opLive})
	testkit.Eventually(t, "a applies r1's run", func() bool { st := pa.Stats(); return st.Live && st.Blocks == 1 })

	// r2's run, before the lease names it: dropped.
	start := r.sendAs("2222222222222222", []byte{opClear})
	r.sendAs("2222222222222222", applyMsg(t, 8))
	r.sendAs("2222222222222222", applyMsg(t, 9))
	r.sendAs("2222222222222222", []byte{opLive})
	stale := func() float64 { return testutil.ToFloat64(a.rep.kv.m.kvDropped.WithLabelValues("stale_relay")) }
	testkit.Eventually(t, "r2's run dropped", func() bool { return stale() == 4 })
	if st := pa.Stats(); !st.Live || st.Blocks != 1 {
		t.Fatalf("after r2's run unseen: %+v; want r1's one block, live", st)
	}
	// The lease names r2, first without its start, then with it.
	mu.Lock()
	value = leaseValue{Holder: "r2", Token: "2222222222222222"}
	mu.Unlock()
	put()
	time.Sleep(300 * time.Millisecond)
	if st := pa.Stats(); st.Blocks != 1 {
		t.Fatalf("before r2's start is known: %+v; want r1's one block", st)
	}
	mu.Lock()
	value.Stream, value.Start = st.CachedInfo().Created.UnixNano(), start
	mu.Unlock()
	put()
	testkit.Eventually(t, "a reads r2's run again from its start", func() bool { st := pa.Stats(); return st.Live && st.Blocks == 2 })
	if got := testutil.ToFloat64(a.rep.kv.m.kvRewinds); got != 1 {
		t.Errorf("%v rewinds, want 1", got)
	}
}
