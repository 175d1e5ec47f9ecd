package replay

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// DefaultWorkers is the number of simulated workers when none is given:
// the conversation trace needs about 1.6 GPU-seconds of prefill per second
// without cache hits (router/sim/README.md, Trace blocks), so 8 leaves headroom for policies
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
// 2 (key and value) × 2 bytes = 131,072 bytes (router/sim/README.md, Model).
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

// MetadataPriority and MetadataPolicyClass are the Request.Metadata keys
// a replay puts a trace record's priority and policy_class under: the
// HTTP header names the header-priority classifier reads by default.
const (
	MetadataPriority    = "x-priority"
	MetadataPolicyClass = "x-policy-class"
)

// DecodeIDSuffix ends the request id of a request's decode hop in
// disaggregated mode: trace request 7 is admitted as "7" for its prefill
// hop and as "7#d" for its decode hop, so listeners hear each hop's
// lifecycle under its own id.
const DecodeIDSuffix = "#d"

// Options configure one replay.
type Options struct {
	// PolicyName labels the report: the policy file's name, or
	// config.DefaultPolicyName ("default") for the built-in policy.
	PolicyName string
	// Roles maps each role to its policy: aggregated is required in
	// aggregated mode, prefill and decode in disaggregated mode.
	Roles map[shared.Role]*policy.Policy
	// RolePolicies, when set, names each role's policy as the policy file
	// does (config.PolicyFile.RolePolicies), config.DefaultPolicyName for the
	// built-in one. The report copies the names of the roles it routes
	// for, and its table label marks a role that ran the built-in policy
	// although PolicyName names a file (see Report.Label).
	RolePolicies map[shared.Role]string
	// BlockSize is the router's tokens per block. Mooncake traces hash
	// 512-token blocks, so they require 512.
	BlockSize int
	// TraceName labels the report.
	TraceName string
	// Records is the trace, in arrival order; or leave it nil and set
	// Trace.
	Records []trace.Record
	// Trace, in place of Records, is the trace as a stream in arrival
	// order (trace.Records, trace.FileRecords), ranged over once: the
	// replay takes each record when simulated time reaches the previous
	// one's arrival and keeps it only until its request is over, so a
	// long trace takes memory for the requests in flight, not for the
	// whole trace. A record's trace index is its position in the stream.
	// The first error the stream yields ends the replay with that error.
	Trace iter.Seq2[*trace.Record, error]
	// Workers is the number of simulated aggregated workers (1 to
	// MaxWorkers), indexes 0..Workers−1, named "sim-INDEX", with fleet id
	// shared.WorkerIDOf(name) as router serve gives a worker of that name;
	// it must be 0 in disaggregated mode.
	Workers int
	// PrefillWorkers and DecodeWorkers, when set (both >= 1, together at
	// most MaxWorkers), replay disaggregated serving instead
	// (admission.Disaggregated): prefill workers have indexes
	// 0..PrefillWorkers−1 ("prefill-INDEX") and role prefill, decode
	// workers the next DecodeWorkers indexes ("decode-INDEX") and role
	// decode; fleet ids are shared.WorkerIDOf of the names. Each request is admitted for a
	// prefill worker on arrival and computes its prompt and first token
	// there (submitted with OutputLength 1). At that first token its
	// prefill hop ends and, if it has more to generate, its decode hop is
	// admitted for a decode worker; its prompt's KV moves there in
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
	// Speeds, when set, gives every simulated worker its speed, by worker
	// index (aggregated workers; in disaggregated mode the prefill workers
	// then the decode workers): worker x runs Sim with its Timing scaled by
	// Speeds[x] (sim.Timing.Scaled: every step 1/Speeds[x] as long, the KV
	// capacity the same), a fleet of mixed hardware. nil runs every worker
	// at speed 1, as does a list of 1s, byte for byte. It must have one
	// entry per worker, each from sim.MinSpeed to sim.MaxSpeed. Every
	// worker carries its class as the label shared.LabelClass ("speed-2";
	// see ClassOf), so that policies and per-class models can tell the
	// classes apart; the report lists the speeds (Report.Speeds) when any
	// is not 1. CycleSpeeds builds the list from a repeating pattern.
	Speeds []float64
	// PerRequest, when set, receives one JSON line per request in trace
	// order (see Outcome), written as the replay goes: a request's line as
	// soon as it and every request before it are over. A replay that
	// fails may have written part of its lines.
	PerRequest io.Writer
	// Progress, when set, is called from the replay's own goroutine every
	// 1024 iterations of its event loop and once at the end, with the
	// requests retired and arrived and the simulated time (see Progress),
	// for a display. It must return quickly and must not change anything
	// the replay reads: the replay's outputs are the same with it and
	// without it.
	Progress func(Progress)

	// Queue is the policy file's queue block (config.PolicyFile.Queue), for
	// every hop (aggregated, or prefill and decode): MaxActiveRequests is
	// each worker's capacity in in-flight requests; a hop that finds every
	// candidate of its role at capacity waits in its role's queue and is
	// dispatched, by class weight, priority and aging, at the simulated
	// instant capacity frees. The zero value means config.DefaultQueue():
	// no capacity, so nothing queues (unless a policy itself answers that
	// every worker is busy) and the replay is the same as without
	// admission.
	Queue config.Queue
	// Classifier, when set, classifies every hop on its admission
	// (priority, policy class, due time, scheduling cost, advisory
	// target): the factory of the file's request_classifier,
	// config.PolicyFile.Classifier's Instance. Requests carry the trace's
	// session_id as SessionID and, as Metadata, its priority under
	// "x-priority" and its policy_class under "x-policy-class", the HTTP
	// header names header-priority reads by default, so one policy file
	// classifies replayed and served requests alike.
	Classifier shared.ClassifierFactory
	// Listeners hear the lifecycle of every hop (sent, first_token,
	// completed, aborted) at simulated times (see Epoch); a decode hop's
	// request id ends in DecodeIDSuffix.
	Listeners []shared.EventListener
	// DecisionLatency is the simulated time each decision's plugin calls
	// take; the zero value charges none (built-in policies).
	DecisionLatency DecisionLatency
	// Prefix is how the router learns what each engine's prefix cache
	// holds; the zero value is PrefixApproximate.
	Prefix PrefixMode
	// KVEventDelay, in PrefixPrecise mode, is the simulated time between a
	// change of an engine's cache and the router applying its KV event
	// (>= 0; DefaultKVEventDelay is the command line's default). Must be 0
	// in PrefixApproximate mode.
	KVEventDelay time.Duration
	// SLO, when set, adds goodput to the report (Report.Goodput): the
	// requests that met every target. Its TTFT and TPOT are also every
	// request's latency targets (shared.Request.SLO, through
	// admission.Options.DefaultSLO) where its queue class in the policy
	// file sets none, field by field.
	SLO report.SLO
	// Timeline, when true, samples the replay's state over simulated time
	// (Report.Timeline) and keeps its latency distributions
	// (Report.Distributions), for plots; it changes nothing else.
	Timeline bool

	// Canary changes the canaries of the roles' policies (their policy
	// file's canary blocks) for this replay; the zero value runs them as
	// declared. A canary splits the requests by the hash of their
	// session (the trace's session_id) or request id, as serve does, and
	// judges its rollback on the simulated clock: Report.Canary has each
	// side's figures and the rollbacks that fired.
	Canary Canary

	// Replicas is the number of router replicas (1 to MaxReplicas; 0
	// means 1) that share the fleet, as several routers behind a
	// round-robin load balancer: trace request i is routed by replica
	// i mod Replicas. Each replica is a router of its own (its own
	// policies, from Replica; its own admission queue and capacity; its
	// own prefix index and fleet counters) over the same workers, whose
	// simulated engines are shared. A replica's decisions (a booking and
	// its prompt recorded in the prefix index), first tokens and releases
	// reach every other replica SyncDelay later, and in PrefixPrecise mode
	// every replica applies the engines' KV events SyncDelay after
	// KVEventDelay (docs/replay.md, "Replicas and sync delay"). One
	// replica is the replay without any of this, byte for byte.
	Replicas int
	// SyncDelay is the simulated time from a replica's decision, first
	// token or release (or an engine's KV event reaching the shared bus)
	// to every replica applying it; >= 0, and 0 with one replica.
	SyncDelay time.Duration
	// Replica returns the policies of replica k (1 to Replicas−1; replica
	// 0 routes with Roles and Classifier): instances of their own, since
	// components keep state (a round-robin cursor, a seeded picker's
	// draws) that replicas do not share. Required when Replicas > 1; its
	// error ends the replay.
	Replica func(k int) (Replica, error)
	// Failures are engine failures to model, and how the requests they
	// cut migrate (failures.go, docs/replay.md); nil: none.
	Failures *Failures
}

