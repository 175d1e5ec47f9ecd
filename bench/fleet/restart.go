package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
)

// restartResult is scenario B's figures, with or without snapshots.
type restartResult struct {
	snapshots   bool
	bufferSteps int
	// batches is the fewest KV event batches an engine had published
	// when the first router stopped (each engine's replay buffer holds
	// --buffer-steps).
	batches     float64
	warmupReqs  int64
	beforeExact bool   // the first router's belief was exact before it stopped
	before      []diff // and what it was
	// With snapshots: from the new router's readiness until its belief
	// equalled every engine's cache (-1: not within --exact-limit), and
	// until every stream was live.
	exactIn, liveIn time.Duration
	// equalIn: until the listed blocks first equalled the caches, live or
	// not (a bootstrapping index is listed too).
	equalIn time.Duration
	atExact []diff
	// Under load (with snapshots): a third router started while clients
	// sent requests straight to the engines: from its readiness until
	// every stream was live, the load's requests, and its belief once the
	// load stopped and the engines were quiet.
	loadLiveIn time.Duration
	loadReqs   int64
	afterLoad  []diff
	loadExact  bool
	// Without: the belief 5 s after readiness, then after each round.
	rounds []recoveryRound
	// The conversations paused before the restart and continued after
	// it: their first turn after it, and the rest.
	contFirst, contRest *tally
	contReqs            int64
	// counters are the new router's KV-event counters at the end, summed
	// over the engines.
	counters map[string]float64
}

type recoveryRound struct {
	label     string
	requests  int64 // through the new router, so far
	diffs     []diff
	followHit float64 // this round's follow-ups served with their previous prompt cached
	followN   int
}

// believedShare is the share of the engines' cached blocks the router
// believes, over every engine.
func believedShare(ds []diff) float64 {
	var t, m int
	for _, d := range ds {
		t += d.truth
		m += d.missing
	}
	if t == 0 {
		return 1
	}
	return float64(t-m) / float64(t)
}

func extraBlocks(ds []diff) int {
	n := 0
	for _, d := range ds {
		n += d.extra + d.otherMedium
	}
	return n
}

func states(ds []diff) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.state)
	}
	return strings.Join(s, ",")
}

