package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-zeromq/zmq4"
	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// State is a subscriber's stream state.
type State uint8

// The states.
const (
	// StateConnecting: no connection to the publisher yet (or it broke).
	StateConnecting State = iota
	// StateCold: connected, but the stream is not known complete (it
	// began mid-way, or a gap could not be replayed): the sink was
	// cleared and scores the candidate approximately until warm.
	StateCold
	// StateLive: every batch since the engine's start was applied.
	StateLive
)

// String names s: "connecting", "cold" or "live".
func (s State) String() string {
	return [...]string{"connecting", "cold", "live"}[s]
}

// DefaultReplayTimeout bounds one replay exchange.
const DefaultReplayTimeout = 10 * time.Second

// DefaultLogInterval is how often a subscriber logs at most one line per
// cause of trouble coming from the publisher (a payload that does not
// decode, a message that is not three frames, a gap, a restart, a failed
// replay): a publisher sending garbage costs a line per interval, not a
// line per message. The lines held back are counted in the next line's
// "suppressed".
const DefaultLogInterval = 10 * time.Second

// maxReplayBatches bounds the answers of one replay: vLLM buffers 10,000
// batches by default; ten times that is refused as a misbehaving peer.
const maxReplayBatches = 100_000

// Options configure a subscriber.
type Options struct {
	// Endpoint is the engine's PUB socket, e.g. "tcp://10.0.0.5:5557"
	// (for data-parallel rank N, RankEndpoint(endpoint, N)).
	Endpoint string
	// Topic filters messages by topic prefix; "" takes every message
	// (vLLM's default topic is "").
	Topic string
	// ReplayEndpoint, when not "", is the engine's replay ROUTER socket;
	// a gap is then replayed from it instead of clearing the sink.
	ReplayEndpoint string
	// Rank, when HasRank, is the data-parallel rank the endpoint serves:
	// batches naming another data_parallel_rank are skipped and counted.
	Rank    int64
	HasRank bool
	// ReplayTimeout bounds one replay exchange; 0: DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// Backoff paces reconnections; nil: exponential from 100 ms to 5 s,
	// never giving up (cenkalti/backoff defaults otherwise).
	Backoff backoff.BackOff
	// Logger; nil: no logging.
	Logger hclog.Logger
	// MaxPayload is the decoder's payload limit; 0: MaxPayloadBytes. At
	// most MaxFrameBytes, which bounds every frame read from a tcp://
	// endpoint whatever this is.
	MaxPayload int
	// LogInterval is the least time between two log lines of one cause
	// (DefaultLogInterval when 0); the lines held back are counted in the
	// next one ("suppressed"). Every occurrence is counted in Stats
	// whatever this is.
	LogInterval time.Duration
}

// Stats are a subscriber's counters, for metrics and /debug/workers.
type Stats struct {
	State State
	// Batches and Events count applied batches and their events;
	// BlockEvents their blocks stored or removed (Batch.BlockEvents).
	Batches, Events, BlockEvents uint64
	// Gaps counts sequence jumps and restarts (a sequence going back);
	// Replays, gaps filled by a replay; ReplayFailures, replays that
	// failed or came back incomplete (the sink was cleared instead).
	Gaps, Replays, ReplayFailures uint64
	// DecodeErrors counts payloads that did not decode (each also clears
	// the sink); BadMessages, messages that were not [topic, sequence,
	// payload] (ignored); WrongRank, batches of another data-parallel
	// rank.
	DecodeErrors, BadMessages, WrongRank uint64
	// Connects counts connections made.
	Connects uint64
	// LastSeq is the last applied sequence number, when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// LastEvent is when the last batch was applied (zero before).
	LastEvent time.Time
}

// Subscriber follows one engine endpoint's KV events into a Sink.
type Subscriber struct {
	o    Options
	sink Sink
	log  hclog.Logger
	lim  *untrusted.Limiter // log lines per cause
	dec  Decoder
	b    Batch
	done chan struct{}

	mu sync.Mutex
	st Stats
}

// ErrOptions: Subscribe's options are unusable.
var ErrOptions = errors.New("kv events: bad subscriber options")

