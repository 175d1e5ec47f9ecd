package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/heap"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// Hop indexes of request.hops (admission.Path.Hop).
const (
	firstHop  = 0 // aggregated, or prefill
	decodeHop = 1 // disaggregated mode only
)

// driver keeps the state of one replay. The first hop is the aggregated
// cluster, or the prefill cluster in disaggregated mode; decode is nil in
// aggregated mode.
type driver struct {
	ctx context.Context
	// reps are the router replicas (Options.Replicas, at least one):
	// trace request i is routed by reps[i mod len(reps)].
	reps      []*replica
	blockSize int
	path      admission.Path
	// traceName names the trace in errors; hashesChecked is set once a
	// record with hash ids passed the block size check.
	traceName     string
	hashesChecked bool

	first    *sim.Cluster    // aggregated or prefill workers: indexes 0..first.Len()−1
	decode   *sim.Cluster    // decode workers: indexes base[decodeHop].., or nil
	clusters [2]*sim.Cluster // by hop: first, decode
	base     [2]int          // by hop: the index of its cluster's worker 0
	// names, ids and index: the simulated workers' names and fleet ids by
	// index, and the index by fleet id (nameWorkers).
	names     []string
	ids       []shared.WorkerID
	index     map[shared.WorkerID]int32
	bandwidth float64 // bytes per second

	// workers is the fleet's size: aggregated, or prefill and decode
	// workers together.
	workers int
	// speeds are the workers' speeds by index (Options.Speeds); nil when
	// every worker runs at speed 1.
	speeds []float64

	// now is the simulated time the router's clock reads (Epoch + now):
	// set before every admission call. reached is the latest instant the
	// loop went to (the clusters have run up to it).
	now, reached time.Duration
	capacity     int // max_active_requests; 0: nothing queues for capacity
	// waiting counts the hops in the router's queues, decodeWaiting those
	// of them that are decode hops.
	waiting, decodeWaiting int
	classify               bool // per-request lines carry priority and policy_class
	// defaultClass is the queue's default class, and classes its classes
	// in file order (the report's order).
	defaultClass string
	classes      []string
	dispatched   []*admission.Handle // Dispatch's buffer

	// pull takes the trace's next record (iter.Pull2 over Options.Records
	// or Options.Trace); arriving is that record, the next to arrive, nil
	// once the trace is over; next is its trace index (the requests
	// arrived so far).
	pull     func() (*trace.Record, error, bool)
	arriving *trace.Record
	next     int
	// firstArrival is the first request's arrival.
	firstArrival time.Duration
	// reqs holds the requests from trace index lo, the first one not yet
	// retired (written and tallied), to the latest arrival: reqs[j] is
	// request lo+j. Requests are retired in trace order as soon as they
	// and every one before them are over, so it holds the requests in
	// flight and those that ended after an earlier one still in flight.
	reqs []*request
	lo   int
	// out writes the per-request lines (Options.PerRequest), enc encodes
	// them; nil without PerRequest.
	out *bufio.Writer
	enc *json.Encoder
	// tally accumulates the report over the retired requests; ref the KV
	// reference over the arrived ones.
	tally tally
	ref   *kvRef
	// tl samples the state over simulated time (Options.Timeline); nil
	// without.
	tl *timeline
	// progress is Options.Progress, called every progressEvery loop
	// iterations (see notify); total is Progress.Total.
	progress func(Progress)
	total    int

	starts    heap.Heap[due] // by dueLess: first hops placed, reaching their worker after the decision latency
	transfers heap.Heap[due] // by dueLess: decode hops placed, reaching their worker after the decision latency and the KV transfer

	firstEvents, decodeEvents []sim.Event

	// kv feeds the first-hop workers' KV events to the routers' precise
	// indexes (PrefixPrecise mode); nil in approximate mode.
	kv *kvFeed
	// sync carries each replica's decisions, first tokens and releases to
	// the others (Options.Replicas > 1); nil with one replica.
	sync *syncFeed
	// engineBlock is the simulated engines' tokens per KV block
	// (sim.Config.BlockSize), for the belief accuracy.
	engineBlock int
	// engineKV is each simulated engine's KV capacity in engine blocks
	// (sim.Config.TotalKVBlocks).
	engineKV int

	// charge is each hop's role policy's decision latency, classifierCharge
	// the classifier's (zero without one), policyCharge every policy's
	// (for fallbacks); see Options.DecisionLatency.
	charge           [2]time.Duration
	classifierCharge time.Duration
	policyCharge     map[string]time.Duration

	lastAt       time.Duration // latest completion
	decisions    int           // Admit calls and dispatches
	decisionTime time.Duration // wall time in Admit and Dispatch

	// selections counts the selections that placed a request on a worker
	// (first hops and decode hops); fell, those a fallback decided, by
	// cause. policy names each hop's role policy.
	selections int64
	fell       fallbackTally
	policy     [2]string
	// shadow counts the shadow decisions by result (the roles' policies'
	// shadows); all zero without one.
	shadow map[router.ShadowResult]int64
	// shadowFirstErr is the first failed shadow decision's error.
	shadowFirstErr string
	// rollbacks are the canaries' rollbacks, in order (canaryRolledBack).
	rollbacks []report.CanaryRollback
	// faults are the engine failures and their migrations
	// (Options.Failures, failures.go); nil without.
	faults *faults
}

