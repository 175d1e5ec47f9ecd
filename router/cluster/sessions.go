package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// Bounds of the shared session bindings.
const (
	// DefaultMaxSharedSessions bounds the bindings a replica's mirror of
	// the sessions bucket holds, all partitions together: about 200 bytes
	// each with 36-byte session ids, some 50 MB at the bound. Past it,
	// once the expired ones are swept, a new binding is dropped and
	// counted (too_many); the classifiers' own bindings are unaffected.
	DefaultMaxSharedSessions = 1 << 18
	// maxSessionValue bounds a binding's encoded value (its session id,
	// model, role, worker and replica names): larger ones are not shared
	// (too_long) and, received, are dropped (malformed). The bucket's
	// max_value_size.
	maxSessionValue = 1024
	// sessionQueue bounds the bindings waiting to be written; past it a
	// binding is dropped and counted (queue_full).
	sessionQueue = 1 << 12
	// sessionBucketBytes bounds the sessions bucket (memory storage):
	// past it NATS refuses new keys until old ones expire (counted as
	// write_failed).
	sessionBucketBytes = 64 << 20
	// sessionWriteTimeout bounds one write's wait for NATS's ack.
	sessionWriteTimeout = 5 * time.Second
	// sessionValueVersion is the first byte of a binding's value.
	sessionValueVersion = 1
)

// SessionsOptions configure Sessions.
type SessionsOptions struct {
	// Config is the policy file's cluster block (required): its NATS,
	// replica, name and session_ttl.
	Config config.Cluster
	// Router resolves worker names in each partition (required): a
	// binding names its worker, which this replica finds among the
	// partition's workers (router.Router.Workers) or ignores.
	Router *router.Router
	// MaxBindings bounds the mirror (0: DefaultMaxSharedSessions).
	MaxBindings int
	// Registerer receives the metrics; nil: none.
	Registerer prometheus.Registerer
	// Logger receives the logs; nil discards them.
	Logger hclog.Logger
	// now overrides the clock of the mirror's expiry in tests; nil:
	// time.Now.
	now func() time.Time
}

// Sessions shares the session-affinity classifiers' bindings between the
// replicas of a cluster through the JetStream key-value bucket
// <name>-sessions (memory storage, TTL session_ttl, one value per key):
// the key is a hash of the binding's model, role and session, the value
// names the worker, the time of the send and the replica. Each replica
// writes its sends through a bounded queue and keeps a mirror of the
// whole bucket, fed by a watch, from which its classifiers read: no
// classifier call waits on NATS. docs/replicas.md ("Sessions") gives the
// model. Safe for concurrent use.
type Sessions struct {
	o      SessionsOptions
	log    hclog.Logger
	bucket string
	out    chan sessionWrite
	kv     atomic.Pointer[jetstream.KeyValue] // nil until the bucket is joined

	mu     sync.RWMutex
	mirror map[sessionKey]sessionEntry
	// nextSweep is when a full mirror may be swept again on a new
	// binding: one sweep per session_ttl/16 (at least a second) at most,
	// so a full mirror costs a binding no more than a map lookup.
	nextSweep time.Time

	events chan bool
	m      *sessionMetrics
	// received, when set (tests), is called after each binding the watch
	// applied to the mirror.
	received func()
}

// sessionKey identifies one binding: a session of a partition.
type sessionKey struct {
	model   string
	role    shared.Role
	session string
}

// sessionEntry is a binding as shared: the worker's name, when it was
// made (the sending replica's clock, Unix nanoseconds) and by whom.
type sessionEntry struct {
	worker  string
	at      int64
	replica string
}

// sessionWrite is a binding waiting to be written.
type sessionWrite struct {
	key    sessionKey
	worker shared.WorkerID
	at     int64
}