// Subscribe starts following o.Endpoint into sink until ctx ends; Wait
// returns once it has stopped. Errors wrap ErrOptions.
func Subscribe(ctx context.Context, o Options, sink Sink) (*Subscriber, error) {
	if !strings.HasPrefix(o.Endpoint, "tcp://") && !strings.HasPrefix(o.Endpoint, "ipc://") {
		return nil, fmt.Errorf("%w: endpoint %q, want tcp://host:port or ipc://path", ErrOptions, o.Endpoint)
	}
	if o.ReplayEndpoint != "" && !strings.HasPrefix(o.ReplayEndpoint, "tcp://") && !strings.HasPrefix(o.ReplayEndpoint, "ipc://") {
		return nil, fmt.Errorf("%w: replay endpoint %q, want tcp://host:port or ipc://path", ErrOptions, o.ReplayEndpoint)
	}
	if sink == nil {
		return nil, fmt.Errorf("%w: no sink", ErrOptions)
	}
	if o.MaxPayload < 0 || o.MaxPayload > MaxFrameBytes {
		return nil, fmt.Errorf("%w: payload limit %d bytes, want 0 to %d", ErrOptions, o.MaxPayload, MaxFrameBytes)
	}
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = DefaultReplayTimeout
	}
	if o.LogInterval <= 0 {
		o.LogInterval = DefaultLogInterval
	}
	if o.Backoff == nil {
		eb := backoff.NewExponentialBackOff()
		eb.InitialInterval, eb.MaxInterval, eb.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, 0
		o.Backoff = eb
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	s := &Subscriber{o: o, sink: sink, log: o.Logger, lim: untrusted.NewLimiter(o.LogInterval), done: make(chan struct{}), dec: Decoder{MaxPayload: o.MaxPayload}}
	go s.run(ctx)
	return s, nil
}