// request is one trace request's state through the replay, from its
// arrival until it is retired.
type request struct {
	rec     *trace.Record
	out     Outcome
	arrival time.Duration
	done    bool // over: completed or rejected
	// priority and class are the first hop's classification: its
	// priority, and its class ("" until classified, then the queue's
	// default class when the classifier named none). out.Priority points
	// at priority.
	priority int
	class    string
	charged  time.Duration // decision latency charged so far (out.DecisionMs)
	hops     [2]hopState   // by hop index; decode only in disaggregated mode
	side     uint8         // the canary side that decided it (sideNone, sideLive, sideCandidate)
	// migrations is how many times an engine failure cut it and it was
	// placed again; generated the output tokens it had when last cut
	// (its continuation's sim.Request.Generated). cutPending is set from
	// a cut until the next token reaches the client, cutAt the first
	// such cut's instant (failures.go).
	migrations, generated int
	cutPending            bool
	cutAt                 time.Duration
}

// hopState is one hop of a request.
type hopState struct {
	h      *admission.Handle // while admitted: nil before, and once it ended
	worker int32             // its worker's index in the hop's cluster, once placed
	queued bool              // waiting in the router's queue
	// mirror is the hop's booking as the other replicas see it, from its
	// placement until its end (Options.Replicas > 1); nil otherwise.
	mirror *mirror
}

// replica is one router replica: a router of its own, with its own
// admission queue and fleet members (the same fleet ids, shared.WorkerIDOf of the names, in every
// replica).
type replica struct {
	r       *router.Router
	roles   map[shared.Role]*policy.Policy // what r routes with (Options.Canary applied)
	adm     *admission.Controller
	workers []*fleet.Worker // by worker index (driver.ids)
	// specs are the workers' fleet specs by worker index, to join a
	// failed worker again when it restarts (failures.go).
	specs []fleet.Spec
}

