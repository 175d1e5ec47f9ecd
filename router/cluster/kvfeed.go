package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/kvevents"
)

// kvShare is a replica's (or a `router kv-relay`'s) part in relaying
// engine KV events: the relays it competes for (relay.go) and, in a
// replica, the candidates it follows from the stream.
//
// Each followed candidate has its own ordered consumer on the KV stream,
// filtered to the candidate's subject: messages come in order without a
// gap (the client recreates the consumer from the last sequence after a
// reconnect), and a candidate that joins late (a worker added by a reload,
// or ready only now) reads its subject from the stream's first message,
// not from the moment the replica started. The consumers are ephemeral:
// a replica that starts again has lost its indexes with its memory, so it
// reads every subject from the start again (or from Options.KVStartSeq).
type kvShare struct {
	c        config.Cluster
	holder   string
	prefix   string
	stream   jetstream.StreamConfig
	log      hclog.Logger
	m        *kvMetrics
	startSeq func(worker string, rank uint32) uint64
	// gate, when set, is closed once the follows may start: the replica
	// has looked for its warm-start snapshot (set before run).
	gate <-chan struct{}

	follows taskSet
	relays  taskSet
	// malformedLog limits the logging of malformed kv messages.
	malformedLog rate.Sometimes

	// Set by run before the tasks start, read-only after.
	nc     *nats.Conn
	js     jetstream.JetStream
	leases *Leases
	ready  chan struct{} // closed once leases is set

	needed   chan struct{} // closed once a candidate is followed or relayed
	needOnce sync.Once

	mu       sync.Mutex
	followed map[*follow]struct{}
	epoch    chan struct{} // closed when the stream was found made again
	created  time.Time     // the stream's creation time as last seen
}

func newKVShare(c config.Cluster, holder string, m *kvMetrics, log hclog.Logger, startSeq func(string, uint32) uint64) *kvShare {
	prefix := "switchyard." + c.Name + "."
	return &kvShare{c: c, holder: holder, prefix: prefix, stream: kvStreamConfig(c.Name, prefix), log: log, m: m, startSeq: startSeq,
		ready: make(chan struct{}), needed: make(chan struct{}), followed: map[*follow]struct{}{}, epoch: make(chan struct{}),
		malformedLog: rate.Sometimes{Interval: malformedLogInterval}}
}

// run makes sure the lease bucket exists, then, once a candidate is
// followed or relayed, the KV stream (retrying every second while NATS
// refuses: a cluster without kv_events blocks never makes the stream nor
// reserves its memory), then runs the follows and relays until ctx ends,
// and waits for them (the relays give their leases up).
func (x *kvShare) run(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) {
	x.nc, x.js = nc, js
	retry := func(what string, f func(context.Context) error) bool {
		for {
			err := f(ctx)
			if err == nil {
				return true
			}
			x.log.Warn(what+" not available; retrying", "error", err)
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Second):
			}
		}
	}
	if !retry("lease bucket", x.openLeases) {
		return
	}
	close(x.ready)
	select {
	case <-ctx.Done():
		return
	case <-x.needed:
	}
	if !retry("KV events stream", x.ensure) {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { x.watch(ctx) })
	wg.Go(func() {
		if x.gate != nil {
			select {
			case <-ctx.Done():
				return
			case <-x.gate:
			}
		}
		x.follows.run(ctx)
	})
	wg.Go(func() { x.relays.run(ctx) })
	wg.Wait()
}

// openLeases opens the lease bucket.
func (x *kvShare) openLeases(ctx context.Context) error {
	l, err := openLeases(ctx, x.js, x.c, x.holder, x.m.leasesHeld, x.log)
	if err != nil {
		return err
	}
	x.leases = l
	return nil
}

// need notes that a candidate is followed or relayed: the stream is made.
func (x *kvShare) need() { x.needOnce.Do(func() { close(x.needed) }) }

// ensure makes the KV stream and notes its creation time.
func (x *kvShare) ensure(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := x.js.CreateOrUpdateStream(cctx, x.stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", x.stream.Name, err)
	}
	x.mu.Lock()
	x.created = s.CachedInfo().Created
	x.mu.Unlock()
	return nil
}

