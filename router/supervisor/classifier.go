package supervisor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/shared"
)

// Out-of-process request classifiers and lifecycle events.
//
// A classifier type of a plugin configures into a classifierFactory (a
// shared.ClassifierFactory). NewClassifier returns a remoteClassifier
// bound to the partition: each Classify is one Classify call of the
// plugin under call_timeout, through the plugin's circuit breaker, counted
// like decision calls. A timeout, a plugin that is gone or restarting, and
// the classifier's own error or panic all fail only that request: the
// router has no classifier fallback.
//
// An instance whose plugin said at Configure that it wants lifecycle events
// (pluginclient.ConfigureResult.Events: the Go instance implements
// shared.EventListener, or a classifier type sets TypeInfo.Events) is a
// listeningComponent or listeningFactory, which implement
// shared.EventListener by queueing the events on the current process's
// Events stream (pluginclient.Client.SendEvents). Other instances do not
// implement it, so they cost no events at all.
//
// Across a restart, events are dropped and counted (Stats.EventsDropped),
// not buffered: events emitted while no process serves the plugin, and
// those the old process had not acknowledged. A restarted process has lost
// whatever state the events built (its instances are configured afresh),
// so replaying a bounded tail of them would restore only part of it, and
// the requests they describe started before the restart: listeners must
// ignore requests they do not know anyway.

// classifierFactory is a plugin's classifier instance.
type classifierFactory struct{ *component }

// listeningFactory is a classifier instance that wants lifecycle events.
type listeningFactory struct{ classifierFactory }

// listeningComponent is a filter, scorer or picker instance that wants
// lifecycle events.
type listeningComponent struct{ *component }

// asComponent returns the *component behind any of the remote component
// types.
func asComponent(c any) (*component, bool) {
	switch c := c.(type) {
	case *component:
		return c, true
	case *listeningComponent:
		return c.component, true
	}
	return nil, false
}

// OnEvents forwards the events to the plugin.
func (c *listeningComponent) OnEvents(events []shared.Event) { c.m.sendEvents(c.name, events) }

// OnEvents forwards the events to the plugin.
func (f *listeningFactory) OnEvents(events []shared.Event) { f.m.sendEvents(f.name, events) }

// sendEvents queues events for instance on the current process, or drops
// and counts them when there is none.
func (m *managed) sendEvents(instance string, events []shared.Event) {
	p := m.cur.Load()
	if p == nil || p.hasExited() {
		m.stats.eventsDropped.Add(int64(len(events)))
		return
	}
	p.rc.SendEvents(instance, events)
}

// NewClassifier returns the partition's classifier. The plugin creates its
// own on the partition's first request.
func (f *classifierFactory) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	return &remoteClassifier{f: f, pc: pc}, nil
}

// remoteClassifier is one partition of a plugin's classifier instance. It
// numbers the partition's worker snapshots (the router publishes a new
// slice when membership changes) and sends the list only until a process
// has answered a call that carried that version.
type remoteClassifier struct {
	f  *classifierFactory
	pc shared.PartitionContext

	mu      sync.Mutex
	first   *shared.WorkerInfo // the snapshot's identity: its first element
	n       int
	version uint64
	ackedBy *pluginclient.Client // the process that has version, if any
}

// Classify classifies req in the plugin under call_timeout.
func (c *remoteClassifier) Classify(ctx context.Context, req *shared.Request) (shared.Classification, error) {
	var ws []shared.WorkerInfo
	if c.pc.Workers != nil {
		ws = c.pc.Workers()
	}
	var first *shared.WorkerInfo
	if len(ws) > 0 {
		first = &ws[0]
	}
	c.mu.Lock()
	if c.version == 0 || first != c.first || len(ws) != c.n {
		c.version++
		c.first, c.n, c.ackedBy = first, len(ws), nil
	}
	version, ackedBy := c.version, c.ackedBy
	c.mu.Unlock()
	var now time.Time
	if c.pc.Now != nil {
		now = c.pc.Now()
	}
	var cl shared.Classification
	m := c.f.m
	err := m.call(ctx, "classify", func(cctx context.Context, p *proc) error {
		send := ackedBy != p.rc
		var err error
		cl, err = p.rc.Classify(cctx, pluginclient.ClassifyCall{Instance: c.f.name, Request: req,
			WorkersVersion: version, SendWorkers: send, Workers: ws, Now: now})
		if err == nil && send {
			c.mu.Lock()
			if c.version == version {
				c.ackedBy = p.rc
			}
			c.mu.Unlock()
		}
		return err
	})
	if err != nil {
		return shared.Classification{}, fmt.Errorf("%s %q: %w", c.f.typ, c.f.name, err)
	}
	return cl, nil
}

// Interface guards.
var (
	_ shared.ClassifierFactory = (*classifierFactory)(nil)
	_ shared.ClassifierFactory = (*listeningFactory)(nil)
	_ shared.EventListener     = (*listeningFactory)(nil)
	_ shared.EventListener     = (*listeningComponent)(nil)
	_ shared.Filter            = (*listeningComponent)(nil)
	_ shared.Classifier        = (*remoteClassifier)(nil)
)
