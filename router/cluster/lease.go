package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/config"
)

// Leases.
//
// A lease is a key of the JetStream KV bucket <cluster>-leases (memory
// storage, one revision kept, keys expiring LeaseTTL after their last
// write). Whoever holds a key runs what the key stands for (a relay of
// one engine's KV events, relay.go); the others wait for it to be free:
//
//   - take: kv.Create (only when the key is absent, deleted or expired);
//   - keep: kv.Update(key, value, last revision) every heartbeat; an
//     update that fails for a revision mismatch means another holder took
//     the key (it expired meanwhile): the run is stopped at once. An update
//     that fails otherwise (NATS away) is retried every heartbeat until
//     LeaseTTL has passed since the last renewal, then the run is stopped
//     too: by then the key has expired and another may hold it;
//   - give up: on a clean stop the key is deleted (at its revision), so a
//     waiting replica takes it within a heartbeat; a holder that dies
//     leaves it to expire after LeaseTTL.
//
// Two holders can overlap only while one has not yet seen its renewal
// fail: at most a heartbeat, and only after it could not renew for a
// whole TTL.
//
// A lease's value (leaseValue, JSON, at most maxLeaseValue bytes) names
// its holder and a token drawn at random when the lease is taken: what a
// relay's messages carry, so that its followers, watching the bucket,
// apply the messages of the lease's current holder only (kvfeed.go). A
// relay also writes in it where its run starts on the KV stream.

// LeaseTTL is how long a lease outlives its holder's last renewal: three
// heartbeats (config.Cluster.Heartbeat, renewed every heartbeat), at least
// minLeaseTTL. Every replica of a cluster should run with the same
// heartbeat: the bucket's TTL is the last one set.
func LeaseTTL(c config.Cluster) time.Duration {
	hb := c.Heartbeat
	if hb <= 0 {
		hb = config.DefaultHeartbeat
	}
	return max(3*hb, minLeaseTTL)
}

// minLeaseTTL keeps leases from flapping on a busy machine when the
// heartbeat is very short.
const minLeaseTTL = time.Second

// LeaseKey returns the KV key of a lease named by kind and parts: kind,
// then each part encoded base64url without padding (so any worker name
// makes a valid key and subject token), joined by dots, e.g.
// LeaseKey("relay", "vllm-0", "0") = "relay.dmxsbS0w.MA". kind must be
// letters, digits, '-' or '_'.
func LeaseKey(kind string, parts ...string) string {
	var b strings.Builder
	b.WriteString(kind)
	for _, p := range parts {
		b.WriteByte('.')
		b.WriteString(encodeToken(p))
	}
	return b.String()
}

