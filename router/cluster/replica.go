// Package cluster makes router replicas share what they know over NATS
// JetStream: each replica's bookings (ACTIVE_REQUESTS, LOAD) and prefix
// records, so that N replicas behind any load balancer count each other's
// in-flight work and keep a conversation on the worker that holds its
// cache. docs/replicas.md gives the consistency model.
//
// A Replica is an admission.Observer: every booking the replica's
// admission makes, its first token and its release become records
// (codec.go) published on the subject switchyard.<cluster>.d.<replica>,
// which the JetStream stream <cluster>-deltas keeps in memory for twice
// the booking TTL. Each replica reads the stream with its own ordered
// consumer from the moment it joins and applies the others' records to
// its own Router: a booking is made on the named worker (router.Router.Bind:
// booked and recorded in the prefix index, no policy run), released when its release arrives. Heartbeats
// (core NATS, every Heartbeat) tell the replicas alive; a replica silent
// for BookingTTL has its bookings released everywhere. A replica that
// joins or reconnects asks the others (hello) to send their live bookings
// again: each answers with a reset record followed by one booked record
// per live booking.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Bounds.
const (
	// outQueue bounds the local records waiting to be published; past it
	// a record is dropped, counted, and the peers are sent a snapshot.
	outQueue = 1 << 14
	// maxRemoteBookings bounds the bookings of other replicas held, all
	// peers together; past it a booking is dropped and counted.
	maxRemoteBookings = 1 << 20
	// maxPeers bounds the other replicas heard (within BookingTTL); past
	// it a new name's heartbeats and messages are dropped and counted.
	maxPeers = 1 << 10
	// resyncGap is the least time between two snapshots of this
	// replica's bookings: a flood of hellos (anyone may publish one)
	// costs at most one snapshot per gap.
	resyncGap = 100 * time.Millisecond
	// malformedLogInterval is how often a malformed message is logged
	// after the first (they are all counted): garbage published on the
	// cluster's subjects does not flood the log.
	malformedLogInterval = 10 * time.Second
	// batchBytes is the size past which a deltas message is sent.
	batchBytes = 60 << 10
	// streamBytes bounds the deltas stream (memory storage): the oldest
	// messages go first past it. Replicas read it live, so it only needs
	// the moments a consumer is behind; NATS reserves it against its
	// max_memory_store.
	streamBytes = 64 << 20
)

// Options configure a Replica.
type Options struct {
	// Config is the policy file's cluster block (required).
	Config config.Cluster
	// Router receives the other replicas' bookings (required).
	Router *router.Router
	// Resolve maps a worker name to its id in Router's fleet; false when
	// this replica has no such worker (its record is dropped and counted).
	Resolve func(name string) (shared.WorkerID, bool)
	// Capacity is the queue block's max_active_requests (0: none): the
	// others' bookings count toward it (router.Binding.Capacity), so a
	// worker they fill is at capacity here too.
	Capacity int64
	// Registerer receives the cluster's metrics; nil: none.
	Registerer prometheus.Registerer
	// Logger receives the cluster's logs; nil discards them.
	Logger hclog.Logger
	// KVStartSeq, when set, returns the KV-events stream sequence from
	// which candidate (worker, rank) is followed (FollowKV); 0, or nil:
	// from the stream's first message.
	KVStartSeq func(worker string, rank uint32) uint64
}