func newDriver(ctx context.Context, o *Options) (*driver, error) {
	cfg, err := o.check()
	if err != nil {
		return nil, err
	}
	queue := o.Queue
	if len(queue.Classes) == 0 {
		queue = config.DefaultQueue()
	}
	d := &driver{
		ctx:          ctx,
		blockSize:    o.BlockSize,
		traceName:    o.TraceName,
		path:         o.path(),
		capacity:     queue.MaxActiveRequests,
		classify:     o.classified(),
		policyCharge: o.DecisionLatency.Policies,
		engineBlock:  cfg.BlockSize,
		engineKV:     cfg.TotalKVBlocks,
		progress:     o.Progress,
		total:        len(o.Records),
		starts:       heap.New(dueLess),
		transfers:    heap.New(dueLess),
	}
	if o.Classifier != nil {
		d.classifierCharge = o.DecisionLatency.Classifier
	}
	for k := range d.path.Len() {
		d.policy[k] = o.Roles[d.path.Hop(k).Role].Name
		d.charge[k] = d.policyCharge[d.policy[k]]
	}
	d.defaultClass = queue.DefaultClass
	if d.defaultClass == "" {
		d.defaultClass = queue.Classes[0].Name
	}
	for _, c := range queue.Classes {
		d.classes = append(d.classes, c.Name)
	}
	sizes := [2]int{o.Workers}
	if d.path == admission.Disaggregated {
		sizes = [2]int{o.PrefillWorkers, o.DecodeWorkers}
	}
	d.speeds = o.Speeds
	for k := range d.path.Len() {
		if d.clusters[k], err = d.newCluster(cfg, d.workers, sizes[k]); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		d.base[k] = d.workers
		d.workers += sizes[k]
	}
	if err := d.nameWorkers(); err != nil {
		return nil, err
	}
	for k := range o.replicas() {
		pol := Replica{Roles: o.Roles, Classifier: o.Classifier}
		if k > 0 {
			if pol, err = o.Replica(k); err != nil {
				return nil, fmt.Errorf("replay: replica %d: %w", k, err)
			}
			for h := range d.path.Len() {
				if role := d.path.Hop(h).Role; pol.Roles[role] == nil {
					return nil, fmt.Errorf("replay: replica %d: no policy for role %s", k, role)
				}
			}
		}
		rep, err := d.newReplica(o, &cfg, &queue, pol, sizes)
		if err != nil {
			return nil, err
		}
		d.reps = append(d.reps, rep)
	}
	d.first, d.decode = d.clusters[firstHop], d.clusters[decodeHop]
	if len(d.reps) > 1 {
		d.sync = &syncFeed{delay: o.SyncDelay, events: heap.New(syncLess)}
	}
	if o.Prefix == PrefixPrecise {
		// With replicas the events go through the shared bus: every
		// replica applies them SyncDelay later.
		d.newKVFeed(d.first, d.base[firstHop], o.KVEventDelay+o.SyncDelay)
	}
	d.bandwidth = o.KVTransferBandwidth
	if d.bandwidth == 0 {
		d.bandwidth = DefaultKVTransferBandwidth
	}
	d.tally.init(d.workers, d.classes)
	if o.Failures != nil {
		d.faults = newFaults(o.Failures, d.workers)
	}
	d.ref = newKVRef(d.blockSize, d.engineBlock, int64(d.first.Len())*int64(d.engineKV))
	if o.Timeline {
		d.tl = newTimeline(d.workers)
	}
	d.tally.slo = o.SLO
	d.tally.itl = newITLHistogram()
	for _, c := range d.clusters[:d.path.Len()] {
		c.OnTokenGap(d.tally.tokenGap)
	}
	// Every engine reports once before the first arrival, idle (0 waiting,
	// 0% KV usage), as a scraped vLLM /metrics would: without it a worker
	// that has served nothing yet has no report, and a policy scoring the
	// reports (llm-d's queue and KV-usage scorers, normalized-score) would
	// rank it as unknown rather than idle.
	for k, c := range d.clusters[:d.path.Len()] {
		for w := range c.Len() {
			d.publish(c, w, d.base[k]+w)
		}
	}
	if o.PerRequest != nil {
		d.out = bufio.NewWriterSize(o.PerRequest, 1<<16)
		d.enc = json.NewEncoder(d.out)
	}
	return d, nil
}

// newCluster is the simulated cluster of n workers of indexes base..,
// each running cfg at its speed (speedOf).
func (d *driver) newCluster(cfg sim.Config, base, n int) (*sim.Cluster, error) {
	if d.speeds == nil {
		return sim.NewCluster(n, cfg)
	}
	cfgs := make([]sim.Config, n)
	for i := range cfgs {
		cfgs[i] = cfg
		var err error
		if cfgs[i].Timing, err = cfg.Timing.Scaled(d.speedOf(base + i)); err != nil {
			return nil, fmt.Errorf("worker %d: %w", base+i, err)
		}
	}
	return sim.NewClusterOf(cfgs)
}

// speedOf is the speed of the worker of index x: Options.Speeds[x], or 1.
func (d *driver) speedOf(x int) float64 {
	if d.speeds == nil {
		return 1
	}
	return d.speeds[x]
}