// watch checks the stream after each reconnect: a NATS server that
// restarted has lost it (memory storage), and the stream made again
// starts its sequences over; the follows then start over from its first
// message (clearing their indexes), as the relays do after their failed
// publishes.
func (x *kvShare) watch(ctx context.Context) {
	ch := x.nc.StatusChanged(nats.CONNECTED)
	defer x.nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		x.mu.Lock()
		before := x.created
		x.mu.Unlock()
		if err := x.ensure(ctx); err != nil {
			x.log.Warn("KV events stream not checked after a reconnect", "error", err)
			continue
		}
		x.mu.Lock()
		if !x.created.Equal(before) {
			close(x.epoch)
			x.epoch = make(chan struct{})
		}
		x.mu.Unlock()
	}
}

// RelayKV makes the replica compete for t's relay lease from Run on, and
// relay t's engine while it holds it; stop ends that (giving the lease up
// if held) without waiting.
func (r *Replica) RelayKV(t RelayTarget) (stop func()) { return r.kv.RelayKV(t) }

// RelayKV: see Replica.RelayKV.
func (x *kvShare) RelayKV(t RelayTarget) (stop func()) {
	key := LeaseKey(relayLeaseKind, t.Worker, fmt.Sprint(t.Rank))
	x.need()
	return x.relays.add(func(ctx context.Context) {
		x.leases.Hold(ctx, key, func(ctx context.Context) { x.relay(ctx, t) })
	})
}

// HoldLease competes for the lease key (a valid KV key: LeaseKey makes
// one from any names) until ctx ends, running run whenever it holds it
// (Leases.Hold), once the replica has joined NATS (Run). It returns when
// ctx ends, after run returned and the lease was given up.
func (r *Replica) HoldLease(ctx context.Context, key string, run func(ctx context.Context)) {
	select {
	case <-ctx.Done():
		return
	case <-r.kv.ready:
	}
	r.kv.leases.Hold(ctx, key, run)
}

// follow is one candidate followed from the stream.
type follow struct {
	worker  string
	rank    uint32
	subject string
	sink    kvevents.Sink
	caught  atomic.Bool
	next    atomic.Uint64 // the stream sequence to resume from; 0: the start
	rev     atomic.Uint64 // the highest relay revision seen (relayRevHeader)
	dec     kvevents.Decoder
	b       kvevents.Batch
}

// FollowKV feeds sink (the candidate's precise index) with candidate
// (worker, rank)'s messages on the KV stream, from Run on: from the
// stream's first message, or from Options.KVStartSeq's sequence when it
// returns one. stop ends it without waiting; sink may receive one more
// call meanwhile.
func (r *Replica) FollowKV(worker string, rank uint32, sink kvevents.Sink) (stop func()) {
	x := r.kv
	f := &follow{worker: worker, rank: rank, subject: kvSubject(x.prefix, worker, rank), sink: sink}
	x.mu.Lock()
	x.followed[f] = struct{}{}
	x.mu.Unlock()
	x.need()
	remove := x.follows.add(func(ctx context.Context) { x.follow(ctx, f) })
	return func() {
		remove()
		x.mu.Lock()
		delete(x.followed, f)
		x.mu.Unlock()
	}
}

// KVCaughtUp reports whether every followed candidate has been delivered
// its subject's messages up to the last one the stream held when its
// consumer started (true with no candidate followed): the precise indexes
// are as complete as the stream can make them (readiness).
func (r *Replica) KVCaughtUp() bool {
	x := r.kv
	x.mu.Lock()
	defer x.mu.Unlock()
	for f := range x.followed {
		if !f.caught.Load() {
			return false
		}
	}
	return true
}

// relayLeaseKind is the kind (LeaseKey) of the relays' leases, the ones
// switchyard_cluster_leases_held counts.
const relayLeaseKind = "relay"

// kvCandidate names a followed candidate across replicas.
type kvCandidate struct {
	worker string
	rank   uint32
}

// kvPositions returns, for each followed candidate, the stream sequence
// its next message will have (0: none applied yet): its index holds every
// message before it.
func (r *Replica) kvPositions() map[kvCandidate]uint64 {
	x := r.kv
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[kvCandidate]uint64, len(x.followed))
	for f := range x.followed {
		out[kvCandidate{f.worker, f.rank}] = f.next.Load()
	}
	return out
}

