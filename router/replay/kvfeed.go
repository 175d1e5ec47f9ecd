package replay

import (
	"time"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
)

// kvFeed carries the first-hop workers' KV events to the routers' precise
// indexes in PrefixPrecise mode: the simulated engines publish them
// (sim.Cluster.SetKVEventHook) in simulated time, and each is applied
// delay later, before the first routing decision at or after that instant,
// to every replica's index (in replica order).
// Each worker's events keep their order (their times never decrease and
// the delay is constant); workers are fed in index order, so the replay is
// deterministic. Memory is the events published within one delay.
type kvFeed struct {
	delay time.Duration
	sinks [][]*prefix.Precise // by worker index in the first-hop cluster, then by replica
	// pending[w][head[w]:] are worker w's events not yet applied.
	pending [][]sim.KVEvent
	head    []int

	batch  kvevents.Batch // reused
	hashes []uint64       // the batch's block hashes, one per event

	batches, events int64
}

// newKVFeed puts every worker of c (indexes base..) in precise mode in
// every replica, keyed by engine hashes and live from the start (the
// routers see each stream from its first event), and hooks c's events.
func (d *driver) newKVFeed(c *sim.Cluster, base int, delay time.Duration) {
	f := &kvFeed{delay: delay, sinks: make([][]*prefix.Precise, c.Len()), pending: make([][]sim.KVEvent, c.Len()), head: make([]int, c.Len())}
	for w := range f.sinks {
		for _, rep := range d.reps {
			p := rep.r.Prefix().Precise(prefix.Candidate{ID: rep.workers[base+w].ID})
			p.KeyByEngineHashes()
			p.MarkLive()
			f.sinks[w] = append(f.sinks[w], p)
		}
	}
	c.SetKVEventHook(func(e sim.KVEvent) { f.pending[e.Worker] = append(f.pending[e.Worker], e) })
	d.kv = f
}

// deliver applies every event published at or before now − delay, worker
// by worker, one kvevents.Batch per engine step (events of one instant),
// as vLLM publishes once per step.
func (f *kvFeed) deliver(now time.Duration) {
	if f == nil {
		return
	}
	for w, q := range f.pending {
		i := f.head[w]
		for i < len(q) && q[i].At+f.delay <= now {
			j := i + 1
			for j < len(q) && q[j].At == q[i].At {
				j++
			}
			f.apply(f.sinks[w], q[i:j])
			i = j
		}
		if i == f.head[w] {
			continue
		}
		// Drop the applied events once they are half the queue, so the
		// queue stays within twice the events of one delay.
		if i == len(q) {
			f.pending[w], i = q[:0], 0
		} else if i > len(q)/2 {
			f.pending[w] = q[:copy(q, q[i:])]
			i = 0
		}
		f.head[w] = i
	}
}

// apply applies one step's events of one worker as one batch to each of
// its indexes (one per replica).
func (f *kvFeed) apply(sinks []*prefix.Precise, evs []sim.KVEvent) {
	f.hashes = f.hashes[:0]
	for _, e := range evs {
		f.hashes = append(f.hashes, e.Hash)
	}
	b := &f.batch
	b.TS = float64(epoch.Add(evs[0].At).UnixNano()) / 1e9
	b.Events = b.Events[:0]
	for k, e := range evs {
		ev := kvevents.Event{}
		switch e.Kind {
		case sim.KVBlockStored:
			ev.Kind, ev.BlockHashes, ev.BlockSize = kvevents.BlockStored, f.hashes[k:k+1], int64(e.Tokens)
			if e.Group > 0 {
				ev.ParentBlockHash, ev.HasParent = e.Parent, true
			}
		case sim.KVBlockRemoved:
			ev.Kind, ev.BlockHashes = kvevents.BlockRemoved, f.hashes[k:k+1]
		case sim.KVAllCleared:
			ev.Kind = kvevents.AllBlocksCleared
		}
		b.Events = append(b.Events, ev)
	}
	for _, p := range sinks {
		p.Apply(b)
	}
	f.batches++
	f.events += int64(len(evs))
}