// Replica is this router's membership in a cluster of replicas. Its
// Observer methods are safe for concurrent use and never block.
type Replica struct {
	o      Options
	log    hclog.Logger
	self   string
	prefix string // "switchyard.<cluster>."
	stream string

	out    chan Record
	resync chan struct{}
	hello  chan struct{}

	// live are this replica's own bookings by request id: what a snapshot
	// sends.
	liveMu sync.Mutex
	live   map[string]*Record

	// peers are the other replicas, by name; their bookings are held in
	// this replica's fleet.
	mu     sync.Mutex
	peers  map[string]*peer
	remote int // bookings held, all peers
	// remoteOn counts the bookings held, all peers, per worker rank
	// (remoteLimit bounds them).
	remoteOn map[remoteKey]int
	// malformedLog limits the logging of malformed deltas messages.
	malformedLog rate.Sometimes

	connected atomic.Bool
	events    chan bool // the connection's ups (true) and downs (false)

	// Warm start (snapshot.go). deltaSeq is the last deltas stream
	// sequence applied; deltasCaughtUp turns true once the first session
	// has applied the stream's last message as of its start, caughtUp once
	// the KV-event follows have too (KVCaughtUp); warmed, once the
	// snapshot was looked for (Run's goroutine only), and warm is closed
	// then (the follows wait for it, so that they start where the
	// snapshot's indexes end); started is when Run began (WarmTimeout
	// counts from it).
	deltaSeq       atomic.Uint64
	deltasCaughtUp atomic.Bool
	caughtUp       atomic.Bool
	warmed         bool
	warm           chan struct{}
	started        atomic.Int64
	snapMu         sync.Mutex
	snapLoaded     *SnapshotState
	snapKV         map[kvCandidate]uint64        // the snapshot's KV-stream positions of the precise indexes it filled
	pending        map[kvCandidate]pendingPrefix // the snapshot's content of workers not members yet (Joined)
	m              *metrics
	kv             *kvShare // engine KV events: relays and follows (kvfeed.go)
	// applied, when set (tests, benchmarks), is called with each applied
	// booked record's id and decision time, under mu.
	applied func(id string, at int64)
}

// peer is another replica as this one knows it.
type peer struct {
	lastSeen time.Time
	bookings map[string]remoteBooking
}

// remoteKey is a worker rank another replica's booking is on: the
// worker's id here and the record's rank (0 for a version 1 record).
type remoteKey struct {
	id   shared.WorkerID
	rank uint32
}

// remoteBooking is another replica's booking held here.
type remoteBooking struct {
	b  *fleet.Booking
	on remoteKey
}

var _ admission.Observer = (*Replica)(nil)

