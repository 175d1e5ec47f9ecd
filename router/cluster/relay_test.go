package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// engine is an in-process KV-event publisher (with replay) behind a TCP
// proxy that counts the connections open to its PUB socket.
type engine struct {
	pub    *kvevents.Publisher
	proxy  net.Listener
	open   atomic.Int64
	mu     sync.Mutex
	blocks uint64 // blocks published (one per batch, hashes 1..blocks)
	enc    kvevents.Encoder
}

func startEngine(t testing.TB) *engine {
	t.Helper()
	pub, err := kvevents.NewPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{pub: pub, proxy: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", pub.Addr().String())
			if err != nil {
				_ = c.Close()
				continue
			}
			e.open.Add(1)
			wg.Go(func() {
				var cw sync.WaitGroup
				cw.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
				_, _ = io.Copy(c, up)
				_ = c.Close()
				cw.Wait()
				e.open.Add(-1)
			})
		}
	})
	return e
}

// kvEvents is the engine's kv_events block (the PUB socket through the
// proxy).
func (e *engine) kvEvents() config.KVEvents {
	return config.KVEvents{Endpoint: "tcp://" + e.proxy.Addr().String(), ReplayEndpoint: "tcp://" + e.pub.ReplayAddr().String()}
}

// publish publishes a batch storing one new block (4 tokens, no parent).
func (e *engine) publish(t testing.TB) { e.publishBlocks(t, 1) }

// publishBlocks publishes a batch storing n new blocks of 4 tokens, a
// chain (the first without a parent).
func (e *engine) publishBlocks(t testing.TB, n int) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4}
	for range n {
		e.blocks++
		ev.BlockHashes = append(ev.BlockHashes, e.blocks)
		x := int64(e.blocks)
		ev.TokenIDs = append(ev.TokenIDs, x, x, x, x)
	}
	payload, err := e.enc.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pub.Publish(payload); err != nil {
		t.Fatal(err)
	}
}

func (e *engine) published() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return int(e.blocks)
}

// precise returns n's precise index of w0 rank 0, following the stream.
func followW0(n *node) *prefix.Precise {
	p := n.r.Prefix().Precise(prefix.Candidate{ID: n.ids["w0"]})
	n.rep.FollowKV("w0", 0, p)
	return p
}

func held(n *node) float64 { return testutil.ToFloat64(n.rep.kv.m.leasesHeld) }
func relayedApplies(n *node) float64 {
	return testutil.ToFloat64(n.rep.kv.m.relayed.WithLabelValues("apply"))
}

// relaying publishes batches until some node's relay has published one
// (its subscriber is connected), and returns that node.
func relaying(t *testing.T, e *engine, ns ...*node) *node {
	t.Helper()
	var holder *node
	testkit.Eventually(t, "a relay publishes the engine's batches", func() bool {
		e.publish(t)
		for _, n := range ns {
			if relayedApplies(n) > 0 && held(n) == 1 {
				holder = n
				return true
			}
		}
		return false
	})
	return holder
}

// holds waits until p holds every block e published and is live.
func holds(t *testing.T, what string, e *engine, p *prefix.Precise) {
	t.Helper()
	want := e.published()
	testkit.Eventually(t, what, func() bool {
		st := p.Stats()
		return st.Live && st.Blocks == want
	})
}

