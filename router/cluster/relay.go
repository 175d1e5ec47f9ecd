package cluster

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/kvevents"
)

// Engine KV events through a relay (docs/replicas.md, "KV events through
// a relay").
//
// One relay per candidate (worker, data-parallel rank) with a kv_events
// block subscribes to the engine (kvevents.Subscribe) and forwards what
// its subscriber hands its Sink to the JetStream stream <cluster>-kv,
// subject switchyard.<cluster>.kv.<worker>.<rank> (the worker's name
// base64url-encoded, encodeToken). It runs wherever the candidate's lease
// (LeaseKey("relay", worker, rank)) is held: in one router replica, or in
// a `router kv-relay` sidecar. Every replica follows each of its
// candidates' subjects (kvfeed.go) into the candidate's precise index, so
// the replicas see exactly what the relay's subscriber saw: its gaps,
// replays and engine restarts are handled once, by it.
//
// A kv message, version 1 (one NATS message per Sink call):
//
//	message = op:byte body
//	apply   = 1 batch     (the batch in msgpack, kvevents.Encoder's array layout)
//	clear   = 2           (Sink.Clear)
//	live    = 3           (Sink.MarkLive)
//
// Events of a kind the decoder does not know (Kind 0) are left out of the
// re-encoded batch; the precise index skips them anyway.
//
// Fencing. Each message carries, in the header Switchyard-Relay, its
// relay's lease token (LeaseToken: drawn at random when the lease was
// taken, written in the lease's value), and the relay writes in the
// lease's value the stream sequence of its run's first message (its
// clear; noteLeaseStart). A follower watches the lease bucket and applies
// the messages of the token its candidate's lease names now, and no
// other (kvfeed.go): a late message of an older relay (two relays of one
// engine may overlap for up to a heartbeat, the old holder not yet having
// seen its lease lost), or a message published by anyone else, is
// dropped (counted stale_relay), and nothing a message says can make the
// follower drop the current relay's. When its candidate's lease changes
// hands, a follower that has read past the new relay's first message
// before its watch said so reads the stream again from it.
const relayHeader = "Switchyard-Relay"

const (
	opApply byte = 1
	opClear byte = 2
	opLive  byte = 3
)

// kvStreamBytes bounds the KV-events stream (memory storage; NATS
// reserves it against its max_memory_store): the oldest messages go first
// past it. A replica that starts reads a candidate's subject from its
// first message kept, so the stream is the history a new replica learns
// an engine's cache from; once the head is discarded a new replica's
// index of that engine stays cold (it never sees the relay's live
// message) until the engine restarts or the index fills (prefix.Precise).
const kvStreamBytes = 256 << 20

// relayRetry paces a relay's restarts (after a publish failure).
const relayRetry = time.Second

// defaultMaxPayload is NATS's default max_payload, taken while the
// server has not said its own.
const defaultMaxPayload = 1 << 20

// publishTimeout bounds one acknowledged publish.
const publishTimeout = 5 * time.Second

// RelayTarget is one candidate whose engine's KV events are relayed.
type RelayTarget struct {
	// Worker is the worker's name (the worker block's label).
	Worker string
	// Rank is the data-parallel rank: the relay subscribes to the rank's
	// endpoint (kvevents.RankEndpoint).
	Rank uint32
	// KVEvents is the worker's kv_events block.
	KVEvents config.KVEvents
	// RankEndpoints: KVEvents' endpoints are the rank's own (as the
	// engine reported them), not to be offset by Rank.
	RankEndpoints bool
}

// kvSubject returns candidate (worker, rank)'s subject on the KV stream.
func kvSubject(prefix, worker string, rank uint32) string {
	return prefix + "kv." + encodeToken(worker) + "." + strconv.FormatUint(uint64(rank), 10)
}

// kvStreamConfig is the KV-events stream of cluster name (prefix
// "switchyard.<name>.").
func kvStreamConfig(name, prefix string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name + "-kv",
		Description: "switchyard engine KV events (docs/replicas.md)",
		Subjects:    []string{prefix + "kv.>"},
		Storage:     jetstream.MemoryStorage,
		MaxBytes:    kvStreamBytes,
		Discard:     jetstream.DiscardOld,
	}
}