// NewSessions checks o and returns Sessions; Run connects it. Errors:
// options missing.
func NewSessions(o SessionsOptions) (*Sessions, error) {
	if o.Router == nil || o.Config.NATS == "" || o.Config.Replica == "" || o.Config.Name == "" {
		return nil, errors.New("cluster: SessionsOptions needs Config (nats, replica, name) and Router")
	}
	if o.Config.SessionTTL <= 0 {
		o.Config.SessionTTL = config.DefaultSharedSessionTTL
	}
	if o.MaxBindings <= 0 {
		o.MaxBindings = DefaultMaxSharedSessions
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.now == nil {
		o.now = time.Now
	}
	s := &Sessions{o: o, log: o.Logger.Named("cluster.sessions"), bucket: o.Config.Name + "-sessions",
		out: make(chan sessionWrite, sessionQueue), mirror: map[sessionKey]sessionEntry{}, events: make(chan bool, 16)}
	m, err := newSessionMetrics(o.Registerer, s)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	s.m = m
	return s, nil
}

// For returns the shared.SessionStore of the (model, role) partition:
// what admission hands its classifier (admission.Options.Sessions).
func (s *Sessions) For(model string, role shared.Role) shared.SessionStore {
	return &partitionSessions{s: s, model: model, role: role}
}

// Len returns the number of bindings in the mirror.
func (s *Sessions) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.mirror)
}

// partitionSessions is one partition's view of Sessions.
type partitionSessions struct {
	s     *Sessions
	model string
	role  shared.Role
}

// Bind queues the binding for writing; it never blocks: with the queue
// full it is dropped and counted.
func (p *partitionSessions) Bind(session string, worker shared.WorkerID, at time.Time) {
	if len(session)+len(p.model) > maxSessionValue/2 {
		p.s.m.dropped.WithLabelValues("too_long").Inc()
		return
	}
	w := sessionWrite{key: sessionKey{p.model, p.role, strings.Clone(session)}, worker: worker, at: at.UnixNano()}
	select {
	case p.s.out <- w:
	default:
		p.s.m.dropped.WithLabelValues("queue_full").Inc()
	}
}

// Binding returns the mirror's binding of session in the partition,
// with its worker found among the partition's workers by name; false
// when there is none or the worker is not here. It does not allocate.
func (p *partitionSessions) Binding(session string) (shared.WorkerID, time.Time, bool) {
	p.s.mu.RLock()
	e, ok := p.s.mirror[sessionKey{p.model, p.role, session}]
	p.s.mu.RUnlock()
	if !ok {
		return 0, time.Time{}, false
	}
	for _, w := range p.s.o.Router.Workers(p.model, p.role) {
		if w.Name == e.worker {
			return w.ID, time.Unix(0, e.at), true
		}
	}
	return 0, time.Time{}, false
}

// workerName returns the name of worker id in the partition of k.
func (s *Sessions) workerName(k *sessionKey, id shared.WorkerID) (string, bool) {
	for _, w := range s.o.Router.Workers(k.model, k.role) {
		if w.ID == id {
			return w.Name, true
		}
	}
	return "", false
}

// Run connects to NATS on a connection of its own and shares the
// bindings until ctx ends; it returns nil then. NATS being away is not an
// error: it retries, the writes meanwhile are dropped and counted, and the
// mirror keeps what it holds (expiring it by session_ttl). On every
// (re)connection it makes sure the bucket exists (a restarted NATS keeps
// no memory bucket) and watches it again from its current values.
// Errors: a NATS URL the client refuses; NATS refusing the cluster
// block's credentials or TLS, or their files not read (connect).
func (s *Sessions) Run(ctx context.Context) error {
	nc, closeConn, err := connect(s.o.Config, "switchyard "+s.o.Config.Replica+" sessions", s.log, s.connEvent)
	if err != nil {
		return err
	}
	defer closeConn()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.write(ctx, nc) })
	wg.Go(func() { s.sweep(ctx) })

	keepJoined(ctx, nc, s.events, s.log, "joining the sessions bucket", func() (func(), error) {
		wctx, cancel := context.WithCancel(ctx)
		if err := s.join(wctx, js, &wg); err != nil {
			cancel()
			return nil, err
		}
		return func() { cancel(); s.kv.Store(nil) }, nil
	})
	s.kv.Store(nil)
	return nil
}

