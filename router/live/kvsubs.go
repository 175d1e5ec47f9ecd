package live

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// kvSubs runs the KV-event subscribers of the workers whose engines
// publish KV events: one per candidate (worker, data-parallel rank),
// feeding the candidate's precise prefix index (router.Router.PrefixPrecise).
// A candidate's source is its worker's kv_events block when it has one
// (rank N: each endpoint offset by N, kvevents.RankEndpoint), else the
// rank's source the engine reported (SetSources: vLLM's
// GET /kv_event_sources, SGLang's /server_info), used as reported.
//
// It is the workers.Manager's Membership, wrapping the Router: a candidate
// joining the fleet (AddWorker) gets its subscriber then, before any
// request is routed to it. A subscriber outlives its candidate's absences
// (a failed probe, a model list that changed): the engine's cache does not
// change when the router stops routing to it, and its socket reconnects by
// itself. It stops, and the candidate's precise index is dropped, when the
// worker leaves the configuration (setWorkers), when its source goes
// away, and when the daemon stops (close); a changed source (a kv_events
// block edited, the engine reporting other endpoints) starts it again on
// the new one.
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

	mu sync.Mutex
	// cfgs has every configured worker by name, with its kv_events block
	// or nil; discovered, the sources engines reported, by worker name;
	// known, the worker of every candidate that joined.
	cfgs       map[string]*config.KVEvents
	discovered map[string][]kvSource
	known      map[prefix.Candidate]string
	subs       map[prefix.Candidate]*kvSub
	// importing counts, per candidate, the warm-start imports under way
	// (importJoined): its follow starts when the last ends.
	importing map[prefix.Candidate]int
	// beforeImport, when set (tests), is called by importJoined before
	// the import.
	beforeImport func(prefix.Candidate)
	stopped      bool
	stop         context.CancelFunc
	wg           sync.WaitGroup
}

// kvSource is one data-parallel rank's KV-event source as the engine
// reports it (vLLM's GET /kv_event_sources, one per rank; SGLang's
// /server_info kv_events, one per rank from its port base), after
// discovery resolved wildcard hosts against the worker's URL: the rank's
// own endpoints, not offset further. Topic is the subscription's prefix.
// ReplayEndpoint and SnapshotEndpoint are "" when the engine has none.
// It is the workers.Manager's discovery result as it is.
type kvSource = workers.KVSource

// Bounds on the sources an engine reports (SetSources): at most
// maxKVSources per worker, ranks below maxKVSources, endpoints and topics
// of at most maxKVSourceText bytes. What is past them is dropped and
// logged.
const (
	maxKVSources    = 1024
	maxKVSourceText = 512
)

// kvSub is one candidate's subscriber, or its feed from the cluster's
// stream (clustered).
type kvSub struct {
	name string
	src  kvSource // the rank's endpoints, as subscribed to
	// cfg and rankEndpoints are the source as a relay takes it: the
	// worker's kv_events block (offset by the rank), or the engine's
	// report for the rank (rankEndpoints: not offset).
	cfg           config.KVEvents
	rankEndpoints bool
	cancel        context.CancelFunc
	sub           *kvevents.Subscriber // nil when clustered
	precise       *prefix.Precise
	feed          *feedSink // clustered: what the stream delivered

	mu    sync.Mutex // the state last shown and since when
	shown string
	since time.Time
}

