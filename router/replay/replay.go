// Package replay drives a recorded trace through a Router on simulated
// workers, in simulated time, and reports per-request outcomes and a
// summary. The loop is single-threaded and reads no clock but for the wall
// time it reports, so the same trace, policy and seed give byte-identical
// per-request output.
package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/switchyard-router/switchyard/router"
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

// Options configure one replay.
type Options struct {
	// PolicyName labels the report ("default" or the policy file).
	PolicyName string
	// Roles maps each role to its policy; Aggregated is required.
	Roles map[shared.Role]*shared.Policy
	// BlockSize is the router's tokens per block. Mooncake traces hash
	// 512-token blocks, so they require 512.
	BlockSize int
	// TraceName labels the report.
	TraceName string
	// Records is the trace, in arrival order.
	Records []trace.Record
	// Workers is the number of simulated aggregated workers (>= 1).
	Workers int
	// Sim configures every simulated worker; zero means sim.DefaultConfig().
	Sim sim.Config
	// PerRequest, when set, receives one JSON line per request in trace
	// order (see Outcome).
	PerRequest io.Writer
}

// Outcome is one request's result, one JSON line of --per-request.
type Outcome struct {
	Index         int     `json:"index"`
	ArrivalMs     float64 `json:"arrival_ms"`
	Worker        int     `json:"worker"` // worker row, -1 when rejected
	InputLength   int     `json:"input_length"`
	OutputLength  int     `json:"output_length"`
	OverlapBlocks int     `json:"overlap_blocks"` // router's prefix-index belief at selection
	CachedTokens  int     `json:"cached_tokens"`  // prompt tokens the engine served from cache
	QueueMs       float64 `json:"queue_ms"`       // arrival to first scheduled step
	TTFTMs        float64 `json:"ttft_ms"`
	E2EMs         float64 `json:"e2e_ms"`
	Status        string  `json:"status"` // "ok" or "rejected: reason"
	Fallback      bool    `json:"fallback,omitempty"`
}

// Run replays o.Records and returns the report. ctx cancels between
// requests. Errors: an invalid option, a trace/block-size mismatch, or a
// write error on PerRequest.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Workers < 1 {
		return nil, fmt.Errorf("replay: %d workers, want >= 1", o.Workers)
	}
	if o.Roles[shared.RoleAggregated] == nil {
		return nil, errors.New("replay: no policy for role aggregated")
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
	cluster, err := sim.NewCluster(o.Workers, cfg)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	// The index tracks what fits in each engine's KV cache, in router blocks.
	capacity := int64(cfg.TotalKVBlocks) * int64(cfg.BlockSize) / int64(o.BlockSize)
	for i := range o.Workers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i), Role: shared.RoleAggregated,
			TotalKVBlocks: max(capacity, 1), Name: "sim-" + strconv.Itoa(i)}); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
	}

	d := driver{
		r:        r,
		cluster:  cluster,
		outcomes: make([]Outcome, len(o.Records)),
		bookings: make([]*fleet.Booking, len(o.Records)),
		arrival:  make([]time.Duration, len(o.Records)),
	}
	start := time.Now()
	var decisionTime time.Duration
	var events []sim.Event
	reqs := make([]sim.Request, len(o.Records))
	for i := range o.Records {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		rec := &o.Records[i]
		now := rec.Arrival
		events = cluster.AdvanceTo(now, events[:0])
		d.handle(events)

		hashes := prefix.ChainHashes(make([]uint64, 0, len(rec.HashIDs)), rec.HashIDs)
		req := shared.Request{
			ID:           strconv.Itoa(i),
			Role:         shared.RoleAggregated,
			PromptTokens: rec.InputLength,
			BlockSize:    o.BlockSize,
			BlockHashes:  hashes,
		}
		out := &d.outcomes[i]
		*out = Outcome{Index: i, ArrivalMs: millis(now), Worker: -1, InputLength: rec.InputLength, OutputLength: rec.OutputLength}
		d.arrival[i] = now
		t0 := time.Now()
		dec, err := r.Select(ctx, &req)
		decisionTime += time.Since(t0)
		if err != nil {
			out.Status = "rejected: " + err.Error()
			continue
		}
		row := int(dec.Worker.ID)
		out.Worker = row
		out.OverlapBlocks = dec.OverlapBlocks
		out.Fallback = dec.Fallback
		d.bookings[i] = dec.Booking
		reqs[i] = sim.Request{ID: i, InputLength: max(rec.InputLength, 1), OutputLength: rec.OutputLength,
			PrefixHashes: hashes, PrefixBlockTokens: o.BlockSize}
		if err := cluster.Submit(now, row, &reqs[i]); err != nil {
			dec.Booking.Release()
			out.Status = "rejected: " + err.Error()
			continue
		}
	}
	events = cluster.Drain(events[:0])
	d.handle(events)
	wall := time.Since(start)

	rep := d.report(o, r, cluster, wall, decisionTime)
	if o.PerRequest != nil {
		if err := writeOutcomes(o.PerRequest, d.outcomes); err != nil {
			return nil, fmt.Errorf("replay: writing per-request output: %w", err)
		}
	}
	return rep, nil
}

