package serve

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// kvSubs runs the KV-event subscribers of the workers with a kv_events
// block: one per candidate (worker, data-parallel rank), subscribed to the
// block's endpoint (rank N: port + N, kvevents.RankEndpoint) and feeding
// the candidate's precise prefix index (router.Router.PrefixPrecise).
//
// It is the workers.Manager's Membership, wrapping the Router: a candidate
// joining the fleet (AddWorker) gets its subscriber then, before any
// request is routed to it. A subscriber outlives its candidate's absences
// (a failed probe, a model list that changed): the engine's cache does not
// change when the router stops routing to it, and its socket reconnects by
// itself. It stops, and the candidate's precise index is dropped, when the
// worker leaves the configuration (setWorkers) and when the daemon stops
// (close); a changed kv_events block starts it again on the new one.
//
// With a cluster block (clustered) no candidate subscribes to its engine
// itself: its precise index is fed from the cluster's KV-events stream
// (cluster.Replica.FollowKV), and the replica competes for the relay
// lease of the candidate (cluster.Replica.RelayKV), relaying the engine
// into the stream while it holds it (docs/replicas.md). The candidates
// started before the Replica exists (useCluster) are handed to it then.
type kvSubs struct {
	r         *router.Router
	log       hclog.Logger
	ctx       context.Context // the subscribers' parent; close cancels it
	clustered bool
	rep       *cluster.Replica // set by useCluster; nil before

	mu      sync.Mutex
	cfgs    map[string]*config.KVEvents // the kv_events block of each configured worker that has one, by name
	subs    map[prefix.Candidate]*kvSub
	stopped bool
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// kvSub is one candidate's subscriber, or its feed from the cluster's
// stream (clustered).
type kvSub struct {
	name    string
	cfg     config.KVEvents
	cancel  context.CancelFunc
	sub     *kvevents.Subscriber // nil when clustered
	precise *prefix.Precise
	feed    *feedSink // clustered: what the stream delivered
}

// newKVSubs returns the kvSubs of r; clustered: the candidates are fed
// from the cluster's stream (useCluster) instead of their engines.
func newKVSubs(r *router.Router, log hclog.Logger, clustered bool) *kvSubs {
	ctx, stop := context.WithCancel(context.Background())
	return &kvSubs{r: r, log: log, ctx: ctx, stop: stop, clustered: clustered, cfgs: map[string]*config.KVEvents{}, subs: map[prefix.Candidate]*kvSub{}}
}

// useCluster hands the candidates to rep (clustered): each is followed
// from the stream, and rep competes for its relay lease, from now on.
func (k *kvSubs) useCluster(rep *cluster.Replica) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rep = rep
	for c, s := range k.subs {
		k.feedLocked(c, s)
	}
}

// feedLocked follows candidate c from the stream and competes for its
// relay lease. k.mu is held; k.rep is set.
func (k *kvSubs) feedLocked(c prefix.Candidate, s *kvSub) {
	stopFollow := k.rep.FollowKV(s.name, c.Rank, s.feed)
	stopRelay := k.rep.RelayKV(cluster.RelayTarget{Worker: s.name, Rank: c.Rank, KVEvents: s.cfg})
	s.cancel = func() { stopFollow(); stopRelay() }
}

// feedSink is a candidate's precise index fed from the cluster's stream,
// counting what it delivered for /debug/workers.
type feedSink struct {
	*prefix.Precise
	events, clears atomic.Uint64
}

// Apply applies b (kvevents.Sink).
func (f *feedSink) Apply(b *kvevents.Batch) {
	f.events.Add(uint64(len(b.Events)))
	f.Precise.Apply(b)
}

// Clear clears the index (kvevents.Sink).
func (f *feedSink) Clear() {
	f.clears.Add(1)
	f.Precise.Clear()
}

