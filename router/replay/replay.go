// Package replay drives a recorded trace through a Router on simulated
// workers, in simulated time, and reports per-request outcomes and a
// summary. Workers are either aggregated (each serves prefill and decode)
// or disaggregated into a prefill pool and a decode pool, with the prompt's
// KV transferred between them. Every hop of a request goes through the
// router's admission layer (router/admission), as under router serve. The
// loop is single-threaded and reads no clock but for the wall time it
// reports, so the same trace, policy and seed give byte-identical
// per-request output.
//
// Sweep runs an experiment of many replays: policy files x fleet sizes x
// prefix modes x sync delays, each cell once per seed, loading each
// policy file itself; the table, baselines and goodput verdicts of its
// cells are package report's.
//
// The package is laid out by job: options.go (Options and their checks),
// driver.go (the discrete-event loop), hops.go (admitting, placing,
// submitting and ending each hop), outcome.go (the per-request lines),
// tally.go (counting the outcomes into a report.Report), fallback.go
// (fallbacks by cause), reference.go and timeline.go (the KV reference
// and the timeline, as the run goes), and sweep.go (Sweep). What the
// summary holds and how the table shows it is package report; trace
// opening is package trace's (trace.Open).
package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// Run replays o.Records (or o.Trace) and returns the report. ctx cancels
// between requests. Errors: an invalid option, a trace/block-size
// mismatch, the first error o.Trace yields, or a write error on
// PerRequest.
//
// Memory: Run holds a request (its record, its state, its per-request
// line) from its arrival until it and every request before it are over,
// then writes its line and keeps only the figures the report needs (see
// tally and kvRef).
//
// Run is a discrete-event loop over five sources (six with replicas, below): arrivals, first hops
// decided and on their way to their worker (the decision latency),
// decode hops decided and on their way (decision latency and KV
// transfer), the step ends of the first-hop (aggregated or prefill)
// cluster, and those of the decode cluster. Everything is handled in
// simulated-time order; at one instant, in this order: steps that end
// then (decode workers' events first, then the others', each cluster in
// sim.Cluster order), then decode submissions (by trace index), then
// first-hop submissions (by trace index), then queued requests are
// dispatched, then arrivals (trace order). A step that starts at that
// instant is formed after all of them, so requests submitted then join
// it, and nothing is ever submitted to a worker at a time before one it
// has reached.
//
// Every hop goes through the router's admission API (router/admission):
// Admit when it is routed (a request's arrival, or its prefill's end),
// FirstToken and End on its worker's events, and Dispatch whenever
// capacity may have freed. Without a capacity (Options.Queue's
// MaxActiveRequests 0, the default) nothing waits, and only arrivals feed
// the first-hop cluster, so its steps up to the next arrival (or first-hop
// submission) are run in one AdvanceTo and their events then handled one
// by one, the decode side brought up to each event's time first. The
// result is the same as taking the single earliest source at every step
// (routing reads only the bookings of the role it routes for), and the
// aggregated loop is exactly the single-cluster one.
//
// When requests may wait (a capacity, or a hop that waits because its
// policy itself found every worker busy), a queued hop may be dispatched
// at any step end, so the loop steps event by event: the next instant is
// the earliest of all the sources (sim.Cluster.NextEvent for the
// clusters). At each instant the sources are handled in the order above,
// each arrival after another Dispatch so that waiting requests go first;
// a decode worker's completion dispatches the waiting decode hops at once.
// No request is submitted in a worker's past.
//
// With replicas (Options.Replicas > 1) request i is admitted by replica
// i mod Replicas, and a sixth source carries what each replica learns
// from the others: each placed hop's booking, its first token and its
// release, due SyncDelay after they happened (replicas.go). Like the KV
// events of precise mode, whatever is due at or before an instant is
// applied before the first routing decision (Admit or Dispatch, of any
// replica) at that instant or later: the KV events first, then the sync
// events in (due time, publication) order. So with SyncDelay 0 a replica
// sees a decision made earlier at the same instant. While hops wait in a
// queue, the sync events' due times are instants of the loop too, since
// a release may free the capacity they wait for; at such an instant the
// queues are dispatched replica by replica. After the last request the
// pending sync events are applied, so every replica ends with nothing
// booked.
func Run(ctx context.Context, o Options) (*report.Report, error) {
	rep, _, err := executeFrom(ctx, o, time.Now()) // wall_s includes building the router and the clusters
	return rep, err
}

// execute is Run, also returning the driver so that tests can inspect the
// final state (bookings, workers).
func execute(ctx context.Context, o Options) (*report.Report, *driver, error) {
	return executeFrom(ctx, o, time.Now())
}

// executeFrom is execute with wall_s counted from start: a time taken
// before the driver is built, so that the setup counts.
func executeFrom(ctx context.Context, o Options, start time.Time) (*report.Report, *driver, error) {
	d, err := newDriver(ctx, &o)
	if err != nil {
		return nil, nil, err
	}
	stop, err := d.start(&o)
	defer stop()
	if err != nil {
		return nil, nil, err
	}
	if err := d.loop(); err != nil {
		return nil, nil, err
	}
	d.notify() // the final count, every request retired
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if d.out != nil {
		if err := d.out.Flush(); err != nil {
			return nil, nil, fmt.Errorf("replay: writing per-request output: %w", err)
		}
	}
	wall := time.Since(start)
	return d.report(&o, wall), d, nil
}