// relay runs t's relay while the lease is held (ctx): it publishes a clear
// (the replicas forget what a previous relay sent), then subscribes to the
// engine; a publish that fails stops the subscriber, and after relayRetry
// it starts again with a clear, so that the replicas never apply a stream
// with a hole as if it were whole. So does the stream made again (kvShare
// watch): the subscriber's new start replays the engine's batches from
// sequence 0 when the engine still buffers them.
func (x *kvShare) relay(ctx context.Context, t RelayTarget) {
	log := x.log.With("worker", t.Worker, "rank", t.Rank)
	offset := int(t.Rank)
	if t.RankEndpoints {
		offset = 0
	}
	endpoint, err := kvevents.RankEndpoint(t.KVEvents.Endpoint, offset)
	replay, snapshot := "", ""
	if err == nil && t.KVEvents.ReplayEndpoint != "" {
		replay, err = kvevents.RankEndpoint(t.KVEvents.ReplayEndpoint, offset)
	}
	if err == nil && t.KVEvents.SnapshotEndpoint != "" {
		snapshot, err = kvevents.RankEndpoint(t.KVEvents.SnapshotEndpoint, offset)
	}
	if err != nil {
		log.Error("KV events not relayed", "error", err)
		<-ctx.Done()
		return
	}
	for {
		x.mu.Lock()
		epoch := x.epoch
		x.mu.Unlock()
		sctx, fail := context.WithCancel(ctx)
		// A stream made again (NATS restarted) lost what was relayed: the
		// relay starts again on it.
		go func() {
			select {
			case <-epoch:
				log.Info("the KV events stream was made again; the relay starts again")
				fail()
			case <-sctx.Done():
			}
		}()
		s := &relaySink{x: x, ctx: sctx, fail: fail, log: log, subject: kvSubject(x.prefix, t.Worker, t.Rank),
			maxPayload: int(x.nc.MaxPayload()), token: LeaseToken(ctx)}
		if s.maxPayload <= 0 { // not told by the server yet
			s.maxPayload = defaultMaxPayload
		}
		if s.send(opClear, nil) {
			// The run starts at its clear: a follower that missed it
			// reads the stream again from there.
			x.mu.Lock()
			created := x.created
			x.mu.Unlock()
			noteLeaseStart(ctx, created.UnixNano(), s.seq)
			sub, err := kvevents.Subscribe(sctx, kvevents.Options{
				Endpoint: endpoint, Topic: t.KVEvents.Topic, ReplayEndpoint: replay, SnapshotEndpoint: snapshot,
				Rank: int64(t.Rank), HasRank: true, Logger: log.Named("kv-events"),
			}, s)
			if err != nil {
				fail()
				log.Error("KV events not relayed", "endpoint", endpoint, "error", err)
				<-ctx.Done()
				return
			}
			log.Info("relaying KV events", "endpoint", endpoint, "replay_endpoint", replay, "subject", s.subject)
			sub.Wait()
		}
		fail()
		select {
		case <-ctx.Done():
			return
		case <-epoch:
			// Started again at once.
		case <-time.After(relayRetry):
		}
	}
}

// relaySink is the kvevents.Sink of a relay's subscriber: it publishes
// each call as a kv message. Called from the subscriber's goroutine only.
type relaySink struct {
	x          *kvShare
	ctx        context.Context
	fail       context.CancelFunc
	log        hclog.Logger
	subject    string
	maxPayload int
	token      string // the lease's token (relayHeader)
	seq        uint64 // the stream sequence of the last message sent
	enc        kvevents.Encoder
	events     []kvevents.Event
	buf        []byte
}

// Apply publishes b (kvevents.Sink).
func (s *relaySink) Apply(b *kvevents.Batch) {
	known := b
	for i := range b.Events {
		if b.Events[i].Kind == 0 {
			// Copy the batch without the unknown events.
			s.events = s.events[:0]
			for j := range b.Events {
				if b.Events[j].Kind != 0 {
					s.events = append(s.events, b.Events[j])
				}
			}
			known = &kvevents.Batch{TS: b.TS, Events: s.events, DataParallelRank: b.DataParallelRank, HasDataParallelRank: b.HasDataParallelRank}
			break
		}
	}
	payload, err := s.enc.Encode(known)
	if err != nil {
		// The decoder's batches always encode; a batch that does not is
		// a hole in the stream like any other.
		s.x.m.relayFailures.WithLabelValues("encode").Inc()
		s.log.Warn("a KV event batch does not encode; the replicas clear the engine's index", "error", err)
		s.send(opClear, nil)
		return
	}
	s.send(opApply, payload)
}

// Clear publishes a clear (kvevents.Sink).
func (s *relaySink) Clear() { s.send(opClear, nil) }

// MarkLive publishes a live message (kvevents.Sink).
func (s *relaySink) MarkLive() { s.send(opLive, nil) }

