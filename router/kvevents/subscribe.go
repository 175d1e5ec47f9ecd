package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-zeromq/zmq4"
	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// State is a subscriber's stream state.
type State uint8

// The states. The values of the first three are those of the first
// releases; the others were added after them.
const (
	// StateConnecting: no connection to the publisher yet (or it broke;
	// the sink was cleared then).
	StateConnecting State = iota
	// StateCold: connected, but the stream is not known complete (it
	// began mid-way, or a gap could not be replayed, or a snapshot could
	// not be had): the sink was cleared and scores the candidate
	// approximately until warm.
	StateCold
	// StateLive: the sink holds the engine's state exactly: every batch
	// since the engine's start was applied, or a snapshot and every batch
	// after its cut.
	StateLive
	// StateBootstrapping: a snapshot was asked for (Options.SnapshotEndpoint)
	// and the live messages are buffered until it comes; the sink is cold.
	StateBootstrapping
	// StateStale: a publisher that sends heartbeats sent nothing for
	// Options.HeartbeatTimeout; the sink was cleared, and the subscriber
	// connects again after the recovery backoff.
	StateStale
)

// String names s: "connecting", "cold", "live", "bootstrapping" or "stale".
func (s State) String() string {
	names := [...]string{"connecting", "cold", "live", "bootstrapping", "stale"}
	if int(s) < len(names) {
		return names[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// SnapshotFailure is why a snapshot bootstrap failed (Stats.SnapshotFailures
// is indexed by it).
type SnapshotFailure uint8

// The snapshot failures.
const (
	// SnapshotUnavailable: the publisher answered cut -2 (vLLM's
	// SNAPSHOT_UNAVAILABLE_SEQ: its recorder failed, over a budget or
	// missing metadata, and stays failed until the engine restarts). The
	// subscriber follows that publisher by replay where offered, else
	// live-only, until its identity changes.
	SnapshotUnavailable SnapshotFailure = iota
	// SnapshotTimeout: no reply within Options.SnapshotTimeout.
	SnapshotTimeout
	// SnapshotTransport: the snapshot endpoint could not be reached, or
	// the exchange broke.
	SnapshotTransport
	// SnapshotTooLarge: the reply was over Options.MaxSnapshotBytes (the
	// connection was closed at the frame that passed it).
	SnapshotTooLarge
	// SnapshotInvalid: the reply is not [cut (8 bytes), publisher id (16
	// bytes), chunk...], or a chunk does not decode or names another
	// data-parallel rank.
	SnapshotInvalid
	// SnapshotBuffer: the live messages buffered during the bootstrap
	// passed Options.MaxBufferMessages or Options.MaxBufferBytes.
	SnapshotBuffer
	// SnapshotStream: the publisher restarted during the bootstrap (the
	// reply names another publisher id), or the buffered messages after
	// the cut are not consecutive.
	SnapshotStream
	// NumSnapshotFailures is the number of reasons.
	NumSnapshotFailures
)

// String names f as its metric label: "unavailable", "timeout",
// "transport", "too_large", "invalid", "buffer" or "stream".
func (f SnapshotFailure) String() string {
	names := [...]string{"unavailable", "timeout", "transport", "too_large", "invalid", "buffer", "stream"}
	if int(f) < len(names) {
		return names[f]
	}
	return "SnapshotFailure(" + strconv.Itoa(int(f)) + ")"
}

// Signal is what showed that the engine restarted, or may have
// (Stats.Restarts is indexed by it). Each clears the sink at once.
type Signal uint8

// The signals.
const (
	// SignalPublisherID: the publisher's 16-byte identity changed (vLLM
	// with a snapshot endpoint draws one per publisher lifetime), or the
	// sequence frame changed between 8 and 24 bytes.
	SignalPublisherID Signal = iota
	// SignalSequence: the sequence went back (or repeated).
	SignalSequence
	// SignalDisconnect: the connection to the PUB socket broke.
	SignalDisconnect
	// SignalHeartbeat: a publisher that sends heartbeats sent nothing for
	// Options.HeartbeatTimeout.
	SignalHeartbeat
	// SignalEngine: Subscriber.EngineRestarted, a signal from outside the
	// stream (the engine's metrics).
	SignalEngine
	// NumSignals is the number of signals.
	NumSignals
)

// String names s as its metric label: "publisher_id", "sequence",
// "disconnect", "heartbeat" or "engine".
func (s Signal) String() string {
	names := [...]string{"publisher_id", "sequence", "disconnect", "heartbeat", "engine"}
	if int(s) < len(names) {
		return names[s]
	}
	return "Signal(" + strconv.Itoa(int(s)) + ")"
}

// DefaultReplayTimeout bounds one replay exchange.
const DefaultReplayTimeout = 10 * time.Second

// Snapshot defaults, from vLLM's snapshot recorder and the consumers of
// its branch (vMaroon/vllm@08ee3e54 vllm/distributed/kv_events_snapshot.py
// and examples/others/kv_snapshot_poc/client.py; llm-d-router PR 2946,
// vMaroon/llm-d-router@0c7fe8d3 pkg/kvevents/snapshot.go).
const (
	// DefaultSnapshotTimeout bounds one snapshot exchange, from the
	// request to the whole reply: the PoC client's bootstrap timeout and
	// llm-d's snapshotTimeout.
	DefaultSnapshotTimeout = 10 * time.Second
	// DefaultHeartbeatTimeout is how long a publisher that sends
	// heartbeats (an empty batch each idle second) may stay silent before
	// it is stale: the PoC client's 5 s and llm-d's heartbeatTimeout.
	DefaultHeartbeatTimeout = 5 * time.Second
	// DefaultMaxSnapshotBytes bounds a snapshot reply (every frame) and
	// each of its chunks: vLLM's MAX_REPLY_BYTES, 256 MiB; the publisher
	// answers unavailable rather than send more.
	DefaultMaxSnapshotBytes = 256 << 20
	// MaxSnapshotBytesLimit is the largest Options.MaxSnapshotBytes.
	MaxSnapshotBytesLimit = 1 << 30
	// DefaultMaxBufferBytes bounds the payloads of the live messages
	// buffered during a bootstrap: the PoC client's MAX_BUFFER_BYTES and
	// llm-d's snapshotBufferBytes, 64 MiB.
	DefaultMaxBufferBytes = 64 << 20
	// DefaultMaxBufferMessages bounds the live messages buffered during a
	// bootstrap: 4096, the recorder's pending-batch bound and llm-d's.
	DefaultMaxBufferMessages = 4096
	// DefaultRecoveryInitial and DefaultRecoveryMax pace the retries of
	// a failed bootstrap and the reconnection after a heartbeat timeout:
	// exponential with ±50% jitter from 1 s, capped at 30 s (llm-d's
	// retryInitial and retryMaximum).
	DefaultRecoveryInitial = time.Second
	DefaultRecoveryMax     = 30 * time.Second
)

// DefaultLogInterval is how often a subscriber logs at most one line per
// cause of trouble coming from the publisher (a payload that does not
// decode, a message that is not three frames, a gap, a restart, a failed
// replay or snapshot): a publisher sending garbage costs a line per
// interval, not a line per message. The lines held back are counted in
// the next line's "suppressed".
const DefaultLogInterval = 10 * time.Second

// maxReplayBatches bounds the answers of one replay: vLLM buffers 10,000
// batches by default; ten times that is refused as a misbehaving peer.
const maxReplayBatches = 100_000

// snapshotRequest is the request frame, as vLLM's PoC client and llm-d
// send it (the recorder takes any single frame).
var snapshotRequest = []byte("snapshot")

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
	// SnapshotEndpoint, when not "", is the engine's snapshot ROUTER
	// socket (vLLM's snapshot_endpoint, PR 57789): a publisher whose
	// messages carry its identity (24-byte sequence frames) is followed by
	// bootstrapping from a snapshot, and a gap or a restart bootstraps
	// again. A publisher without identities, or one answering
	// unavailable, is followed by replay (ReplayEndpoint) or live-only.
	SnapshotEndpoint string
	// Rank, when HasRank, is the data-parallel rank the endpoint serves:
	// batches naming another data_parallel_rank are skipped and counted.
	Rank    int64
	HasRank bool
	// ReplayTimeout bounds one replay exchange; 0: DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// SnapshotTimeout bounds one snapshot exchange; 0:
	// DefaultSnapshotTimeout.
	SnapshotTimeout time.Duration
	// HeartbeatTimeout is how long a publisher that sends heartbeats
	// (24-byte sequence frames) may stay silent before the sink is cleared
	// and the subscriber connects again; 0: DefaultHeartbeatTimeout. A
	// publisher with 8-byte sequence frames sends none and may stay silent
	// for ever.
	HeartbeatTimeout time.Duration
	// MaxSnapshotBytes bounds a snapshot reply, every frame counted, and
	// each chunk's decoding; 0: DefaultMaxSnapshotBytes; at most
	// MaxSnapshotBytesLimit.
	MaxSnapshotBytes int
	// MaxBufferBytes and MaxBufferMessages bound the live messages
	// buffered during a bootstrap (payload bytes, messages); past either
	// the bootstrap fails (SnapshotBuffer) and is retried. 0:
	// DefaultMaxBufferBytes, DefaultMaxBufferMessages.
	MaxBufferBytes    int
	MaxBufferMessages int
	// Backoff paces reconnections; nil: exponential from 100 ms to 5 s,
	// never giving up (cenkalti/backoff defaults otherwise).
	Backoff backoff.BackOff
	// RecoveryBackoff paces the retries of a failed or lost snapshot
	// bootstrap and the reconnection after a heartbeat timeout; it is
	// reset by a bootstrap that succeeds. nil: exponential with ±50%
	// jitter from DefaultRecoveryInitial to DefaultRecoveryMax, never
	// giving up.
	RecoveryBackoff backoff.BackOff
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
	// StateSince is when State last changed (the subscriber's start at
	// first).
	StateSince time.Time
	// Batches and Events count applied batches (snapshot chunks
	// included) and their events; BlockEvents their blocks stored or
	// removed (Batch.BlockEvents).
	Batches, Events, BlockEvents uint64
	// Gaps counts sequence jumps and restarts (a sequence going back);
	// Replays, gaps filled by a replay; ReplayFailures, replays that
	// failed or came back incomplete (the sink was cleared instead).
	Gaps, Replays, ReplayFailures uint64
	// Snapshots counts bootstraps completed from a snapshot;
	// SnapshotFailures, those that failed, by reason.
	Snapshots        uint64
	SnapshotFailures [NumSnapshotFailures]uint64
	// Restarts counts the engine restarts detected (or suspected: a
	// broken connection, a silent publisher), by the signal that showed
	// it; each cleared the sink at once.
	Restarts [NumSignals]uint64
	// DecodeErrors counts payloads that did not decode (each also clears
	// the sink); BadMessages, messages that were not [topic, sequence,
	// payload] with an 8- or 24-byte sequence (ignored); WrongRank,
	// batches of another data-parallel rank.
	DecodeErrors, BadMessages, WrongRank uint64
	// Connects counts connections made.
	Connects uint64
	// LastSeq is the last applied sequence number, when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// PublisherID is the publisher's 16-byte identity, when
	// HasPublisherID (its last message had a 24-byte sequence frame).
	PublisherID    [16]byte
	HasPublisherID bool
	// LastEvent is when the last batch was applied (zero before).
	LastEvent time.Time
}

// setState sets st's state, and StateSince when it changes.
func (st *Stats) setState(s State) {
	if st.State != s {
		st.State, st.StateSince = s, time.Now()
	}
}

// Subscriber follows one engine endpoint's KV events into a Sink.
type Subscriber struct {
	o       Options
	sink    Sink
	log     hclog.Logger
	lim     *untrusted.Limiter // log lines per cause
	dec     Decoder
	snapDec Decoder // snapshot chunks, bounded by MaxSnapshotBytes
	b       Batch
	done    chan struct{}
	restart chan struct{} // EngineRestarted's signals, at most one pending

	mu sync.Mutex
	st Stats
}

// ErrOptions: Subscribe's options are unusable.
var ErrOptions = errors.New("kv events: bad subscriber options")

// zmqEndpoint reports whether e is a tcp:// or ipc:// endpoint.
func zmqEndpoint(e string) bool {
	return strings.HasPrefix(e, "tcp://") || strings.HasPrefix(e, "ipc://")
}

// Subscribe starts following o.Endpoint into sink until ctx ends; Wait
// returns once it has stopped. Errors wrap ErrOptions.
func Subscribe(ctx context.Context, o Options, sink Sink) (*Subscriber, error) {
	if !zmqEndpoint(o.Endpoint) {
		return nil, fmt.Errorf("%w: endpoint %q, want tcp://host:port or ipc://path", ErrOptions, untrusted.Text(o.Endpoint, untrusted.MaxLog))
	}
	if o.ReplayEndpoint != "" && !zmqEndpoint(o.ReplayEndpoint) {
		return nil, fmt.Errorf("%w: replay endpoint %q, want tcp://host:port or ipc://path", ErrOptions, untrusted.Text(o.ReplayEndpoint, untrusted.MaxLog))
	}
	if o.SnapshotEndpoint != "" && !zmqEndpoint(o.SnapshotEndpoint) {
		return nil, fmt.Errorf("%w: snapshot endpoint %q, want tcp://host:port or ipc://path", ErrOptions, untrusted.Text(o.SnapshotEndpoint, untrusted.MaxLog))
	}
	if sink == nil {
		return nil, fmt.Errorf("%w: no sink", ErrOptions)
	}
	if o.MaxPayload < 0 || o.MaxPayload > MaxFrameBytes {
		return nil, fmt.Errorf("%w: payload limit %d bytes, want 0 to %d", ErrOptions, o.MaxPayload, MaxFrameBytes)
	}
	if o.MaxSnapshotBytes < 0 || o.MaxSnapshotBytes > MaxSnapshotBytesLimit {
		return nil, fmt.Errorf("%w: snapshot limit %d bytes, want 0 to %d", ErrOptions, o.MaxSnapshotBytes, MaxSnapshotBytesLimit)
	}
	if o.MaxBufferBytes < 0 || o.MaxBufferMessages < 0 {
		return nil, fmt.Errorf("%w: negative bootstrap buffer bound", ErrOptions)
	}
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = DefaultReplayTimeout
	}
	if o.SnapshotTimeout <= 0 {
		o.SnapshotTimeout = DefaultSnapshotTimeout
	}
	if o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.MaxSnapshotBytes == 0 {
		o.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	if o.MaxBufferBytes == 0 {
		o.MaxBufferBytes = DefaultMaxBufferBytes
	}
	if o.MaxBufferMessages == 0 {
		o.MaxBufferMessages = DefaultMaxBufferMessages
	}
	if o.LogInterval <= 0 {
		o.LogInterval = DefaultLogInterval
	}
	if o.Backoff == nil {
		eb := backoff.NewExponentialBackOff()
		eb.InitialInterval, eb.MaxInterval, eb.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, 0
		o.Backoff = eb
	}
	if o.RecoveryBackoff == nil {
		eb := backoff.NewExponentialBackOff()
		eb.InitialInterval, eb.MaxInterval, eb.MaxElapsedTime = DefaultRecoveryInitial, DefaultRecoveryMax, 0
		eb.RandomizationFactor = 0.5
		o.RecoveryBackoff = eb
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	s := &Subscriber{o: o, sink: sink, log: o.Logger, lim: untrusted.NewLimiter(o.LogInterval),
		done: make(chan struct{}), restart: make(chan struct{}, 1),
		dec: Decoder{MaxPayload: o.MaxPayload}, snapDec: Decoder{MaxPayload: o.MaxSnapshotBytes}}
	s.st.StateSince = time.Now()
	go s.run(ctx)
	return s, nil
}

// RankEndpoint is the endpoint data-parallel rank serves when rank 0
// serves endpoint, as vLLM's offset_endpoint_port: a tcp port plus rank
// (a port of 0, bound by the system, is left alone: vLLM PR 55844), an
// ipc/inproc path suffixed "_dp<rank>".
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
		return "", fmt.Errorf("%w: endpoint %q has no port", ErrOptions, untrusted.Text(endpoint, untrusted.MaxLog))
	}
	if port == 0 {
		return endpoint, nil
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

// EngineRestarted tells the subscriber its engine restarted, as seen from
// outside the stream (the engine's metrics: its process start time grew,
// or its counters went back). The sink is cleared as soon as the
// subscriber's goroutine takes the signal (between two batches), the
// restart counted (SignalEngine), and the stream followed again from
// scratch: a new snapshot bootstrap, a replay from 0, or cold. A
// disconnected subscriber connects again at once. It does not block;
// signals arriving while one is pending are one signal.
func (s *Subscriber) EngineRestarted() {
	select {
	case s.restart <- struct{}{}:
	default:
	}
}

func (s *Subscriber) update(f func(*Stats)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

// Causes of limited log lines (limited).
const (
	causeDecode   = "decode"
	causeFrames   = "frames"
	causeGap      = "gap"
	causeRestart  = "restart"
	causeReplay   = "replay"
	causeConnect  = "connect"
	causeSnapshot = "snapshot"
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

// errHeartbeat ends a session whose publisher went silent.
var errHeartbeat = errors.New("no message from a publisher that sends heartbeats")

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	s.o.Backoff.Reset()
	s.o.RecoveryBackoff.Reset()
	lastErr := "" // the failure last logged at warn since a connection was made
	for ctx.Err() == nil {
		connected, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		stale := errors.Is(err, errHeartbeat)
		if connected {
			s.o.Backoff.Reset()
			lastErr = ""
			if !stale {
				// The engine's state is unknown from here (it may be
				// restarting): forget it at once.
				s.sink.Clear()
				s.update(func(st *Stats) { st.Restarts[SignalDisconnect]++; st.HasSeq = false })
			}
		}
		var wait time.Duration
		if stale {
			wait = s.o.RecoveryBackoff.NextBackOff()
		} else {
			wait = s.o.Backoff.NextBackOff()
			s.update(func(st *Stats) { st.setState(StateConnecting) })
		}
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
		case <-s.restart:
			// The engine restarted while the subscriber was not
			// connected: nothing is kept (cleared at the disconnect; once
			// more in case), and the new engine is tried at once.
			t.Stop()
			s.sink.Clear()
			s.update(func(st *Stats) { st.Restarts[SignalEngine]++; st.HasSeq = false; st.HasPublisherID = false })
			s.o.Backoff.Reset()
		case <-t.C:
		}
	}
}

// follow is one session's view of the publisher, owned by the session's
// goroutine.
type follow struct {
	seen  bool     // a message was taken in this session
	hasID bool     // its sequence frame had the publisher's identity
	id    [16]byte // that identity
	beats bool     // the publisher sends heartbeats (24-byte frames seen)
	// Snapshot following: synced while the sink holds a snapshot and
	// every batch after it; noSnap once the publisher (this identity)
	// answered unavailable.
	synced, noSnap bool
	boot           *bootstrap // the bootstrap in progress
	retry          *time.Timer
	wg             *sync.WaitGroup // the session's goroutines
}

// bootstrap is a snapshot exchange in progress and the live messages
// buffered meanwhile.
type bootstrap struct {
	msgs   []liveMsg
	bytes  int
	reply  chan snapReply // one reply
	cancel context.CancelFunc
}

type liveMsg struct {
	seq     uint64
	payload []byte
}

type snapReply struct {
	frames [][]byte
	err    error
}

// retrying reports whether a bootstrap is to be retried later.
func (f *follow) retrying() bool { return f.retry != nil }

// stopRetry cancels a pending retry.
func (f *follow) stopRetry() {
	if f.retry != nil {
		f.retry.Stop()
		f.retry = nil
	}
}

// abortBoot cancels the bootstrap in progress.
func (f *follow) abortBoot() {
	if f.boot != nil {
		f.boot.cancel()
		f.boot = nil
	}
}

// session connects once and follows the stream until it breaks or ctx
// ends; connected reports whether a connection was made.
func (s *Subscriber) session(ctx context.Context) (connected bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0))
	f := &follow{wg: &wg}
	defer func() {
		f.abortBoot()
		f.stopRetry()
		cancel()
		_ = sub.Close()
		wg.Wait()
	}()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.o.Topic); err != nil {
		return false, err
	}
	if err := sub.Dial(bounded(s.o.Endpoint)); err != nil {
		return false, err
	}
	s.update(func(st *Stats) {
		st.Connects++
		if st.State == StateConnecting || st.State == StateStale {
			st.setState(StateCold)
		}
	})
	// The reader hands the messages over one by one: a sink slower than
	// the publisher holds the socket back (the engine's PUB socket drops
	// past its high-water mark, which shows as a gap), and a bootstrap
	// buffers what arrives meanwhile, bounded.
	msgs := make(chan zmq4.Msg)
	rerr := make(chan error, 1)
	var last atomic.Int64 // when the reader last received a message, Unix ns
	last.Store(time.Now().UnixNano())
	wg.Go(func() {
		defer func() {
			<-sctx.Done()
			drainDone(sub)
		}()
		for {
			m, err := sub.Recv()
			if err != nil {
				rerr <- err
				return
			}
			last.Store(time.Now().UnixNano())
			select {
			case msgs <- m:
			case <-sctx.Done():
				return
			}
		}
	})
	hb := time.NewTimer(s.o.HeartbeatTimeout)
	defer hb.Stop()
	for {
		var reply <-chan snapReply
		if f.boot != nil {
			reply = f.boot.reply
		}
		var retry <-chan time.Time
		if f.retry != nil {
			retry = f.retry.C
		}
		var beat <-chan time.Time
		if f.beats {
			beat = hb.C
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-rerr:
			return true, err
		case m := <-msgs:
			s.take(sctx, f, m)
			if f.beats {
				hb.Reset(s.o.HeartbeatTimeout)
			}
		case r := <-reply:
			s.finishBootstrap(sctx, f, r)
		case <-retry:
			f.retry = nil // the next message starts the bootstrap
		case <-beat:
			// A message waiting to be taken (the loop was busy: a long
			// replay or snapshot) or received lately means the publisher
			// is there.
			select {
			case m := <-msgs:
				s.take(sctx, f, m)
				hb.Reset(s.o.HeartbeatTimeout)
				continue
			default:
			}
			if quiet := time.Since(time.Unix(0, last.Load())); quiet < s.o.HeartbeatTimeout {
				hb.Reset(s.o.HeartbeatTimeout - quiet)
				continue
			}
			s.limited(hclog.Warn, causeRestart, "kv events: no heartbeat from the publisher; the index is cleared and the subscriber connects again",
				"endpoint", s.o.Endpoint, "timeout", s.o.HeartbeatTimeout)
			s.sink.Clear()
			s.update(func(st *Stats) { st.Restarts[SignalHeartbeat]++; st.HasSeq = false; st.setState(StateStale) })
			return true, errHeartbeat
		case <-s.restart:
			s.limited(hclog.Info, causeRestart, "kv events: the engine restarted (seen from outside the stream); the index is cleared", "endpoint", s.o.Endpoint)
			s.restarted(f, SignalEngine)
			// Its next message is taken as a new publisher's, whatever
			// its identity.
			f.seen = false
			s.update(func(st *Stats) { st.HasPublisherID = false })
		}
	}
}

