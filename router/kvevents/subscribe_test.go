package kvevents

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests, except the one
// zmq4 v0.17.0 leaves per closed PUB socket (socket.Close never closes its
// pubMWriter, whose goroutine then waits forever): that is the
// Publisher's side (the mock engine's), not the subscriber's, which
// leaves nothing.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// recSink records what a subscriber did to it: the batches applied (by
// their TS, which the tests set to the sequence number), clears, lives.
type recSink struct {
	mu      sync.Mutex
	applied []float64
	clears  int
	lives   int
}

func (r *recSink) Apply(b *Batch) { r.mu.Lock(); r.applied = append(r.applied, b.TS); r.mu.Unlock() }
func (r *recSink) Clear()         { r.mu.Lock(); r.clears++; r.applied = nil; r.mu.Unlock() }
func (r *recSink) MarkLive()      { r.mu.Lock(); r.lives++; r.mu.Unlock() }
func (r *recSink) snapshot() (applied []float64, clears, lives int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied), r.clears, r.lives
}

// eventually polls cond for up to 60 s (a deadline, not a speed claim).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within 60 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func payloadFor(t *testing.T, seq uint64) []byte {
	t.Helper()
	var e Encoder
	p, err := e.Encode(&Batch{TS: float64(seq), Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{seq}}}})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(p)
}