// RankEndpoint is the endpoint data-parallel rank serves when rank 0
// serves endpoint, as vLLM's offset_endpoint_port: a tcp port plus rank,
// an ipc/inproc path suffixed "_dp<rank>".
func RankEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	if !strings.HasPrefix(endpoint, "tcp://") {
		return endpoint + "_dp" + strconv.Itoa(rank), nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, err := strconv.Atoi(endpoint[i+1:])
	if i < len("tcp://") || err != nil {
		return "", fmt.Errorf("%w: endpoint %q has no port", ErrOptions, endpoint)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// Stats returns a copy of the counters.
func (s *Subscriber) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Wait blocks until the subscriber has stopped (its context ended) and
// every goroutine and socket it started is gone.
func (s *Subscriber) Wait() { <-s.done }

func (s *Subscriber) update(f func(*Stats)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

// Causes of limited log lines (limited).
const (
	causeDecode  = "decode"
	causeFrames  = "frames"
	causeGap     = "gap"
	causeRestart = "restart"
	causeReplay  = "replay"
	causeConnect = "connect"
)

// limited logs msg at level unless a line of cause was logged less than
// LogInterval ago; a line logged after some were held back says how many
// ("suppressed").
func (s *Subscriber) limited(level hclog.Level, cause, msg string, args ...any) {
	ok, held := s.lim.Allow(cause)
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	s.log.Log(level, msg, args...)
}

// errText is err's text for a log line: it may quote the publisher's
// bytes, so it is bounded and control-escaped (untrusted.Text).
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return untrusted.Text(err.Error(), untrusted.MaxLog)
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	s.o.Backoff.Reset()
	lastErr := "" // the failure last logged at warn since a connection was made
	for ctx.Err() == nil {
		connected, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			s.o.Backoff.Reset()
			lastErr = ""
		}
		s.update(func(st *Stats) { st.State = StateConnecting })
		wait := s.o.Backoff.NextBackOff()
		if wait == backoff.Stop {
			wait = 5 * time.Second
		}
		// An engine that stays down fails every retry alike: its first
		// failure is a warning, the same one again only debug, as a
		// worker's repeated probe failure; a new failure is a warning at
		// most once per LogInterval.
		msg := errText(err)
		if msg == lastErr {
			s.log.Debug("kv events: connection lost; reconnecting", "endpoint", s.o.Endpoint, "error", msg, "in", wait)
		} else {
			lastErr = msg
			if ok, held := s.lim.Allow(causeConnect); ok {
				args := []any{"endpoint", s.o.Endpoint, "error", msg, "in", wait}
				if held > 0 {
					args = append(args, "suppressed", held)
				}
				s.log.Warn("kv events: connection lost; reconnecting", args...)
			} else {
				s.log.Debug("kv events: connection lost; reconnecting", "endpoint", s.o.Endpoint, "error", msg, "in", wait)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session connects once and follows the stream until it breaks or ctx
// ends; connected reports whether a connection was made.
func (s *Subscriber) session(ctx context.Context) (connected bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.o.Topic); err != nil {
		return false, err
	}
	if err := sub.Dial(bounded(s.o.Endpoint)); err != nil {
		return false, err
	}
	s.update(func(st *Stats) {
		st.Connects++
		if st.State == StateConnecting {
			st.State = StateCold
		}
	})
	for {
		msg, err := sub.Recv()
		if err != nil {
			return true, err
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.update(func(st *Stats) { st.BadMessages++ })
			s.limited(hclog.Warn, causeFrames, "kv events: message without [topic, sequence, payload]; ignored",
				"endpoint", s.o.Endpoint, "frames", len(msg.Frames))
			continue
		}
		s.handle(ctx, binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
	}
}

// handle applies one published batch, detecting gaps and restarts.
func (s *Subscriber) handle(ctx context.Context, seq uint64, payload []byte) {
	st := s.Stats()
	if st.HasSeq && seq <= st.LastSeq { // the engine restarted: sequences begin again
		s.limited(hclog.Info, causeRestart, "kv events: sequence went back; engine restart", "endpoint", s.o.Endpoint, "last", st.LastSeq, "seq", seq)
		s.sink.Clear()
		s.update(func(st *Stats) { st.Gaps++; st.HasSeq = false; st.State = StateCold })
		st.HasSeq = false
	}
	switch {
	case st.HasSeq && seq == st.LastSeq+1:
	case !st.HasSeq && seq == 0:
		s.sink.MarkLive()
		s.update(func(st *Stats) { st.State = StateLive })
	default: // a jump, or a first message mid-stream
		from := uint64(0)
		if st.HasSeq {
			from = st.LastSeq + 1
			s.update(func(st *Stats) { st.Gaps++ })
			s.limited(hclog.Info, causeGap, "kv events: sequence gap", "endpoint", s.o.Endpoint, "last", st.LastSeq, "seq", seq)
		}
		if !s.replay(ctx, from, seq) {
			s.startCold()
		}
	}
	s.apply(seq, payload)
}

// startCold clears the sink and continues cold.
func (s *Subscriber) startCold() {
	s.sink.Clear()
	s.update(func(st *Stats) { st.State = StateCold; st.HasSeq = false })
}

// apply decodes and applies one batch under seq.
func (s *Subscriber) apply(seq uint64, payload []byte) {
	if err := s.dec.Decode(payload, &s.b); err != nil {
		s.limited(hclog.Warn, causeDecode, "kv events: batch not applied; the index is cleared (counted in DecodeErrors)",
			"endpoint", s.o.Endpoint, "seq", seq, "bytes", len(payload), "error", errText(err))
		s.sink.Clear()
		s.update(func(st *Stats) { st.DecodeErrors++; st.LastSeq, st.HasSeq = seq, true; st.State = StateCold })
		return
	}
	if s.o.HasRank && s.b.HasDataParallelRank && s.b.DataParallelRank != s.o.Rank {
		s.update(func(st *Stats) { st.WrongRank++; st.LastSeq, st.HasSeq = seq, true })
		return
	}
	s.sink.Apply(&s.b)
	events, blocks := uint64(len(s.b.Events)), uint64(s.b.BlockEvents())
	now := time.Now()
	s.update(func(st *Stats) {
		st.Batches++
		st.Events += events
		st.BlockEvents += blocks
		st.LastSeq, st.HasSeq, st.LastEvent = seq, true, now
	})
}

// replay asks the replay endpoint for the batches from..until-1 and
// applies them; it reports whether they all arrived in order (the stream
// is then complete from its start when from was 0 or it was live). The
// answers go on to the end marker; those from until on are left to the
// PUB socket.
func (s *Subscriber) replay(ctx context.Context, from, until uint64) bool {
	if s.o.ReplayEndpoint == "" {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, s.o.ReplayTimeout)
	defer cancel()
	ok, err := s.replayOnce(rctx, from, until)
	if err != nil || !ok {
		s.limited(hclog.Warn, causeReplay, "kv events: replay failed", "endpoint", s.o.ReplayEndpoint, "from", from, "error", errText(err))
		s.update(func(st *Stats) { st.ReplayFailures++ })
		return false
	}
	s.update(func(st *Stats) { st.Replays++ })
	if from == 0 || s.Stats().State == StateLive {
		s.sink.MarkLive()
		s.update(func(st *Stats) { st.State = StateLive })
	}
	return true
}

func (s *Subscriber) replayOnce(ctx context.Context, from, until uint64) (bool, error) {
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0))
	defer d.Close()
	if err := d.Dial(bounded(s.o.ReplayEndpoint)); err != nil {
		return false, err
	}
	if err := d.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return false, err
	}
	next := from
	for range maxReplayBatches {
		msg, err := d.Recv()
		if err != nil {
			return false, err
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 { // the empty delimiter
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return false, fmt.Errorf("replay answer of %d frames, want [sequence, payload]", len(f))
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == ^uint64(0) { // end marker
			return next >= until, nil
		}
		switch {
		case seq < next || seq >= until: // before the gap, or coming by PUB too
			continue
		case seq > next:
			return false, fmt.Errorf("replay starts at %d, want %d: the engine no longer buffers it", seq, next)
		}
		s.apply(seq, f[1])
		next = seq + 1
	}
	return false, fmt.Errorf("replay over %d batches", maxReplayBatches)
}