// newReplica builds one router replica routing with pol over the fleet
// of the given cluster sizes (by hop): its router, its admission
// controller on the simulated clock, and its members, indexes 0.. in
// hop order.
func (d *driver) newReplica(o *Options, cfg *sim.Config, queue *config.Queue, pol Replica, sizes [2]int) (*replica, error) {
	// Shadows run inline: deterministic, and never charged to a request.
	roles, err := o.Canary.apply(pol.Roles)
	if err != nil {
		return nil, err
	}
	// Canaries judge their windows on the simulated clock.
	// Predict: every replay reports the predictor's accuracy, whatever
	// the policy (learning changes no decision of a policy that does not
	// read LATENCY).
	r, err := router.New(router.Options{BlockSize: o.BlockSize, Roles: roles, BookingsAreLoad: true,
		Shadow: router.ShadowOptions{Inline: true}, Predict: true,
		Canary: router.CanaryOptions{Now: func() time.Time { return epoch.Add(d.now) }, OnRollback: d.canaryRolledBack}})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	rep := &replica{r: r, roles: roles}
	if rep.adm, err = admission.New(r, admission.Options{Queue: *queue, Classifier: pol.Classifier, Listeners: o.Listeners,
		Now: func() time.Time { return epoch.Add(d.now) }, InlineEvents: true,
		DefaultSLO: shared.SLO{TTFT: o.SLO.TTFT, TPOT: o.SLO.TPOT}}); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	// The index tracks what fits in each engine's KV cache, in router blocks.
	capacity := max(int64(cfg.TotalKVBlocks)*int64(cfg.BlockSize)/int64(o.BlockSize), 1)
	// Every worker carries its hardware class (Options.Speeds); workers of
	// one class share one map (the fleet copies it into its Labels).
	classes := map[float64]map[string]string{}
	for k := range d.path.Len() {
		// One membership change for the whole cluster: the fleet sorts
		// its partition once, not once per worker.
		specs := make([]fleet.Spec, sizes[k])
		for i := range specs {
			x := d.base[k] + i
			v := d.speedOf(x)
			labels, ok := classes[v]
			if !ok {
				labels = map[string]string{shared.LabelClass: ClassOf(v)}
				classes[v] = labels
			}
			specs[i] = fleet.Spec{ID: d.ids[x], Role: d.path.Hop(k).Role, TotalKVBlocks: capacity, Name: d.names[x], Labels: labels}
		}
		ws, err := r.AddWorkers(specs...)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		rep.workers = append(rep.workers, ws...)
		rep.specs = append(rep.specs, specs...)
	}
	return rep, nil
}

// nameWorkers names the simulated workers and gives them their ids:
// worker x (the index the per-request output's "worker" and the report's
// RequestsPerWorker use) is "sim-x", or in a disaggregated replay
// "prefill-x" and "decode-x" (x counting on across both clusters), and
// its fleet id is shared.WorkerIDOf(name), as router serve and router epp
// give a worker of that name, so a plugin acting on ids or names routes
// the same here. Two names hashing to one id (FNV-1a 64 collisions are
// not known among such short names) is an error.
func (d *driver) nameWorkers() error {
	prefixes := [2]string{"sim-"}
	if d.path == admission.Disaggregated {
		prefixes = [2]string{"prefill-", "decode-"}
	}
	d.names = make([]string, d.workers)
	d.ids = make([]shared.WorkerID, d.workers)
	d.index = make(map[shared.WorkerID]int32, d.workers)
	for k := range d.path.Len() {
		for x := d.base[k]; x < d.workers && (k+1 == d.path.Len() || x < d.base[k+1]); x++ {
			d.names[x] = prefixes[k] + strconv.Itoa(x)
			d.ids[x] = shared.WorkerIDOf(d.names[x])
			if prev, dup := d.index[d.ids[x]]; dup {
				return fmt.Errorf("replay: workers %q and %q have one id %d", d.names[prev], d.names[x], d.ids[x])
			}
			d.index[d.ids[x]] = int32(x)
		}
	}
	return nil
}

// indexOf is the index of the simulated worker with fleet id id (-1 for
// an id that is none of them).
func (d *driver) indexOf(id shared.WorkerID) int {
	if x, ok := d.index[id]; ok {
		return int(x)
	}
	return -1
}

// replicaOf is the replica that routes trace request i: round-robin, as a
// load balancer in front of the replicas would.
func (d *driver) replicaOf(i int) *replica { return d.reps[i%len(d.reps)] }

// start begins reading the trace and takes its first record; the
// returned stop ends the reading.
func (d *driver) start(o *Options) (stop func(), err error) {
	src := o.Trace
	if src == nil {
		src = func(yield func(*trace.Record, error) bool) {
			for i := range o.Records {
				if !yield(&o.Records[i], nil) {
					return
				}
			}
		}
	}
	d.pull, stop = iter.Pull2(src)
	return stop, d.take()
}