// TestRelayLeaseAndHandover: two replicas of one worker with a kv_events
// block compete for its relay lease; only the holder connects to the
// engine, and both replicas' precise indexes hold every block it
// published (from the stream). The holder stops cleanly: the other takes
// the lease, connects, and its index goes on holding every block.
func TestRelayLeaseAndHandover(t *testing.T) {
	_, url := startNATS(t, 0)
	e := startEngine(t)
	a := startNode(t, url, "a", 1, 1, nil)
	b := startNode(t, url, "b", 1, 101, nil)
	pa, pb := followW0(a), followW0(b)
	target := RelayTarget{Worker: "w0", Rank: 0, KVEvents: e.kvEvents()}
	a.rep.RelayKV(target)
	b.rep.RelayKV(target)

	holder := relaying(t, e, a, b)
	other := b
	if holder == b {
		other = a
	}
	for range 5 {
		e.publish(t)
	}
	holds(t, "a's index holds the engine's blocks", e, pa)
	holds(t, "b's index holds the engine's blocks", e, pb)
	if got := held(holder) + held(other); got != 1 {
		t.Errorf("leases held by both replicas: %v, want 1", got)
	}
	if got := relayedApplies(other); got != 0 {
		t.Errorf("the replica without the lease relayed %v batches, want 0", got)
	}
	testkit.Eventually(t, "one connection open to the engine", func() bool { return e.open.Load() == 1 })
	if !a.rep.KVCaughtUp() || !b.rep.KVCaughtUp() {
		t.Errorf("caught up: a %v, b %v; want both", a.rep.KVCaughtUp(), b.rep.KVCaughtUp())
	}
	for _, n := range []*node{a, b} {
		if got := testutil.ToFloat64(n.rep.kv.m.kvConsumed.WithLabelValues("live")); got < 1 {
			t.Errorf("%s consumed %v live messages, want at least 1", n.rep.self, got)
		}
	}

	// The holder stops: it gives the lease up, the other takes it.
	holder.stop(t)
	testkit.Eventually(t, other.rep.self+" takes the lease", func() bool { return held(other) == 1 })
	testkit.Eventually(t, other.rep.self+" relays", func() bool {
		e.publish(t)
		return relayedApplies(other) > 0
	})
	e.publish(t)
	po := pa
	if other == b {
		po = pb
	}
	holds(t, other.rep.self+"'s index holds every block after the handover", e, po)
	testkit.Eventually(t, "one connection open to the engine", func() bool { return e.open.Load() == 1 })
}

