package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
//
// A replica (follower) also watches the lease bucket's relay leases
// (watchLeases): a candidate's messages are applied only when they carry
// the token its lease names now (relay.go, "Fencing"), and a candidate
// whose lease has not been seen written (renewed) for stallAfter is
// stalled: its index is cleared (cold: scored by the approximate list)
// and not fed until its lease is seen again, when its subject is read
// again from the relay's run's start.
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
	// malformedLog limits the logging of malformed kv messages, watchLog
	// of the lease watch failing.
	malformedLog rate.Sometimes
	watchLog     rate.Sometimes

	// Set by run before the tasks start, read-only after.
	nc     *nats.Conn
	js     jetstream.JetStream
	leases *Leases
	ready  chan struct{} // closed once leases is set

	needed   chan struct{} // closed once a candidate is followed or relayed
	needOnce sync.Once

	// follower: a replica's, which follows candidates and watches the
	// leases (not a `router kv-relay`'s). stallAfter: see stalled.
	follower   bool
	stallAfter time.Duration
	// viewed is closed once the lease watch has delivered the bucket's
	// relay leases as they were when it started: the follows wait for it.
	viewed     chan struct{}
	viewedOnce sync.Once

	mu       sync.Mutex
	followed map[*follow]struct{}
	byKey    map[string]map[*follow]struct{} // followed, by relay lease key
	views    map[string]leaseValue           // the relay leases as last seen (watchLeases), at most maxLeaseViews
	epoch    chan struct{}                   // closed when the stream was found made again
	created  time.Time                       // the stream's creation time as last seen
}

// maxLeaseViews bounds the relay leases a follower remembers beyond those
// of its candidates (kvShare.views): anyone who may write the lease
// bucket could make keys without end.
const maxLeaseViews = 1 << 16

// stallFactor times LeaseTTL is how long a followed candidate's lease
// may go unseen before its feed counts as stalled: a lease is renewed
// every third of its TTL, and one that expired is taken by another relay
// within a renewal period.
const stallFactor = 2

func newKVShare(c config.Cluster, holder string, m *kvMetrics, log hclog.Logger, startSeq func(string, uint32) uint64) *kvShare {
	prefix := "switchyard." + c.Name + "."
	return &kvShare{c: c, holder: holder, prefix: prefix, stream: kvStreamConfig(c.Name, prefix), log: log, m: m, startSeq: startSeq,
		ready: make(chan struct{}), needed: make(chan struct{}), followed: map[*follow]struct{}{}, epoch: make(chan struct{}),
		byKey: map[string]map[*follow]struct{}{}, views: map[string]leaseValue{}, viewed: make(chan struct{}),
		stallAfter: stallFactor * LeaseTTL(c), malformedLog: rate.Sometimes{Interval: malformedLogInterval}, watchLog: rate.Sometimes{Interval: malformedLogInterval}}
}