// take takes the trace's next record as the next arrival (none at the
// end), checking that its hash ids suit the block size.
func (d *driver) take() error {
	rec, err, ok := d.pull()
	d.arriving = nil
	switch {
	case !ok:
		return nil
	case err != nil:
		return err
	case len(rec.HashIDs) > 0 && !d.hashesChecked:
		if d.blockSize != trace.MooncakeBlockTokens {
			return fmt.Errorf("replay: %s hashes %d-token blocks; set router.block_size = %d (have %d)",
				d.traceName, trace.MooncakeBlockTokens, trace.MooncakeBlockTokens, d.blockSize)
		}
		d.hashesChecked = true
	}
	d.arriving = rec
	return nil
}

// req returns request i, which has arrived and is not yet retired.
func (d *driver) req(i int) *request { return d.reqs[i-d.lo] }

// retire writes (Options.PerRequest) and tallies the requests at the
// front of reqs that are over, in trace order, and lets them go.
func (d *driver) retire() error {
	for len(d.reqs) > 0 && d.reqs[0].done {
		st := d.reqs[0]
		d.count(st)
		if d.enc != nil {
			if err := d.enc.Encode(&st.out); err != nil {
				return fmt.Errorf("replay: writing per-request output: %w", err)
			}
		}
		d.reqs[0] = nil
		d.reqs = d.reqs[1:]
		d.lo++
	}
	return nil
}

// loop replays every arrival and runs the clusters until nothing is in
// flight and nothing waits (see Run).
func (d *driver) loop() error {
	for steps := 1; ; steps++ {
		if steps%1024 == 0 {
			if err := d.ctx.Err(); err != nil {
				return err
			}
		}
		if steps%progressEvery == 0 {
			d.notify()
		}
		if err := d.retire(); err != nil {
			return err
		}
		if d.sync != nil && d.sync.err != nil {
			return d.sync.err
		}
		if d.capacity == 0 && d.waiting == 0 {
			// Nothing waits for capacity: only arrivals, and the first
			// hops they place, feed the first hop. (A decode hop may
			// still wait, when its policy finds every worker busy; the
			// next iteration then steps event by event.)
			t, ok := d.nextInput()
			if !ok {
				d.drain()
				if d.waiting == 0 {
					return d.finish()
				}
				d.reached = max(d.reached, d.now) // the drain's last event
				continue
			}
			d.reached = t
			d.advance(t)
			if err := d.applyFaults(t); err != nil {
				return err
			}
			d.startDue(t)
			if d.arriving != nil && d.arriving.Arrival == t {
				if err := d.arrive(); err != nil {
					return err
				}
			}
			continue
		}
		// A queued hop may leave the queue at any step end: go event by
		// event.
		t, ok := d.nextInstant()
		if !ok {
			// Nothing is in flight and nothing is left to arrive: dispatch
			// once more; what still waits then never will.
			if !d.dispatch(d.now) {
				d.abandon()
				return d.finish()
			}
			continue
		}
		d.now, d.reached = t, t
		d.advance(t)
		if err := d.applyFaults(t); err != nil {
			return err
		}
		d.startDue(t)
		d.dispatch(t)
		for d.arriving != nil && d.arriving.Arrival == t {
			d.dispatch(t)
			if err := d.arrive(); err != nil {
				return err
			}
		}
	}
}

// finish applies the sync events still pending (the releases of the last
// requests, published within one delay of the end), so that every
// replica ends with nothing booked, and retires the last requests.
func (d *driver) finish() error {
	d.sync.deliver(d, math.MaxInt64)
	if d.sync != nil && d.sync.err != nil {
		return d.sync.err
	}
	return d.retire()
}

// nextInput is the next instant something enters the first-hop cluster:
// the next arrival or first-hop submission, or an engine failure or
// restart that can still matter (nextFault); false when there is none.
func (d *driver) nextInput() (time.Duration, bool) {
	var t time.Duration
	ok := d.arriving != nil
	if ok {
		t = d.arriving.Arrival
	}
	if d.starts.Len() > 0 && (!ok || d.starts.At(0).at < t) {
		t, ok = d.starts.At(0).at, true
	}
	if at, due := d.nextFault(); due && (!ok || at < t) {
		t, ok = at, true
	}
	return t, ok
}

