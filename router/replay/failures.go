package replay

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/heap"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/migrate"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
)

// Engine failures and request migration (Options.Failures): at a failure
// in simulated time the worker leaves the fleet of every replica (no new
// placements; the prefix index forgets it, as for a worker that leaves),
// its simulated engine loses every request it holds and its KV cache
// (sim.Worker.Fail), and each request it held is cut. A cut request that
// migrate.Policy.Decide lets migrate is placed again through its
// admission handle (admission.Handle.Retry: it keeps its id and its
// classification, the failed worker excluded) as the continuation router
// serve sends: prompt = the original prompt plus the k tokens generated
// so far (the router's shared.Request.PromptTokens grows by k; its block
// hashes stay the prompt's: the generated tokens are cached nowhere), and
// the output the original minus k. Its new engine prefills the prompt and
// the k tokens again (the extra prefill; sim.Request.Generated) before it
// samples token k+1. A request the policy does not let migrate, or that
// no worker can take, fails: "rejected: engine failed, not migrated:
// OUTCOME" (Outcome.Status, Report.RejectionReasons). The failed worker
// rejoins the fleet, empty, RestartAfter later.
//
// At one instant, failures and restarts come after the steps that end
// then (their tokens reached the client) and before that instant's
// submissions, dispatches and arrivals. A request excludes every worker
// that failed under it until that worker rejoins (admission.Handle.Retry:
// a rejoined worker is a new join, a candidate again), as serve does.

// DefaultRestartAfter is how long a failed engine stays out of the fleet
// before it rejoins, empty (Failures.RestartAfter): 60 s, about what a
// vLLM pod restart of a small model takes with its torch.compile cache
// kept (vllm-project/vllm#20264: engine init 34 s, the first answer 59 s
// after the start; weights from a cold disk, a larger model or no compile
// cache take minutes, vllm-project/vllm#19824). An assumption of this
// model, not a measurement of ours.
const DefaultRestartAfter = 60 * time.Second

// Bounds of Failures, so that a command line cannot ask for unbounded
// work: MaxScheduledFailures entries of Failures.At, MaxFailRate failures
// per worker-hour (one a second), MaxRestartAfter.
const (
	MaxScheduledFailures = 10000
	MaxFailRate          = 3600
	MaxRestartAfter      = 24 * time.Hour
)

// FailedReason is the rejection reason of a request an engine failure cut
// and that did not migrate, before ": " and its migrate.Outcome.
const FailedReason = "engine failed, not migrated"

// Failures are the engine failures of a replay and how cut requests
// migrate. Aggregated replays with one router replica in approximate
// prefix mode only (Options.check says so otherwise).
type Failures struct {
	// At are failures at given instants.
	At []Failure
	// Rate is random failures per worker per hour of simulated time
	// (>= 0, at most MaxFailRate): each worker, while up, fails after an
	// exponential time of mean 1/Rate hours, drawn from its own stream of
	// Seed (math/rand/v2 PCG seeded with Seed and the worker's index), so a
	// run repeats exactly.
	Rate float64
	// Seed seeds the random failures (Sweep sets the policy's seed).
	Seed int64
	// RestartAfter is how long a failed worker stays out before it rejoins
	// empty; 0 is DefaultRestartAfter.
	RestartAfter time.Duration
	// Migration is when a cut request migrates; start from
	// migrate.DefaultPolicy (its zero value is invalid).
	Migration migrate.Policy
}

// Failure is one engine failure: worker Worker (its index, the N of
// "sim-N") fails At after the trace's start (its first request's
// arrival, trace.Record.Arrival 0).
type Failure struct {
	Worker int
	At     time.Duration
}