// Replica is what one router replica routes with (Options.Replica): its
// own instances of the policy file's policies and classifier.
type Replica struct {
	// Roles maps each role to the replica's policy, as Options.Roles.
	Roles map[shared.Role]*policy.Policy
	// Classifier is the replica's request classifier factory, as
	// Options.Classifier; nil without one.
	Classifier shared.ClassifierFactory
}

// MaxReplicas bounds Options.Replicas: 64 router replicas, far more than
// a fleet runs (each is a whole router with its own prefix index over
// every worker, so memory grows with replicas × workers).
const MaxReplicas = 64

// PrefixMode is how the router's prefix index learns what each simulated
// engine's prefix cache holds.
type PrefixMode uint8

const (
	// PrefixApproximate: from what the router sent each worker (the
	// approximate index, bounded by its KV capacity); the default.
	PrefixApproximate PrefixMode = iota
	// PrefixPrecise: from the engines' KV events. Every first-hop worker
	// (aggregated, or prefill) publishes its stored, removed and cleared
	// prefix groups (sim.Worker.SetKVEventHook); each reaches the router
	// KVEventDelay later, as a kvevents.Batch applied by the same precise
	// index code as router serve's (prefix.Precise), keyed by the trace's
	// chained hashes (prefix.Precise.KeyByEngineHashes, prefix.HashKey).
	PrefixPrecise
)