// run makes sure the lease bucket exists, then, once a candidate is
// followed or relayed, the KV stream (retrying every second while NATS
// refuses: a cluster without kv_events blocks never makes the stream nor
// reserves its memory), then runs the follows and relays until ctx ends,
// and waits for them (the relays give their leases up).
func (x *kvShare) run(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) {
	x.nc, x.js = nc, js
	retryLog := rate.Sometimes{Interval: malformedLogInterval}
	retry := func(what string, f func(context.Context) error) bool {
		for {
			err := f(ctx)
			if err == nil {
				return true
			}
			retryLog.Do(func() {
				x.log.Warn(what+" not available; retrying every second (logged at most every "+malformedLogInterval.String()+")", "error", err)
			})
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
	if x.follower {
		wg.Go(func() { x.watchLeases(ctx) })
	}
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
	key     string // its relay lease's key
	sink    kvevents.Sink
	caught  atomic.Bool
	next    atomic.Uint64 // the stream sequence to resume from; 0: the start
	kick    chan struct{} // the follow loop has something to do (fence)
	dec     kvevents.Decoder
	b       kvevents.Batch

	mu    sync.Mutex
	fence fence
}

// fence is what a follow knows of its candidate's relay (kvShare's
// comment): guarded by follow.mu.
type fence struct {
	// token is the token the candidate's lease names (its relay's); ""
	// when none is known. Only its messages are applied.
	token string
	// start is the stream sequence of the relay's run's first message,
	// as the lease says, when it refers to the stream as this replica
	// knows it; 0: not known.
	start uint64
	// synced: the relay's messages are applied. False from the moment
	// the lease changes hands until the new relay's clear is applied or
	// the subject is read again from its run's start (rewind).
	synced bool
	// rewind asks the follow loop to read the subject again from
	// rewindTo (0: from its first message).
	rewind   bool
	rewindTo uint64
	// started: the follow loop has begun (stalls are counted from it);
	// renewed is when the lease was last seen written, or the loop began.
	started bool
	renewed time.Time
	// stalled: the lease was not seen written for stallAfter; the index
	// is cleared and the subject not read until it is.
	stalled bool
	// removed: the follow was stopped (it stalls no more).
	removed bool
}

// FollowKV feeds sink (the candidate's precise index) with candidate
// (worker, rank)'s messages on the KV stream, from Run on: from the
// stream's first message, or from Options.KVStartSeq's sequence when it
// returns one. Only the messages of the relay that holds the candidate's
// lease are applied (relay.go, "Fencing"); while no lease of it is seen
// written for twice LeaseTTL, the sink is cleared and not fed (stalled).
// stop ends it without waiting; sink may receive one more call
// meanwhile.
func (r *Replica) FollowKV(worker string, rank uint32, sink kvevents.Sink) (stop func()) {
	x := r.kv
	f := &follow{worker: worker, rank: rank, subject: kvSubject(x.prefix, worker, rank), key: LeaseKey(relayLeaseKind, worker, fmt.Sprint(rank)),
		sink: sink, kick: make(chan struct{}, 1)}
	x.mu.Lock()
	x.followed[f] = struct{}{}
	if x.byKey[f.key] == nil {
		x.byKey[f.key] = map[*follow]struct{}{}
	}
	x.byKey[f.key][f] = struct{}{}
	x.mu.Unlock()
	x.need()
	remove := x.follows.add(func(ctx context.Context) { x.follow(ctx, f) })
	return func() {
		remove()
		x.mu.Lock()
		delete(x.followed, f)
		delete(x.byKey[f.key], f)
		if len(x.byKey[f.key]) == 0 {
			delete(x.byKey, f.key)
		}
		x.mu.Unlock()
		f.mu.Lock()
		f.fence.removed = true
		if f.fence.stalled {
			f.fence.stalled = false
			x.m.kvStalled.Dec()
		}
		f.mu.Unlock()
	}
}

// StalledKVFeeds returns the followed candidates whose feed is stalled
// now, as "worker/rank", sorted: their precise indexes are cold (State).
func (r *Replica) StalledKVFeeds() []string {
	x := r.kv
	x.mu.Lock()
	fs := make([]*follow, 0, len(x.followed))
	for f := range x.followed {
		fs = append(fs, f)
	}
	x.mu.Unlock()
	var out []string
	for _, f := range fs {
		f.mu.Lock()
		if f.fence.stalled {
			out = append(out, f.worker+"/"+strconv.FormatUint(uint64(f.rank), 10))
		}
		f.mu.Unlock()
	}
	slices.Sort(out)
	return out
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
// failure (from the sequence it reached), from the stream's start when
// the stream was made again, and from where the fence says (rewind); it
// does not consume while f is stalled.
func (x *kvShare) follow(ctx context.Context, f *follow) {
	if x.startSeq != nil {
		f.next.Store(x.startSeq(f.worker, f.rank))
	}
	select {
	case <-ctx.Done():
		return
	case <-x.viewed:
	}
	// Under x.mu, so that no change of the lease seen meanwhile is lost
	// (leaseEntry updates x.views under it before leaseSeen).
	x.mu.Lock()
	v := x.views[f.key]
	f.mu.Lock()
	f.fence = fence{token: v.Token, synced: true, started: true, renewed: time.Now()}
	if v.Start != 0 && v.Stream == x.created.UnixNano() {
		f.fence.start = v.Start
	}
	f.mu.Unlock()
	x.mu.Unlock()
	for ctx.Err() == nil {
		x.mu.Lock()
		epoch := x.epoch
		x.mu.Unlock()
		f.mu.Lock()
		stalled := f.fence.stalled
		f.mu.Unlock()
		var cc jetstream.ConsumeContext
		var retry <-chan time.Time
		if !stalled {
			var err error
			if cc, err = x.consume(ctx, f); err != nil {
				x.log.Warn("following KV events from the stream; retrying", "worker", f.worker, "rank", f.rank, "error", err)
				retry = time.After(time.Second)
			}
		}
		select {
		case <-ctx.Done():
		case <-retry:
		case <-epoch:
			// The stream was made again (NATS restarted): what the index
			// holds is not followed by anything it will deliver.
			stopConsuming(cc)
			cc = nil
			f.sink.Clear()
			f.next.Store(0)
			f.caught.Store(false)
			f.mu.Lock()
			f.fence.synced, f.fence.start, f.fence.rewind = true, 0, false
			f.mu.Unlock()
		case <-f.kick:
			stopConsuming(cc)
			cc = nil
			f.mu.Lock()
			clearIt := f.fence.stalled
			if f.fence.rewind && !f.fence.stalled {
				f.next.Store(f.fence.rewindTo)
				f.fence.synced, f.fence.rewind = true, false
				x.m.kvRewinds.Inc()
			}
			f.mu.Unlock()
			if clearIt {
				f.sink.Clear()
			}
		}
		stopConsuming(cc)
	}
}

// stopConsuming stops cc (nil: nothing) and waits until its handler has
// returned for good.
func stopConsuming(cc jetstream.ConsumeContext) {
	if cc != nil {
		cc.Stop()
		<-cc.Closed()
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
		var seq uint64
		if err == nil {
			seq = md.Sequence.Stream
		}
		x.receive(f, msg.Data(), msg.Headers().Get(relayHeader), seq)
		// After the apply: a snapshot that reads next holds what came
		// before it (kvPositions).
		if err == nil {
			f.next.Store(seq + 1)
			if md.NumPending == 0 {
				f.caught.Store(true)
			}
		}
	})
}

// errKVMessage: a kv message that does not decode.
var errKVMessage = errors.New("malformed kv message")

// receive applies one kv message (stream sequence seq, relay token
// token) to f's sink, when the fence lets it through: its token is the
// one f's lease names (else it is dropped, stale_relay) and, after the
// lease changed hands, the new relay's clear has been applied (else it is
// dropped, rewound, and the subject read again from the relay's run's
// start once the lease says where that is). A message that does not
// decode is dropped and counted, and the sink cleared: the stream it
// follows has a hole, as when the engine's own payload does not decode.
func (x *kvShare) receive(f *follow, data []byte, token string, seq uint64) {
	f.mu.Lock()
	fe := &f.fence
	switch {
	case fe.stalled:
		// The loop is stopping the consumer.
		f.mu.Unlock()
		return
	case token == "" || token != fe.token:
		f.mu.Unlock()
		x.m.kvDropped.WithLabelValues("stale_relay").Inc()
		return
	case !fe.synced:
		if len(data) != 1 || data[0] != opClear {
			kick := false
			if fe.start != 0 && fe.start <= seq && !fe.rewind {
				fe.rewind, fe.rewindTo, kick = true, fe.start, true
			}
			f.mu.Unlock()
			if kick {
				kickFollow(f)
			}
			x.m.kvDropped.WithLabelValues("rewound").Inc()
			return
		}
		fe.synced = true
	}
	f.mu.Unlock()
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

// kickFollow wakes f's loop without blocking.
func kickFollow(f *follow) {
	select {
	case f.kick <- struct{}{}:
	default:
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

// watchLeases watches the lease bucket's relay leases until ctx ends,
// keeping the follows' fences (leaseSeen) and x.views, and checks every
// renewal period that the bucket it watches is still the bucket (one lost
// and made again is watched anew) and which follows have stalled
// (checkStalls): also while NATS is away, so that a replica cut off from
// its relays leaves live.
func (x *kvShare) watchLeases(ctx context.Context) {
	tick := time.NewTicker(x.leases.renew)
	defer tick.Stop()
	var w jetstream.KeyWatcher
	var updates <-chan jetstream.KeyValueEntry
	var bucket time.Time // the watched bucket's creation
	stop := func() {
		if w != nil {
			_ = w.Stop()
			w, updates = nil, nil
		}
	}
	defer stop()
	start := func() {
		if !x.nc.IsConnected() {
			return
		}
		created, err := x.leases.created(ctx)
		if err == nil {
			var nw jetstream.KeyWatcher
			if nw, err = x.leases.kv.Watch(ctx, relayLeaseKind+".>"); err == nil {
				w, updates, bucket = nw, nw.Updates(), created
				return
			}
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			x.log.Debug("lease bucket not there (its holder makes it again); retrying", "error", err)
			return
		}
		x.watchLog.Do(func() {
			x.log.Warn("relay leases not watched: the KV events followed are fenced by the leases as last seen, a follow not begun waits; retrying (logged at most every "+malformedLogInterval.String()+")", "error", err)
		})
	}
	start()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			switch {
			case !ok:
				w, updates = nil, nil // watched again at the next tick
			case e == nil:
				// The bucket's leases as they were are all delivered.
				x.viewedOnce.Do(func() { close(x.viewed) })
			default:
				x.leaseEntry(e)
			}
		case now := <-tick.C:
			x.checkStalls(now)
			if w == nil {
				start()
				continue
			}
			if !x.nc.IsConnected() {
				continue
			}
			if created, err := x.leases.created(ctx); err == nil && !created.Equal(bucket) || errors.Is(err, jetstream.ErrBucketNotFound) {
				// The bucket was lost (and maybe made again): its
				// leases are watched anew.
				stop()
				start()
			}
		}
	}
}

// leaseEntry applies one change of a relay lease seen by the watch to
// x.views and to the fences of the follows of its key.
func (x *kvShare) leaseEntry(e jetstream.KeyValueEntry) {
	key := e.Key()
	present := e.Operation() == jetstream.KeyValuePut
	var v leaseValue
	if present {
		var ok bool
		if v, ok = decodeLeaseValue(e.Value()); !ok {
			// Not a relay of this version (or garbage): its messages are
			// not applied, and it does not keep the feed from stalling.
			x.m.kvDropped.WithLabelValues("malformed_lease").Inc()
		}
	}
	x.mu.Lock()
	created := x.created
	fs := make([]*follow, 0, len(x.byKey[key]))
	for f := range x.byKey[key] {
		fs = append(fs, f)
	}
	if _, known := x.views[key]; present && (known || len(fs) > 0 || len(x.views) < maxLeaseViews) {
		x.views[key] = v
	} else {
		delete(x.views, key)
	}
	x.mu.Unlock()
	now := time.Now()
	for _, f := range fs {
		x.leaseSeen(f, v, present, created, now)
	}
}

// leaseSeen updates f's fence with its lease's value v as written at now
// (present false: deleted, its holder gave it up; v.Token "": a value
// that does not decode, which renews nothing), the KV stream being
// the one made at created: a new token is a new relay (its messages are
// applied once its clear is, or the subject read again from its run's
// start when f has read past it); a stalled f resumes from the relay's
// run's start (the stream's first message when not known).
func (x *kvShare) leaseSeen(f *follow, v leaseValue, present bool, created time.Time, now time.Time) {
	f.mu.Lock()
	fe := &f.fence
	if !present || !fe.started || fe.removed {
		// A lease given up: its relay's last messages are still its own;
		// a stall counts from its last renewal. A follow not begun reads
		// x.views when it begins.
		f.mu.Unlock()
		return
	}
	if v.Token != "" {
		fe.renewed = now
	}
	if v.Token != fe.token {
		fe.token, fe.synced, fe.start = v.Token, false, 0
	}
	if v.Start != 0 && v.Stream == created.UnixNano() {
		fe.start = v.Start
	}
	kick, resumed := false, false
	switch {
	case fe.stalled && v.Token != "":
		fe.stalled, resumed = false, true
		fe.rewind, fe.rewindTo, kick = true, fe.start, true
		x.m.kvStalled.Dec()
	case !fe.synced && !fe.rewind && fe.start != 0 && fe.start < f.next.Load():
		fe.rewind, fe.rewindTo, kick = true, fe.start, true
	}
	f.mu.Unlock()
	if resumed {
		x.log.Info("the KV events feed resumed: its relay's lease is seen again; the index is read again from the relay's start", "worker", f.worker, "rank", f.rank)
	}
	if kick {
		kickFollow(f)
	}
}

// checkStalls marks stalled the follows whose lease has not been seen
// written for stallAfter as of now: their loops clear their indexes.
func (x *kvShare) checkStalls(now time.Time) {
	x.mu.Lock()
	fs := make([]*follow, 0, len(x.followed))
	for f := range x.followed {
		fs = append(fs, f)
	}
	x.mu.Unlock()
	for _, f := range fs {
		f.mu.Lock()
		fe := &f.fence
		stall := fe.started && !fe.removed && !fe.stalled && now.Sub(fe.renewed) > x.stallAfter
		if stall {
			fe.stalled = true
			x.m.kvStalled.Inc()
			x.m.kvStalls.Inc()
		}
		silent := now.Sub(fe.renewed)
		f.mu.Unlock()
		if stall {
			x.log.Warn("the KV events feed stalled: no relay lease of the engine seen written; its precise index is cleared (cold) until one is",
				"worker", f.worker, "rank", f.rank, "silent_for", silent.Round(time.Millisecond), "stall_after", x.stallAfter)
			kickFollow(f)
		}
	}
}