// AddWorker joins s to the Router's fleet (workers.Membership) and, when
// its worker has a kv_events block, starts its candidate's subscriber if
// it has none.
func (k *kvSubs) AddWorker(s fleet.Spec) (*fleet.Worker, error) {
	w, err := k.r.AddWorker(s)
	if err != nil {
		return w, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	cfg := k.cfgs[s.Name]
	c := prefix.Candidate{ID: s.ID, Rank: s.DPRank}
	if k.rep != nil {
		// The warm-start snapshot's content of a worker that joins only
		// now, before its follow starts (a precise index first, to take
		// the snapshot's precise content).
		if cfg != nil && !k.stopped {
			k.r.PrefixPrecise(c.ID, c.Rank)
		}
		k.rep.Joined(s.Name, s.DPRank)
	}
	if cfg == nil || k.stopped {
		return w, nil
	}
	if old := k.subs[c]; old != nil {
		if cfg.Equal(&old.cfg) {
			return w, nil
		}
		k.stopLocked(c, old)
	}
	k.start(c, s.Name, *cfg)
	return w, nil
}

// RemoveWorker takes the candidate out of the fleet (workers.Membership);
// its subscriber goes on.
func (k *kvSubs) RemoveWorker(id shared.WorkerID, rank uint32) error {
	return k.r.RemoveWorker(id, rank)
}

// start subscribes candidate c of worker name to cfg's endpoint. k.mu is
// held. A subscriber that cannot start (a bad endpoint) is logged and
// the candidate stays approximate.
func (k *kvSubs) start(c prefix.Candidate, name string, cfg config.KVEvents) {
	log := k.log.With("worker", name, "rank", c.Rank)
	endpoint, err := kvevents.RankEndpoint(cfg.Endpoint, int(c.Rank))
	if err != nil {
		log.Error("KV events not followed; the worker is scored approximately", "endpoint", cfg.Endpoint, "error", err)
		return
	}
	replay := ""
	if cfg.ReplayEndpoint != "" {
		if replay, err = kvevents.RankEndpoint(cfg.ReplayEndpoint, int(c.Rank)); err != nil {
			log.Error("KV events not followed; the worker is scored approximately", "replay_endpoint", cfg.ReplayEndpoint, "error", err)
			return
		}
	}
	p := k.r.PrefixPrecise(c.ID, c.Rank)
	if p == nil {
		return // it left again meanwhile; its next join starts it
	}
	if k.clustered {
		s := &kvSub{name: name, cfg: cfg, cancel: func() {}, precise: p, feed: &feedSink{Precise: p}}
		k.subs[c] = s
		if k.rep != nil {
			k.feedLocked(c, s)
		}
		log.Info("following KV events from the cluster's stream", "endpoint", endpoint)
		return
	}
	ctx, cancel := context.WithCancel(k.ctx)
	sub, err := kvevents.Subscribe(ctx, kvevents.Options{
		Endpoint: endpoint, Topic: cfg.Topic, ReplayEndpoint: replay,
		Rank: int64(c.Rank), HasRank: true, Logger: log.Named("kv-events"),
	}, p)
	if err != nil {
		cancel()
		k.r.PrefixDropPrecise(c.ID, c.Rank)
		log.Error("KV events not followed; the worker is scored approximately", "endpoint", endpoint, "error", err)
		return
	}
	log.Info("following KV events", "endpoint", endpoint, "replay_endpoint", replay)
	k.subs[c] = &kvSub{name: name, cfg: cfg, cancel: cancel, sub: sub, precise: p}
	k.wg.Go(func() {
		sub.Wait()
	})
}

// expect makes ws's kv_events blocks known before the Manager syncs ws,
// so that a worker joining during the sync finds its block; the blocks of
// workers not in ws are kept until setWorkers. It returns the blocks
// known before, for setWorkers to restore when the sync fails.
func (k *kvSubs) expect(ws []config.Worker) map[string]*config.KVEvents {
	k.mu.Lock()
	defer k.mu.Unlock()
	prev := k.cfgs
	cfgs := make(map[string]*config.KVEvents, len(prev)+len(ws))
	for n, c := range prev {
		cfgs[n] = c
	}
	for _, w := range ws {
		if w.KVEvents != nil {
			cfgs[w.Name] = w.KVEvents
		} else {
			delete(cfgs, w.Name)
		}
	}
	k.cfgs = cfgs
	return prev
}

// setWorkers makes cfgs the kv_events blocks of the configured workers, by
// name (after the Manager synced them, or the blocks expect returned when
// it failed): the subscribers of workers without a block now stop (their
// precise index dropped), and those whose block changed start again on
// the new one.
func (k *kvSubs) setWorkers(cfgs map[string]*config.KVEvents) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cfgs = cfgs
	for c, s := range k.subs {
		switch cfg := cfgs[s.name]; {
		case cfg == nil:
			k.stopLocked(c, s)
		case !cfg.Equal(&s.cfg) && !k.stopped:
			k.stopLocked(c, s)
			k.start(c, s.name, *cfg)
		}
	}
}