// driver keeps the per-request state of one replay.
type driver struct {
	r        *router.Router
	cluster  *sim.Cluster
	outcomes []Outcome
	bookings []*fleet.Booking
	arrival  []time.Duration
	lastAt   time.Duration
}

// handle feeds engine events back: the first token ends the request's
// booked prefill, completion releases its booking.
func (d *driver) handle(events []sim.Event) {
	for _, e := range events {
		out := &d.outcomes[e.RequestID]
		since := e.At - d.arrival[e.RequestID]
		switch e.Kind {
		case sim.FirstToken:
			out.TTFTMs = millis(since)
			out.CachedTokens = e.CachedTokens
			out.QueueMs = millis(e.ScheduledAt - d.arrival[e.RequestID])
			d.bookings[e.RequestID].PrefillDone()
		case sim.Completed:
			out.E2EMs = millis(since)
			out.Status = "ok"
			d.bookings[e.RequestID].Release()
			d.lastAt = max(d.lastAt, e.At)
		}
	}
}

func millis(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func (d *driver) report(o Options, r *router.Router, c *sim.Cluster, wall, decisions time.Duration) *Report {
	rep := &Report{
		Policy:            o.PolicyName,
		Trace:             o.TraceName,
		Workers:           o.Workers,
		Requests:          len(o.Records),
		RequestsPerWorker: make([]int, o.Workers),
		WallS:             round3(wall.Seconds()),
		Fallbacks:         r.Fallbacks(),
		Hosted:            r.Hosted(shared.RoleAggregated),
	}
	var ttft, e2e, queue []float64
	var prompt, cached, predicted int64
	for _, out := range d.outcomes {
		if out.Worker >= 0 {
			rep.RequestsPerWorker[out.Worker]++
		}
		if out.Status != "ok" {
			if out.Worker < 0 {
				rep.Rejected++
			}
			continue
		}
		rep.Completed++
		ttft = append(ttft, out.TTFTMs)
		e2e = append(e2e, out.E2EMs)
		queue = append(queue, out.QueueMs)
		prompt += int64(out.InputLength)
		cached += int64(out.CachedTokens)
		predicted += min(int64(out.OverlapBlocks)*int64(o.BlockSize), int64(max(out.InputLength-1, 0)))
	}
	rep.TTFT, rep.E2E, rep.Queue = summarize(ttft), summarize(e2e), summarize(queue)
	if prompt > 0 {
		rep.KVHitRatio = round4(float64(cached) / float64(prompt))
		rep.RouterOverlapRatio = round4(float64(predicted) / float64(prompt))
	}
	var maxN, sum int
	for _, n := range rep.RequestsPerWorker {
		maxN = max(maxN, n)
		sum += n
	}
	if sum > 0 {
		rep.Imbalance = round3(float64(maxN) / (float64(sum) / float64(o.Workers)))
	}
	for i := range c.Len() {
		rep.Preemptions += c.Worker(i).Stats().Preemptions
	}
	if len(o.Records) > 0 {
		rep.SimDurationS = round3((d.lastAt - o.Records[0].Arrival).Seconds())
	}
	if s := wall.Seconds(); s > 0 {
		rep.SimRequestsPerS = float64(int(float64(len(o.Records)) / s))
	}
	if s := decisions.Seconds(); s > 0 {
		rep.DecisionsPerS = float64(int(float64(len(o.Records)) / s))
	}
	return rep
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