// drainDone takes what zmq4 queued for sock once sock's context has
// ended: zmq4 v0.17.0's reader goroutine of a connection sends each
// message it reads to a queue of 10 without watching the context, so a
// socket left with a full queue would keep that goroutine blocked for
// ever. Recv on a socket whose context ended returns a queued message or
// the context's error at random (a select), so 16 errors in a row mean
// the queue is empty but for a chance of 2^-16; taking one message is
// enough for the blocked reader to see the context and end.
func drainDone(sock zmq4.Socket) {
	for misses := 0; misses < 16; {
		if _, err := sock.Recv(); err != nil {
			misses++
		}
	}
}

// restarted drops what the sink knows of the engine, counted under sig,
// and follows the stream again from scratch (a new bootstrap at the next
// message).
func (s *Subscriber) restarted(f *follow, sig Signal) {
	f.abortBoot()
	f.stopRetry()
	f.synced, f.noSnap = false, false
	s.sink.Clear()
	s.update(func(st *Stats) {
		st.Restarts[sig]++
		st.HasSeq = false
		st.setState(StateCold)
	})
}

// take handles one message from the SUB socket.
func (s *Subscriber) take(ctx context.Context, f *follow, m zmq4.Msg) {
	fr := m.Frames
	if len(fr) != 3 || len(fr[1]) != 8 && len(fr[1]) != 24 {
		s.update(func(st *Stats) { st.BadMessages++ })
		size := -1
		if len(fr) > 1 {
			size = len(fr[1])
		}
		s.limited(hclog.Warn, causeFrames, "kv events: message without [topic, sequence, payload]; ignored",
			"endpoint", s.o.Endpoint, "frames", len(fr), "sequence_bytes", size)
		return
	}
	seq := binary.BigEndian.Uint64(fr[1][:8])
	hasID := len(fr[1]) == 24
	var id [16]byte
	if hasID {
		copy(id[:], fr[1][8:])
	}
	if f.seen && (hasID != f.hasID || id != f.id) {
		s.limited(hclog.Info, causeRestart, "kv events: the publisher's identity changed; engine restart", "endpoint", s.o.Endpoint,
			"had_identity", f.hasID, "has_identity", hasID)
		s.restarted(f, SignalPublisherID)
	}
	f.seen, f.hasID, f.id = true, hasID, id
	f.beats = f.beats || hasID
	s.update(func(st *Stats) { st.PublisherID, st.HasPublisherID = id, hasID })
	if hasID && s.o.SnapshotEndpoint != "" && !f.noSnap {
		s.snapshotFollow(ctx, f, seq, fr[2])
		return
	}
	s.handle(ctx, seq, fr[2], true)
}