// New checks o and returns a Replica; Run connects it.
func New(o Options) (*Replica, error) {
	if o.Router == nil || o.Resolve == nil || o.Config.NATS == "" || o.Config.Replica == "" || o.Config.Name == "" {
		return nil, errors.New("cluster: Options needs Config (nats, replica, name), Router and Resolve")
	}
	if o.Config.Heartbeat <= 0 {
		o.Config.Heartbeat = config.DefaultHeartbeat
	}
	if o.Config.BookingTTL <= 0 {
		o.Config.BookingTTL = config.DefaultBookingTTL
	}
	if o.Config.SnapshotInterval <= 0 {
		o.Config.SnapshotInterval = config.DefaultSnapshotInterval
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	r := &Replica{
		o: o, log: o.Logger.Named("cluster"), self: o.Config.Replica,
		prefix: "switchyard." + o.Config.Name + ".", stream: o.Config.Name + "-deltas",
		out: make(chan Record, outQueue), resync: make(chan struct{}, 1), hello: make(chan struct{}, 1),
		live: map[string]*Record{}, peers: map[string]*peer{}, remoteOn: map[remoteKey]int{}, events: make(chan bool, 16), warm: make(chan struct{}),
		snapKV: map[kvCandidate]uint64{}, pending: map[kvCandidate]pendingPrefix{},
		malformedLog: rate.Sometimes{Interval: malformedLogInterval},
	}
	m, err := newMetrics(o.Registerer, r)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	r.m = m
	km, err := newKVMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	startSeq := o.KVStartSeq
	if startSeq == nil {
		startSeq = r.snapshotKVNext
	}
	r.kv = newKVShare(o.Config, r.self, km, r.log, startSeq)
	r.kv.gate = r.warm
	r.kv.follower = true
	return r, nil
}

// Connected reports whether the replica is connected to NATS now. While
// it is not, it routes on its own state (and its peers' bookings expire
// after BookingTTL).
func (r *Replica) Connected() bool { return r.connected.Load() }

// State is what a replica knows of its cluster now (router serve's
// /readyz shows it).
type State struct {
	// Replica and Cluster are the names of the cluster block.
	Replica string `json:"replica"`
	Cluster string `json:"cluster"`
	// Connected: to NATS now; while false the replica routes on its own
	// state.
	Connected bool `json:"connected"`
	// Peers are the other replicas heard within the booking TTL, sorted.
	Peers []string `json:"peers"`
	// RemoteBookings counts the other replicas' bookings held.
	RemoteBookings int `json:"remote_bookings"`
	// CaughtUp: the replica has loaded the prefix-index snapshot and
	// applied the deltas stream, and each followed engine's KV events, up
	// to their last message as of its start.
	CaughtUp bool `json:"caught_up"`
	// Snapshot is the prefix-index snapshot loaded at start; absent when
	// there was none (or NATS was away).
	Snapshot *SnapshotState `json:"snapshot,omitempty"`
	// StalledKVFeeds are the followed engine ranks ("worker/rank") whose
	// KV events feed is stalled (no relay lease seen written for twice
	// the lease TTL): their precise indexes are cold, the workers scored
	// by their approximate lists. Absent when none.
	StalledKVFeeds []string `json:"stalled_kv_feeds,omitempty"`
}

// Ready reports whether the replica is ready to route: caught up (State),
// or WarmTimeout has passed since Run began without it (NATS may be
// away: it then routes on what it has). Before Run, false.
func (r *Replica) Ready() bool {
	if r.caughtUp.Load() {
		return true
	}
	start := r.started.Load()
	return start != 0 && time.Since(time.Unix(0, start)) >= r.o.Config.WarmTimeout
}

// State returns the replica's State.
func (r *Replica) State() State {
	st := State{Replica: r.self, Cluster: r.o.Config.Name, Connected: r.Connected(), Peers: []string{}}
	r.mu.Lock()
	st.Peers = r.sortedPeers()
	st.RemoteBookings = r.remote
	r.mu.Unlock()
	st.CaughtUp = r.caughtUp.Load()
	st.StalledKVFeeds = r.StalledKVFeeds()
	r.snapMu.Lock()
	if r.snapLoaded != nil {
		// A copy: Joined counts workers into it under snapMu while the
		// caller reads the State (encodes it for /readyz) without it.
		loaded := *r.snapLoaded
		st.Snapshot = &loaded
	}
	r.snapMu.Unlock()
	return st
}

// Booked publishes a booking of this replica (admission.Observer).
func (r *Replica) Booked(req *shared.Request, d router.Decision) {
	rec := &Record{Kind: KindBooked, ID: req.ID, At: time.Now().UnixNano(), Worker: d.Worker.Name, Model: req.Model,
		Role: req.Role, PromptTokens: req.PromptTokens, BlockSize: req.BlockSize, BlockHashes: slices.Clone(req.BlockHashes),
		Rank: d.Worker.DPRank, HasRank: true}
	r.liveMu.Lock()
	r.live[req.ID] = rec
	r.liveMu.Unlock()
	r.enqueue(*rec)
}

// FirstToken publishes a booking's first token (admission.Observer).
func (r *Replica) FirstToken(id string) { r.enqueue(Record{Kind: KindFirstToken, ID: id}) }

// Released publishes a booking's release (admission.Observer).
func (r *Replica) Released(id string) {
	r.liveMu.Lock()
	delete(r.live, id)
	r.liveMu.Unlock()
	r.enqueue(Record{Kind: KindReleased, ID: id})
}

// enqueue hands rec to the publisher without blocking; when its queue is
// full the record is dropped and the peers will get a snapshot.
func (r *Replica) enqueue(rec Record) {
	select {
	case r.out <- rec:
	default:
		r.m.dropped.WithLabelValues("queue_full").Inc()
		r.requestResync()
	}
}

func (r *Replica) requestResync() {
	select {
	case r.resync <- struct{}{}:
	default:
	}
}

// Run connects to NATS and shares until ctx ends; it returns nil then.
// It never fails for NATS being away: it retries, and meanwhile the
// router routes on its own state. On return the peers are told to forget
// this replica's bookings (a reset record). Errors: a NATS URL the client
// refuses; NATS refusing the cluster block's credentials or TLS, or
// their files not read (connect).
func (r *Replica) Run(ctx context.Context) error {
	r.started.Store(time.Now().UnixNano())
	nc, closeConn, err := connect(r.o.Config, "switchyard "+r.self, r.log, r.connEvent)
	if err != nil {
		return err
	}
	defer closeConn()
	if nc.IsConnected() {
		r.connEvent(true)
	} else {
		r.log.Warn("NATS not reachable; routing on this replica's own state meanwhile, retrying every 250ms", "nats", config.RedactNATS(r.o.Config.NATS))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	hb, err := nc.Subscribe(r.prefix+"hb.*", func(m *nats.Msg) { r.seen(token(m.Subject), time.Now()) })
	if err != nil {
		return fmt.Errorf("cluster: subscribing: %w", err)
	}
	defer func() { _ = hb.Unsubscribe() }()
	hello, err := nc.Subscribe(r.prefix+"hello", func(m *nats.Msg) {
		if string(m.Data) != r.self {
			r.requestResync()
		}
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribing: %w", err)
	}
	defer func() { _ = hello.Unsubscribe() }()

	var wg sync.WaitGroup
	pctx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	wg.Go(func() { r.publish(pctx, nc) })
	wg.Go(func() { r.expire(pctx) })
	wg.Go(func() { r.writeSnapshots(pctx, js) })
	wg.Go(func() { r.watchCatchUp(pctx) })
	wg.Go(func() { r.kv.run(pctx, nc, js) })
	defer func() {
		stopPub()
		wg.Wait()
		if nc.IsConnected() {
			_ = nc.FlushTimeout(2 * time.Second) // the reset record
		}
	}()

	keepJoined(ctx, nc, r.events, r.log, "joining the cluster", func() (func(), error) {
		c, err := r.session(ctx, js)
		if err != nil {
			return nil, err
		}
		// Ask the others for their live bookings, and send ours.
		if err := nc.Publish(r.prefix+"hello", []byte(r.self)); err != nil {
			r.log.Warn("saying hello", "error", err)
		}
		r.requestResync()
		r.log.Info("joined the cluster", "cluster", r.o.Config.Name, "replica", r.self)
		return c.Stop, nil
	})
	return nil
}

// connEvent records a connection change, logs it, and hands it to Run.
func (r *Replica) connEvent(up bool) {
	if r.connected.Swap(up) != up {
		if up {
			r.log.Info("connected to NATS", "nats", config.RedactNATS(r.o.Config.NATS))
		} else {
			r.log.Warn("disconnected from NATS; routing on this replica's own state until it is back", "nats", config.RedactNATS(r.o.Config.NATS))
		}
	}
	r.m.connected.Set(map[bool]float64{true: 1, false: 0}[up])
	select {
	case r.events <- up:
	default:
	}
}

// session makes sure the stream exists and starts this replica's ordered
// consumer on it. The first session loads the prefix-index snapshot and
// replays the stream from the sequence after it (all of it when there is
// none); a later one (a reconnect) goes on after the last sequence
// applied, or from the stream's first message when the stream is new (a
// restarted NATS server). Messages up to the stream's last as of now are
// a replay: they count no sync lag, and this replica's own records of an
// earlier run teach their prefix blocks. Applying them is caught up.
func (r *Replica) session(ctx context.Context, js jetstream.JetStream) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{
		Name:     r.stream,
		Subjects: []string{r.prefix + "d.*"},
		Storage:  jetstream.MemoryStorage,
		// Kept long enough to replay from the last snapshot.
		MaxAge:   max(2*r.o.Config.BookingTTL, 2*r.o.Config.SnapshotInterval),
		MaxBytes: streamBytes,
		Discard:  jetstream.DiscardOld,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", r.stream, err)
	}
	from := r.deltaSeq.Load() + 1
	if !r.warmed {
		seq, err := r.loadSnapshot(ctx, js)
		if err != nil {
			r.log.Warn("no warm start: the prefix-index snapshot cannot be loaded; replaying the streams alone", "error", err)
		}
		r.warmed = true
		close(r.warm)
		from = seq + 1
	}
	first, last := stream.CachedInfo().State.FirstSeq, stream.CachedInfo().State.LastSeq
	if from > last+1 {
		from = first // a new stream: its sequences started again
	}
	if from < first {
		if from > 1 {
			r.m.dropped.WithLabelValues("replay_gap").Add(float64(first - from))
		}
		from = first
	}
	until := last
	if from > until {
		r.markCaughtUp()
	}
	cons, err := js.OrderedConsumer(cctx, r.stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: max(from, 1)})
	if err != nil {
		return nil, fmt.Errorf("consumer on %s: %w", r.stream, err)
	}
	return cons.Consume(func(msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			return
		}
		seq := meta.Sequence.Stream
		r.receive(token(msg.Subject()), msg.Data(), time.Now(), seq <= until)
		r.deltaSeq.Store(seq)
		if seq >= until {
			r.markCaughtUp()
		}
	})
}