// configured returns the kv_events blocks of ws by worker name.
func configured(ws []config.Worker) map[string]*config.KVEvents {
	out := make(map[string]*config.KVEvents, len(ws))
	for _, w := range ws {
		if w.KVEvents != nil {
			out[w.Name] = w.KVEvents
		}
	}
	return out
}

// stopLocked stops c's subscriber and drops its precise index. k.mu is
// held.
func (k *kvSubs) stopLocked(c prefix.Candidate, s *kvSub) {
	s.cancel()
	delete(k.subs, c)
	k.r.PrefixDropPrecise(c.ID, c.Rank)
}

// stream reports candidate (id, rank)'s event stream for the workers
// Manager (Options.Streams): "live" while its precise index scores it,
// else the subscriber's state ("connecting" or "cold").
func (k *kvSubs) stream(id shared.WorkerID, rank uint32) (workers.EventStream, bool) {
	k.mu.Lock()
	s := k.subs[prefix.Candidate{ID: id, Rank: rank}]
	k.mu.Unlock()
	if s == nil {
		return workers.EventStream{}, false
	}
	if s.feed != nil {
		// Fed from the cluster's stream: "connecting" until it delivered
		// anything; gaps are the clears the relay sent (a relay starting,
		// a gap it could not replay, the engine restarting).
		ps := s.precise.Stats()
		events, clears := s.feed.events.Load(), s.feed.clears.Load()
		state := "connecting"
		switch {
		case ps.Live:
			state = "live"
		case events > 0 || clears > 0:
			state = "cold"
		}
		return workers.EventStream{State: state, Received: events, Gaps: clears, Evicted: ps.Evicted,
			Skipped: ps.SkippedTier + ps.SkippedBlockSize + ps.SkippedParent + ps.SkippedGroup + ps.SkippedMalformed}, true
	}
	st, ps := s.sub.Stats(), s.precise.Stats()
	state := st.State.String()
	if ps.Live {
		state = "live"
	} else if st.State == kvevents.StateLive {
		state = "cold"
	}
	return workers.EventStream{State: state, Received: st.Events, Gaps: st.Gaps, Evicted: ps.Evicted,
		Skipped:   ps.SkippedTier + ps.SkippedBlockSize + ps.SkippedParent + ps.SkippedGroup + ps.SkippedMalformed,
		Malformed: st.DecodeErrors + st.BadMessages}, true
}

// indexBlocks reports the prefix-index entries of candidate (id, rank)
// for the workers Manager (Options.IndexBlocks): its precise index's
// engine blocks while it has one, else its approximate list's router
// blocks.
func (k *kvSubs) indexBlocks(id shared.WorkerID, rank uint32) (int64, bool) {
	k.mu.Lock()
	s := k.subs[prefix.Candidate{ID: id, Rank: rank}]
	k.mu.Unlock()
	if s != nil {
		return int64(s.precise.Stats().Blocks), true
	}
	return int64(k.r.PrefixBlocks(id, rank)), true
}

// close stops every subscriber and waits for them.
func (k *kvSubs) close() {
	k.mu.Lock()
	k.stopped = true
	for c, s := range k.subs {
		k.stopLocked(c, s)
	}
	k.mu.Unlock()
	k.stop()
	k.wg.Wait()
}
