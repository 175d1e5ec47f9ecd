package kvevents

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"
	"github.com/switchyard-router/switchyard/internal/testkit"
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
	testkit.Eventually(t, "a first batch applied", func() bool {
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
	testkit.Eventually(t, "every batch applied", func() bool { return s.Stats().HasSeq && s.Stats().LastSeq == uint64(total-1) })
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
	testkit.Eventually(t, "the batches after the gap", func() bool { return s.Stats().LastSeq == last })
	applied, clears, _ := sink.snapshot()
	st := s.Stats()
	if st.Gaps != 1 || clears != clearsBefore+1 || st.State != StateCold || !slices.Equal(applied, []float64{float64(last - 1), float64(last)}) {
		t.Fatalf("gaps %d, clears %d (before %d), state %v, applied since clear %v", st.Gaps, clears, clearsBefore, st.State, applied)
	}
	cancel()
	s.Wait()
}

// TestSubscribeEngineRestart: the publisher goes away and another starts
// on the same port from sequence 0; the subscriber clears the sink when
// the connection breaks (counted as SignalDisconnect), reconnects and,
// replaying from 0, is live on the new stream.
func TestSubscribeEngineRestart(t *testing.T) {
	p := newPub(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recSink{}
	s := subscribe(t, ctx, p, sink)
	publishUntilSeen(t, p, s)
	publish(t, p, 5)
	testkit.Eventually(t, "the first stream", func() bool { return s.Stats().LastSeq >= 5 })
	addr, raddr := p.Addr().String(), p.ReplayAddr().String()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var q *Publisher
	testkit.Eventually(t, "the port free again", func() bool {
		var err error
		q, err = NewPublisher("tcp://"+addr, "tcp://"+raddr, "kv", 100)
		return err == nil
	})
	defer q.Close()
	testkit.Eventually(t, "the new stream applied", func() bool {
		publish(t, q, 1)
		time.Sleep(2 * time.Millisecond)
		st := s.Stats()
		return st.Restarts[SignalDisconnect] >= 1 && st.State == StateLive && st.Connects >= 2
	})
	q.mu.Lock()
	n := int(q.seq)
	q.mu.Unlock()
	testkit.Eventually(t, "all of the new stream", func() bool { return s.Stats().LastSeq == uint64(n-1) })
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
	testkit.Eventually(t, "10 reconnections logged", func() bool { return logs.count("", "reconnecting") >= 10 })
	cancel()
	s.Wait()
	if n := logs.count("[WARN]", "reconnecting"); n != 1 {
		t.Fatalf("%d warnings for one repeated failure, want 1:\n%s", n, logs.b.String())
	}
}

// badPayloads are payloads that do not decode, some quoting a publisher's
// map key of 10 KiB with terminal escapes and a newline in the error.
func badPayloads() [][]byte {
	key := append([]byte("\x1b]0;owned\x07\x1b[2J\nlevel=ERROR "), bytes.Repeat([]byte("K"), 10<<10)...)
	str16 := func(b []byte) []byte {
		return append([]byte{0xda, byte(len(b) >> 8), byte(len(b))}, b...)
	}
	huge := []byte{0xdd, 0xff, 0xff, 0xff, 0xff} // an array of 2^32-1 elements in no bytes
	// A map envelope whose one (unknown) key's value does not decode.
	envelope := append(append([]byte{0x81}, str16(key)...), huge...)
	// An array envelope whose one map event has such a field.
	event := []byte{0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x81}
	event = append(append(event, str16(key)...), huge...)
	return [][]byte{envelope, event, []byte("hello")}
}

// TestSubscribeMalformedPayloadsLogOncePerInterval: a real publisher
// sending 1,000 payloads that do not decode costs one warning per
// LogInterval, not one per payload; each is counted (DecodeErrors) and
// clears the sink; the next warning after the interval carries the count
// held back, so the lines and their "suppressed" add up to every payload;
// the publisher's bytes reach the log bounded and control-escaped.
func TestSubscribeMalformedPayloadsLogOncePerInterval(t *testing.T) {
	p := newPub(t, false)
	defer p.Close()
	logs := &lockedBuf{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recSink{}
	const interval = 2 * time.Second
	s, err := Subscribe(ctx, Options{Endpoint: "tcp://" + p.Addr().String(), Topic: "kv", Logger: log, LogInterval: interval,
		Backoff: backoff.NewConstantBackOff(20 * time.Millisecond)}, sink)
	if err != nil {
		t.Fatal(err)
	}
	publishUntilSeen(t, p, s)
	_, clears0, _ := sink.snapshot()
	bad := badPayloads()
	const n = 1000
	start := time.Now()
	var last uint64
	for i := range n {
		if last, err = p.Publish(bad[i%len(bad)]); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "every bad payload received", func() bool { return s.Stats().LastSeq == last })
	elapsed := time.Since(start)
	lines := logs.count("[WARN]", "batch not applied")
	if max := 2 + int(elapsed/interval); lines < 1 || lines > max {
		t.Fatalf("%d warnings for %d bad payloads in %v, want 1 to %d (one per %v):\n%.4000s", lines, n, elapsed, max, interval, logs.b.String())
	}
	// After the interval, one more: its warning counts those held back.
	time.Sleep(interval)
	if last, err = p.Publish(bad[1]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the last bad payload received", func() bool { return s.Stats().LastSeq == last })
	st := s.Stats()
	_, clears, _ := sink.snapshot()
	if st.DecodeErrors != n+1 || clears-clears0 != n+1 || st.Gaps != 0 {
		t.Fatalf("decode errors %d, clears %d, gaps %d; want %d, %d, 0", st.DecodeErrors, clears-clears0, st.Gaps, n+1, n+1)
	}
	logs.mu.Lock()
	out := logs.b.String()
	logs.mu.Unlock()
	var total uint64
	warnings := 0
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if len(line) > 1024 {
			t.Errorf("a log line of %d bytes: %.300s...", len(line), line)
		}
		for _, c := range []byte(line) {
			if c < ' ' && c != '\t' || c == 0x7f {
				t.Fatalf("a control byte %#x in a log line: %q", c, line)
			}
		}
		if !strings.Contains(line, "batch not applied") {
			continue
		}
		warnings++
		total++
		if _, rest, ok := strings.Cut(line, "suppressed="); ok {
			f, _, _ := strings.Cut(rest, " ")
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("suppressed=%q in %q", f, line)
			}
			total += v
		}
	}
	if total != n+1 || warnings != lines+1 {
		t.Fatalf("%d warnings standing for %d payloads, want %d warnings for %d:\n%.4000s", warnings, total, lines+1, n+1, out)
	}
	if !strings.Contains(out, `\x1b]0;owned\x07`) {
		t.Errorf("the publisher's key is not quoted escaped in the log:\n%.4000s", out)
	}
	cancel()
	s.Wait()
}