// follow consumes f's subject until ctx ends, starting over after a
// failure (from the sequence it reached) and from the stream's start when
// the stream was made again.
func (x *kvShare) follow(ctx context.Context, f *follow) {
	if x.startSeq != nil {
		f.next.Store(x.startSeq(f.worker, f.rank))
	}
	for ctx.Err() == nil {
		x.mu.Lock()
		epoch := x.epoch
		x.mu.Unlock()
		cc, err := x.consume(ctx, f)
		var retry <-chan time.Time
		if err != nil {
			x.log.Warn("following KV events from the stream; retrying", "worker", f.worker, "rank", f.rank, "error", err)
			retry = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
		case <-retry:
		case <-epoch:
			// The stream was made again (NATS restarted): what the index
			// holds is not followed by anything it will deliver.
			if cc != nil {
				cc.Stop()
				<-cc.Closed()
				cc = nil
			}
			f.sink.Clear()
			f.next.Store(0)
			f.rev.Store(0) // the lease bucket was made again too: revisions start over
			f.caught.Store(false)
		}
		if cc != nil {
			cc.Stop()
			<-cc.Closed()
		}
	}
}

// consume starts f's ordered consumer from f.next (0: the first message).
func (x *kvShare) consume(ctx context.Context, f *follow) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.subject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if next := f.next.Load(); next > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, next
	}
	cons, err := x.js.OrderedConsumer(cctx, x.stream.Name, cfg)
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(cctx)
	if err != nil {
		return nil, err
	}
	if info.NumPending == 0 {
		f.caught.Store(true)
	}
	return cons.Consume(func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		x.receive(f, msg.Data(), relayRevision(msg.Headers()))
		// After the apply: a snapshot that reads next holds what came
		// before it (kvPositions).
		if err == nil {
			f.next.Store(md.Sequence.Stream + 1)
			if md.NumPending == 0 {
				f.caught.Store(true)
			}
		}
	})
}

// relayRevision reads a kv message's relay revision (relayRevHeader); 0
// when it has none or it does not parse.
func relayRevision(h nats.Header) uint64 {
	v := h.Get(relayRevHeader)
	if v == "" || len(v) > 20 {
		return 0
	}
	rev, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0
	}
	return rev
}

// errKVMessage: a kv message that does not decode.
var errKVMessage = errors.New("malformed kv message")

// receive applies one kv message to f's sink. A message that does not
// decode is dropped and counted, and the sink cleared: the stream it
// follows has a hole, as when the engine's own payload does not decode.
func (x *kvShare) receive(f *follow, data []byte, rev uint64) {
	// Fencing: a message of an older relay than one already seen is
	// dropped (relayRevHeader).
	switch cur := f.rev.Load(); {
	case rev < cur:
		x.m.kvDropped.WithLabelValues("stale_relay").Inc()
		return
	case rev > cur:
		f.rev.Store(rev)
	}
	err := x.apply(f, data)
	if err != nil {
		x.m.kvDropped.WithLabelValues("malformed").Inc()
		x.malformedLog.Do(func() {
			x.log.Warn("a KV events message does not decode; the engine's index is cleared (logged at most every "+malformedLogInterval.String()+
				", each counted in switchyard_cluster_kv_dropped_total{reason=\"malformed\"})", "worker", f.worker, "rank", f.rank, "error", err)
		})
		f.sink.Clear()
	}
}

func (x *kvShare) apply(f *follow, data []byte) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty", errKVMessage)
	}
	switch op := data[0]; op {
	case opApply:
		if err := f.dec.Decode(data[1:], &f.b); err != nil {
			return fmt.Errorf("%w: %w", errKVMessage, err)
		}
		f.sink.Apply(&f.b)
	case opClear, opLive:
		if len(data) != 1 {
			return fmt.Errorf("%w: %d bytes after a %s", errKVMessage, len(data)-1, opName(op))
		}
		if op == opClear {
			f.sink.Clear()
		} else {
			f.sink.MarkLive()
		}
	default:
		return fmt.Errorf("%w: op %d", errKVMessage, op)
	}
	x.m.kvConsumed.WithLabelValues(opName(data[0])).Inc()
	return nil
}
