package admission

import (
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/shared"
)

// maxPendingEvents bounds the events waiting for the delivery goroutine;
// past it events are dropped and counted (Controller.DroppedEvents). A
// listener that keeps up never gets near it: shared.EventListener asks
// listeners not to block.
const maxPendingEvents = 1 << 20

// bus delivers lifecycle events to the listeners: the Controller's, the
// current classifier set's and the core's current bundle components'.
// Listeners are looked up at delivery, so a reload's new components hear
// the events of requests admitted before it.
type bus struct {
	c       *Controller
	static  []shared.EventListener
	inline  bool
	mu      sync.Mutex
	pending []shared.Event
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	dropped atomic.Int64
	closed  bool
}

func newBus(c *Controller, static []shared.EventListener, inline bool) *bus {
	b := &bus{c: c, static: static, inline: inline}
	if !inline {
		b.wake, b.stop, b.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go b.run()
	}
	return b
}

// listening reports whether any listener would hear an event now: a
// router whose components do not listen never takes the bus's lock.
func (b *bus) listening() bool {
	if len(b.static) > 0 || len(b.c.core.EventListeners()) > 0 {
		return true
	}
	cs := b.c.cls.Load()
	return cs != nil && len(*cs.listeners.Load()) > 0
}

// emit delivers ev: at once (inline) or through the delivery goroutine.
// Callers emit a request's events in its lifecycle order (under its
// handle's lock), so each listener hears them in that order. A zero ev.At
// is set to the Controller's clock: read only when someone listens.
func (b *bus) emit(ev shared.Event) {
	if !b.listening() {
		return
	}
	if ev.At.IsZero() {
		ev.At = b.c.now()
	}
	if b.inline {
		batch := [1]shared.Event{ev}
		b.deliver(batch[:])
		return
	}
	b.mu.Lock()
	if b.closed || len(b.pending) >= maxPendingEvents {
		b.mu.Unlock()
		b.dropped.Add(1)
		return
	}
	b.pending = append(b.pending, ev)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// deliver hands one batch to every listener, in order.
func (b *bus) deliver(batch []shared.Event) {
	for _, l := range b.static {
		l.OnEvents(batch)
	}
	if cs := b.c.cls.Load(); cs != nil {
		for _, l := range *cs.listeners.Load() {
			l.OnEvents(batch)
		}
	}
	for _, l := range b.c.core.EventListeners() {
		l.OnEvents(batch)
	}
}

// run is the delivery goroutine: it takes every pending event as one
// batch, delivers it, and reuses the buffer.
func (b *bus) run() {
	defer close(b.done)
	var batch []shared.Event
	for {
		select {
		case <-b.wake:
		case <-b.stop:
			b.flush(&batch)
			return
		}
		b.flush(&batch)
	}
}

func (b *bus) flush(batch *[]shared.Event) {
	for {
		b.mu.Lock()
		*batch, b.pending = b.pending, (*batch)[:0]
		b.mu.Unlock()
		if len(*batch) == 0 {
			return
		}
		b.deliver(*batch)
		clear(*batch) // drop the strings
	}
}

func (b *bus) close() {
	if b.inline {
		return
	}
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	<-b.done
}

// DroppedEvents is how many lifecycle events were dropped because the
// delivery queue held maxPendingEvents (a listener that blocks), or were
// emitted after Close.
func (c *Controller) DroppedEvents() int64 { return c.bus.dropped.Load() }
