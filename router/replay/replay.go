// Package replay drives a recorded trace through a Router on simulated
// workers, in simulated time, and reports per-request outcomes and a
// summary. Workers are either aggregated (each serves prefill and decode)
// or disaggregated into a prefill pool and a decode pool, with the prompt's
// KV transferred between them. The loop is single-threaded and reads no
// clock but for the wall time it reports, so the same trace, policy and
// seed give byte-identical per-request output.
package replay

import (
	"bufio"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// DefaultWorkers is the number of simulated workers when none is given:
// the conversation trace needs about 1.6 GPU-seconds of prefill per second
// without cache hits (SIMULATION.md §3), so 8 leaves headroom for policies
// to differ in latency rather than in whether they keep up.
const DefaultWorkers = 8

// MaxWorkers bounds the simulated fleet of one replay, aggregated workers
// or prefill and decode workers together: 4,096, the largest fleet the
// benchmarks measure (BENCHMARKS.md). Every simulated worker carries its
// own engine state and prefix index, so memory grows linearly with the
// fleet; beyond this a typo such as --workers 100000 would take many
// gigabytes before the first request.
const MaxWorkers = 4096

// KVBytesPerToken is the KV cache of one token of the simulated model,
// Llama-3.1-8B-Instruct in bf16: 32 layers × 8 KV heads × 128 dimensions ×
// 2 (key and value) × 2 bytes = 131,072 bytes (SIMULATION.md, model).
const KVBytesPerToken = 128 << 10

// DefaultKVTransferBandwidth is the prefill-to-decode KV transfer
// bandwidth in bytes per second when Options gives none: 50 GB/s, one
// 400 Gb/s RDMA NIC per GPU (ConnectX-7 class) at line rate. This is an
// assumption, not a measurement: it ignores protocol overhead, NVLink
// transfers inside a node (faster) and contention on a shared NIC (slower).
const DefaultKVTransferBandwidth = 50e9

// KVTransferTime is how long moving the KV of promptTokens tokens from a
// prefill worker to a decode worker takes at bytesPerSecond:
// promptTokens × KVBytesPerToken / bytesPerSecond, rounded to the
// nanosecond, with no fixed latency. At the default 50 GB/s a 1,000-token
// prompt (131 MB) takes 2.62144 ms.
func KVTransferTime(promptTokens int, bytesPerSecond float64) time.Duration {
	return time.Duration(math.Round(float64(promptTokens) * KVBytesPerToken / bytesPerSecond * 1e9))
}

// Epoch is the router's clock at simulated time 0: a replay sets the
// Router's Now (queue arrival, aging, due times; classifiers' and
// listeners' clock) to Epoch plus the simulated time, so replays repeat
// exactly. 2025-01-01T00:00:00Z, on a whole second, so an aging grid of
// whole seconds starts at the first arrival.
func Epoch() time.Time { return epoch }

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultSeed seeds a replayed policy whose file sets no router.seed and
// whose command line gives no --seed, so `router replay` repeats exactly
// by default.
const DefaultSeed = 1

// Options configure one replay.
type Options struct {
	// PolicyName labels the report: the policy file's name, or
	// config.DefaultPolicyName ("default") for the built-in policy.
	PolicyName string
	// Roles maps each role to its policy: aggregated is required in
	// aggregated mode, prefill and decode in disaggregated mode.
	Roles map[shared.Role]*shared.Policy
	// RolePolicies, when set, names each role's policy as the policy file
	// does (config.Bundle.RolePolicies), config.DefaultPolicyName for the
	// built-in one. The report copies the names of the roles it routes
	// for, and its table label marks a role that ran the built-in policy
	// although PolicyName names a file (see Report.Label).
	RolePolicies map[shared.Role]string
	// BlockSize is the router's tokens per block. Mooncake traces hash
	// 512-token blocks, so they require 512.
	BlockSize int
	// TraceName labels the report.
	TraceName string
	// Records is the trace, in arrival order.
	Records []trace.Record
	// Workers is the number of simulated aggregated workers (1 to
	// MaxWorkers), fleet ids 0..Workers−1; it must be 0 in disaggregated
	// mode.
	Workers int
	// PrefillWorkers and DecodeWorkers, when set (both >= 1, together at
	// most MaxWorkers), replay disaggregated serving instead: prefill workers have fleet ids
	// 0..PrefillWorkers−1 and role prefill, decode workers the next
	// DecodeWorkers ids and role decode. Each request is routed to a
	// prefill worker on arrival and computes its prompt and first token
	// there (submitted with OutputLength 1). At that first token its
	// prefill booking is released and, if it has more to generate, it is
	// routed to a decode worker; its prompt's KV moves there in
	// KVTransferTime, then it is submitted with sim.Request.KVTransferred
	// and decodes the rest of its output.
	PrefillWorkers, DecodeWorkers int
	// KVTransferBandwidth is the prefill-to-decode KV transfer bandwidth in
	// bytes per second (disaggregated mode only); 0 means
	// DefaultKVTransferBandwidth.
	KVTransferBandwidth float64
	// Sim configures every simulated worker, prefill and decode alike; zero
	// means sim.DefaultConfig().
	Sim sim.Config
	// PerRequest, when set, receives one JSON line per request in trace
	// order (see Outcome).
	PerRequest io.Writer

	// Queue is the policy file's queue block (config.Bundle.Queue) for the
	// first hop (aggregated, or prefill): MaxActiveRequests is each first-hop
	// worker's capacity in in-flight requests; a request that finds every
	// candidate at capacity waits in the queue and is dispatched, by class
	// weight, priority and aging, at the simulated instant capacity frees.
	// The zero value means config.DefaultQueue(): no capacity, so nothing
	// queues and the replay is the same as without admission.
	Queue config.Queue
	// Classifier, when set, classifies every request on arrival (priority,
	// policy class, due time, scheduling cost, advisory target): the
	// factory of the file's request_classifier, config.Bundle.Classifier's
	// Instance. Requests carry the trace's session_id as SessionID and, as
	// Metadata, its priority under "x-priority" and its policy_class under
	// "x-policy-class", the HTTP header names header-priority reads by
	// default, so one policy file classifies replayed and served requests
	// alike.
	Classifier shared.ClassifierFactory
	// Listeners hear the lifecycle of every request's first hop (sent,
	// first_token, completed, aborted), at simulated times (see Epoch).
	Listeners []shared.EventListener
}

// MetadataPriority and MetadataPolicyClass are the Request.Metadata keys
// a replay puts a trace record's priority and policy_class under: the
// HTTP header names the header-priority classifier reads by default.
const (
	MetadataPriority    = "x-priority"
	MetadataPolicyClass = "x-policy-class"
)

// classified reports whether requests are classified or may queue by a
// queue block: then the per-request lines carry priority and policy_class.
func (o *Options) classified() bool { return o.Classifier != nil || len(o.Queue.Classes) > 0 }

// disaggregated reports whether o asks for prefill and decode pools.
func (o *Options) disaggregated() bool { return o.PrefillWorkers != 0 || o.DecodeWorkers != 0 }

// firstRole is the role a request is routed for on arrival.
func (o *Options) firstRole() shared.Role {
	if o.disaggregated() {
		return shared.RolePrefill
	}
	return shared.RoleAggregated
}

// Outcome is one request's result, one JSON line of --per-request. In
// disaggregated mode Worker is the prefill worker, TTFT is measured at the
// prefill worker's first token (the token the client receives first), and
// E2E at the decode worker's last token.
type Outcome struct {
	Index     int     `json:"index"`
	ArrivalMs float64 `json:"arrival_ms"`
	Worker    int     `json:"worker"` // aggregated or prefill worker's fleet id, -1 when rejected
	// DecodeWorker is the decode worker's fleet id in disaggregated mode, or
	// -1 when the request reached none (rejected, or done at prefill with
	// output_length <= 1). It is absent in aggregated mode: decode ids
	// start after at least one prefill worker, so 0 never names one.
	DecodeWorker int `json:"decode_worker,omitempty"`
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// Priority and PolicyClass are the request's classification: its
	// priority, and its queue class (the queue's default class when the
	// classifier named none). Present only when the replay has a queue
	// block or a classifier (Options.Queue, Options.Classifier), so the
	// default configuration's lines are as they always were.
	Priority      *int   `json:"priority,omitempty"`
	PolicyClass   string `json:"policy_class,omitempty"`
	OverlapBlocks int    `json:"overlap_blocks"` // router's prefix-index belief at selection
	CachedTokens  int    `json:"cached_tokens"`  // prompt tokens the engine served from cache
	// QueueMs is arrival to the first scheduled step of the (prefill)
	// worker: time waiting in the router's queue plus in the engine's.
	QueueMs float64 `json:"queue_ms"`
	TTFTMs  float64 `json:"ttft_ms"`
	// KVTransferMs is the prompt's KV transfer from the prefill to the
	// decode worker (KVTransferTime); absent when there was none.
	KVTransferMs float64 `json:"kv_transfer_ms,omitempty"`
	E2EMs        float64 `json:"e2e_ms"`
	Status       string  `json:"status"` // "ok" or "rejected: reason"
	Fallback     bool    `json:"fallback,omitempty"`
}

// Run replays o.Records and returns the report. ctx cancels between
// requests. Errors: an invalid option, a trace/block-size mismatch, or a
// write error on PerRequest.
//
// Run is a discrete-event loop over four sources: arrivals, pending decode
// submissions (KV transfers landing), and the step ends of the first-hop
// (aggregated or prefill) and decode clusters. Everything is handled in
// simulated-time order; at one instant, in this order: steps that end then
// (decode workers' events first, then the others', each cluster in
// sim.Cluster order), then decode submissions (by trace index), then
// arrivals (trace order). A step that starts at that instant is formed
// after all of them, so requests submitted then join it, and nothing is
// ever submitted to a worker at a time before one it has reached.
//
// The first hop goes through the router's admission API: Admit on arrival,
// FirstToken and Complete on the worker's events, and Dispatch whenever
// capacity may have freed. Without a capacity (Options.Queue's
// MaxActiveRequests 0, the default) nothing queues and only arrivals feed
// the first-hop cluster, so its steps up to the next arrival are run in
// one AdvanceTo and their events then handled one by one, the decode side
// brought up to each event's time first. The result is the same as taking
// the single earliest source at every step (routing reads only the
// bookings of the role it routes for), and the aggregated loop is exactly
// the single-cluster one.
//
// With a capacity, a queued request may be dispatched at any step end, so
// the loop steps event by event: the next instant is the earlier of the
// next arrival and the first-hop cluster's next step end
// (sim.Cluster.NextEvent). At each instant the steps that end then are
// handled, then queued requests are dispatched (Dispatch) and submitted at
// that instant, then the arrivals, each after another Dispatch so that
// waiting requests go first. No request is submitted in a worker's past.
func Run(ctx context.Context, o Options) (*Report, error) {
	rep, _, err := execute(ctx, o)
	return rep, err
}

// execute is Run, also returning the driver so that tests can inspect the
// final state (bookings, workers).
func execute(ctx context.Context, o Options) (*Report, *driver, error) {
	start := time.Now() // wall_s includes building the router and the clusters
	d, err := newDriver(ctx, &o)
	if err != nil {
		return nil, nil, err
	}
	if err := d.loop(); err != nil {
		return nil, nil, err
	}
	d.drain()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	wall := time.Since(start)

	rep := d.report(&o, wall)
	if o.PerRequest != nil {
		if err := writeOutcomes(o.PerRequest, d.outcomes); err != nil {
			return nil, nil, fmt.Errorf("replay: writing per-request output: %w", err)
		}
	}
	return rep, d, nil
}

// driver keeps the state of one replay. The first hop is the aggregated
// cluster, or the prefill cluster in disaggregated mode; decode is nil in
// aggregated mode.
type driver struct {
	ctx       context.Context
	r         *router.Router
	adm       *admission.Controller
	blockSize int
	records   []trace.Record

	first      *sim.Cluster // aggregated or prefill workers: fleet ids 0..first.Len()−1
	decode     *sim.Cluster // decode workers: fleet ids decodeBase.., or nil
	decodeBase int
	bandwidth  float64 // bytes per second

	workers []*fleet.Worker // every fleet member, by fleet id

	// now is the simulated time the router's clock reads (Epoch + now):
	// set before every admission call.
	now      time.Duration
	capacity int  // first-hop max_active_requests; 0: nothing queues
	waiting  int  // requests in the router's queue
	classify bool // per-request lines carry priority and policy_class
	// defaultClass is the queue's default class, and classes its classes
	// in file order (the report's order).
	defaultClass string
	classes      []string
	dispatched   []*admission.Handle // Dispatch's buffer

	outcomes       []Outcome
	arrival        []time.Duration
	handles        []*admission.Handle // first-hop handle per request, nil once it ended
	priority       []int               // classification's priority per request
	class          []string            // classification's class per request ("" until classified)
	queued         []bool              // waiting in the router's queue
	decodeBookings []*fleet.Booking    // decode booking per request (disaggregated)
	reqs           []sim.Request       // first-hop request per request
	decodeReqs     []sim.Request       // decode-hop request per request (disaggregated)
	transfers      transferQueue       // routed to a decode worker, KV in flight

	firstEvents, decodeEvents []sim.Event

	lastAt       time.Duration // latest completion
	decisions    int           // Select calls
	decisionTime time.Duration // wall time in Select

	// selections counts the selections that placed a request on a worker
	// (first hops and decode hops); fell, those a fallback decided, by
	// cause. firstPolicy and decodePolicy name the roles' policies.
	selections                int64
	fell                      fallbackTally
	firstPolicy, decodePolicy string
}

func newDriver(ctx context.Context, o *Options) (*driver, error) {
	disagg := o.disaggregated()
	if disagg {
		if o.PrefillWorkers < 1 || o.DecodeWorkers < 1 {
			return nil, fmt.Errorf("replay: %d prefill and %d decode workers, want both >= 1", o.PrefillWorkers, o.DecodeWorkers)
		}
		// Each is checked alone first so that the sum cannot overflow.
		if o.PrefillWorkers > MaxWorkers || o.DecodeWorkers > MaxWorkers || o.PrefillWorkers+o.DecodeWorkers > MaxWorkers {
			return nil, fmt.Errorf("replay: %d prefill and %d decode workers, want at most %d together (MaxWorkers)",
				o.PrefillWorkers, o.DecodeWorkers, MaxWorkers)
		}
		if o.Workers != 0 {
			return nil, fmt.Errorf("replay: %d aggregated workers with prefill and decode workers; use one or the other", o.Workers)
		}
		for _, role := range []shared.Role{shared.RolePrefill, shared.RoleDecode} {
			if o.Roles[role] == nil {
				return nil, fmt.Errorf("replay: no policy for role %s", role)
			}
		}
		if bw := o.KVTransferBandwidth; bw < 0 || math.IsNaN(bw) || math.IsInf(bw, 0) {
			return nil, fmt.Errorf("replay: KV transfer bandwidth %v B/s, want finite and > 0 (0: default)", bw)
		}
	} else {
		if o.Workers < 1 || o.Workers > MaxWorkers {
			return nil, fmt.Errorf("replay: %d workers, want 1 to %d (MaxWorkers)", o.Workers, MaxWorkers)
		}
		if o.Roles[shared.RoleAggregated] == nil {
			return nil, errors.New("replay: no policy for role aggregated")
		}
	}
	cfg := o.Sim
	if cfg == (sim.Config{}) {
		cfg = sim.DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	hashed := false
	for _, rec := range o.Records {
		if len(rec.HashIDs) > 0 {
			hashed = true
			break
		}
	}
	if hashed && o.BlockSize != trace.MooncakeBlockTokens {
		return nil, fmt.Errorf("replay: %s hashes %d-token blocks; set router.block_size = %d (have %d)",
			o.TraceName, trace.MooncakeBlockTokens, trace.MooncakeBlockTokens, o.BlockSize)
	}
	r, err := router.New(router.Options{BlockSize: o.BlockSize, Roles: o.Roles, BookingsAreLoad: true})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	queue := o.Queue
	if len(queue.Classes) == 0 {
		queue = config.DefaultQueue()
	}
	n := len(o.Records)
	d := &driver{
		ctx:       ctx,
		r:         r,
		blockSize: o.BlockSize,
		records:   o.Records,
		capacity:  queue.MaxActiveRequests,
		classify:  o.classified(),
		outcomes:  make([]Outcome, n),
		arrival:   make([]time.Duration, n),
		handles:   make([]*admission.Handle, n),
		priority:  make([]int, n),
		class:     make([]string, n),
		queued:    make([]bool, n),
		reqs:      make([]sim.Request, n),
	}
	d.firstPolicy = o.Roles[o.firstRole()].Name
	if disagg {
		d.decodePolicy = o.Roles[shared.RoleDecode].Name
	}
	d.defaultClass = queue.DefaultClass
	if d.defaultClass == "" {
		d.defaultClass = queue.Classes[0].Name
	}
	for _, c := range queue.Classes {
		d.classes = append(d.classes, c.Name)
	}
	if d.adm, err = admission.New(r, admission.Options{Queue: queue, Classifier: o.Classifier, Listeners: o.Listeners,
		Now: func() time.Time { return epoch.Add(d.now) }, InlineEvents: true}); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	// The index tracks what fits in each engine's KV cache, in router blocks.
	capacity := max(int64(cfg.TotalKVBlocks)*int64(cfg.BlockSize)/int64(o.BlockSize), 1)
	join := func(role shared.Role, name string) error {
		id := len(d.workers)
		w, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(id), Role: role, TotalKVBlocks: capacity, Name: name + strconv.Itoa(id)})
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		d.workers = append(d.workers, w)
		return nil
	}
	if !disagg {
		if d.first, err = sim.NewCluster(o.Workers, cfg); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		for range o.Workers {
			if err := join(shared.RoleAggregated, "sim-"); err != nil {
				return nil, err
			}
		}
		return d, nil
	}
	if d.first, err = sim.NewCluster(o.PrefillWorkers, cfg); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if d.decode, err = sim.NewCluster(o.DecodeWorkers, cfg); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	for range o.PrefillWorkers {
		if err := join(shared.RolePrefill, "prefill-"); err != nil {
			return nil, err
		}
	}
	d.decodeBase = len(d.workers)
	for range o.DecodeWorkers {
		if err := join(shared.RoleDecode, "decode-"); err != nil {
			return nil, err
		}
	}
	d.bandwidth = o.KVTransferBandwidth
	if d.bandwidth == 0 {
		d.bandwidth = DefaultKVTransferBandwidth
	}
	d.decodeBookings = make([]*fleet.Booking, n)
	d.decodeReqs = make([]sim.Request, n)
	return d, nil
}