// ParseFailures parses one --fail value: WORKER@TIME entries separated by
// commas, WORKER a worker's name as replay names them ("sim-3") or its
// index ("3"), TIME a Go duration >= 0 ("90s", "1m30s"). Errors name the
// entry and what is wanted.
func ParseFailures(s string) ([]Failure, error) {
	var out []Failure
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		w, at, ok := strings.Cut(e, "@")
		if !ok {
			return nil, fmt.Errorf("--fail %q: want WORKER@TIME, such as sim-3@90s", e)
		}
		x, err := strconv.Atoi(strings.TrimPrefix(w, "sim-"))
		if err != nil || x < 0 || x >= MaxWorkers {
			return nil, fmt.Errorf("--fail %q: worker %q: want sim-N or N, N from 0 to %d", e, w, MaxWorkers-1)
		}
		t, err := time.ParseDuration(at)
		if err != nil || t < 0 {
			return nil, fmt.Errorf("--fail %q: time %q: want a duration >= 0 such as 90s", e, at)
		}
		out = append(out, Failure{Worker: x, At: t})
	}
	return out, nil
}

// check validates f for o.
func (f *Failures) check(o *Options) error {
	switch {
	case o.disaggregated():
		return errors.New("replay: engine failures are modelled for aggregated workers only, not with prefill and decode workers")
	case o.replicas() > 1:
		return errors.New("replay: engine failures are modelled with one router replica only")
	case o.Prefix != PrefixApproximate:
		return errors.New("replay: engine failures are modelled in approximate prefix mode only")
	case len(f.At) > MaxScheduledFailures:
		return fmt.Errorf("replay: %d failures, want at most %d", len(f.At), MaxScheduledFailures)
	case f.Rate < 0 || f.Rate > MaxFailRate || math.IsNaN(f.Rate):
		return fmt.Errorf("replay: failure rate %v per worker-hour, want 0 to %d", f.Rate, MaxFailRate)
	case f.RestartAfter < 0 || f.RestartAfter > MaxRestartAfter:
		return fmt.Errorf("replay: restart after %v, want 0 (default %v) to %v", f.RestartAfter, DefaultRestartAfter, MaxRestartAfter)
	}
	seen := make(map[Failure]bool, len(f.At))
	for _, x := range f.At {
		if seen[x] {
			return fmt.Errorf("replay: failure of worker sim-%d at %v is listed twice", x.Worker, x.At)
		}
		seen[x] = true
		if x.Worker < 0 || x.Worker >= o.Workers {
			return fmt.Errorf("replay: failure of worker sim-%d at %v: the fleet has sim-0 to sim-%d", x.Worker, x.At, o.Workers-1)
		}
		if x.At < 0 {
			return fmt.Errorf("replay: failure of worker sim-%d at %v, want >= 0", x.Worker, x.At)
		}
	}
	if err := f.Migration.Validate(); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// faults is a replay's failure state (driver.faults; nil without
// Options.Failures).
type faults struct {
	o       *Failures
	restart time.Duration
	queue   heap.Heap[fault] // by faultLess
	down    []bool           // by worker index
	rngs    []*rand.Rand     // by worker index; nil without a rate
	cuts    []sim.Cut        // Fail's buffer
	// reached counts the --fail failures whose time the run reached;
	// whileDown those of them that found their worker already down (failed
	// and not yet rejoined), which did nothing.
	reached, whileDown int

	failures, restarts, cut int
	outcomes                map[migrate.Outcome]int
	extraPrefill            int64 // prompt + generated tokens of continuations placed
	extraCached             int64 // of those, served from cache at their first token
	gaps                    []float64
	migrated, completed     int       // requests migrated at least once; of those completed
	ttft, e2e               []float64 // completed migrated requests
}

// fault is a failure or a restart of worker at `at`.
type fault struct {
	at      time.Duration
	worker  int
	restart bool
	// scheduled: a --fail failure (not a random one, not a restart).
	scheduled bool
}

// faultLess orders faults by time, restarts first, then worker: a total
// order up to identical entries.
func faultLess(a, b fault) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.restart != b.restart {
		return a.restart
	}
	return a.worker < b.worker
}