// String returns "approximate" or "precise", the --prefix values.
func (m PrefixMode) String() string {
	switch m {
	case PrefixApproximate:
		return "approximate"
	case PrefixPrecise:
		return "precise"
	}
	return fmt.Sprintf("PrefixMode(%d)", uint8(m))
}

// DefaultKVEventDelay is the KV event delay of `router replay --prefix
// precise` when none is given: 20 ms, one engine step. vLLM's scheduler
// publishes one batch of events per engine step (KVEventBatch, in
// vllm/v1/core/sched/scheduler.py); the simulator stamps a stored block at
// the end of the step that computed it but an eviction at the start of the
// step whose allocation caused it, so an eviction reaches the wire about
// one step after it happened. The simulated engines' mean step on the
// bundled conversation trace is 19.5 ms at 4 workers, 10.5 ms at 8 and
// 8.8 ms at 16 (BusyTime/Steps, measured); ZeroMQ on a LAN and the
// router's decode and apply (BENCHMARKS.md, KV event ingestion) add well
// under 1 ms.
const DefaultKVEventDelay = 20 * time.Millisecond

// DecisionLatency is the simulated time between a hop's decision and its
// request reaching the chosen worker: what the decision's out-of-process
// calls take. A replay reads no clock, so it charges these fixed figures
// (each plugin's replay_decision_latency, summed per policy by
// config.PolicyFile.ReplayDecisionLatency) whatever the calls took, and
// repeats exactly. The router decides, and books the worker, with the
// state at decision time; the simulated worker receives the request at
// decision time plus the charge (a decode hop's KV transfer starts then).
// Outcome.DecisionMs reports each request's total.
type DecisionLatency struct {
	// Policies is the charge of one decision of each policy, by policy
	// name (config.PolicyFile.ReplayDecisionLatency): charged for the role's
	// policy when it ran (not when an advisory target was taken without
	// it), plus its fallback's when the fallback decided. A policy not in
	// the map is charged nothing. Each >= 0.
	Policies map[string]time.Duration
	// Classifier is charged for every hop that Options.Classifier
	// classified (config.PolicyFile.ReplayClassifierLatency); >= 0.
	Classifier time.Duration
}

// classified reports whether requests are classified or may queue by a
// queue block: then the per-request lines carry priority and policy_class.
func (o *Options) classified() bool { return o.Classifier != nil || len(o.Queue.Classes) > 0 }

// replicas is the number of router replicas: Replicas, 1 when 0.
func (o *Options) replicas() int { return max(o.Replicas, 1) }

// disaggregated reports whether o asks for prefill and decode pools.
func (o *Options) disaggregated() bool { return o.PrefillWorkers != 0 || o.DecodeWorkers != 0 }

// path is how o's requests cross the fleet.
func (o *Options) path() admission.Path {
	if o.disaggregated() {
		return admission.Disaggregated
	}
	return admission.Aggregated
}