// snapshotFollow handles one message of a publisher followed by
// snapshots: buffered while a bootstrap is in progress, applied when the
// sink is synced and it is the next, else it starts a bootstrap (or,
// while a retry is pending, is applied live-only).
func (s *Subscriber) snapshotFollow(ctx context.Context, f *follow, seq uint64, payload []byte) {
	switch {
	case f.boot != nil:
		b := f.boot
		if len(b.msgs)+1 > s.o.MaxBufferMessages || b.bytes+len(payload) > s.o.MaxBufferBytes {
			s.bootFailed(f, SnapshotBuffer, fmt.Errorf("over %d messages or %d bytes buffered during the bootstrap", s.o.MaxBufferMessages, s.o.MaxBufferBytes))
			return
		}
		b.msgs = append(b.msgs, liveMsg{seq, payload})
		b.bytes += len(payload)
	case f.synced:
		st := s.Stats()
		next := uint64(0)
		if st.HasSeq {
			next = st.LastSeq + 1
		}
		switch {
		case seq < next: // already applied
		case seq > next:
			s.update(func(st *Stats) { st.Gaps++ })
			s.limited(hclog.Info, causeGap, "kv events: sequence gap; the index is cleared and bootstrapped again", "endpoint", s.o.Endpoint, "next", next, "seq", seq)
			f.synced = false
			s.startCold()
			s.retryLater(f)
		default:
			if !s.apply(seq, payload) { // the sink was cleared
				f.synced = false
				s.retryLater(f)
			}
		}
	case f.retrying():
		// Until the next attempt, the batches keep the sink as a
		// publisher without snapshots would (cold, warm by its own rule).
		s.handle(ctx, seq, payload, false)
	default:
		s.startBootstrap(ctx, f, seq, payload)
	}
}