func newPub(t *testing.T, replay bool) *Publisher {
	t.Helper()
	r := ""
	if replay {
		r = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher("tcp://127.0.0.1:0", r, "kv", 100)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func subscribe(t *testing.T, ctx context.Context, p *Publisher, sink Sink) *Subscriber {
	t.Helper()
	o := Options{Endpoint: "tcp://" + p.Addr().String(), Topic: "kv", Backoff: backoff.NewConstantBackOff(20 * time.Millisecond)}
	if a := p.ReplayAddr(); a != nil {
		o.ReplayEndpoint = "tcp://" + a.String()
	}
	s, err := Subscribe(ctx, o, sink)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// publishUntilSeen publishes until the subscriber has applied a batch (a
// SUB socket misses what is published before its subscription arrives).
func publishUntilSeen(t *testing.T, p *Publisher, s *Subscriber) {
	t.Helper()
	eventually(t, "a first batch applied", func() bool {
		p.mu.Lock()
		seq := p.seq
		p.mu.Unlock()
		if _, err := p.Publish(payloadFor(t, seq)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		return s.Stats().Batches > 0
	})
}

func publish(t *testing.T, p *Publisher, n int) {
	t.Helper()
	for range n {
		p.mu.Lock()
		seq := p.seq
		p.mu.Unlock()
		if _, err := p.Publish(payloadFor(t, seq)); err != nil {
			t.Fatal(err)
		}
	}
}

// lose takes a sequence number for a batch that only the replay buffer
// gets, as a message lost on the way.
func lose(t *testing.T, p *Publisher) {
	p.mu.Lock()
	p.record(payloadFor(t, p.seq))
	p.mu.Unlock()
}

func seqs(from, to int) []float64 {
	var out []float64
	for i := from; i < to; i++ {
		out = append(out, float64(i))
	}
	return out
}

// TestSubscribeReplaysToLive: whatever the SUB socket missed at the start
// is replayed from 0, so the sink sees every batch once, in order, and is
// live; a lost message later is replayed too.
func TestSubscribeReplaysToLive(t *testing.T) {
	p := newPub(t, true)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recSink{}
	s := subscribe(t, ctx, p, sink)
	publishUntilSeen(t, p, s)
	publish(t, p, 3)
	lose(t, p)
	publish(t, p, 3)
	p.mu.Lock()
	total := int(p.seq)
	p.mu.Unlock()
	eventually(t, "every batch applied", func() bool { return s.Stats().HasSeq && s.Stats().LastSeq == uint64(total-1) })
	applied, clears, lives := sink.snapshot()
	if !slices.Equal(applied, seqs(0, total)) || clears != 0 || lives < 1 {
		t.Fatalf("applied %v (want 0..%d), clears %d, lives %d", applied, total-1, clears, lives)
	}
	st := s.Stats()
	if st.State != StateLive || st.Gaps != 1 || st.Replays < 1 || st.Batches != uint64(total) || st.BlockEvents != uint64(total) {
		t.Fatalf("stats %+v", st)
	}
	cancel()
	s.Wait()
}

// TestSubscribeGapWithoutReplayClears: without a replay endpoint a gap
// clears the sink and leaves the stream cold.
func TestSubscribeGapWithoutReplayClears(t *testing.T) {
	p := newPub(t, false)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recSink{}
	s := subscribe(t, ctx, p, sink)
	publishUntilSeen(t, p, s)
	_, clearsBefore, _ := sink.snapshot()
	lose(t, p)
	publish(t, p, 2)
	p.mu.Lock()
	last := p.seq - 1
	p.mu.Unlock()
	eventually(t, "the batches after the gap", func() bool { return s.Stats().LastSeq == last })
	applied, clears, _ := sink.snapshot()
	st := s.Stats()
	if st.Gaps != 1 || clears != clearsBefore+1 || st.State != StateCold || !slices.Equal(applied, []float64{float64(last - 1), float64(last)}) {
		t.Fatalf("gaps %d, clears %d (before %d), state %v, applied since clear %v", st.Gaps, clears, clearsBefore, st.State, applied)
	}
	cancel()
	s.Wait()
}

// TestSubscribeEngineRestart: the publisher goes away and another starts
// on the same port from sequence 0; the subscriber reconnects, counts the
// restart and, replaying from 0, is live on the new stream.
func TestSubscribeEngineRestart(t *testing.T) {
	p := newPub(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recSink{}
	s := subscribe(t, ctx, p, sink)
	publishUntilSeen(t, p, s)
	publish(t, p, 5)
	eventually(t, "the first stream", func() bool { return s.Stats().LastSeq >= 5 })
	addr, raddr := p.Addr().String(), p.ReplayAddr().String()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var q *Publisher
	eventually(t, "the port free again", func() bool {
		var err error
		q, err = NewPublisher("tcp://"+addr, "tcp://"+raddr, "kv", 100)
		return err == nil
	})
	defer q.Close()
	eventually(t, "the new stream applied", func() bool {
		publish(t, q, 1)
		time.Sleep(2 * time.Millisecond)
		st := s.Stats()
		return st.Gaps >= 1 && st.State == StateLive && st.Connects >= 2
	})
	q.mu.Lock()
	n := int(q.seq)
	q.mu.Unlock()
	eventually(t, "all of the new stream", func() bool { return s.Stats().LastSeq == uint64(n-1) })
	applied, clears, _ := sink.snapshot()
	if clears < 1 || !slices.Equal(applied, seqs(0, n)) {
		t.Fatalf("clears %d, applied %v, want 0..%d", clears, applied, n-1)
	}
	cancel()
	s.Wait()
}

func TestSubscribeOptions(t *testing.T) {
	ctx := context.Background()
	for _, o := range []Options{{Endpoint: "localhost:5557"}, {Endpoint: "tcp://h:1", ReplayEndpoint: "h:2"}} {
		if _, err := Subscribe(ctx, o, &recSink{}); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := Subscribe(ctx, Options{Endpoint: "tcp://h:1"}, nil); err == nil {
		t.Error("nil sink: no error")
	}
	for _, c := range []struct {
		ep   string
		rank int
		want string
	}{{"tcp://*:5557", 0, "tcp://*:5557"}, {"tcp://10.0.0.1:5557", 3, "tcp://10.0.0.1:5560"}, {"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"}} {
		if got, err := RankEndpoint(c.ep, c.rank); err != nil || got != c.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q", c.ep, c.rank, got, err, c.want)
		}
	}
	if _, err := RankEndpoint("tcp://host", 1); err == nil || !strings.Contains(err.Error(), "no port") {
		t.Errorf("RankEndpoint without a port: %v", err)
	}
}

// lockedBuf is a log destination safe for the subscriber's goroutine.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) count(level, s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(line, level) && strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestSubscribeUnreachableWarnsOnce: an endpoint nothing listens on is
// retried for ever; the failure is logged at warn once, and its repeats
// (the same error) only at debug, as a worker's failed probes are.
func TestSubscribeUnreachableWarnsOnce(t *testing.T) {
	p := newPub(t, false) // take a free port, then free it
	endpoint := "tcp://" + p.Addr().String()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuf{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Subscribe(ctx, Options{Endpoint: endpoint, Logger: log, Backoff: backoff.NewConstantBackOff(time.Millisecond)}, &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "10 reconnections logged", func() bool { return logs.count("", "reconnecting") >= 10 })
	cancel()
	s.Wait()
	if n := logs.count("[WARN]", "reconnecting"); n != 1 {
		t.Fatalf("%d warnings for one repeated failure, want 1:\n%s", n, logs.b.String())
	}
}