// TestRelayLeaseExpires: the lease is held by a holder that died (it
// took the key and never renews it nor gives it up); the replica takes it
// once it expired, and relays.
func TestRelayLeaseExpires(t *testing.T) {
	_, url := startNATS(t, 0)
	e := startEngine(t)
	_, js := client(t, url)
	c := config.Cluster{Name: "test", Heartbeat: 100 * time.Millisecond}
	ctx := context.Background()
	l, err := openLeases(ctx, js, c, "dead", nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	key := LeaseKey("relay", "w0", "0")
	if _, err := l.kv.Create(ctx, key, []byte("dead")); err != nil {
		t.Fatal(err)
	}

	a := startNode(t, url, "a", 1, 1, nil)
	pa := followW0(a)
	a.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
	if relaying(t, e, a) != a {
		t.Fatal("a does not relay")
	}
	holds(t, "a's index holds the engine's blocks", e, pa)
	v, err := l.kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := leaseHolderOf(v); got != "a" {
		t.Errorf("the lease's holder is %q, want a", got)
	}
}

// TestMalformedKVMessagesAreDropped: a kv message that does not decode is
// dropped and counted, and the index it was for is cleared (cold).
func TestMalformedKVMessagesAreDropped(t *testing.T) {
	_, url := startNATS(t, 0)
	relay := startFakeRelay(t, url, "r").waitRun()
	a := startNode(t, url, "a", 1, 1, nil)
	pa := followW0(a)
	var enc kvevents.Encoder
	good, err := enc.Encode(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{7}, TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range [][]byte{
		{opLive},
		append([]byte{opApply}, good...),
		{opApply, 0xc1}, // not msgpack
		{9},             // no such op
		{opClear, 0},    // bytes after a clear
		append([]byte{opApply}, good[:len(good)-1]...), // cut short
	} {
		relay.send(msg)
	}
	dropped := func() float64 { return testutil.ToFloat64(a.rep.kv.m.kvDropped.WithLabelValues("malformed")) }
	testkit.Eventually(t, "four malformed messages dropped", func() bool { return dropped() == 4 })
	st := pa.Stats()
	if st.Live || st.Blocks != 0 || st.Resets != 4 || st.Stored != 1 {
		t.Errorf("index after the malformed messages: live %v, %d blocks, %d resets, %d stored; want cold, 0, 4, 1", st.Live, st.Blocks, st.Resets, st.Stored)
	}
	if got := testutil.ToFloat64(a.rep.kv.m.kvConsumed.WithLabelValues("apply")); got != 1 {
		t.Errorf("applied %v batches, want 1", got)
	}
}

// TestRelayNATSRestart: NATS restarts (its memory stream is lost). The
// relay's publishes fail, so it starts again (a clear, then the engine's
// replay from sequence 0) on the stream made anew; the other replica's
// follow sees the stream made again and reads it from its start: both
// indexes hold every block the engine published, live.
func TestRelayNATSRestart(t *testing.T) {
	port := freePort(t)
	s, url := startNATS(t, port)
	e := startEngine(t)
	a := startNode(t, url, "a", 1, 1, nil)
	b := startNode(t, url, "b", 1, 101, nil)
	pa, pb := followW0(a), followW0(b)
	target := RelayTarget{Worker: "w0", KVEvents: e.kvEvents()}
	a.rep.RelayKV(target)
	b.rep.RelayKV(target)
	relaying(t, e, a, b)
	holds(t, "a's index holds the engine's blocks", e, pa)
	holds(t, "b's index holds the engine's blocks", e, pb)

	s.Shutdown()
	s.WaitForShutdown()
	testkit.Eventually(t, "both see NATS gone", func() bool { return !a.rep.Connected() && !b.rep.Connected() })
	startNATS(t, port)
	testkit.Eventually(t, "both reconnect", func() bool { return a.rep.Connected() && b.rep.Connected() })
	// The engine goes on publishing; the relay's next publish fails, or
	// it sees the stream made again: it starts again (a second clear).
	clears := func() float64 {
		return testutil.ToFloat64(a.rep.kv.m.relayed.WithLabelValues("clear")) + testutil.ToFloat64(b.rep.kv.m.relayed.WithLabelValues("clear"))
	}
	testkit.Eventually(t, "the relay starts again on the new stream, and both indexes go live", func() bool {
		e.publish(t)
		return clears() >= 2 && pa.Stats().Live && pb.Stats().Live
	})
	// The lease may change hands once the bucket is made again (the
	// holder could not renew it on the lost bucket): the new relay's clear
	// leaves the indexes cold until the engine's next batch has it replay
	// the engine from its start. So the engine publishes until both hold
	// every block, live.
	deadline := time.Now().Add(time.Minute)
	for {
		e.publish(t)
		want := e.published()
		settled := time.Now().Add(2 * time.Second)
		for time.Now().Before(settled) {
			sa, sb := pa.Stats(), pb.Stats()
			if sa.Live && sb.Live && sa.Blocks == want && sb.Blocks == want {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			diag := func(n *node) string {
				m := n.rep.kv.m
				return fmt.Sprintf("%s: leases %v, relayed apply %v clear %v live %v, consumed apply %v clear %v live %v, stale %v, relay failures publish %v",
					n.rep.self, held(n), testutil.ToFloat64(m.relayed.WithLabelValues("apply")), testutil.ToFloat64(m.relayed.WithLabelValues("clear")),
					testutil.ToFloat64(m.relayed.WithLabelValues("live")), testutil.ToFloat64(m.kvConsumed.WithLabelValues("apply")),
					testutil.ToFloat64(m.kvConsumed.WithLabelValues("clear")), testutil.ToFloat64(m.kvConsumed.WithLabelValues("live")),
					testutil.ToFloat64(m.kvDropped.WithLabelValues("stale_relay")), testutil.ToFloat64(m.relayFailures.WithLabelValues("publish")))
			}
			t.Fatalf("after the restart the indexes do not hold every block (%d), live: a %+v, b %+v\n%s\n%s", want, pa.Stats(), pb.Stats(), diag(a), diag(b))
		}
	}
}

// TestKVStartSeq: a replica told a start sequence (Options.KVStartSeq)
// applies its candidate's messages from that stream sequence on only.
func TestKVStartSeq(t *testing.T) {
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	relay := startFakeRelay(t, url, "r").waitRun()
	var seqs []uint64
	for h := range uint64(3) {
		seqs = append(seqs, relay.send(applyMsg(t, h+1)))
		// Another candidate's message between them: sequences are the
		// stream's, not the subject's.
		if _, err := js.Publish(ctx, kvSubject("switchyard.test.", "w1", 0), []byte{opClear}); err != nil {
			t.Fatal(err)
		}
	}
	var asked []string
	var mu sync.Mutex
	a := startNode(t, url, "a", 1, 1, func(c *config.Cluster) {})
	a.rep.kv.startSeq = func(worker string, rank uint32) uint64 {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, worker)
		return seqs[1]
	}
	pa := followW0(a)
	testkit.Eventually(t, "a caught up", a.rep.KVCaughtUp)
	testkit.Eventually(t, "two batches applied", func() bool { return pa.Stats().Stored == 2 })
	if got := testutil.ToFloat64(a.rep.kv.m.kvConsumed.WithLabelValues("apply")); got != 2 {
		t.Errorf("applied %v batches from sequence %d, want 2", got, seqs[1])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "w0" {
		t.Errorf("KVStartSeq asked for %v, want [w0]", asked)
	}
}