// check validates o and returns the simulated workers' configuration.
func (o *Options) check() (sim.Config, error) {
	if o.disaggregated() {
		if o.PrefillWorkers < 1 || o.DecodeWorkers < 1 {
			return sim.Config{}, fmt.Errorf("replay: %d prefill and %d decode workers, want both >= 1", o.PrefillWorkers, o.DecodeWorkers)
		}
		// Each is checked alone first so that the sum cannot overflow.
		if o.PrefillWorkers > MaxWorkers || o.DecodeWorkers > MaxWorkers || o.PrefillWorkers+o.DecodeWorkers > MaxWorkers {
			return sim.Config{}, fmt.Errorf("replay: %d prefill and %d decode workers, want at most %d together (MaxWorkers)",
				o.PrefillWorkers, o.DecodeWorkers, MaxWorkers)
		}
		if o.Workers != 0 {
			return sim.Config{}, fmt.Errorf("replay: %d aggregated workers with prefill and decode workers; use one or the other", o.Workers)
		}
		if bw := o.KVTransferBandwidth; bw < 0 || math.IsNaN(bw) || math.IsInf(bw, 0) {
			return sim.Config{}, fmt.Errorf("replay: KV transfer bandwidth %v B/s, want finite and > 0 (0: default)", bw)
		}
	} else if o.Workers < 1 || o.Workers > MaxWorkers {
		return sim.Config{}, fmt.Errorf("replay: %d workers, want 1 to %d (MaxWorkers)", o.Workers, MaxWorkers)
	}
	path := o.path()
	for k := range path.Len() {
		if role := path.Hop(k).Role; o.Roles[role] == nil {
			return sim.Config{}, fmt.Errorf("replay: no policy for role %s", role)
		}
	}
	switch {
	case o.Prefix > PrefixPrecise:
		return sim.Config{}, fmt.Errorf("replay: prefix mode %d, want approximate or precise", o.Prefix)
	case o.KVEventDelay < 0:
		return sim.Config{}, fmt.Errorf("replay: KV event delay %v, want >= 0", o.KVEventDelay)
	case o.KVEventDelay != 0 && o.Prefix != PrefixPrecise:
		return sim.Config{}, fmt.Errorf("replay: KV event delay %v without precise prefix mode: only precise mode reads KV events", o.KVEventDelay)
	}
	switch {
	case o.Replicas < 0 || o.Replicas > MaxReplicas:
		return sim.Config{}, fmt.Errorf("replay: %d replicas, want 1 to %d (MaxReplicas)", o.Replicas, MaxReplicas)
	case o.SyncDelay < 0:
		return sim.Config{}, fmt.Errorf("replay: sync delay %v, want >= 0", o.SyncDelay)
	case o.SyncDelay != 0 && o.replicas() == 1:
		return sim.Config{}, fmt.Errorf("replay: sync delay %v with one replica: only replicas sync", o.SyncDelay)
	case o.replicas() > 1 && o.Replica == nil:
		return sim.Config{}, fmt.Errorf("replay: %d replicas without Options.Replica: each replica needs policies of its own", o.Replicas)
	}
	if o.DecisionLatency.Classifier < 0 {
		return sim.Config{}, fmt.Errorf("replay: classifier decision latency %v, want >= 0", o.DecisionLatency.Classifier)
	}
	for name, l := range o.DecisionLatency.Policies {
		if l < 0 {
			return sim.Config{}, fmt.Errorf("replay: policy %q decision latency %v, want >= 0", name, l)
		}
	}
	cfg := o.Sim
	if cfg == (sim.Config{}) {
		cfg = sim.DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return sim.Config{}, fmt.Errorf("replay: %w", err)
	}
	if o.Speeds != nil {
		n := o.Workers
		if o.disaggregated() {
			n = o.PrefillWorkers + o.DecodeWorkers
		}
		if len(o.Speeds) != n {
			return sim.Config{}, fmt.Errorf("replay: %d speeds for %d workers, want one per worker (nil: all 1)", len(o.Speeds), n)
		}
		for x, v := range o.Speeds {
			if err := sim.CheckSpeed(v); err != nil {
				return sim.Config{}, fmt.Errorf("replay: worker %d: %w", x, err)
			}
		}
	}
	if o.Failures != nil {
		if err := o.Failures.check(o); err != nil {
			return sim.Config{}, err
		}
	}
	if o.Records != nil && o.Trace != nil {
		return sim.Config{}, errors.New("replay: both Records and Trace set; give the trace one way")
	}
	return cfg, nil
}

// CycleSpeeds returns the per-worker speeds (Options.Speeds) of a fleet of
// n workers whose speeds repeat pattern: worker i gets pattern[i mod
// len(pattern)], so CycleSpeeds([]float64{2, 1}, 8) is 2,1,2,1,2,1,2,1,
// half the workers twice as fast. It returns nil when every speed is 1
// (the fleet of one hardware class) or pattern is empty.
func CycleSpeeds(pattern []float64, n int) []float64 {
	if len(pattern) == 0 || !slices.ContainsFunc(pattern, func(v float64) bool { return v != 1 }) {
		return nil
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = pattern[i%len(pattern)]
	}
	return out
}

// ClassOf is the hardware class of a simulated worker of speed v, the
// value of its shared.LabelClass label: "speed-" and v as the shortest
// decimal that reads back as v ("speed-1", "speed-2", "speed-0.5").
func ClassOf(v float64) string { return "speed-" + strconv.FormatFloat(v, 'g', -1, 64) }