// nextInstant is the earliest instant of any source (see Run); false when
// there is none: no arrival left, nothing on its way to a worker, every
// worker idle.
func (d *driver) nextInstant() (time.Duration, bool) {
	t, ok := d.nextInput()
	earliest := func(at time.Duration) {
		if !ok || at < t {
			t, ok = at, true
		}
	}
	if at, busy := d.first.NextEvent(); busy {
		earliest(at)
	}
	if at, ok := d.sync.next(); ok && d.waiting > 0 {
		// Another replica's release may free capacity a queued hop waits
		// for. An event due before the instant the clusters reached (it
		// was published while nothing waited) is applied at that instant.
		earliest(max(at, d.reached))
	}
	if d.decode != nil {
		if d.transfers.Len() > 0 {
			earliest(d.transfers.At(0).at)
		}
		if at, busy := d.decode.NextEvent(); busy {
			earliest(at)
		}
	}
	return t, ok
}

// advance processes the step ends up to and including t and the decode
// submissions up to t (see Run for the order). The first-hop cluster's
// inputs are the arrivals and the first hops placed, so with every one of
// them before t submitted its events up to t are final and can be taken
// at once; each may admit a decode hop, so the decode side is brought up
// to each event's time before it is handled.
func (d *driver) advance(t time.Duration) {
	d.firstEvents = d.first.AdvanceTo(t, d.firstEvents[:0])
	for _, e := range d.firstEvents {
		d.decodeUpTo(e.At, false)
		d.handleFirst(e)
	}
	d.decodeUpTo(t, true)
}

// drain runs every worker until idle. With a timeline it goes step end
// by step end, as the event-by-event loop does: the timeline samples each
// worker's state at its events (observe), and a whole drain taken at once
// would show every worker idle from the last arrival on.
func (d *driver) drain() {
	if d.tl != nil {
		for t, ok := d.nextInstant(); ok; t, ok = d.nextInstant() {
			d.advance(t)
		}
		return
	}
	d.firstEvents = d.first.Drain(d.firstEvents[:0])
	for _, e := range d.firstEvents {
		d.decodeUpTo(e.At, false)
		d.handleFirst(e)
	}
	if d.decode == nil {
		return
	}
	d.decodeUpTo(math.MaxInt64, false)
	d.decodeEvents = d.decode.Drain(d.decodeEvents[:0])
	d.handleDecode(d.decodeEvents)
}

// startDue submits the first hops whose decision latency ends at or
// before t, in (time, trace index) order.
func (d *driver) startDue(t time.Duration) {
	for d.starts.Len() > 0 && d.starts.At(0).at <= t {
		x := d.starts.Pop()
		d.submit(x.index, firstHop, x.at)
	}
}

// decodeUpTo submits the decode hops that reach their worker before t (or
// at t, when inclusive), each after the decode workers' events up to its
// time, and then handles the decode workers' events up to t. While decode
// hops wait, a decode worker's completion dispatches them and sends them
// on their way, so the decode workers are then run one step end at a
// time. No-op in aggregated mode.
func (d *driver) decodeUpTo(t time.Duration, inclusive bool) {
	if d.decode == nil {
		return
	}
	for {
		landing := d.transfers.Len() > 0 && (d.transfers.At(0).at < t || (inclusive && d.transfers.At(0).at == t))
		if d.decodeWaiting > 0 {
			if at, busy := d.decode.NextEvent(); busy && at <= t && (!landing || at <= d.transfers.At(0).at) {
				d.decodeEvents = d.decode.AdvanceTo(at, d.decodeEvents[:0])
				d.handleDecode(d.decodeEvents)
				continue
			}
		}
		if !landing {
			break
		}
		x := d.transfers.Pop()
		d.decodeEvents = d.decode.AdvanceTo(x.at, d.decodeEvents[:0])
		d.handleDecode(d.decodeEvents)
		d.submit(x.index, decodeHop, x.at)
	}
	if t != math.MaxInt64 {
		d.decodeEvents = d.decode.AdvanceTo(t, d.decodeEvents[:0])
		d.handleDecode(d.decodeEvents)
	}
}