// encodeToken encodes s as one NATS subject token or KV key segment:
// base64url without padding ("_" for the empty string).
func encodeToken(s string) string {
	if s == "" {
		return "_"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

// maxLeaseValue bounds a lease's value (the bucket's max_value_size); a
// value read that is larger, or does not decode, names no holder.
const maxLeaseValue = 1024

// leaseValue is a lease's value.
type leaseValue struct {
	// Holder names the holder (logs, `nats kv get`).
	Holder string `json:"holder"`
	// Token is drawn at random when the lease is taken (16 hex digits):
	// the holder's messages carry it (relayHeader).
	Token string `json:"token"`
	// Stream and Start, for a relay's lease: the KV stream's creation
	// time (Unix nanoseconds, as the relay saw it) and the stream
	// sequence of its run's first message (its clear); 0 until it is
	// known.
	Stream int64  `json:"stream,omitempty"`
	Start  uint64 `json:"start,omitempty"`
}

// decodeLeaseValue decodes a lease's value; false when it is larger than
// maxLeaseValue, does not decode or has no token.
func decodeLeaseValue(b []byte) (leaseValue, bool) {
	var v leaseValue
	if len(b) > maxLeaseValue || json.Unmarshal(b, &v) != nil || v.Token == "" || len(v.Token) > 64 {
		return leaseValue{}, false
	}
	return v, true
}

// newToken draws a lease token: 64 random bits in hex.
func newToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Leases holds leases of one cluster for one holder. Make it with
// openLeases; safe for concurrent use.
type Leases struct {
	js     jetstream.JetStream
	cfg    jetstream.KeyValueConfig
	kv     jetstream.KeyValue
	holder string
	renew  time.Duration
	ttl    time.Duration
	log    hclog.Logger
	held   prometheus.Gauge
}

// openLeases makes sure the bucket <cluster>-leases exists and returns
// holder's Leases on it. held counts the relay leases held (may be nil).
func openLeases(ctx context.Context, js jetstream.JetStream, c config.Cluster, holder string, held prometheus.Gauge, log hclog.Logger) (*Leases, error) {
	ttl := LeaseTTL(c)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	bucket := c.Name + "-leases"
	cfg := jetstream.KeyValueConfig{
		Bucket: bucket, Description: "switchyard leases (docs/replicas.md)",
		History: 1, TTL: ttl, Storage: jetstream.MemoryStorage, MaxValueSize: maxLeaseValue,
	}
	kv, err := js.CreateOrUpdateKeyValue(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	return &Leases{js: js, cfg: cfg, kv: kv, holder: holder, renew: ttl / 3, ttl: ttl, held: held, log: log}, nil
}

// remake makes the bucket again when NATS has lost it (a restarted
// server keeps no memory bucket); nothing when it exists. The handle
// l.kv names the bucket, so it works on the bucket made again.
func (l *Leases) remake(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, l.renew)
	defer cancel()
	if _, err := l.js.KeyValue(cctx, l.cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		return err
	}
	if _, err := l.js.CreateOrUpdateKeyValue(cctx, l.cfg); err != nil {
		return fmt.Errorf("lease bucket %s: %w", l.cfg.Bucket, err)
	}
	l.log.Info("lease bucket made again (NATS lost it)", "bucket", l.cfg.Bucket)
	return nil
}

// created returns the bucket's creation time: a bucket lost and made
// again has another. Errors: jetstream.ErrBucketNotFound when it is gone;
// NATS away.
func (l *Leases) created(ctx context.Context) (time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, max(l.renew, time.Second))
	defer cancel()
	st, err := l.kv.Status(cctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = jetstream.ErrBucketNotFound
	}
	if err != nil {
		return time.Time{}, err
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return time.Time{}, fmt.Errorf("lease bucket %s: no stream info", l.cfg.Bucket)
	}
	return bs.StreamInfo().Created, nil
}

// gone reports whether the bucket was lost, after making it again.
func (l *Leases) gone(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, l.renew)
	defer cancel()
	if _, err := l.js.KeyValue(cctx, l.cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false
	}
	if err := l.remake(ctx); err != nil {
		l.log.Debug("lease bucket not made again", "error", err)
	}
	return true
}