// loop replays every arrival and runs the first-hop cluster until it is
// idle with nothing queued (see Run).
func (d *driver) loop() error {
	recs := d.records
	i, steps := 0, 0
	for {
		if steps++; steps%1024 == 0 {
			if err := d.ctx.Err(); err != nil {
				return err
			}
		}
		if d.capacity == 0 && d.waiting == 0 {
			// Nothing can wait for capacity: only arrivals feed the
			// first hop.
			if i == len(recs) {
				return nil
			}
			now := recs[i].Arrival
			d.advance(now)
			d.arrive(i, &recs[i])
			i++
			continue
		}
		// A queued request may leave the queue at any step end: go event
		// by event.
		next, busy := d.first.NextEvent()
		arrival := i < len(recs)
		if !arrival && !busy {
			if d.waiting > 0 {
				d.dispatch(d.now)
				d.abandon()
			}
			return nil
		}
		if arrival && (!busy || recs[i].Arrival <= next) {
			next = recs[i].Arrival
		}
		d.advance(next)
		d.dispatch(next)
		for ; i < len(recs) && recs[i].Arrival == next; i++ {
			d.dispatch(next)
			d.arrive(i, &recs[i])
		}
	}
}

// advance processes everything that happens up to and including t (see
// Run for the order). The first-hop cluster's inputs are the arrivals
// only, so with every arrival before t submitted its events up to t are
// final and can be taken at once; each may route a decode hop, so the
// decode side is brought up to each event's time before it is handled.
func (d *driver) advance(t time.Duration) {
	d.firstEvents = d.first.AdvanceTo(t, d.firstEvents[:0])
	for _, e := range d.firstEvents {
		d.decodeUpTo(e.At, false)
		d.handleFirst(e)
	}
	d.decodeUpTo(t, true)
}