// connEvent hands a connection change to Run.
func (s *Sessions) connEvent(up bool) {
	select {
	case s.events <- up:
	default:
	}
}

// join makes sure the bucket exists and starts watching it (until ctx
// ends) on wg.
func (s *Sessions) join(ctx context.Context, js jetstream.JetStream, wg *sync.WaitGroup) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(cctx, jetstream.KeyValueConfig{
		Bucket:       s.bucket,
		Description:  "switchyard session-affinity bindings (docs/replicas.md)",
		TTL:          s.o.Config.SessionTTL,
		History:      1,
		Storage:      jetstream.MemoryStorage,
		MaxValueSize: maxSessionValue,
		MaxBytes:     sessionBucketBytes,
	})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", s.bucket, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching %s: %w", s.bucket, err)
	}
	s.kv.Store(&kv)
	wg.Go(func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil { // nil: the current values are all delivered
					s.apply(e.Key(), e.Operation(), e.Value())
				}
			}
		}
	})
	s.log.Info("sharing session bindings", "bucket", s.bucket, "ttl", s.o.Config.SessionTTL)
	return nil
}

// write writes the queued bindings until ctx ends.
func (s *Sessions) write(ctx context.Context, nc *nats.Conn) {
	buf := make([]byte, 0, maxSessionValue)
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-s.out:
			kvp := s.kv.Load()
			if kvp == nil || !nc.IsConnected() {
				s.m.dropped.WithLabelValues("disconnected").Inc()
				continue
			}
			name, ok := s.workerName(&w.key, w.worker)
			if !ok {
				s.m.dropped.WithLabelValues("unknown_worker").Inc()
				continue
			}
			buf = appendSessionValue(buf[:0], &w.key, sessionEntry{worker: name, at: w.at, replica: s.o.Config.Replica})
			if len(buf) > maxSessionValue {
				s.m.dropped.WithLabelValues("too_long").Inc()
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, sessionWriteTimeout)
			_, err := (*kvp).Put(wctx, sessionBucketKey(&w.key), buf)
			cancel()
			if err != nil {
				s.m.dropped.WithLabelValues("write_failed").Inc()
				s.log.Debug("writing a session binding", "error", err)
				continue
			}
			s.m.published.Inc()
		}
	}
}

// apply applies one entry of the bucket to the mirror. Replicas never
// delete a binding (they expire), so a delete or purge someone made by
// hand is ignored: the mirror forgets the binding at its expiry.
func (s *Sessions) apply(key string, op jetstream.KeyValueOp, value []byte) {
	if op != jetstream.KeyValuePut {
		return
	}
	k, e, err := decodeSessionValue(value)
	if err == nil && sessionBucketKey(&k) != key {
		err = errors.New("the key is not the binding's")
	}
	if err != nil {
		s.m.dropped.WithLabelValues("malformed").Inc()
		s.log.Debug("a session binding does not decode; dropped", "key", key, "error", err)
		return
	}
	s.mu.Lock()
	if _, ok := s.mirror[k]; !ok && len(s.mirror) >= s.o.MaxBindings {
		if now := s.o.now(); !now.Before(s.nextSweep) {
			s.sweepLocked(now)
			s.nextSweep = now.Add(max(s.o.Config.SessionTTL/16, time.Second))
		}
		if len(s.mirror) >= s.o.MaxBindings {
			s.mu.Unlock()
			s.m.dropped.WithLabelValues("too_many").Inc()
			return
		}
	}
	s.mirror[k] = e
	s.mu.Unlock()
	s.m.received.Inc()
	if s.received != nil {
		s.received()
	}
}

// sweep drops the mirror's expired bindings every quarter of session_ttl
// (at most every minute) until ctx ends: the bucket expires its keys
// without telling its watchers.
func (s *Sessions) sweep(ctx context.Context) {
	t := time.NewTicker(min(s.o.Config.SessionTTL/4, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			s.sweepLocked(s.o.now())
			s.mu.Unlock()
		}
	}
}

