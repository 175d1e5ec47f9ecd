package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Cluster is N independent workers with one deterministic event order:
// earliest time first, ties broken by worker index, then by the order the
// worker produced them. A replay driver does, for each trace arrival at t:
//
//	events = c.AdvanceTo(t, events[:0]) // feed to the router
//	// route, then:
//	c.Submit(t, worker, req)
//
// and c.Drain at the end.
type Cluster struct {
	workers []*Worker
}

// NewCluster returns n idle workers with the same configuration. It
// returns an error wrapping ErrInvalidConfig for n < 1 or an invalid cfg.
func NewCluster(n int, cfg Config) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: %d workers, want >= 1", ErrInvalidConfig, n)
	}
	c := &Cluster{workers: make([]*Worker, n)}
	for i := range c.workers {
		w, err := NewWorker(cfg)
		if err != nil {
			return nil, err
		}
		w.index = i
		c.workers[i] = w
	}
	return c, nil
}

// NewClusterOf returns len(cfgs) idle workers, worker i configured by
// cfgs[i]: a fleet of mixed hardware, such as workers whose Timing is
// DefaultTiming().Scaled(2) beside default ones. It returns an error
// wrapping ErrInvalidConfig for no configs or an invalid one (naming its
// index).
func NewClusterOf(cfgs []Config) (*Cluster, error) {
	if len(cfgs) == 0 {
		return nil, fmt.Errorf("%w: 0 workers, want >= 1", ErrInvalidConfig)
	}
	c := &Cluster{workers: make([]*Worker, len(cfgs))}
	for i := range c.workers {
		w, err := NewWorker(cfgs[i])
		if err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		w.index = i
		c.workers[i] = w
	}
	return c, nil
}

// Len returns the number of workers.
func (c *Cluster) Len() int { return len(c.workers) }

// Worker returns worker i (0 <= i < Len()), for Stats, Load and
// CachedPrefixTokens.
func (c *Cluster) Worker(i int) *Worker { return c.workers[i] }

// OnTokenGap sets f as every worker's inter-token latency callback
// (Worker.OnTokenGap).
func (c *Cluster) OnTokenGap(f func(gap time.Duration, n int)) {
	for _, w := range c.workers {
		w.OnTokenGap(f)
	}
}

// Submit queues r on worker i at time now (see Worker.Submit). Errors:
// ErrNoSuchWorker for i out of range, or those of Worker.Submit.
func (c *Cluster) Submit(now time.Duration, i int, r *Request) error {
	if i < 0 || i >= len(c.workers) {
		return fmt.Errorf("%w: %d of %d", ErrNoSuchWorker, i, len(c.workers))
	}
	return c.workers[i].Submit(now, r)
}

// AdvanceTo runs every worker's steps that end at or before t and appends
// their events to out in cluster order (time, worker, sequence).
func (c *Cluster) AdvanceTo(t time.Duration, out []Event) []Event {
	start := len(out)
	for _, w := range c.workers {
		out = w.Advance(t, out)
	}
	sortEvents(out[start:])
	return out
}

// Drain runs every worker until idle and appends the remaining events in
// cluster order.
func (c *Cluster) Drain(out []Event) []Event {
	start := len(out)
	for _, w := range c.workers {
		out = w.Drain(out)
	}
	sortEvents(out[start:])
	return out
}

// sortEvents orders one batch of worker-ordered events by time. The sort
// is stable: each worker's events are already in order and workers were
// appended by index.
func sortEvents(ev []Event) {
	byTime := func(a, b Event) int { return cmp.Compare(a.At, b.At) }
	if !slices.IsSortedFunc(ev, byTime) {
		slices.SortStableFunc(ev, byTime)
	}
}

// NextEvent returns the earliest end of a step in flight on any worker, or
// false if all are idle (see Worker.NextEvent).
func (c *Cluster) NextEvent() (time.Duration, bool) {
	var (
		best time.Duration
		ok   bool
	)
	for _, w := range c.workers {
		if t, busy := w.NextEvent(); busy && (!ok || t < best) {
			best, ok = t, true
		}
	}
	return best, ok
}

// Stats returns the sum of every worker's Stats.
func (c *Cluster) Stats() Stats {
	var s Stats
	for _, w := range c.workers {
		x := w.Stats()
		s.Steps += x.Steps
		s.BusyTime += x.BusyTime
		s.Preemptions += x.Preemptions
		s.EvictedBlocks += x.EvictedBlocks
		s.CacheHitTokens += x.CacheHitTokens
		s.PrefillTokens += x.PrefillTokens
		s.DecodeTokens += x.DecodeTokens
		s.TransferredTokens += x.TransferredTokens
		s.Submitted += x.Submitted
		s.Completed += x.Completed
		s.Aborted += x.Aborted
		s.Failures += x.Failures
		s.Cut += x.Cut
	}
	return s
}