// drain runs every worker until idle.
func (d *driver) drain() {
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

// decodeUpTo submits the KV transfers that land before t (or at t, when
// inclusive), each after the decode workers' events up to its time, and
// then handles the decode workers' events up to t. No-op in aggregated
// mode.
func (d *driver) decodeUpTo(t time.Duration, inclusive bool) {
	if d.decode == nil {
		return
	}
	for len(d.transfers) > 0 {
		x := d.transfers[0]
		if x.at > t || (x.at == t && !inclusive) {
			break
		}
		heap.Pop(&d.transfers)
		d.decodeEvents = d.decode.AdvanceTo(x.at, d.decodeEvents[:0])
		d.handleDecode(d.decodeEvents)
		out := &d.outcomes[x.index]
		if err := d.decode.Submit(x.at, out.DecodeWorker-d.decodeBase, &d.decodeReqs[x.index]); err != nil {
			d.decodeBookings[x.index].Release()
			out.Status = "rejected: decode: " + err.Error()
		}
		d.observe(d.decode, out.DecodeWorker-d.decodeBase, out.DecodeWorker)
	}
	if t != math.MaxInt64 {
		d.decodeEvents = d.decode.AdvanceTo(t, d.decodeEvents[:0])
		d.handleDecode(d.decodeEvents)
	}
}

// arrive admits trace request i, arriving now, for its first hop and, when
// a worker has capacity, submits it there; otherwise it waits in the
// router's queue for dispatch.
func (d *driver) arrive(i int, rec *trace.Record) {
	now := rec.Arrival
	d.now = now
	hashes := prefix.ChainHashes(make([]uint64, 0, len(rec.HashIDs)), rec.HashIDs)
	req := &shared.Request{
		ID:           strconv.Itoa(i),
		Role:         shared.RoleAggregated,
		PromptTokens: rec.InputLength,
		BlockSize:    d.blockSize,
		BlockHashes:  hashes,
		SessionID:    rec.SessionID,
	}
	if rec.HasPriority || rec.PolicyClass != "" {
		req.Metadata = make(map[string]string, 2)
		if rec.HasPriority {
			req.Metadata[MetadataPriority] = strconv.Itoa(rec.Priority)
		}
		if rec.PolicyClass != "" {
			req.Metadata[MetadataPolicyClass] = rec.PolicyClass
		}
	}
	out := &d.outcomes[i]
	*out = Outcome{Index: i, ArrivalMs: millis(now), Worker: -1, InputLength: rec.InputLength, OutputLength: rec.OutputLength}
	if d.decode != nil {
		req.Role = shared.RolePrefill
		out.DecodeWorker = -1
	}
	d.arrival[i] = now
	t0 := time.Now()
	h, err := d.adm.Admit(d.ctx, req)
	d.decisionTime += time.Since(t0)
	d.decisions++
	var cl shared.Classification
	if h != nil {
		cl = h.Classification()
	}
	d.classified(i, &cl)
	switch {
	case err != nil:
		out.Status = "rejected: " + err.Error()
	case h.Queued():
		d.handles[i] = h
		d.queued[i] = true
		d.waiting++
	default:
		d.handles[i] = h
		dec := h.Decision()
		d.start(i, &dec, hashes, now)
	}
}

// classified records request i's classification in its outcome.
func (d *driver) classified(i int, cl *shared.Classification) {
	d.priority[i], d.class[i] = cl.Priority, cl.PolicyClass
	if d.class[i] == "" {
		d.class[i] = d.defaultClass
	}
	if d.classify {
		d.outcomes[i].Priority = &d.priority[i]
		d.outcomes[i].PolicyClass = d.class[i]
	}
}

// start submits request i, placed by dec, to its first-hop worker at `at`;
// hashes are its chained prefix-block hashes.
func (d *driver) start(i int, dec *router.Decision, hashes []uint64, at time.Duration) {
	rec := &d.records[i]
	out := &d.outcomes[i]
	out.Worker = int(dec.Worker.ID)
	out.OverlapBlocks = dec.OverlapBlocks
	out.Fallback = dec.Fallback
	d.selected(d.firstPolicy, dec)
	outputLength := rec.OutputLength
	if d.decode != nil {
		outputLength = 1 // the prefill worker samples the first token only
	}
	d.reqs[i] = sim.Request{ID: i, InputLength: max(rec.InputLength, 1), OutputLength: outputLength,
		PrefixHashes: hashes, PrefixBlockTokens: d.blockSize}
	if err := d.first.Submit(at, out.Worker, &d.reqs[i]); err != nil {
		d.end(i, admission.Aborted(err.Error())) // releases the booking
		out.Status = "rejected: " + err.Error()
	}
	d.observe(d.first, out.Worker, out.Worker)
}

// end ends request i's first hop.
func (d *driver) end(i int, o admission.Outcome) {
	if h := d.handles[i]; h != nil {
		h.End(o)
		d.handles[i] = nil
	}
}

// selected counts a selection that placed a request, by policy (the
// role's), and tallies its cause when its fallback decided.
func (d *driver) selected(policy string, dec *router.Decision) {
	d.selections++
	if dec.Fallback {
		d.fell.add(policy, dec.FallbackCause)
	}
}

// observe publishes simulated worker idx's engine state (queue length, KV
// usage) as fleet worker id's engine report, as a scraped vLLM /metrics
// would, so policies that read LOAD's kv_usage and waiting see them. It
// runs after every change to the worker, in simulated-time order, so the
// replay stays deterministic.
func (d *driver) observe(c *sim.Cluster, idx, id int) {
	l := c.Worker(idx).Load()
	var usage float64
	if total := l.UsedBlocks + l.FreeBlocks; total > 0 {
		usage = float64(l.UsedBlocks) / float64(total)
	}
	d.workers[id].SetEngineLoad(&fleet.EngineLoad{KVUsage: usage, HasKVUsage: true, Waiting: int64(l.Waiting), HasWaiting: true})
}

// dispatch places queued requests while capacity allows and submits them
// at `at`; those whose due time passed are rejected.
func (d *driver) dispatch(at time.Duration) {
	if d.waiting == 0 {
		return
	}
	d.now = at
	t0 := time.Now()
	d.dispatched = d.adm.Dispatch(d.ctx, d.dispatched[:0])
	d.decisionTime += time.Since(t0)
	for _, h := range d.dispatched {
		i, _ := strconv.Atoi(h.Request().ID)
		d.queued[i] = false
		d.waiting--
		if err := h.Err(); err != nil {
			d.handles[i] = nil
			d.outcomes[i].Status = "rejected: " + err.Error()
			continue
		}
		d.decisions++
		dec := h.Decision()
		d.start(i, &dec, h.Request().BlockHashes, at)
	}
	clear(d.dispatched) // drop the handles
}

// abandon rejects the requests still queued when the first hop is idle
// and no arrival is left: only a policy that answers "all busy" with no
// request in flight leaves any.
func (d *driver) abandon() {
	const reason = "never dispatched: every worker stayed busy after the last request ended"
	for i, q := range d.queued {
		if q {
			d.end(i, admission.Aborted(reason))
			d.queued[i] = false
			d.waiting--
			d.outcomes[i].Status = "rejected: " + reason
		}
	}
}

// selectWorker calls the router for a decode hop, timing the decision.
func (d *driver) selectWorker(req *shared.Request) (router.Decision, error) {
	t0 := time.Now()
	dec, err := d.r.Place(d.ctx, req, router.Placement{})
	d.decisionTime += time.Since(t0)
	d.decisions++
	return dec, err
}

// handleFirst feeds back one event of an aggregated or prefill worker:
// the first token ends the request's booked prefill; completion releases
// its booking and, in disaggregated mode, hands a request with more to
// generate to the decode side.
func (d *driver) handleFirst(e sim.Event) {
	i := e.RequestID
	out := &d.outcomes[i]
	defer d.observe(d.first, e.Worker, e.Worker)
	switch e.Kind {
	case sim.FirstToken:
		out.TTFTMs = millis(e.At - d.arrival[i])
		out.CachedTokens = e.CachedTokens
		out.QueueMs = millis(e.ScheduledAt - d.arrival[i])
		d.now = e.At
		d.handles[i].FirstToken() // ends the booked prefill
	case sim.Completed:
		d.now = e.At
		d.end(i, admission.Completed(int64(d.reqs[i].InputLength+max(d.reqs[i].OutputLength, 1)))) // releases the booking
		if d.decode != nil && d.records[i].OutputLength > 1 {
			d.handOff(i, e.At)
			return
		}
		out.E2EMs = millis(e.At - d.arrival[i])
		out.Status = "ok"
		d.lastAt = max(d.lastAt, e.At)
	}
}

// handOff routes request i, whose prefill ended at `at`, to a decode
// worker and queues its submission there for when its prompt's KV has
// arrived. The decode worker is chosen before the transfer (the KV needs
// a destination), so its booking covers the transfer too. The decode hop
// carries no block hashes: transferred KV is not published to the decode
// workers' prefix caches (sim.Request.KVTransferred), so the router must
// not record it in its prefix index either.
func (d *driver) handOff(i int, at time.Duration) {
	rec := &d.records[i]
	out := &d.outcomes[i]
	req := shared.Request{
		ID:           strconv.Itoa(i),
		Role:         shared.RoleDecode,
		PromptTokens: rec.InputLength,
		BlockSize:    d.blockSize,
	}
	dec, err := d.selectWorker(&req)
	if err != nil {
		out.Status = "rejected: decode: " + err.Error()
		return
	}
	out.DecodeWorker = int(dec.Worker.ID)
	out.Fallback = out.Fallback || dec.Fallback
	d.selected(d.decodePolicy, &dec)
	d.decodeBookings[i] = dec.Booking
	prompt := max(rec.InputLength, 1)
	xfer := KVTransferTime(prompt, d.bandwidth)
	out.KVTransferMs = millis(xfer)
	d.decodeReqs[i] = sim.Request{ID: i, InputLength: prompt, OutputLength: rec.OutputLength, KVTransferred: true}
	heap.Push(&d.transfers, transfer{at: at + xfer, index: i})
}

// handleDecode feeds back decode workers' events: completion ends the
// request and releases its decode booking.
func (d *driver) handleDecode(events []sim.Event) {
	for _, e := range events {
		i := e.RequestID
		d.observe(d.decode, e.Worker, d.decodeBase+e.Worker)
		switch e.Kind {
		case sim.FirstToken:
			d.decodeBookings[i].PrefillDone() // books no prefill; marks the state
		case sim.Completed:
			out := &d.outcomes[i]
			out.E2EMs = millis(e.At - d.arrival[i])
			out.Status = "ok"
			d.decodeBookings[i].Release()
			d.lastAt = max(d.lastAt, e.At)
		}
	}
}

// transfer is a request routed to a decode worker whose KV lands at `at`.
type transfer struct {
	at    time.Duration
	index int
}

// transferQueue is a min-heap of transfers by (at, index), so decode
// submissions happen in time order, ties in trace order.
type transferQueue []transfer

func (q transferQueue) Len() int { return len(q) }
func (q transferQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].index < q[j].index)
}
func (q transferQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *transferQueue) Push(x any)   { *q = append(*q, x.(transfer)) }
func (q *transferQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

func millis(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func (d *driver) report(o *Options, wall time.Duration) *Report {
	rep := &Report{
		Policy:            o.PolicyName,
		Trace:             o.TraceName,
		Workers:           len(d.workers),
		Requests:          len(o.Records),
		RequestsPerWorker: make([]int, len(d.workers)),
		WallS:             round3(wall.Seconds()),
		Selections:        d.selections,
		Fallbacks:         d.r.Fallbacks(),
		FallbackSources:   d.fell.list(),
		Hosted:            d.r.Hosted(o.firstRole()),
	}
	roles := []shared.Role{shared.RoleAggregated}
	if d.decode != nil {
		rep.PrefillWorkers, rep.DecodeWorkers = d.first.Len(), d.decode.Len()
		roles = []shared.Role{shared.RolePrefill, shared.RoleDecode}
	}
	if len(o.RolePolicies) > 0 {
		rep.RolePolicies = make(map[string]string, len(roles))
		for _, role := range roles {
			rep.RolePolicies[string(role)] = o.RolePolicies[role]
		}
	}
	var ttft, e2e, queue, xfer []float64
	var prompt, cached, predicted int64
	rep.Classes = make(map[string]*ClassReport, len(d.classes))
	rep.classOrder = append(rep.classOrder, d.classes...)
	for _, name := range d.classes {
		rep.Classes[name] = &ClassReport{}
	}
	type samples struct{ ttft, queue []float64 }
	perClass := make(map[string]*samples, len(d.classes))
	var extra []string // classes the queue does not declare
	for i := range d.outcomes {
		out := &d.outcomes[i]
		name := d.class[i]
		c := rep.Classes[name]
		if c == nil {
			c = &ClassReport{}
			rep.Classes[name] = c
			extra = append(extra, name)
		}
		c.Requests++
		if out.Status != "ok" {
			c.Rejected++
			continue
		}
		c.Completed++
		sm := perClass[name]
		if sm == nil {
			sm = &samples{}
			perClass[name] = sm
		}
		sm.ttft = append(sm.ttft, out.TTFTMs)
		sm.queue = append(sm.queue, out.QueueMs)
	}
	for name, sm := range perClass {
		rep.Classes[name].TTFT, rep.Classes[name].Queue = summarize(sm.ttft), summarize(sm.queue)
	}
	slices.Sort(extra)
	rep.classOrder = append(rep.classOrder, extra...)
	for _, out := range d.outcomes {
		if out.Worker >= 0 {
			rep.RequestsPerWorker[out.Worker]++
		}
		if d.decode != nil && out.DecodeWorker >= 0 {
			rep.RequestsPerWorker[out.DecodeWorker]++
		}
		if out.Status != "ok" {
			rep.Rejected++
			if rep.RejectionReasons == nil {
				rep.RejectionReasons = make(map[string]int)
			}
			rep.RejectionReasons[strings.TrimPrefix(out.Status, "rejected: ")]++
			continue
		}
		rep.Completed++
		ttft = append(ttft, out.TTFTMs)
		e2e = append(e2e, out.E2EMs)
		queue = append(queue, out.QueueMs)
		if out.DecodeWorker > 0 {
			xfer = append(xfer, out.KVTransferMs)
		}
		prompt += int64(out.InputLength)
		cached += int64(out.CachedTokens)
		predicted += min(int64(out.OverlapBlocks)*int64(o.BlockSize), int64(max(out.InputLength-1, 0)))
	}
	rep.TTFT, rep.E2E, rep.Queue = summarize(ttft), summarize(e2e), summarize(queue)
	rep.KVTransfer = summarize(xfer)
	if prompt > 0 {
		rep.KVHitRatio = round4(float64(cached) / float64(prompt))
		rep.RouterOverlapRatio = round4(float64(predicted) / float64(prompt))
	}
	rep.Imbalance = imbalance(rep.RequestsPerWorker[:d.first.Len()])
	clusters := []*sim.Cluster{d.first}
	if d.decode != nil {
		rep.Imbalance = max(rep.Imbalance, imbalance(rep.RequestsPerWorker[d.decodeBase:]))
		clusters = append(clusters, d.decode)
	}
	for _, c := range clusters {
		rep.Preemptions += c.Stats().Preemptions
	}
	if len(o.Records) > 0 {
		rep.SimDurationS = round3((d.lastAt - o.Records[0].Arrival).Seconds())
	}
	if rep.Selections > 0 {
		rep.FallbackShare = float64(rep.Fallbacks) / float64(rep.Selections)
	}
	if s := wall.Seconds(); s > 0 {
		rep.SimRequestsPerS = float64(int(float64(len(o.Records)) / s))
	}
	if s := d.decisionTime.Seconds(); s > 0 {
		rep.DecisionsPerS = float64(int(float64(d.decisions) / s))
	}
	return rep
}

// imbalance is max over mean of one pool's request counts (0 when the
// pool got none).
func imbalance(counts []int) float64 {
	var maxN, sum int
	for _, n := range counts {
		maxN = max(maxN, n)
		sum += n
	}
	if sum == 0 {
		return 0
	}
	return round3(float64(maxN) / (float64(sum) / float64(len(counts))))
}

func round4(x float64) float64 { return float64(int64(x*10000+0.5)) / 10000 }

// writeOutcomes writes one JSON object per line. encoding/json renders
// struct fields in declaration order and floats in their shortest form, so
// the output is a pure function of the outcomes.
func writeOutcomes(w io.Writer, outs []Outcome) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	for i := range outs {
		if err := enc.Encode(&outs[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