// newFaults schedules f's failures on a fleet of n workers.
func newFaults(f *Failures, n int) *faults {
	fs := &faults{o: f, restart: f.RestartAfter, queue: heap.New(faultLess), down: make([]bool, n),
		outcomes: make(map[migrate.Outcome]int, len(migrate.Outcomes))}
	if fs.restart == 0 {
		fs.restart = DefaultRestartAfter
	}
	for _, x := range f.At {
		fs.queue.Push(fault{at: x.At, worker: x.Worker, scheduled: true})
	}
	if f.Rate > 0 {
		fs.rngs = make([]*rand.Rand, n)
		for x := range fs.rngs {
			fs.rngs[x] = rand.New(rand.NewPCG(uint64(f.Seed), uint64(x)))
			fs.scheduleRandom(x, 0)
		}
	}
	return fs
}

// scheduleRandom schedules worker x's next random failure after from.
func (fs *faults) scheduleRandom(x int, from time.Duration) {
	ns := fs.rngs[x].ExpFloat64() / fs.o.Rate * float64(time.Hour)
	fs.queue.Push(fault{at: from + time.Duration(min(ns, 1<<61)), worker: x}) // a rate near 0: never, without overflow
}

// nextFault is the instant of the next failure or restart, when it can
// still matter: while a request is to arrive, on its way, queued or held
// by a worker (random failures go on forever; past the last request they
// change nothing).
func (d *driver) nextFault() (time.Duration, bool) {
	fs := d.faults
	if fs == nil || fs.queue.Len() == 0 {
		return 0, false
	}
	if d.arriving == nil && d.starts.Len() == 0 && d.waiting == 0 && !d.first.Busy() {
		return 0, false
	}
	return fs.queue.At(0).at, true
}