// dispatch places queued hops while capacity allows and sends them on
// their way at `at`; those whose due time passed are rejected. It reports
// whether the router dispatched or refused any.
func (d *driver) dispatch(at time.Duration) bool {
	if d.waiting == 0 {
		return false
	}
	d.now = at
	n := 0
	for _, rep := range d.reps {
		// Before each replica's dispatch: with no delay, a replica sees
		// what the one before it dispatched.
		d.deliver(at)
		t0 := time.Now()
		d.dispatched = rep.adm.Dispatch(d.ctx, d.dispatched[:0])
		d.decisionTime += time.Since(t0)
		for _, h := range d.dispatched {
			i := requestIndex(h.Request().ID)
			k := firstHop
			if d.req(i).hops[decodeHop].h == h {
				k = decodeHop
			}
			d.unqueue(i, k)
			if err := h.Err(); err != nil {
				d.req(i).hops[k].h = nil
				d.reject(i, k, rejectReason(err, i, k))
				continue
			}
			d.decisions++
			dec := h.Decision()
			d.placed(i, k, &dec, at)
		}
		n += len(d.dispatched)
		clear(d.dispatched) // drop the handles
	}
	return n > 0
}

// deliver applies what the routers learn by `at`, before a routing
// decision then: the engines' KV events (PrefixPrecise mode), then the
// other replicas' decisions, first tokens and releases (replicas).
func (d *driver) deliver(at time.Duration) {
	d.kv.deliver(at)
	d.sync.deliver(d, at)
}

// unqueue records that hop k of request i left the router's queue.
func (d *driver) unqueue(i, k int) {
	d.req(i).hops[k].queued = false
	d.waiting--
	d.tl.queue(d.now, d.waiting)
	if k == decodeHop {
		d.decodeWaiting--
	}
}

// abandon rejects the hops still queued when every worker is idle and no
// arrival is left: only a policy that answers "all busy" with no request
// in flight leaves any.
func (d *driver) abandon() {
	const reason = "never dispatched: every worker stayed busy after the last request ended"
	for j, st := range d.reqs {
		i := d.lo + j
		for k := range st.hops {
			if st.hops[k].queued {
				d.unqueue(i, k)
				d.end(i, k, admission.Aborted(reason))
				d.reject(i, k, reason)
			}
		}
	}
}

// requestIndex is the trace index of an admitted request's id ("7",
// "7#d" for a decode hop, "7#m1" for a migrated request's continuation).
func requestIndex(id string) int {
	if n := len(id) - len(DecodeIDSuffix); n > 0 && id[n:] == DecodeIDSuffix {
		id = id[:n]
	}
	// A migrated request's continuation is "N#mK" (failures.go).
	if j := strings.IndexByte(id, '#'); j >= 0 {
		id = id[:j]
	}
	i, _ := strconv.Atoi(id)
	return i
}

// observe publishes simulated worker idx's engine state (queue length, KV
// usage) as fleet worker id's engine report, as a scraped vLLM /metrics
// would, so policies that read LOAD's kv_usage and waiting see them, and
// samples it for the timeline. It runs after every change to the worker
// (at simulated time at), in simulated-time order, so the replay stays
// deterministic.
func (d *driver) observe(c *sim.Cluster, idx, id int, at time.Duration) {
	l := c.Worker(idx).Load()
	d.tl.worker(at, id, l.Running, l.Waiting)
	d.publish(c, idx, id)
}

// publish sets simulated worker idx's engine state as fleet worker id's
// engine report on every replica.
func (d *driver) publish(c *sim.Cluster, idx, id int) {
	l := c.Worker(idx).Load()
	var usage float64
	if total := l.UsedBlocks + l.FreeBlocks; total > 0 {
		usage = float64(l.UsedBlocks) / float64(total)
	}
	// Every replica scrapes every engine itself: no sync delay.
	for _, rep := range d.reps {
		rep.workers[id].SetEngineLoad(&fleet.EngineLoad{KVUsage: usage, HasKVUsage: true, Waiting: int64(l.Waiting), HasWaiting: true})
	}
}

// due is a hop placed on a worker, reaching it at `at`.
type due struct {
	at    time.Duration
	index int
}

// dueLess orders hops by (at, index), so submissions happen in time
// order, ties in trace order: a total order (a request has one hop of
// each kind), so the order does not depend on the heap's tie-breaking.
func dueLess(a, b due) bool {
	return a.at < b.at || (a.at == b.at && a.index < b.index)
}