// newKVSubs returns the kvSubs of r; clustered: the candidates are fed
// from the cluster's stream (useCluster) instead of their engines.
func newKVSubs(r *router.Router, log hclog.Logger, clustered bool) *kvSubs {
	ctx, stop := context.WithCancel(context.Background())
	return &kvSubs{r: r, log: log, ctx: ctx, stop: stop, clustered: clustered, cfgs: map[string]*config.KVEvents{},
		discovered: map[string][]kvSource{}, known: map[prefix.Candidate]string{}, importing: map[prefix.Candidate]int{}, subs: map[prefix.Candidate]*kvSub{}}
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
	stopRelay := k.rep.RelayKV(cluster.RelayTarget{Worker: s.name, Rank: c.Rank, KVEvents: s.cfg, RankEndpoints: s.rankEndpoints})
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
// its worker has a KV-event source for the candidate's rank, starts the
// candidate's subscriber if it has none. A clustered candidate whose
// content the warm-start snapshot holds (cluster.Replica.Pending) has it
// imported first, by importJoined on its own goroutine, which then starts
// the subscriber: the worker manager calls AddWorker holding its lock.
func (k *kvSubs) AddWorker(s fleet.Spec) (*fleet.Worker, error) {
	w, err := k.r.AddWorker(s)
	if err != nil {
		return w, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	c := prefix.Candidate{ID: s.ID, Rank: s.DPRank}
	k.known[c] = s.Name
	if k.rep != nil {
		// The warm-start snapshot's content of a worker that joins only
		// now, before its follow starts (a precise index first, to take
		// the snapshot's precise content).
		if _, _, _, ok := k.sourceLocked(s.Name, c.Rank); ok && !k.stopped {
			k.r.Prefix().Precise(c)
		}
		if !k.stopped && k.rep.Pending(s.Name, s.DPRank) {
			// The import can take long (a million blocks), and the
			// caller, the worker manager, holds its lock: it runs on
			// its own, the follow after it.
			k.importing[c]++
			k.wg.Add(1)
			go k.importJoined(c, s)
			return w, nil
		}
	}
	k.reconcileLocked(c, s.Name)
	return w, nil
}

// importJoined imports the warm-start snapshot's content of candidate c,
// which joined as s, then starts its follow (unless another import of c
// is still under way: the last one starts it).
func (k *kvSubs) importJoined(c prefix.Candidate, s fleet.Spec) {
	defer k.wg.Done()
	k.mu.Lock()
	hook := k.beforeImport
	k.mu.Unlock()
	if hook != nil {
		hook(c)
	}
	k.rep.Joined(s.Name, s.DPRank, s.ID)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.importing[c]--; k.importing[c] > 0 {
		return
	}
	delete(k.importing, c)
	if name, ok := k.known[c]; ok {
		k.reconcileLocked(c, name)
	}
}

// RemoveWorker takes the candidate out of the fleet (workers.Membership);
// its subscriber goes on.
func (k *kvSubs) RemoveWorker(id shared.WorkerID, rank uint32) error {
	return k.r.RemoveWorker(id, rank)
}

// sourceLocked returns candidate (name, rank)'s source: from the worker's
// kv_events block (offset by the rank; an endpoint without a port is
// logged and gives none), else from the engine's report for the rank.
// k.mu is held.
func (k *kvSubs) sourceLocked(name string, rank uint32) (src kvSource, cfg config.KVEvents, rankEndpoints, ok bool) {
	if b := k.cfgs[name]; b != nil {
		src = kvSource{Rank: int(rank), Topic: b.Topic}
		var err error
		if src.Endpoint, err = kvevents.RankEndpoint(b.Endpoint, int(rank)); err == nil && b.ReplayEndpoint != "" {
			src.ReplayEndpoint, err = kvevents.RankEndpoint(b.ReplayEndpoint, int(rank))
		}
		if err == nil && b.SnapshotEndpoint != "" {
			src.SnapshotEndpoint, err = kvevents.RankEndpoint(b.SnapshotEndpoint, int(rank))
		}
		if err != nil {
			k.log.Error("KV events not followed; the worker is scored approximately", "worker", name, "rank", rank, "error", err)
			return kvSource{}, config.KVEvents{}, false, false
		}
		return src, *b, false, true
	}
	for _, s := range k.discovered[name] {
		if s.Rank == int(rank) {
			return s, config.KVEvents{Endpoint: s.Endpoint, Topic: s.Topic, ReplayEndpoint: s.ReplayEndpoint, SnapshotEndpoint: s.SnapshotEndpoint}, true, true
		}
	}
	return kvSource{}, config.KVEvents{}, false, false
}

// reconcileLocked makes candidate c of worker name follow its source:
// nothing when it follows it already, else its subscriber (if any) is
// stopped and, when it has a source, started on it. k.mu is held.
func (k *kvSubs) reconcileLocked(c prefix.Candidate, name string) {
	if k.stopped || k.importing[c] > 0 {
		return
	}
	src, cfg, rankEndpoints, ok := k.sourceLocked(name, c.Rank)
	old := k.subs[c]
	if old != nil {
		if ok && old.src == src && old.rankEndpoints == rankEndpoints {
			return
		}
		k.stopLocked(c, old)
	}
	if ok {
		k.start(c, name, src, cfg, rankEndpoints)
	}
}

// start subscribes candidate c of worker name to src. k.mu is held. A
// subscriber that cannot start (a bad endpoint) is logged and the
// candidate stays approximate.
func (k *kvSubs) start(c prefix.Candidate, name string, src kvSource, cfg config.KVEvents, rankEndpoints bool) {
	log := k.log.With("worker", name, "rank", c.Rank)
	p := k.r.Prefix().Precise(c)
	if p == nil {
		return // it left again meanwhile; its next join starts it
	}
	if k.clustered {
		s := &kvSub{name: name, src: src, cfg: cfg, rankEndpoints: rankEndpoints, cancel: func() {}, precise: p, feed: &feedSink{Precise: p}}
		k.subs[c] = s
		if k.rep != nil {
			k.feedLocked(c, s)
		}
		log.Info("following KV events from the cluster's stream", "endpoint", src.Endpoint)
		return
	}
	ctx, cancel := context.WithCancel(k.ctx)
	sub, err := kvevents.Subscribe(ctx, kvevents.Options{
		Endpoint: src.Endpoint, Topic: src.Topic, ReplayEndpoint: src.ReplayEndpoint, SnapshotEndpoint: src.SnapshotEndpoint,
		Rank: int64(c.Rank), HasRank: true, Logger: log.Named("kv-events"),
	}, p)
	if err != nil {
		cancel()
		k.r.Prefix().DropPrecise(c)
		log.Error("KV events not followed; the worker is scored approximately", "endpoint", src.Endpoint, "error", err)
		return
	}
	log.Info("following KV events", "endpoint", src.Endpoint, "replay_endpoint", src.ReplayEndpoint, "snapshot_endpoint", src.SnapshotEndpoint,
		"reported_by_engine", rankEndpoints)
	k.subs[c] = &kvSub{name: name, src: src, cfg: cfg, rankEndpoints: rankEndpoints, cancel: cancel, sub: sub, precise: p}
	k.wg.Go(func() {
		sub.Wait()
	})
}

// SetSources makes sources the KV-event sources worker's engine reports,
// one per data-parallel rank (discovery calls it after each report; nil
// or empty: none). A candidate whose source changed is subscribed again
// on the new one (its precise index started over), one whose source went
// away stops; a worker's kv_events block, when it has one, overrides
// them all. Sources of workers not configured are ignored. What comes
// from the engine is bounded (maxKVSources, maxKVSourceText) and checked
// (tcp://HOST:PORT or ipc://PATH endpoints); a source that is not is
// dropped and logged, and of two for one rank the first is kept.
func (k *kvSubs) SetSources(worker string, sources []kvSource) {
	valid := k.checkSources(worker, sources)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.cfgs[worker]; !ok || k.stopped {
		return
	}
	if slices.Equal(k.discovered[worker], valid) {
		return
	}
	if len(valid) == 0 {
		delete(k.discovered, worker)
	} else {
		k.discovered[worker] = valid
	}
	for c, name := range k.known {
		if name == worker {
			k.reconcileLocked(c, name)
		}
	}
}

// checkSources returns the sources to keep, sorted by rank; what it
// drops is logged in one line (how many, and the first one's reason).
func (k *kvSubs) checkSources(worker string, sources []kvSource) []kvSource {
	var out []kvSource
	seen := map[int]bool{}
	dropped, first, firstEndpoint := 0, "", ""
	for i, s := range sources {
		why := ""
		switch {
		case i >= maxKVSources:
			why = "past the bound of " + strconv.Itoa(maxKVSources) + " sources"
		case s.Rank < 0 || s.Rank >= maxKVSources:
			why = "rank out of range"
		case seen[s.Rank]:
			why = "a second source for the rank"
		case len(s.Topic) > maxKVSourceText:
			why = "topic too long"
		case !sourceEndpoint(s.Endpoint):
			why = "endpoint is not tcp://HOST:PORT or ipc://PATH"
		case s.ReplayEndpoint != "" && !sourceEndpoint(s.ReplayEndpoint):
			why = "replay endpoint is not tcp://HOST:PORT or ipc://PATH"
		case s.SnapshotEndpoint != "" && !sourceEndpoint(s.SnapshotEndpoint):
			why = "snapshot endpoint is not tcp://HOST:PORT or ipc://PATH"
		}
		if why != "" {
			if dropped == 0 {
				first, firstEndpoint = why, s.Endpoint
			}
			dropped++
			continue
		}
		seen[s.Rank] = true
		out = append(out, s)
	}
	if dropped > 0 {
		k.log.Warn("KV-event sources the engine reported are ignored", "worker", worker, "ignored", dropped, "of", len(sources),
			"first_reason", first, "first_endpoint", untrusted.Text(firstEndpoint, untrusted.MaxLog))
	}
	slices.SortFunc(out, func(a, b kvSource) int { return a.Rank - b.Rank })
	return out
}

// sourceEndpoint reports whether e is "tcp://HOST:PORT" (a host that is
// not a wildcard, a port from 1 to 65535) or "ipc://PATH", at most
// maxKVSourceText bytes of printable ASCII (so that it can be logged as
// it is).
func sourceEndpoint(e string) bool {
	if len(e) > maxKVSourceText {
		return false
	}
	for i := 0; i < len(e); i++ {
		if e[i] <= ' ' || e[i] >= 0x7f {
			return false
		}
	}
	if p, ok := strings.CutPrefix(e, "ipc://"); ok {
		return p != ""
	}
	rest, ok := strings.CutPrefix(e, "tcp://")
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" || host == "*" || strings.ContainsAny(rest, "/?#@") {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// EngineRestarted tells the subscribers of worker's candidates (every
// rank) that its engine restarted, as seen from outside the event stream
// (its metrics: process_start_time_seconds grew, counters went back):
// each clears its precise index as soon as it takes the signal and
// follows the engine again from scratch (kvevents.Subscriber.EngineRestarted).
// With a cluster block the candidates' indexes are cleared here; the
// relay's own subscriber sees the restart on the stream. It does not
// block; a worker without subscribers is ignored. workers.Options'
// EngineRestarted calls it.
func (k *kvSubs) EngineRestarted(worker string) {
	k.mu.Lock()
	var subs []*kvSub
	for _, s := range k.subs {
		if s.name == worker {
			subs = append(subs, s)
		}
	}
	k.mu.Unlock()
	for _, s := range subs {
		if s.sub != nil {
			s.sub.EngineRestarted()
		} else {
			s.precise.Clear()
		}
	}
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
		cfgs[w.Name] = w.KVEvents
	}
	k.cfgs = cfgs
	return prev
}

// setWorkers makes cfgs the configured workers, by name, with their
// kv_events blocks or nil (after the Manager synced them, or what expect
// returned when it failed): the subscribers of workers no longer
// configured, or without a source now, stop (their precise index
// dropped), and those whose source changed start again on the new one.
func (k *kvSubs) setWorkers(cfgs map[string]*config.KVEvents) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cfgs = cfgs
	for name := range k.discovered {
		if _, ok := cfgs[name]; !ok {
			delete(k.discovered, name)
		}
	}
	for c, name := range k.known {
		if _, ok := cfgs[name]; !ok {
			if s := k.subs[c]; s != nil {
				k.stopLocked(c, s)
			}
			delete(k.known, c)
			continue
		}
		k.reconcileLocked(c, name)
	}
}

// configured returns ws's workers by name with their kv_events blocks
// (nil for a worker without one).
func configured(ws []config.Worker) map[string]*config.KVEvents {
	out := make(map[string]*config.KVEvents, len(ws))
	for _, w := range ws {
		out[w.Name] = w.KVEvents
	}
	return out
}

// stopLocked stops c's subscriber and drops its precise index. k.mu is
// held.
func (k *kvSubs) stopLocked(c prefix.Candidate, s *kvSub) {
	s.cancel()
	delete(k.subs, c)
	k.r.Prefix().DropPrecise(c)
}

// kvStatus is a candidate's stream as shown: its state and since when,
// and the counters behind it.
type kvStatus struct {
	state string
	since time.Time
	sub   kvevents.Stats // zero when clustered
	ps    prefix.PreciseStats
	// events, clears: what the cluster's stream delivered (clustered).
	events, clears uint64
	clustered      bool
}

// status returns s's stream: "live" while its precise index scores the
// candidate, else the subscriber's state ("connecting", "cold",
// "bootstrapping" or "stale"); fed from the cluster's stream,
// "connecting" until it delivered anything, then "cold" or "live". since
// is when the state was entered: the subscriber's own time when the
// state is its own, else when a call first saw it.
func (s *kvSub) status() kvStatus {
	ps := s.precise.Stats()
	var out kvStatus
	if s.feed != nil {
		out = kvStatus{ps: ps, events: s.feed.events.Load(), clears: s.feed.clears.Load(), clustered: true, state: "connecting"}
		switch {
		case ps.Live:
			out.state = "live"
		case out.events > 0 || out.clears > 0:
			out.state = "cold"
		}
	} else {
		st := s.sub.Stats()
		out = kvStatus{ps: ps, sub: st, state: st.State.String()}
		if ps.Live {
			out.state = "live"
		} else if st.State == kvevents.StateLive {
			out.state = "cold"
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if out.state != s.shown {
		s.shown, s.since = out.state, time.Now()
		if !out.clustered && out.state == out.sub.State.String() {
			s.since = out.sub.StateSince
		}
	}
	out.since = s.since
	return out
}

// skipped is every stored block the precise index could not key, by any
// reason: the sum of switchyard_worker_kv_blocks_skipped_total's series.
func (p kvStatus) skipped() uint64 {
	s := p.ps
	return s.SkippedTier + s.SkippedBlockSize + s.SkippedParent + s.SkippedUnresolved + s.SkippedGroup + s.SkippedScope + s.SkippedMalformed
}

// stream reports candidate (id, rank)'s event stream for the workers
// Manager (Options.Streams): its state (kvSub.status) and counters.
func (k *kvSubs) stream(id shared.WorkerID, rank uint32) (workers.EventStream, bool) {
	k.mu.Lock()
	s := k.subs[prefix.Candidate{ID: id, Rank: rank}]
	k.mu.Unlock()
	if s == nil {
		return workers.EventStream{}, false
	}
	p := s.status()
	if p.clustered {
		// Gaps are the clears the relay sent (a relay starting, a gap it
		// could not replay, the engine restarting).
		return workers.EventStream{State: p.state, Received: p.events, Gaps: p.clears, Evicted: p.ps.Evicted, Skipped: p.skipped()}, true
	}
	return workers.EventStream{State: p.state, Received: p.sub.Events, Gaps: p.sub.Gaps, Evicted: p.ps.Evicted,
		Skipped: p.skipped(), Malformed: p.sub.DecodeErrors + p.sub.BadMessages}, true
}

// rankStatus returns candidate c's precise index and its stream's
// status (kvSub.status); false when c has no subscriber.
func (k *kvSubs) rankStatus(c prefix.Candidate) (*prefix.Precise, kvStatus, bool) {
	k.mu.Lock()
	s := k.subs[c]
	k.mu.Unlock()
	if s == nil {
		return nil, kvStatus{}, false
	}
	return s.precise, s.status(), true
}

// hasSource reports whether worker name's rank has a KV-event source (its
// kv_events block, or one its engine reported).
func (k *kvSubs) hasSource(name string, rank uint32) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if b, ok := k.cfgs[name]; ok && b != nil {
		return true
	}
	for _, s := range k.discovered[name] {
		if s.Rank == int(rank) {
			return true
		}
	}
	return false
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
	return int64(k.r.Prefix().Len(prefix.Candidate{ID: id, Rank: rank})), true
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

// kvStates are the values of switchyard_worker_kv_state's state label.
var kvStates = []string{"connecting", "cold", "bootstrapping", "live", "stale"}

var (
	kvRankLabels = []string{"worker", "rank"}
	kvStateDesc  = prometheus.NewDesc("switchyard_worker_kv_state",
		"1 for the state the rank's KV-event stream is in, 0 for the others: connecting, cold (scored approximately), bootstrapping (a snapshot asked for), live (scored by the engine's events) or stale (a publisher silent past its heartbeat timeout).",
		[]string{"worker", "rank", "state"}, nil)
	kvStateSinceDesc = prometheus.NewDesc("switchyard_worker_kv_state_start_time_seconds",
		"When the rank's KV-event stream entered its current state, seconds since the Unix epoch.", kvRankLabels, nil)
	kvSnapshotsDesc = prometheus.NewDesc("switchyard_worker_kv_snapshots_total",
		"Bootstraps of the rank's precise index completed from the engine's snapshot.", kvRankLabels, nil)
	kvSnapshotFailuresDesc = prometheus.NewDesc("switchyard_worker_kv_snapshot_failures_total",
		"Snapshot bootstraps that failed, by reason: unavailable (the engine answered -2), timeout, transport, too_large, invalid, buffer (the live messages buffered meanwhile passed the bound), stream (a restart or a gap during the bootstrap).",
		[]string{"worker", "rank", "reason"}, nil)
	kvReplaysDesc = prometheus.NewDesc("switchyard_worker_kv_replays_total",
		"Gaps (and mid-stream starts) of the rank's KV-event stream filled by the engine's replay.", kvRankLabels, nil)
	kvReplayFailuresDesc = prometheus.NewDesc("switchyard_worker_kv_replay_failures_total",
		"Replays that failed or came back incomplete (the precise index was cleared instead).", kvRankLabels, nil)
	kvRestartsDesc = prometheus.NewDesc("switchyard_worker_kv_restarts_total",
		"Engine restarts detected (or suspected) on the rank, each clearing its precise index at once, by signal: publisher_id, sequence (going back), disconnect, heartbeat (timed out), engine (its metrics).",
		[]string{"worker", "rank", "signal"}, nil)
	kvSkippedDesc = prometheus.NewDesc("switchyard_worker_kv_blocks_skipped_total",
		"Stored blocks the rank's precise index could not key, by reason: tier (neither the GPU's nor the CPU's), block_size, parent (its parent unknown), unresolved (a store without token ids naming a hash no store named), group, scope (past 256 residency scopes), malformed.",
		[]string{"worker", "rank", "reason"}, nil)
)

// kvCollector exports each candidate's stream (kvSubs.register).
type kvCollector struct{ k *kvSubs }

// register puts k's metrics on reg: per worker and rank, the stream's
// state and since when, snapshots taken and failed, replays, restarts
// detected and blocks skipped (the descs above; the events, gaps and
// malformed messages are the workers collector's).
func (k *kvSubs) register(reg prometheus.Registerer) error {
	return reg.Register(kvCollector{k})
}

func (c kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{kvStateDesc, kvStateSinceDesc, kvSnapshotsDesc, kvSnapshotFailuresDesc, kvReplaysDesc, kvReplayFailuresDesc, kvRestartsDesc, kvSkippedDesc} {
		ch <- d
	}
}

func (c kvCollector) Collect(ch chan<- prometheus.Metric) {
	type cand struct {
		rank uint32
		s    *kvSub
	}
	c.k.mu.Lock()
	cands := make([]cand, 0, len(c.k.subs))
	for cd, s := range c.k.subs {
		cands = append(cands, cand{cd.Rank, s})
	}
	c.k.mu.Unlock()
	for _, cd := range cands {
		name, rank := cd.s.name, strconv.FormatUint(uint64(cd.rank), 10)
		p := cd.s.status()
		for _, st := range kvStates {
			v := 0.0
			if st == p.state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(kvStateDesc, prometheus.GaugeValue, v, name, rank, st)
		}
		ch <- prometheus.MustNewConstMetric(kvStateSinceDesc, prometheus.GaugeValue, float64(p.since.UnixNano())/1e9, name, rank)
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{name, rank}, labels...)...)
		}
		if !p.clustered {
			counter(kvSnapshotsDesc, p.sub.Snapshots)
			for r, n := range p.sub.SnapshotFailures {
				counter(kvSnapshotFailuresDesc, n, kvevents.SnapshotFailure(r).String())
			}
			counter(kvReplaysDesc, p.sub.Replays)
			counter(kvReplayFailuresDesc, p.sub.ReplayFailures)
			for sig, n := range p.sub.Restarts {
				counter(kvRestartsDesc, n, kvevents.Signal(sig).String())
			}
		}
		for _, r := range []struct {
			reason string
			n      uint64
		}{{"tier", p.ps.SkippedTier}, {"block_size", p.ps.SkippedBlockSize}, {"parent", p.ps.SkippedParent},
			{"unresolved", p.ps.SkippedUnresolved}, {"group", p.ps.SkippedGroup}, {"scope", p.ps.SkippedScope}, {"malformed", p.ps.SkippedMalformed}} {
			counter(kvSkippedDesc, r.n, r.reason)
		}
	}
}