// applyFaults fails and restarts the workers whose faults are due at t,
// after the steps that end at t were handled.
func (d *driver) applyFaults(t time.Duration) error {
	fs := d.faults
	if fs == nil {
		return nil
	}
	for fs.queue.Len() > 0 && fs.queue.At(0).at <= t {
		if d.arriving == nil && d.starts.Len() == 0 && d.waiting == 0 && !d.first.Busy() {
			// The run is over by t (nextFault read the workers busy
			// before they ran up to t): what is left changes nothing.
			fs.queue = heap.New(faultLess)
			return nil
		}
		f := fs.queue.Pop()
		if f.scheduled {
			fs.reached++
		}
		var err error
		switch {
		case f.restart:
			err = d.rejoin(f.worker, t)
		case !fs.down[f.worker]:
			err = d.failWorker(f.worker, t)
		case f.scheduled: // a failure of a worker already down changes nothing: said in the report
			fs.whileDown++
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// failWorker fails worker x at `at`: it leaves every replica's fleet, its
// engine drops what it holds, each request it held is cut, and its
// restart is scheduled.
func (d *driver) failWorker(x int, at time.Duration) error {
	fs := d.faults
	fs.failures++
	fs.down[x] = true
	d.now = at
	for _, rep := range d.reps {
		if err := rep.r.RemoveWorker(d.ids[x], 0); err != nil {
			return fmt.Errorf("replay: failing %s: %w", d.names[x], err)
		}
	}
	cuts, err := d.first.Fail(at, x, fs.cuts[:0])
	if err != nil {
		return fmt.Errorf("replay: failing %s: %w", d.names[x], err)
	}
	fs.cuts = cuts
	d.observe(d.first, x, x, at)
	for _, c := range cuts {
		d.cut(c.ID, c.Generated, x, at)
	}
	clear(fs.cuts)
	fs.queue.Push(fault{at: at + fs.restart, worker: x, restart: true})
	return nil
}

// rejoin brings failed worker x back at `at`, empty, into every replica's
// fleet, and schedules its next random failure.
func (d *driver) rejoin(x int, at time.Duration) error {
	fs := d.faults
	fs.restarts++
	fs.down[x] = false
	for _, rep := range d.reps {
		ws, err := rep.r.AddWorkers(rep.specs[x])
		if err != nil {
			return fmt.Errorf("replay: restarting %s: %w", d.names[x], err)
		}
		rep.workers[x] = ws[0]
	}
	d.publish(d.first, x, x)
	if fs.rngs != nil {
		fs.scheduleRandom(x, at)
	}
	return nil
}

// cut handles request i, cut at `at` by the failure of worker x after
// generated tokens (its whole answer so far): it migrates when the policy
// lets it and a worker takes it, else it fails.
func (d *driver) cut(i, generated, x int, at time.Duration) {
	fs := d.faults
	st := d.req(i)
	fs.cut++
	if !st.cutPending {
		st.cutPending, st.cutAt = true, at
	}
	st.generated = generated
	d.now = at
	if ok, outcome := fs.o.Migration.Decide(st.migrations, generated); !ok {
		d.notMigrated(i, outcome)
		return
	}
	hp := &st.hops[firstHop]
	h := hp.h
	req := h.Request()
	req.PromptTokens = max(st.rec.InputLength, 1) + generated
	d.mirrorReleased(i, firstHop, at)
	// The continuation's id is serve's: the request's own, "#m" and the
	// migration's number (router/serve, Server.replace).
	id := strconv.Itoa(i) + "#m" + strconv.Itoa(st.migrations+1)
	if err := h.Retry(d.ctx, id, "engine failed: "+d.names[x], d.ids[x]); err != nil {
		hp.h = nil // ended by the failed placement
		d.notMigrated(i, migrate.NoWorker)
		return
	}
	if st.migrations == 0 {
		fs.migrated++
	}
	st.migrations++
	fs.outcomes[migrate.Migrated]++
	fs.extraPrefill += int64(req.PromptTokens)
	st.out.Migrations = st.migrations
	st.out.ExtraPrefillTokens += req.PromptTokens
	if h.Queued() {
		hp.queued = true
		d.waiting++
		d.tl.queue(at, d.waiting)
		return
	}
	dec := h.Decision()
	d.placed(i, firstHop, &dec, at)
}

// notMigrated fails request i, cut, with outcome.
func (d *driver) notMigrated(i int, outcome migrate.Outcome) {
	d.faults.outcomes[outcome]++
	d.end(i, firstHop, admission.Aborted("engine failed"))
	d.reject(i, firstHop, FailedReason+": "+string(outcome))
}

// isDown reports whether worker x (of the first hop) is failed.
func (fs *faults) isDown(x int) bool { return fs != nil && fs.down[x] }

// continued records the first token of request i's continuation at `at`,
// with cached prompt tokens: the end of the client's gap.
func (d *driver) continued(st *request, at time.Duration, cached int) {
	fs := d.faults
	fs.extraCached += int64(cached)
	fs.gaps = append(fs.gaps, report.Millis(at-st.cutAt))
	st.cutPending = false
}

// countMigrated adds a retired request that migrated to the tally.
func (fs *faults) countMigrated(out *Outcome) {
	if out.Status != "ok" {
		return
	}
	fs.completed++
	fs.ttft = append(fs.ttft, out.TTFTMs)
	fs.e2e = append(fs.e2e, out.E2EMs)
}

// report is the run's report.MigrationReport.
func (fs *faults) report() *report.MigrationReport {
	r := &report.MigrationReport{
		Limit: fs.o.Migration.Limit, RestartAfterMs: report.Millis(fs.restart), RatePerWorkerHour: fs.o.Rate,
		Failures: fs.failures, Restarts: fs.restarts, Cut: fs.cut, NotReached: len(fs.o.At) - fs.reached, WhileDown: fs.whileDown,
		Causes:   map[string]int{string(migrate.CauseFailure): fs.cut},
		Outcomes: make(map[string]int, len(migrate.Outcomes)),
		Requests: fs.migrated, Completed: fs.completed,
		TTFT: summarize(fs.ttft), E2E: summarize(fs.e2e), Gap: summarize(fs.gaps),
		ExtraPrefillTokens: fs.extraPrefill, ExtraPrefillCachedTokens: fs.extraCached,
	}
	for _, o := range migrate.Outcomes {
		r.Outcomes[string(o)] = fs.outcomes[o]
	}
	return r
}