// sweepLocked drops the bindings older than session_ttl. s.mu is held.
func (s *Sessions) sweepLocked(now time.Time) {
	horizon := now.Add(-s.o.Config.SessionTTL).UnixNano()
	for k, e := range s.mirror {
		if e.at < horizon {
			delete(s.mirror, k)
		}
	}
}

// sessionBucketKey returns k's key in the bucket: "s." and the base64url
// of the first 18 bytes of SHA-256(model, 0, role, 0, session), a valid
// KV key of fixed length whatever the session id holds.
func sessionBucketKey(k *sessionKey) string {
	h := sha256.New()
	h.Write([]byte(k.model))
	h.Write([]byte{0})
	h.Write([]byte(k.role))
	h.Write([]byte{0})
	h.Write([]byte(k.session))
	var sum [sha256.Size]byte
	return "s." + base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:18])
}

// appendSessionValue appends the value of binding (k, e) to b: the
// version byte, the time as a uvarint of Unix nanoseconds, then the
// model, role, session, worker and replica, each a uvarint length and its
// bytes.
func appendSessionValue(b []byte, k *sessionKey, e sessionEntry) []byte {
	b = append(b, sessionValueVersion)
	b = binary.AppendUvarint(b, uint64(max(e.at, 0)))
	for _, f := range []string{k.model, string(k.role), k.session, e.worker, e.replica} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// errSessionValue reports a binding's value that does not decode.
var errSessionValue = errors.New("malformed session binding")

// decodeSessionValue decodes a value appendSessionValue made, in one pass
// over it; values over maxSessionValue bytes are refused.
func decodeSessionValue(b []byte) (sessionKey, sessionEntry, error) {
	var k sessionKey
	var e sessionEntry
	if len(b) > maxSessionValue {
		return k, e, fmt.Errorf("%w: %d bytes, more than %d", errSessionValue, len(b), maxSessionValue)
	}
	if len(b) == 0 || b[0] != sessionValueVersion {
		return k, e, fmt.Errorf("%w: not version %d", errSessionValue, sessionValueVersion)
	}
	b = b[1:]
	at, n := binary.Uvarint(b)
	if n <= 0 || at > 1<<62 {
		return k, e, fmt.Errorf("%w: bad time", errSessionValue)
	}
	b = b[n:]
	var fields [5]string
	for i := range fields {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return k, e, fmt.Errorf("%w: field %d truncated", errSessionValue, i+1)
		}
		fields[i] = string(b[n : n+int(l)])
		b = b[n+int(l):]
	}
	if len(b) != 0 {
		return k, e, fmt.Errorf("%w: %d trailing bytes", errSessionValue, len(b))
	}
	k = sessionKey{model: fields[0], role: shared.Role(fields[1]), session: fields[2]}
	e = sessionEntry{worker: fields[3], at: int64(at), replica: fields[4]}
	if k.session == "" || e.worker == "" || !k.role.Valid() {
		return k, e, fmt.Errorf("%w: no session, worker or valid role", errSessionValue)
	}
	return k, e, nil
}

// sessionMetrics are the shared sessions' Prometheus series
// (docs/replicas.md).
type sessionMetrics struct {
	published prometheus.Counter
	received  prometheus.Counter
	dropped   *prometheus.CounterVec // reason
}

func newSessionMetrics(reg prometheus.Registerer, s *Sessions) (*sessionMetrics, error) {
	m := &sessionMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_session_bindings_published_total",
			Help: "Session bindings this replica wrote to the sessions bucket."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_session_bindings_received_total",
			Help: "Session bindings (this replica's and the others') applied to this replica's mirror of the sessions bucket."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_session_bindings_dropped_total",
			Help: "Session bindings not shared or not applied, by reason: queue_full, disconnected, unknown_worker, too_long, write_failed (not written); malformed, too_many (not applied)."}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "switchyard_cluster_session_bindings",
		Help: "Session bindings in this replica's mirror of the sessions bucket."}, func() float64 { return float64(s.Len()) })
	for _, c := range []prometheus.Collector{m.published, m.received, m.dropped, held} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