// markCaughtUp records that the replica has caught up with the deltas
// stream.
func (r *Replica) markCaughtUp() { r.deltasCaughtUp.Store(true) }

// watchCatchUp marks the replica caught up once the deltas stream and
// every KV-event follow are (checked every 10 ms), then returns; or when
// ctx ends. It logs WarmTimeout passing before that (the replica is ready
// on what it has).
func (r *Replica) watchCatchUp(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var timeout <-chan time.Time
	if wt := r.o.Config.WarmTimeout; wt > 0 {
		tm := time.NewTimer(time.Until(time.Unix(0, r.started.Load()).Add(wt)))
		defer tm.Stop()
		timeout = tm.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			r.log.Warn("ready without having caught up with the cluster: warm_timeout passed", "warm_timeout", r.o.Config.WarmTimeout)
			timeout = nil
			continue
		case <-t.C:
		}
		if r.deltasCaughtUp.Load() && r.KVCaughtUp() {
			r.caughtUp.Store(true)
			start := r.started.Load()
			r.log.Info("caught up with the cluster", "after", time.Since(time.Unix(0, start)).Round(time.Millisecond))
			return
		}
	}
}

// token returns a subject's last token: the sending replica.
func token(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// publish sends the local records, snapshots and heartbeats until ctx
// ends, then a reset record: the peers forget this replica's bookings at
// once instead of after the TTL.
func (r *Replica) publish(ctx context.Context, nc *nats.Conn) {
	subject := r.prefix + "d." + r.self
	hbSubject := r.prefix + "hb." + r.self
	buf := make([]byte, 0, batchBytes+4096)
	send := func() {
		if len(buf) <= 1 {
			return
		}
		if err := nc.Publish(subject, buf); err != nil {
			r.m.dropped.WithLabelValues("disconnected").Inc()
			r.requestResync()
		} else {
			r.m.published.Inc()
		}
		buf = append(buf[:0], wireVersion)
	}
	buf = append(buf, wireVersion)
	add := func(rec *Record) {
		if len(buf)+rec.size() > maxMessage {
			send()
		}
		buf = appendRecord(buf, rec)
	}
	snapshot := func() {
		r.liveMu.Lock()
		snap := make([]*Record, 0, len(r.live))
		for _, rec := range r.live {
			snap = append(snap, rec)
		}
		r.liveMu.Unlock()
		send()
		add(&Record{Kind: KindReset})
		for _, rec := range snap {
			add(rec)
		}
		send()
		r.m.snapshots.Inc()
	}
	// Snapshots are at most one per resyncGap: a request within it waits
	// for the gap's end (resync is then nil, the requests coalesced in
	// r.resync meanwhile).
	resync := r.resync
	var resyncLater <-chan time.Time
	var lastSnapshot time.Time
	hb := time.NewTicker(r.o.Config.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			add(&Record{Kind: KindReset})
			send()
			return
		case rec := <-r.out:
			add(&rec)
			for len(buf) < batchBytes {
				select {
				case rec := <-r.out:
					add(&rec)
					continue
				default:
				}
				break
			}
			send()
		case <-resync:
			if wait := resyncGap - time.Since(lastSnapshot); wait > 0 {
				resync, resyncLater = nil, time.After(wait)
				continue
			}
			snapshot()
			lastSnapshot = time.Now()
		case <-resyncLater:
			resync, resyncLater = r.resync, nil
			snapshot()
			lastSnapshot = time.Now()
		case <-hb.C:
			if err := nc.Publish(hbSubject, nil); err != nil {
				r.m.dropped.WithLabelValues("disconnected").Inc()
			}
		}
	}
}