// send publishes one kv message and waits for the stream's
// acknowledgement; it reports whether the stream has it. A message over
// NATS's max_payload is replaced by a clear; any other failure stops the
// relay's subscriber (relay starts it again).
func (s *relaySink) send(op byte, body []byte) bool {
	if s.ctx.Err() != nil {
		return false
	}
	s.buf = append(append(s.buf[:0], op), body...)
	if len(s.buf) > s.maxPayload {
		s.x.m.relayFailures.WithLabelValues("too_large").Inc()
		s.log.Warn("a KV event batch is over NATS's max_payload; the replicas clear the engine's index instead", "bytes", len(s.buf), "max_payload", s.maxPayload)
		s.buf = append(s.buf[:0], opClear)
		op = opClear
	}
	ctx, cancel := context.WithTimeout(s.ctx, publishTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: s.subject, Data: s.buf, Header: nats.Header{relayHeader: []string{s.token}}}
	ack, err := s.x.js.PublishMsg(ctx, msg)
	if err != nil {
		if s.ctx.Err() == nil {
			s.x.m.relayFailures.WithLabelValues("publish").Inc()
			s.log.Warn("KV events not relayed; the relay starts again", "error", err, "in", relayRetry)
			s.fail()
		}
		return false
	}
	s.seq = ack.Sequence
	s.x.m.relayed.WithLabelValues(opName(op)).Inc()
	return true
}

// opName names a kv message's op for metrics: apply, clear, live.
func opName(op byte) string {
	switch op {
	case opApply:
		return "apply"
	case opClear:
		return "clear"
	case opLive:
		return "live"
	}
	return "unknown"
}

// RelayOptions configure RunRelays.
type RelayOptions struct {
	// Config is the policy file's cluster block (nats, name and heartbeat
	// are used).
	Config config.Cluster
	// Holder names the holder in the leases' values (logs, `nats kv`);
	// "" takes Config.Replica + "-relay".
	Holder string
	// Targets are the candidates to relay (each competing for its lease).
	Targets []RelayTarget
	// Registerer receives the relay metrics; nil: none.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger hclog.Logger
}

// RunRelays connects to NATS and competes for the relay leases of
// o.Targets, relaying those it holds, until ctx ends; then it gives its
// leases up and returns nil (`router kv-relay`). NATS being away is
// retried. Errors: no targets or no NATS URL; a URL the client refuses;
// NATS refusing the credentials or the TLS of o.Config, or their files
// not read (connect); metrics that do not register.
func RunRelays(ctx context.Context, o RelayOptions) error {
	if o.Config.NATS == "" || o.Config.Name == "" || len(o.Targets) == 0 {
		return fmt.Errorf("cluster: RelayOptions needs Config (nats, name) and targets")
	}
	if o.Holder == "" {
		o.Holder = o.Config.Replica + "-relay"
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	m, err := newKVMetrics(o.Registerer)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	x := newKVShare(o.Config, o.Holder, m, o.Logger.Named("kv-relay"), nil)
	for _, t := range o.Targets {
		x.RelayKV(t)
	}
	log := o.Logger.Named("kv-relay")
	var connected atomic.Bool
	nc, closeConn, err := connect(o.Config, "switchyard kv-relay "+o.Holder, log, func(up bool) {
		if connected.Swap(up) != up {
			if up {
				log.Info("connected to NATS", "nats", config.RedactNATS(o.Config.NATS))
			} else {
				log.Warn("disconnected from NATS; the relays start again once it is back", "nats", config.RedactNATS(o.Config.NATS))
			}
		}
	})
	if err != nil {
		return err
	}
	defer closeConn()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	x.run(ctx, nc, js)
	_ = nc.Flush()
	return nil
}

// taskSet runs background tasks from the moment run is called until its
// context ends; a task added before waits for run. Safe for concurrent
// use.
type taskSet struct {
	mu     sync.Mutex
	ctx    context.Context // nil until run
	closed bool
	tasks  map[*task]struct{}
	wg     sync.WaitGroup
}

type task struct {
	fn     func(ctx context.Context)
	cancel context.CancelFunc
}

// add adds fn, started at once when the set runs; remove cancels its
// context (without waiting for it).
func (s *taskSet) add(fn func(ctx context.Context)) (remove func()) {
	t := &task{fn: fn}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tasks == nil {
		s.tasks = map[*task]struct{}{}
	}
	s.tasks[t] = struct{}{}
	if s.ctx != nil {
		s.startLocked(t)
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.tasks, t)
		if t.cancel != nil {
			t.cancel()
		}
	}
}

func (s *taskSet) startLocked(t *task) {
	if s.closed {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	t.cancel = cancel
	s.wg.Go(func() { t.fn(ctx) })
}

// run starts the tasks and those added later, until ctx ends; then it
// waits for them all.
func (s *taskSet) run(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	for t := range s.tasks {
		s.startLocked(t)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
}