// startBootstrap asks for a snapshot and buffers the message that showed
// the subscription delivers (vLLM's handoff: a live message first).
func (s *Subscriber) startBootstrap(ctx context.Context, f *follow, seq uint64, payload []byte) {
	bctx, cancel := context.WithTimeout(ctx, s.o.SnapshotTimeout)
	b := &bootstrap{msgs: []liveMsg{{seq, payload}}, bytes: len(payload), reply: make(chan snapReply, 1), cancel: cancel}
	f.boot = b
	s.update(func(st *Stats) { st.setState(StateBootstrapping) })
	f.wg.Go(func() {
		frames, err := s.requestSnapshot(bctx)
		b.reply <- snapReply{frames, err}
	})
}

// requestSnapshot sends one request on a DEALER socket (with the empty
// delimiter a REQ socket would add) and returns the reply's frames after
// the delimiter. The whole reply is bounded by MaxSnapshotBytes as it is
// read.
func (s *Subscriber) requestSnapshot(ctx context.Context) ([][]byte, error) {
	lim := uint64(s.o.MaxSnapshotBytes)
	dctx, cancel := context.WithCancel(withLimits(ctx, frameLimits{frame: lim, message: lim}))
	d := zmq4.NewDealer(dctx, zmq4.WithDialerMaxRetries(0))
	defer func() {
		cancel()
		_ = d.Close()
		drainDone(d)
	}()
	fail := func(err error) ([][]byte, error) {
		if ctx.Err() != nil { // the exchange's time is up
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := d.Dial(bounded(s.o.SnapshotEndpoint)); err != nil {
		return fail(err)
	}
	if err := d.Send(zmq4.NewMsgFrom(nil, snapshotRequest)); err != nil {
		return fail(err)
	}
	msg, err := d.Recv()
	if err != nil {
		return fail(err)
	}
	f := msg.Frames
	if len(f) > 0 && len(f[0]) == 0 { // the empty delimiter
		f = f[1:]
	}
	return f, nil
}

// finishBootstrap takes the snapshot's reply: checks its cut and
// identity, clears the sink, applies the chunks and then the buffered
// messages after the cut, which must be consecutive, and marks the sink
// live.
func (s *Subscriber) finishBootstrap(ctx context.Context, f *follow, r snapReply) {
	b := f.boot
	f.boot = nil
	b.cancel()
	if r.err != nil {
		reason := SnapshotTransport
		switch {
		case errors.Is(r.err, context.DeadlineExceeded):
			reason = SnapshotTimeout
		case errors.Is(r.err, errFrameTooLarge):
			reason = SnapshotTooLarge
		}
		s.bootFailed(f, reason, r.err)
		return
	}
	fr := r.frames
	if len(fr) < 2 || len(fr[0]) != 8 || len(fr[1]) != 16 {
		sizes := make([]int, 0, 2)
		for _, x := range fr[:min(len(fr), 2)] {
			sizes = append(sizes, len(x))
		}
		s.bootFailed(f, SnapshotInvalid, fmt.Errorf("snapshot reply of %d frames starting with %v bytes, want [cut (8), publisher id (16), chunk...]", len(fr), sizes))
		return
	}
	cut := int64(binary.BigEndian.Uint64(fr[0]))
	if cut < -1 {
		// vLLM's recorder failed (-2) and stays failed until the engine
		// restarts: follow this publisher as one without snapshots.
		s.update(func(st *Stats) { st.SnapshotFailures[SnapshotUnavailable]++ })
		s.limited(hclog.Warn, causeSnapshot, "kv events: the engine's snapshot is unavailable; following it by replay or live-only until it restarts",
			"endpoint", s.o.SnapshotEndpoint, "cut", cut, "replay_endpoint", s.o.ReplayEndpoint)
		f.noSnap = true
		s.update(func(st *Stats) { st.setState(StateCold) })
		for _, m := range b.msgs {
			s.handle(ctx, m.seq, m.payload, true)
		}
		return
	}
	if !bytes.Equal(fr[1], f.id[:]) {
		s.bootFailed(f, SnapshotStream, errors.New("the snapshot is of another publisher identity: the engine restarted during the bootstrap"))
		return
	}
	if cc, ok := s.sink.(ColdClearer); ok {
		cc.ClearCold()
	} else {
		s.sink.Clear()
	}
	for i, chunk := range fr[2:] {
		if err := s.applyChunk(chunk); err != nil {
			s.bootFailed(f, SnapshotInvalid, fmt.Errorf("snapshot chunk %d: %w", i, err))
			return
		}
	}
	next := uint64(cut + 1)
	s.update(func(st *Stats) { st.LastSeq, st.HasSeq = uint64(cut), cut >= 0 })
	for _, m := range b.msgs {
		if cut >= 0 && m.seq <= uint64(cut) {
			continue
		}
		if m.seq != next {
			s.bootFailed(f, SnapshotStream, fmt.Errorf("gap during the bootstrap: batch %d buffered, %d expected after the cut %d", m.seq, next, cut))
			return
		}
		if !s.apply(m.seq, m.payload) {
			s.bootFailed(f, SnapshotInvalid, fmt.Errorf("buffered batch %d does not decode", m.seq))
			return
		}
		next++
	}
	s.sink.MarkLive()
	f.synced = true
	s.o.RecoveryBackoff.Reset()
	s.update(func(st *Stats) { st.Snapshots++; st.setState(StateLive) })
	s.log.Debug("kv events: bootstrapped from a snapshot", "endpoint", s.o.SnapshotEndpoint, "cut", cut, "chunks", len(fr)-2, "next", next)
}

// bootFailed counts a failed bootstrap, clears the sink (it may hold part
// of a snapshot) and retries after the recovery backoff.
func (s *Subscriber) bootFailed(f *follow, reason SnapshotFailure, err error) {
	f.abortBoot()
	s.update(func(st *Stats) { st.SnapshotFailures[reason]++ })
	s.limited(hclog.Warn, causeSnapshot, "kv events: snapshot bootstrap failed; retrying", "endpoint", s.o.SnapshotEndpoint,
		"reason", reason.String(), "error", errText(err))
	s.startCold()
	s.retryLater(f)
}

// retryLater schedules the next bootstrap after the recovery backoff.
func (s *Subscriber) retryLater(f *follow) {
	f.stopRetry()
	wait := s.o.RecoveryBackoff.NextBackOff()
	if wait == backoff.Stop {
		wait = DefaultRecoveryMax
	}
	f.retry = time.NewTimer(wait)
}

// applyChunk applies one snapshot chunk (an EventBatch).
func (s *Subscriber) applyChunk(chunk []byte) error {
	if err := s.snapDec.Decode(chunk, &s.b); err != nil {
		return err
	}
	if s.o.HasRank && s.b.HasDataParallelRank && s.b.DataParallelRank != s.o.Rank {
		return fmt.Errorf("a chunk of data-parallel rank %d, want %d", s.b.DataParallelRank, s.o.Rank)
	}
	s.sink.Apply(&s.b)
	events, blocks := uint64(len(s.b.Events)), uint64(s.b.BlockEvents())
	s.update(func(st *Stats) { st.Batches++; st.Events += events; st.BlockEvents += blocks })
	return nil
}

// handle applies one published batch of a publisher followed without
// snapshots, detecting gaps and restarts; replayOK: a gap may be replayed.
func (s *Subscriber) handle(ctx context.Context, seq uint64, payload []byte, replayOK bool) {
	st := s.Stats()
	if st.HasSeq && seq <= st.LastSeq { // the engine restarted: sequences begin again
		s.limited(hclog.Info, causeRestart, "kv events: sequence went back; engine restart", "endpoint", s.o.Endpoint, "last", st.LastSeq, "seq", seq)
		s.sink.Clear()
		s.update(func(st *Stats) { st.Gaps++; st.Restarts[SignalSequence]++; st.HasSeq = false; st.setState(StateCold) })
		st.HasSeq = false
	}
	switch {
	case st.HasSeq && seq == st.LastSeq+1:
	case !st.HasSeq && seq == 0:
		s.sink.MarkLive()
		s.update(func(st *Stats) { st.setState(StateLive) })
	default: // a jump, or a first message mid-stream
		from := uint64(0)
		if st.HasSeq {
			from = st.LastSeq + 1
			s.update(func(st *Stats) { st.Gaps++ })
			s.limited(hclog.Info, causeGap, "kv events: sequence gap", "endpoint", s.o.Endpoint, "last", st.LastSeq, "seq", seq)
		}
		if !replayOK || !s.replay(ctx, from, seq) {
			s.startCold()
		}
	}
	s.apply(seq, payload)
}

// startCold clears the sink and continues cold.
func (s *Subscriber) startCold() {
	s.sink.Clear()
	s.update(func(st *Stats) { st.setState(StateCold); st.HasSeq = false })
}

// apply decodes and applies one batch under seq; false when it did not
// decode (the sink was cleared).
func (s *Subscriber) apply(seq uint64, payload []byte) bool {
	if err := s.dec.Decode(payload, &s.b); err != nil {
		s.limited(hclog.Warn, causeDecode, "kv events: batch not applied; the index is cleared (counted in DecodeErrors)",
			"endpoint", s.o.Endpoint, "seq", seq, "bytes", len(payload), "error", errText(err))
		s.sink.Clear()
		s.update(func(st *Stats) { st.DecodeErrors++; st.LastSeq, st.HasSeq = seq, true; st.setState(StateCold) })
		return false
	}
	if s.o.HasRank && s.b.HasDataParallelRank && s.b.DataParallelRank != s.o.Rank {
		s.update(func(st *Stats) { st.WrongRank++; st.LastSeq, st.HasSeq = seq, true })
		return true
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
	return true
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
		s.update(func(st *Stats) { st.setState(StateLive) })
	}
	return true
}

// replayOnce runs one replay exchange. The answers after the delimiter
// are [topic, sequence, payload] (vLLM since PR 45177, merged 2026-06-10,
// tests/distributed/test_events.py test_replay_includes_topic) or
// [sequence, payload] (vLLM before it, SGLang); the end marker is a
// sequence of -1 in either shape.
func (s *Subscriber) replayOnce(ctx context.Context, from, until uint64) (bool, error) {
	dctx, cancel := context.WithCancel(ctx)
	d := zmq4.NewDealer(dctx, zmq4.WithDialerMaxRetries(0))
	defer func() {
		// The engine's answers not read (a replay given up) would block
		// zmq4's reader goroutine: end, close and drain.
		cancel()
		_ = d.Close()
		drainDone(d)
	}()
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
		if len(f) == 3 { // the topic first
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 && len(f[0]) != 24 {
			return false, fmt.Errorf("replay answer of %d frames, want [topic, sequence, payload] or [sequence, payload]", len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(f[0][:8])
		if seq == ^uint64(0) { // end marker
			return next >= until, nil
		}
		switch {
		case seq < next || seq >= until: // before the gap, or coming by PUB too
			continue
		case seq > next:
			return false, fmt.Errorf("replay starts at %d, want %d: the engine no longer buffers it", seq, next)
		}
		if !s.apply(seq, f[1]) {
			return false, fmt.Errorf("replayed batch %d does not decode", seq)
		}
		next = seq + 1
	}
	return false, fmt.Errorf("replay over %d batches", maxReplayBatches)
}
