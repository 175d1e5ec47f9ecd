package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
)

// leaseHolder runs Leases.Hold for one holder and records its runs.
type leaseHolder struct {
	name    string
	mu      sync.Mutex
	running bool
	runs    int
	cancel  context.CancelFunc
	done    chan struct{}
}

func (h *leaseHolder) state() (bool, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.running, h.runs
}

// leaseHolderOf returns the holder a lease's value names ("" when it does
// not decode).
func leaseHolderOf(e jetstream.KeyValueEntry) string {
	if e == nil {
		return ""
	}
	v, _ := decodeLeaseValue(e.Value())
	return v.Holder
}

func holdLease(t *testing.T, l *Leases, key string) *leaseHolder {
	h := &leaseHolder{name: l.holder, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		l.Hold(ctx, key, func(ctx context.Context) {
			h.mu.Lock()
			h.running, h.runs = true, h.runs+1
			h.mu.Unlock()
			<-ctx.Done()
			h.mu.Lock()
			h.running = false
			h.mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

// TestLeaseHold: of two holders of one key one runs; a holder whose key
// was overwritten (another took it) stops at its next renewal; a holder
// whose context ends gives the key up (deleted), and the other takes it.
// Keys made by LeaseKey are valid whatever the names.
func TestLeaseHold(t *testing.T) {
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	c := config.Cluster{Name: "test", Heartbeat: 100 * time.Millisecond}
	open := func(holder string) *Leases {
		l, err := openLeases(ctx, js, c, holder, nil, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	la, lb := open("a"), open("b")
	if la.ttl != time.Second || la.renew != time.Second/3 {
		t.Errorf("ttl %v, renew %v; want 1s (3 heartbeats of 100ms, at least 1s) and a third of it", la.ttl, la.renew)
	}
	key := LeaseKey("relay", "w/0 x.é*>", "")
	if key != "relay.dy8wIHguw6kqPg._" {
		t.Errorf("key %q", key)
	}
	a, b := holdLease(t, la, key), holdLease(t, lb, key)
	var holder *leaseHolder
	testkit.Eventually(t, "one holder runs", func() bool {
		ra, _ := a.state()
		rb, _ := b.state()
		switch {
		case ra && !rb:
			holder = a
		case rb && !ra:
			holder = b
		}
		return holder != nil
	})
	if e, err := la.kv.Get(ctx, key); err != nil || leaseHolderOf(e) != holder.name {
		t.Fatalf("the key holds %v (%v), want %s", e, err, holder.name)
	}

	// Another takes the key: the holder stops at its next renewal.
	if _, err := la.kv.Put(ctx, key, []byte("intruder")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, holder.name+" stops", func() bool { r, _ := holder.state(); return !r })
	// The intruder never renews: the key expires, and a holder takes it.
	testkit.Eventually(t, "a holder runs again", func() bool {
		ra, _ := a.state()
		rb, _ := b.state()
		return ra || rb
	})

	// Whoever runs now stops cleanly: the key is given up, the other
	// takes it.
	var running, waiting *leaseHolder = a, b
	if r, _ := b.state(); r {
		running, waiting = b, a
	}
	_, before := waiting.state()
	running.cancel()
	<-running.done
	testkit.Eventually(t, waiting.name+" takes the key given up", func() bool {
		r, n := waiting.state()
		return r && n == before+1
	})
	e, err := la.kv.Get(ctx, key)
	if err != nil || leaseHolderOf(e) != waiting.name {
		t.Errorf("the key holds %v (%v), want %s", e, err, waiting.name)
	}
	waiting.cancel()
	<-waiting.done
	if _, err := la.kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after both stopped the key is %v, want deleted", err)
	}
}

// TestLeaseBucketMadeAgain: NATS restarted (a memory bucket does not
// survive it) for longer than the lease's TTL: the holder loses its
// lease, and once NATS is back it makes the bucket again and holds the
// lease again.
func TestLeaseBucketMadeAgain(t *testing.T) {
	port := freePort(t)
	s, url := startNATS(t, port)
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := config.Cluster{Name: "test", Heartbeat: 100 * time.Millisecond}
	l, err := openLeases(ctx, js, c, "a", nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	h := holdLease(t, l, "snapshot")
	testkit.Eventually(t, "a holds the lease", func() bool { r, n := h.state(); return r && n == 1 })

	s.Shutdown()
	s.WaitForShutdown()
	testkit.Eventually(t, "a loses the lease while NATS is away", func() bool { r, _ := h.state(); return !r })
	startNATS(t, port)
	testkit.Eventually(t, "a holds the lease again on the new server", func() bool { r, n := h.state(); return r && n == 2 })
	kv, err := js.KeyValue(ctx, "test-leases")
	if err != nil {
		t.Fatalf("the lease bucket was not made again: %v", err)
	}
	if e, err := kv.Get(ctx, "snapshot"); err != nil || leaseHolderOf(e) != "a" {
		t.Errorf("the key holds %v (%v), want a", e, err)
	}
}