// Hold competes for the lease key until ctx ends: whenever it holds the
// key it runs run with a context that ends when the lease is lost or ctx
// ends, and waits for run to return before competing again. A free key is
// tried every renewal period (LeaseTTL/3); a try that fails otherwise than
// for the key being held makes the bucket again if NATS lost it. On return the lease is given
// up (deleted) if held; so is it when run returns by itself (Hold then
// competes again). key must be a valid KV key (LeaseKey makes one).
func (l *Leases) Hold(ctx context.Context, key string, run func(ctx context.Context)) {
	t := time.NewTicker(l.renew)
	defer t.Stop()
	var failing time.Time // since when takes fail otherwise than for the key being held
	for {
		rev, h, err := l.take(ctx, key)
		switch {
		case err == nil:
			failing = time.Time{}
			l.hold(ctx, t, key, rev, h, run)
		case errors.Is(err, jetstream.ErrKeyExists) || ctx.Err() != nil:
			failing = time.Time{}
		default:
			l.log.Debug("lease not taken", "key", key, "error", err)
			if failing.IsZero() {
				failing = time.Now()
			}
			// The bucket may be gone (a restarted NATS server): its holder
			// makes it again at its next renewal (hold); the others only
			// after twice the TTL, so that the holder keeps its lease rather
			// than two relays starting.
			if time.Since(failing) >= 2*l.ttl {
				if err := l.remake(ctx); err != nil && ctx.Err() == nil {
					l.log.Debug("lease bucket not checked", "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// take creates the key with a new token; it returns the key's revision
// and the lease.
func (l *Leases) take(ctx context.Context, key string) (uint64, *heldLease, error) {
	cctx, cancel := context.WithTimeout(ctx, l.renew)
	defer cancel()
	h := &heldLease{value: leaseValue{Holder: l.holder, Token: newToken()}, dirty: make(chan struct{}, 1)}
	rev, err := l.kv.Create(cctx, key, h.encode())
	return rev, h, err
}

// heldLease is a lease held by a run (Hold): its value, which the run
// may change (noteLeaseStart) and Hold writes at once and at each
// renewal.
type heldLease struct {
	mu    sync.Mutex
	value leaseValue
	dirty chan struct{} // a value to write
}

func (h *heldLease) encode() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, _ := json.Marshal(h.value) // strings and numbers always encode
	return b
}

// release gives the lease (key at rev) up at once, so that another
// holder takes it within its next try rather than after the TTL.
func (l *Leases) release(ctx context.Context, key string, rev uint64) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(dctx, key, jetstream.LastRevision(rev)); err != nil {
		l.log.Warn("lease not given up; it expires after its TTL", "key", key, "ttl", l.ttl, "error", err)
		return
	}
	l.log.Info("lease given up", "key", key)
}

// heldLeaseKey is the context key of the lease a run holds
// (LeaseToken).
type heldLeaseKey struct{}

// LeaseToken returns the token of the lease held by the run of ctx
// (Leases.Hold): 16 hex digits drawn when the lease was taken, written in
// the lease's value; "" outside one. A later holder of the key has
// another: followers that watch the bucket tell the current holder's
// messages by it.
func LeaseToken(ctx context.Context) string {
	h, _ := ctx.Value(heldLeaseKey{}).(*heldLease)
	if h == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.value.Token
}

// noteLeaseStart records in the value of the lease held by the run of
// ctx that its run started at sequence start of the KV stream made at
// stream (Unix nanoseconds); Hold writes it at once. Nothing outside a
// run.
func noteLeaseStart(ctx context.Context, stream int64, start uint64) {
	h, _ := ctx.Value(heldLeaseKey{}).(*heldLease)
	if h == nil {
		return
	}
	h.mu.Lock()
	h.value.Stream, h.value.Start = stream, start
	h.mu.Unlock()
	select {
	case h.dirty <- struct{}{}:
	default:
	}
}

// hold runs run while the lease (key at rev) is renewed, then gives it up
// (ctx ended, or run returned) or lets it go (lost).
func (l *Leases) hold(ctx context.Context, t *time.Ticker, key string, rev uint64, h *heldLease, run func(ctx context.Context)) {
	l.log.Info("lease taken", "key", key, "holder", l.holder)
	if l.held != nil && strings.HasPrefix(key, relayLeaseKind+".") {
		l.held.Inc()
		defer l.held.Dec()
	}
	rctx, stop := context.WithCancel(context.WithValue(ctx, heldLeaseKey{}, h))
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(rctx)
	}()
	defer func() {
		stop()
		<-done
	}()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			stop()
			<-done
			l.release(ctx, key, rev)
			return
		case <-done: // run ended by itself
			l.release(ctx, key, rev)
			return
		case <-t.C:
		case <-h.dirty:
		}
		// Renew, writing the value as it is now.
		cctx, cancel := context.WithTimeout(ctx, l.renew)
		r, err := l.kv.Update(cctx, key, h.encode(), rev)
		cancel()
		switch {
		case err == nil:
			rev, renewed = r, time.Now()
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			l.log.Warn("lease lost: another holder took it", "key", key)
			return
		case ctx.Err() != nil:
		case l.gone(ctx):
			// NATS lost the bucket (a restarted server): made again, the
			// lease is taken again at once, its run started anew with a new
			// token.
			l.log.Warn("lease bucket lost with NATS; made again and the lease taken again", "key", key)
			return
		case time.Since(renewed) >= l.ttl:
			l.log.Warn("lease lost: not renewed within its TTL", "key", key, "ttl", l.ttl, "error", err)
			return
		default:
			l.log.Debug("lease not renewed; retrying", "key", key, "error", err)
		}
	}
}