// receive applies a deltas message of replica from, received at now;
// replay: it was published before this session began. This replica's
// own records are skipped, but for the prefix blocks of its bookings in a
// replay (an earlier run's, which its index lost).
func (r *Replica) receive(from string, data []byte, now time.Time, replay bool) {
	if from == r.self {
		if replay {
			r.relearn(data)
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peer(from, now)
	if p == nil {
		return
	}
	// The bookings of p a reset in this message let go of: a snapshot's
	// booked record that repeats one (same worker and rank) takes it back
	// as it is; the rest are released at the message's end.
	var stale map[string]remoteBooking
	err := decode(data, func(rec *Record) { r.apply(from, p, rec, now, replay, &stale) })
	r.releaseStale(stale)
	if err != nil {
		r.m.dropped.WithLabelValues("malformed").Inc()
		r.malformedLog.Do(func() {
			r.log.Warn("a replica's message does not decode; its records after the fault are dropped (logged at most every "+malformedLogInterval.String()+
				", each counted in switchyard_cluster_dropped_total{reason=\"malformed\"})", "replica", from, "error", err)
		})
	}
}

// relearn records the prefix blocks of this replica's own bookings in a
// replayed message (an earlier run's) in the Router's approximate index.
// Malformed messages are dropped as receive drops them.
func (r *Replica) relearn(data []byte) {
	if err := decode(data, func(rec *Record) {
		if rec.Kind != KindBooked || len(rec.BlockHashes) == 0 {
			return
		}
		// Hashes without a positive block size are no chain of any size.
		if id, ok := r.o.Resolve(rec.Worker); ok && rec.BlockSize > 0 {
			r.o.Router.Prefix().Record(prefix.Candidate{ID: id, Rank: rec.Rank}, rec.BlockHashes)
		}
	}); err != nil {
		r.m.dropped.WithLabelValues("malformed").Inc()
	}
}

// peer returns from's state, made on first sight; it is alive as of now.
// nil, counted, when from is not a replica name (malformed) or is new
// with maxPeers replicas heard already (too_many). r.mu is held.
func (r *Replica) peer(from string, now time.Time) *peer {
	p := r.peers[from]
	if p == nil {
		switch {
		case !config.ClusterToken(from):
			r.m.dropped.WithLabelValues("malformed").Inc()
			return nil
		case len(r.peers) >= maxPeers:
			r.m.dropped.WithLabelValues("too_many").Inc()
			return nil
		}
		p = &peer{bookings: map[string]remoteBooking{}}
		r.peers[from] = p
	}
	p.lastSeen = now
	return p
}

// seen records a heartbeat of from.
func (r *Replica) seen(from string, now time.Time) {
	if from == r.self {
		return
	}
	r.mu.Lock()
	r.peer(from, now)
	r.mu.Unlock()
}

// apply applies one record of peer p (named from). r.mu is held: the
// placement runs no policy and does not block (a binding target).
//
// A reset does not release p's bookings at once: it moves them to
// *stale, from which a booked record that follows (the snapshot the reset
// begins) takes back the booking it repeats, on the same worker rank,
// unchanged: re-placing it would charge its prefill against an index that
// holds its own blocks by now (a prefill of 0 tokens), and would forget
// its first token. receive releases what is left in *stale at the end of
// the message.
func (r *Replica) apply(from string, p *peer, rec *Record, now time.Time, replay bool, stale *map[string]remoteBooking) {
	r.m.received.WithLabelValues(rec.Kind.String()).Inc()
	switch rec.Kind {
	case KindReset:
		r.releaseStale(*stale) // an earlier reset's in this message, not repeated
		*stale = p.bookings
		p.bookings = map[string]remoteBooking{}
		for _, rb := range *stale {
			r.uncount(rb) // no longer held for p: the limits do not count it
		}
	case KindBooked:
		if _, dup := p.bookings[rec.ID]; dup {
			return // a snapshot repeating a booking already applied
		}
		id, ok := r.o.Resolve(rec.Worker)
		if !ok {
			r.m.dropped.WithLabelValues("unknown_worker").Inc()
			return
		}
		on := remoteKey{id, rec.Rank}
		if rb, ok := (*stale)[rec.ID]; ok {
			delete(*stale, rec.ID)
			if rb.on == on {
				// The snapshot repeats it: kept as it is.
				p.bookings[rec.ID] = rb
				r.remote++
				r.remoteOn[on]++
				return
			}
			rb.b.Release() // it moved meanwhile: placed again below
		}
		if r.remote >= maxRemoteBookings {
			r.m.dropped.WithLabelValues("too_many").Inc()
			return
		}
		if limit, bounded := r.remoteLimit(); bounded && int64(r.remoteOn[on]) >= limit {
			r.m.dropped.WithLabelValues("over_share").Inc()
			return
		}
		req := &shared.Request{ID: from + "/" + rec.ID, Model: rec.Model, Role: rec.Role, PromptTokens: rec.PromptTokens,
			BlockSize: rec.BlockSize, BlockHashes: slices.Clone(rec.BlockHashes)}
		d, err := r.o.Router.Bind(context.Background(), req, router.Binding{Worker: id, Rank: rec.Rank, HasRank: rec.HasRank, Capacity: r.o.Capacity})
		if err != nil {
			r.m.dropped.WithLabelValues("not_placed").Inc()
			return
		}
		p.bookings[rec.ID] = remoteBooking{d.Booking, on}
		r.remote++
		r.remoteOn[on]++
		if rec.At > 0 && !replay {
			r.m.lag.Observe(max(now.Sub(time.Unix(0, rec.At)).Seconds(), 0))
		}
		if r.applied != nil {
			r.applied(rec.ID, rec.At)
		}
	case KindFirstToken:
		if rb, ok := p.bookings[rec.ID]; ok {
			rb.b.PrefillDone()
		} else if rb, ok := (*stale)[rec.ID]; ok {
			rb.b.PrefillDone()
		}
	case KindReleased:
		if rb, ok := p.bookings[rec.ID]; ok {
			r.release(p, rec.ID, rb)
		} else if rb, ok := (*stale)[rec.ID]; ok {
			delete(*stale, rec.ID)
			rb.b.Release()
		}
	}
}

// remoteLimit returns how many of the other replicas' bookings, all
// together, count on one worker rank: the capacity (Options.Capacity)
// less this replica's share of it, ceil(capacity / replicas heard,
// this one included); false without a capacity (then only
// maxRemoteBookings bounds them). Anyone who can publish on the deltas
// subjects can claim bookings under made-up names: past the limit they
// are dropped (over_share), so they can never fill a worker for this
// replica, which always keeps at least its share. r.mu is held.
func (r *Replica) remoteLimit() (int64, bool) {
	c := r.o.Capacity
	if c <= 0 {
		return 0, false
	}
	n := int64(len(r.peers) + 1)
	return c - (c+n-1)/n, true
}

// release releases p's booking id (rb). r.mu is held.
func (r *Replica) release(p *peer, id string, rb remoteBooking) {
	rb.b.Release()
	delete(p.bookings, id)
	r.uncount(rb)
}

// uncount takes rb out of the counts of the bookings held (remote,
// remoteOn). r.mu is held.
func (r *Replica) uncount(rb remoteBooking) {
	r.remote--
	if r.remoteOn[rb.on]--; r.remoteOn[rb.on] <= 0 {
		delete(r.remoteOn, rb.on)
	}
}

// releaseStale releases the bookings a reset let go of that no snapshot
// record took back (apply; they are counted no more). r.mu is held.
func (r *Replica) releaseStale(stale map[string]remoteBooking) {
	for _, rb := range stale {
		rb.b.Release()
	}
}

// releaseAll releases every booking of p. r.mu is held.
func (r *Replica) releaseAll(p *peer) int {
	n := len(p.bookings)
	for id, rb := range p.bookings {
		r.release(p, id, rb)
	}
	return n
}

// expire releases, every heartbeat, the bookings of the peers silent for
// BookingTTL, until ctx ends; then it releases every peer's bookings (this
// replica stops counting them).
func (r *Replica) expire(ctx context.Context) {
	t := time.NewTicker(r.o.Config.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for _, p := range r.peers {
				r.releaseAll(p)
			}
			r.mu.Unlock()
			return
		case now := <-t.C:
			r.mu.Lock()
			for name, p := range r.peers {
				if now.Sub(p.lastSeen) <= r.o.Config.BookingTTL {
					continue
				}
				if n := r.releaseAll(p); n > 0 {
					r.m.expired.Add(float64(n))
					r.log.Warn("a replica fell silent; its bookings expired", "replica", name, "bookings", n, "silent_for", now.Sub(p.lastSeen).Round(time.Millisecond))
				}
				delete(r.peers, name)
			}
			r.mu.Unlock()
		}
	}
}

// String returns the kind's name: booked, first_token, released, reset.
func (k Kind) String() string {
	switch k {
	case KindBooked:
		return "booked"
	case KindFirstToken:
		return "first_token"
	case KindReleased:
		return "released"
	case KindReset:
		return "reset"
	}
	return "unknown"
}

// sortedPeers returns the names of the replicas heard, sorted. r.mu is
// held.
func (r *Replica) sortedPeers() []string {
	names := make([]string, 0, len(r.peers))
	for name := range r.peers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