// engineBatches returns the fewest KV event batches any engine has
// published (the mock's mock_kv_event_batches_total).
func (f *fleet) engineBatches() (float64, error) {
	least := -1.0
	for _, e := range f.engines {
		m, err := benchproc.Scrape(f.client, e.url)
		if err != nil {
			return 0, err
		}
		var n float64
		for k, v := range m {
			if strings.HasPrefix(k, "mock_kv_event_batches_total") {
				n += v
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return least, nil
}

func runRestart(ctx context.Context, o options, run int, snapshots bool) (*restartResult, error) {
	name := "restart-nosnap"
	if snapshots {
		name = "restart-snap"
	}
	f, err := newFleet(o, name)
	if err != nil {
		return nil, err
	}
	defer f.close(fmt.Sprintf("run%d-%s", run+1, name))
	if err := f.startEngines(ctx, engineArgs{bufferSteps: o.bufferSteps, noSnapshots: !snapshots}); err != nil {
		return nil, err
	}
	if _, err := f.startRouter(ctx); err != nil {
		return nil, err
	}
	if err := f.waitLive(ctx, time.Minute); err != nil {
		return nil, err
	}
	res := &restartResult{snapshots: snapshots, bufferSteps: o.bufferSteps, exactIn: -1, liveIn: -1, equalIn: -1}
	w := newWorkload(o)
	t := newTally()
	next := 0
	// Whole conversations until every engine has run past its replay
	// buffer, then the first half of --recovery-round more, continued
	// after the restart.
	for n := o.warmupConvs; ; n = 20 {
		drive(ctx, f.client, f.router, w.conversations(o.seed, next, n), o.concurrency, t, nil)
		next += n
		if res.batches, err = f.engineBatches(); err != nil {
			return nil, err
		}
		if res.batches > float64(2*o.bufferSteps) {
			break
		}
		if next > 50*o.warmupConvs {
			return nil, fmt.Errorf("the engines published only %.0f batches after %d conversations", res.batches, next)
		}
	}
	paused := w.conversations(o.seed, next, o.recoveryRound)
	next += len(paused)
	half := func(c *conversation) int { return (c.turns + 1) / 2 } // turns >= 2 leave a follow-up
	drive(ctx, f.client, f.router, paused, o.concurrency, t, half)
	res.warmupReqs = t.requests.Load()
	if n := t.failed.Load(); n > t.requests.Load()/100 {
		return nil, fmt.Errorf("%d of %d requests failed, the first: %w", n, t.requests.Load(), t.firstErr)
	}
	// The first router's belief, once the engines are quiet.
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if res.before, err = f.compare(ctx); err != nil {
			return nil, err
		}
		if res.beforeExact = allExact(res.before); res.beforeExact || time.Since(start) > o.settle {
			break
		}
	}
	if err := f.stopRouter(); err != nil {
		return nil, err
	}

	ready, err := f.startRouter(ctx)
	if err != nil {
		return nil, err
	}
	// continued sends the paused conversations' next turn, the first
	// after the restart, then the rest of them.
	continued := func() error {
		first, rest := newTally(), newTally()
		drive(ctx, f.client, f.router, paused, o.concurrency, first, func(c *conversation) int { return half(c) + 1 })
		drive(ctx, f.client, f.router, paused, o.concurrency, rest, nil)
		for _, x := range []*tally{first, rest} {
			if n := x.failed.Load(); n > x.requests.Load()/100 {
				return fmt.Errorf("%d of %d requests failed, the first: %w", n, x.requests.Load(), x.firstErr)
			}
		}
		res.contFirst, res.contRest = first, rest
		res.contReqs = first.requests.Load() + rest.requests.Load()
		return nil
	}
	if snapshots {
		for {
			ds, err := f.compare(ctx)
			if err != nil {
				return nil, err
			}
			since := time.Since(ready)
			live := !slices.ContainsFunc(ds, func(d diff) bool { return d.state != "live" })
			if res.liveIn < 0 && live {
				res.liveIn = since
			}
			if res.equalIn < 0 && allExact(ds) {
				res.equalIn = since
			}
			res.atExact = ds
			// Exact: the blocks equal, and routed by (the streams live).
			if live && allExact(ds) {
				res.exactIn = since
				break
			}
			if since > o.exactLimit {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := continued(); err != nil {
			return nil, err
		}
		if err := f.routerCounters(res); err != nil {
			return nil, err
		}
		return res, f.restartUnderLoad(ctx, w, &next, res)
	}

	// Without snapshots: idle engines tell the router nothing.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Until(ready.Add(5 * time.Second))):
	}
	ds, err := f.compare(ctx)
	if err != nil {
		return nil, err
	}
	res.rounds = append(res.rounds, recoveryRound{label: "5 s idle", diffs: ds})
	var sent int64
	for i := range o.recoveryRounds + 1 {
		rt := newTally()
		label := fmt.Sprintf("round %d", i)
		if i == 0 {
			// The paused conversations first: their blocks are on the
			// engines, known to the router only through the events.
			if err := continued(); err != nil {
				return nil, err
			}
			rt, label = res.contRest, "continued"
			sent += res.contReqs
		} else {
			drive(ctx, f.client, f.router, w.conversations(o.seed, next, o.recoveryRound), o.concurrency, rt, nil)
			next += o.recoveryRound
			sent += rt.requests.Load()
			if n := rt.failed.Load(); n > rt.requests.Load()/100 {
				return nil, fmt.Errorf("%d of %d requests failed, the first: %w", n, rt.requests.Load(), rt.firstErr)
			}
		}
		// Quiet: the round's last events applied.
		var ds []diff
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			if ds, err = f.compare(ctx); err != nil {
				return nil, err
			}
			if allExact(ds) || time.Since(start) > time.Second {
				break
			}
		}
		fs, _, fn := share(rt.followHits, rt.followUps)
		res.rounds = append(res.rounds, recoveryRound{label: label, requests: sent, diffs: ds, followHit: fs, followN: fn})
		if allExact(ds) {
			break
		}
	}
	return res, f.routerCounters(res)
}

// restartUnderLoad restarts the router again while --concurrency
// conversations are sent straight to the engines (one engine each, as
// other clients of the engines would), so that it bootstraps from
// snapshots while the engines publish: it records when every stream was
// live, then stops the load 2 s later and compares once the engines are
// quiet.
func (f *fleet) restartUnderLoad(ctx context.Context, w *workload, next *int, res *restartResult) error {
	if err := f.stopRouter(); err != nil {
		return err
	}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	load := newTally()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; lctx.Err() == nil; i++ {
			convs := w.conversations(f.o.seed, *next, f.o.concurrency)
			*next += len(convs)
			e := f.engines[i%len(f.engines)]
			drive(lctx, f.client, e.url, convs, f.o.concurrency, load, nil)
		}
	}()
	// The load runs a moment before the router starts.
	time.Sleep(time.Second)
	ready, err := f.startRouter(ctx)
	if err != nil {
		return err
	}
	res.loadLiveIn = -1
	for time.Since(ready) < f.o.exactLimit {
		st, err := f.kvStates()
		if err != nil {
			return err
		}
		live := 0
		for _, e := range f.engines {
			if st[e.name] == "live" {
				live++
			}
		}
		if live == len(f.engines) {
			res.loadLiveIn = time.Since(ready)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	stop()
	<-done
	res.loadReqs = load.requests.Load()
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if res.afterLoad, err = f.compare(ctx); err != nil {
			return err
		}
		if res.loadExact = allExact(res.afterLoad); res.loadExact || time.Since(start) > f.o.settle {
			return nil
		}
	}
}

// routerCounters reads the new router's snapshot, replay and skipped-block
// counters into res.
func (f *fleet) routerCounters(res *restartResult) error {
	m, err := scrape(f)
	if err != nil {
		return err
	}
	res.counters = map[string]float64{}
	for k, v := range m {
		for _, p := range []string{"switchyard_worker_kv_snapshots_total", "switchyard_worker_kv_snapshot_failures_total",
			"switchyard_worker_kv_replays_total", "switchyard_worker_kv_replay_failures_total", "switchyard_worker_kv_blocks_skipped_total"} {
			if strings.HasPrefix(k, p+"{") && v > 0 {
				key := p
				if i := strings.Index(k, `reason="`); i >= 0 {
					key += "{" + k[i:strings.IndexByte(k[i+8:], '"')+i+9] + "}"
				}
				res.counters[strings.TrimPrefix(key, "switchyard_worker_kv_")] += v
			}
		}
	}
	return nil
}

func (r *restartResult) print(out io.Writer, run int) {
	mode := "without snapshots (the engines answer unavailable)"
	if r.snapshots {
		mode = "with snapshots"
	}
	fmt.Fprintf(out, "\nrun %d, B (router restart) %s: the first router served %d requests; each engine published >= %.0f KV event batches (replay buffer %d); its belief before the stop: %s\n",
		run, mode, r.warmupReqs, r.batches, r.bufferSteps, exactWord(r.beforeExact))
	if !r.beforeExact {
		printDiffs(out, r.before)
	}
	var cs []string
	for k, v := range r.counters {
		cs = append(cs, fmt.Sprintf("%s %.0f", k, v))
	}
	slices.Sort(cs)
	fmt.Fprintf(out, "  the new router's counters, all engines: %s\n", strings.Join(cs, ", "))
	cont := func() {
		fs, fh, fn := share(r.contFirst.followHits, r.contFirst.followUps)
		rs, rh, rn := share(r.contRest.followHits, r.contRest.followUps)
		fmt.Fprintf(out, "  conversations continued across the restart: first follow-up after it with the previous prompt cached %d/%d (%.1f%%), later ones %d/%d (%.1f%%)\n",
			fh, fn, 100*fs, rh, rn, 100*rs)
		if r.snapshots {
			for _, m := range append(r.contFirst.misses, r.contRest.misses...) {
				fmt.Fprintf(out, "    missed %s\n", m)
			}
		}
	}
	if r.snapshots {
		printDiffs(out, r.atExact)
		cont()
		if r.exactIn < 0 {
			fmt.Fprintf(out, "  target: belief exact within 5 s of /readyz: MISSED (not exact within --exact-limit)\n")
			return
		}
		fmt.Fprintf(out, "  after /readyz: blocks listed equal to the caches %.2f s, streams live %.2f s, both (exact) %.2f s\n",
			r.equalIn.Seconds(), r.liveIn.Seconds(), r.exactIn.Seconds())
		fmt.Fprintf(out, "  target: belief exact within 5 s of /readyz: %s (%.2f s)\n", verdict(r.exactIn <= restartTarget), r.exactIn.Seconds())
		live := "not within --exact-limit"
		if r.loadLiveIn >= 0 {
			live = fmt.Sprintf("%.2f s after /readyz", r.loadLiveIn.Seconds())
		}
		fmt.Fprintf(out, "  restarted again under load (%d requests straight to the engines): streams live %s; belief once the load stopped: %s\n",
			r.loadReqs, live, exactWord(r.loadExact))
		printDiffs(out, r.afterLoad)
		return
	}
	cont()
	fmt.Fprintf(out, "  %-10s %9s %16s %12s %-20s %s\n", "after", "requests", "blocks believed", "extra", "streams", "follow-ups prev cached (the round)")
	for _, rd := range r.rounds {
		fh := "-"
		if rd.followN > 0 {
			fh = fmt.Sprintf("%.1f%% of %d", 100*rd.followHit, rd.followN)
		}
		fmt.Fprintf(out, "  %-10s %9d %15.1f%% %12d %-20s %s\n", rd.label, rd.requests, 100*believedShare(rd.diffs), extraBlocks(rd.diffs), states(rd.diffs), fh)
	}
	last := r.rounds[len(r.rounds)-1]
	printDiffs(out, last.diffs)
}

func exactWord(ok bool) string {
	if ok {
		return "exact"
	}
	return "NOT exact"
}

func scrape(f *fleet) (map[string]float64, error) { return benchproc.Scrape(f.client, f.router) }

// summary prints each figure's median and range over the runs and
// reports whether a target was missed in any.
func summary(out io.Writer, o options, rs []runResult) (missed bool) {
	fmt.Fprintf(out, "\nsummary over %d run(s): median [min, max]\n", len(rs))
	var follow, repeat, settle, exactS, liveS, loadLiveS []float64
	var beliefMissed, exactMissed, loadMissed, bRuns int
	var missing, extra []float64
	for _, r := range rs {
		if a := r.a; a != nil {
			follow = append(follow, 100*a.followShare())
			repeat = append(repeat, 100*a.repeatShare())
			if a.compareErr == nil {
				var m, x int
				for _, d := range a.diffs {
					m += d.missing
					x += d.extra + d.otherMedium + d.copiesWrong + d.notHeld + d.flagged
				}
				missing, extra = append(missing, float64(m)), append(extra, float64(x))
			}
			if !a.beliefExact() {
				beliefMissed++
			} else {
				settle = append(settle, a.exactIn.Seconds())
			}
			missed = missed || a.followShare() < followUpTarget || a.repeatShare() < repeatTarget || !a.beliefExact()
		}
		if b := r.bs; b != nil {
			bRuns++
			if !b.loadExact {
				loadMissed++
				missed = true
			}
			if b.loadLiveIn >= 0 {
				loadLiveS = append(loadLiveS, b.loadLiveIn.Seconds())
			}
			if b.exactIn < 0 || b.exactIn > restartTarget {
				exactMissed++
				missed = true
			}
			if b.exactIn >= 0 {
				exactS = append(exactS, b.exactIn.Seconds())
				liveS = append(liveS, b.liveIn.Seconds())
			}
		}
	}
	if len(follow) > 0 {
		fmt.Fprintf(out, "  A: follow-ups with the previous prompt cached %s %%   (target >= 95)\n", mmr(follow))
		fmt.Fprintf(out, "  A: LoRA and salted repeats at the holder       %s %%   (target >= 95)\n", mmr(repeat))
		fmt.Fprintf(out, "  A: blocks missing %s, extra %s after the traffic; belief exact in %d of %d runs (settled in %s s)\n",
			mmr(missing), mmr(extra), len(rs)-beliefMissed, len(rs), mmr(settle))
	}
	if len(exactS) > 0 || exactMissed > 0 {
		fmt.Fprintf(out, "  B with snapshots: belief exact %s s after /readyz, streams live %s s; target <= 5 s missed in %d of %d runs\n",
			mmr(exactS), mmr(liveS), exactMissed, bRuns)
		fmt.Fprintf(out, "  B with snapshots, restarted under load: streams live %s s after /readyz; belief exact once the load stopped in %d of %d runs\n",
			mmr(loadLiveS), bRuns-loadMissed, bRuns)
	}
	var rounds [][]float64
	var labels []string
	for _, r := range rs {
		if r.bn == nil {
			continue
		}
		for i, rd := range r.bn.rounds {
			if i == len(rounds) {
				rounds = append(rounds, nil)
				labels = append(labels, fmt.Sprintf("%s (%d requests)", rd.label, rd.requests))
			}
			rounds[i] = append(rounds[i], 100*believedShare(rd.diffs))
		}
	}
	for i := range rounds {
		fmt.Fprintf(out, "  B without snapshots: blocks believed after %-24s %s %%\n", labels[i], mmr(rounds[i]))
	}
	if missed {
		fmt.Fprintln(out, "a target was MISSED")
	} else {
		fmt.Fprintln(out, "every target met")
	}
	return missed
}

// mmr formats the median and range of v.
func mmr(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%.2f [%.2f, %.2f]", med, s[0], s[len(s)-1])
}
