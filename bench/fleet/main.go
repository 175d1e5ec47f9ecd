// Command fleet measures `router serve` in front of a fleet configured as
// a new user would write it (issue #26, "Measured, not assumed"): three
// vLLM-like `router mock-worker` engines given by URL only, a workers file
// of `worker "eN" { url = "http://127.0.0.1:PORT" }` and an empty policy
// file (no tokenizer block, no kv_events block, no router.block_size, no
// total_kv_blocks): the router learns the block size (16), the tokenizer
// (the engines' /tokenize), the LoRA adapters (/v1/models), the capacity
// and the KV-event sources (/kv_event_sources: live stream, replay,
// snapshots) from the engines. Every process is real, on 127.0.0.1,
// stopped before the command exits and killed by the kernel if it dies
// (Linux).
//
// Scenario A, the fleet: the engines' KV caches are small enough that they
// evict all along. Traffic is multi-turn chat conversations, each
// follow-up's messages the previous ones plus the previous answer and a
// new question, --lora-share of them on LoRA adapters and --salt-share
// with a cache_salt (a tenant's), and, in those, turns sent again right
// after their answer (repeats). It measures:
//
//   - follow-ups served with their previous prompt cached: the answer's
//     usage.prompt_tokens_details.cached_tokens at least the previous
//     turn's prompt_tokens in whole 16-token blocks (the engine does not
//     cache generated tokens, so the previous answer is not counted).
//     Target >= 95%.
//   - LoRA and salted repeats reaching the engine that holds their prefix:
//     cached_tokens all of the prompt's whole blocks (all but the last when
//     the prompt is block-aligned: the engine computes its last token).
//     Target >= 95%, like the follow-ups.
//   - once the traffic has stopped, for each engine, the router's believed
//     blocks (GET /debug/workers/NAME/blocks on --debug-listen) against the
//     blocks the engine's cache holds (the mock's GET /debug/kv_blocks: its
//     simulated cache itself, not its KV events): 0 missing, 0 extra.
//
// Scenario B, a router restart: engines whose replay buffer
// (--buffer-steps batches, vLLM's buffer_steps) no longer reaches their
// start. A first router serves --warmup-conversations (more until every
// engine has published more than twice --buffer-steps batches) and the
// first half of --recovery-round more, and is stopped (SIGTERM); a second
// router starts in front of the idle engines. With snapshots, it measures
// the time from the new router's /readyz until its belief equals every
// engine's cache with every stream live (target <= 5 s), continues the
// paused conversations (their first follow-up after the restart tells
// whether the router knew where their prefixes are), then restarts the
// router once more while clients send requests straight to the engines
// and checks the belief once they stop. Without (the engines answer every
// snapshot request unavailable), it records what the router believes 5 s
// after /readyz, after the paused conversations, and after each of
// --recovery-rounds rounds of --recovery-round new conversations: the
// share of the engines' blocks believed, blocks believed that the engine
// does not hold, the streams' states (the router scores a cold engine
// approximately), and the round's follow-up hits; a documented figure,
// no target.
//
// The engines' own block sets come from the mock's GET /debug/kv_blocks
// (its simulated cache itself, not its KV events). --mock-bin runs the
// engines from another binary than the router, to measure an older router
// in front of today's engines (its belief is then a miss if it has no
// /debug/workers/NAME/blocks).
//
//	go run ./bench/fleet --router-bin bin/router --runs 3   # make bench-fleet
//	go run ./bench/fleet --router-bin bin/router --smoke    # under a minute
//
// --runs N repeats both scenarios on fresh processes and prints the
// median and range of each figure. It exits 1 when a target is missed in
// any run (the table says which), 2 on a usage error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

type options struct {
	routerBin    string
	mockBin      string
	tokenizer    string
	tokenizerCfg string
	engines      int
	kvBlocks     int
	speedup      string
	adapters     []string
	scenario     string
	runs         int
	seed         uint64
	logLevel     string
	keepLogs     string

	conversations int
	concurrency   int
	minTurns      int
	maxTurns      int
	loraShare     float64
	saltShare     float64
	repeatShare   float64
	settle        time.Duration

	bufferSteps    int
	warmupConvs    int
	recoveryRound  int
	recoveryRounds int
	exactLimit     time.Duration
}

// Targets (issue #26).
const (
	followUpTarget = 0.95
	repeatTarget   = 0.95
	restartTarget  = 5 * time.Second
)

func main() {
	var o options
	var adapters string
	var smoke bool
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (make build)")
	flag.StringVar(&o.mockBin, "mock-bin", "", "the binary whose `router mock-worker` plays the engines (default: --router-bin); to measure an older router in front of today's engines")
	flag.StringVar(&o.tokenizer, "tokenizer", "router/tokenizer/testdata/bytebpe.json", "the engines' tokenizer.json")
	flag.StringVar(&o.tokenizerCfg, "tokenizer-config", "router/tokenizer/testdata/chatml_config.json", "its tokenizer_config.json (chat template)")
	flag.IntVar(&o.engines, "engines", 3, "mock engines")
	flag.IntVar(&o.kvBlocks, "kv-blocks", 2000, "each engine's KV cache in 16-token blocks: the conversations need several times that, so the engines evict, but the requests in flight fit")
	flag.StringVar(&o.speedup, "speedup", "50", "the engines' simulated seconds per wall second")
	flag.StringVar(&adapters, "lora", "ad1,ad2,ad3", "the engines' LoRA adapters")
	flag.StringVar(&o.scenario, "scenario", "all", "fleet (A), restart (B), or all")
	flag.IntVar(&o.runs, "runs", 1, "runs of each scenario, each on fresh processes")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the conversations (run i uses seed+i)")
	flag.StringVar(&o.logLevel, "log-level", "info", "the router's --log-level")
	flag.StringVar(&o.keepLogs, "keep-logs", "", "copy every process's log to this directory")
	flag.IntVar(&o.conversations, "conversations", 240, "conversations of scenario A")
	flag.IntVar(&o.concurrency, "concurrency", 8, "conversations in flight at once")
	flag.IntVar(&o.minTurns, "min-turns", 3, "turns of a conversation, at least")
	flag.IntVar(&o.maxTurns, "max-turns", 6, "turns of a conversation, at most")
	flag.Float64Var(&o.loraShare, "lora-share", 0.3, "share of the conversations on a LoRA adapter")
	flag.Float64Var(&o.saltShare, "salt-share", 0.3, "share of the conversations with a cache_salt")
	flag.Float64Var(&o.repeatShare, "repeat-share", 0.3, "chance that a turn of a LoRA or salted conversation is sent again right after its answer")
	flag.DurationVar(&o.settle, "settle", 10*time.Second, "after the traffic, how long the router's belief may take to equal the engines' caches")
	flag.IntVar(&o.bufferSteps, "buffer-steps", 64, "scenario B: the engines' replay buffer in batches")
	flag.IntVar(&o.warmupConvs, "warmup-conversations", 120, "scenario B: conversations through the first router (more are sent until every engine has run past its replay buffer)")
	flag.IntVar(&o.recoveryRound, "recovery-round", 40, "scenario B without snapshots: conversations per round through the new router")
	flag.IntVar(&o.recoveryRounds, "recovery-rounds", 6, "scenario B without snapshots: rounds")
	flag.DurationVar(&o.exactLimit, "exact-limit", time.Minute, "scenario B with snapshots: how long to wait for an exact belief")
	flag.BoolVar(&smoke, "smoke", false, "a short run (fewer conversations and rounds): under a minute on an idle machine")
	flag.Parse()
	if smoke {
		o.conversations, o.warmupConvs, o.recoveryRound, o.recoveryRounds = 50, 30, 20, 1
	}
	if o.mockBin == "" {
		o.mockBin = o.routerBin
	}
	if adapters != "" {
		o.adapters = strings.Split(adapters, ",")
	}
	if flag.NArg() > 0 || o.engines < 1 || o.runs < 1 || o.minTurns < 1 || o.maxTurns < o.minTurns || o.concurrency < 1 ||
		!slices.Contains([]string{"fleet", "restart", "all"}, o.scenario) || o.bufferSteps < 1 {
		fmt.Fprintln(os.Stderr, "fleet: bad flags (see -h)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	missed, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
	if missed {
		os.Exit(1)
	}
}

// runResult is one run's figures.
type runResult struct {
	a  *fleetResult
	bs *restartResult // with snapshots
	bn *restartResult // without
}

func run(ctx context.Context, o options, out io.Writer) (missed bool, err error) {
	fmt.Fprintf(out, "bench/fleet: %d engines (16-token blocks, %d blocks each, adapters %s, speedup %s), workers file of URLs only, empty policy; %d run(s)\n",
		o.engines, o.kvBlocks, strings.Join(o.adapters, ","), o.speedup, o.runs)
	var results []runResult
	for i := range o.runs {
		ro := o
		ro.seed = o.seed + uint64(i)
		var r runResult
		if o.scenario != "restart" {
			if r.a, err = runFleet(ctx, ro, i); err != nil {
				return true, fmt.Errorf("run %d, scenario A: %w", i+1, err)
			}
			r.a.print(out, i+1)
		}
		if o.scenario != "fleet" {
			if r.bs, err = runRestart(ctx, ro, i, true); err != nil {
				return true, fmt.Errorf("run %d, scenario B with snapshots: %w", i+1, err)
			}
			r.bs.print(out, i+1)
			if r.bn, err = runRestart(ctx, ro, i, false); err != nil {
				return true, fmt.Errorf("run %d, scenario B without snapshots: %w", i+1, err)
			}
			r.bn.print(out, i+1)
		}
		results = append(results, r)
	}
	return summary(out, o, results), nil
}

// newFleet makes a run's directory and client.
func newFleet(o options, name string) (*fleet, error) {
	dir, err := os.MkdirTemp("", "bench-fleet-"+name+"-")
	if err != nil {
		return nil, err
	}
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: 2 * time.Minute}
	return &fleet{o: o, dir: dir, client: c}, nil
}

// close stops the processes and keeps or removes the logs.
func (f *fleet) close(name string) {
	f.procs.StopAll()
	if f.o.keepLogs != "" {
		dst := filepath.Join(f.o.keepLogs, name)
		if err := os.MkdirAll(dst, 0o755); err == nil {
			ents, _ := os.ReadDir(f.dir)
			for _, e := range ents {
				if b, err := os.ReadFile(filepath.Join(f.dir, e.Name())); err == nil {
					_ = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
				}
			}
		}
	}
	_ = os.RemoveAll(f.dir)
}

// fleetResult is scenario A's figures.
type fleetResult struct {
	t        *tally
	elapsed  time.Duration
	diffs    []diff
	exactIn  time.Duration // from the traffic's end until the belief was exact; -1: never within --settle
	belief   map[string]float64
	evictedB int64
	// compareErr: the belief could not be read (counted a miss).
	compareErr error
	// notLive: the engines' KV events were not all live 30 s after the
	// router was ready (the traffic was sent all the same).
	notLive error
}

func runFleet(ctx context.Context, o options, run int) (*fleetResult, error) {
	f, err := newFleet(o, "fleet")
	if err != nil {
		return nil, err
	}
	defer f.close(fmt.Sprintf("run%d-fleet", run+1))
	if err := f.startEngines(ctx, engineArgs{}); err != nil {
		return nil, err
	}
	if _, err := f.startRouter(ctx); err != nil {
		return nil, err
	}
	// A router that never follows the engines' KV events is measured all
	// the same (the belief then misses): it is what a user would get.
	notLive := f.waitLive(ctx, 30*time.Second)
	w := newWorkload(o)
	t := newTally()
	start := time.Now()
	drive(ctx, f.client, f.router, w.conversations(o.seed, 0, o.conversations), o.concurrency, t, nil)
	res := &fleetResult{t: t, elapsed: time.Since(start), exactIn: -1, notLive: notLive}
	if n := t.failed.Load(); n > t.requests.Load()/100 {
		return nil, fmt.Errorf("%d of %d requests failed, the first: %w", n, t.requests.Load(), t.firstErr)
	}
	end := time.Now()
	for {
		ds, err := f.compare(ctx)
		if err != nil {
			// A router without /debug/workers/NAME/blocks (one from before
			// it): the traffic's figures stand, the belief is a miss.
			res.compareErr = err
			break
		}
		res.diffs = ds
		if allExact(ds) {
			res.exactIn = time.Since(end)
			break
		}
		if time.Since(end) > o.settle {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, d := range res.diffs {
		res.evictedB += d.evicted
	}
	if res.compareErr != nil {
		for _, e := range f.engines {
			if _, ev, err := f.truth(ctx, e); err == nil {
				res.evictedB += ev
			}
		}
	}
	m, err := scrapeBelief(f)
	if err != nil {
		return nil, err
	}
	res.belief = m
	return res, nil
}

// scrapeBelief reads the router's switchyard_prefix_belief_total.
func scrapeBelief(f *fleet) (map[string]float64, error) {
	m, err := scrape(f)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mode := range []string{"precise", "approximate"} {
		for _, r := range []string{"exact", "over", "under"} {
			out[mode+"/"+r] = m[`switchyard_prefix_belief_total{mode="`+mode+`",result="`+r+`"}`]
		}
	}
	return out, nil
}

func (r *fleetResult) followShare() float64 {
	s, _, _ := share(r.t.followHits, r.t.followUps)
	return s
}
func (r *fleetResult) repeatShare() float64 { s, _, _ := share(r.t.repeatHits, r.t.repeats); return s }

func (r *fleetResult) beliefExact() bool { return r.compareErr == nil && allExact(r.diffs) }

func (r *fleetResult) print(out io.Writer, run int) {
	t := r.t
	fmt.Fprintf(out, "\nrun %d, A (fleet): %d requests (%d failed) in %.1f s; KV hit %.1f%% of prompt tokens; the engines evicted %d blocks\n",
		run, t.requests.Load(), t.failed.Load(), r.elapsed.Seconds(), 100*float64(t.cachedT.Load())/float64(max(1, t.promptTokens.Load())), r.evictedB)
	if r.notLive != nil {
		fmt.Fprintf(out, "  before the traffic: %v\n", r.notLive)
	}
	fmt.Fprintf(out, "  %-12s %22s %22s\n", "traffic", "follow-ups prev cached", "repeats at the holder")
	for _, k := range []string{"base", "lora", "salted", "lora+salted"} {
		fmt.Fprintf(out, "  %-12s %22s %22s\n", k, frac(t.followHits[k], t.followUps[k]), frac(t.repeatHits[k], t.repeats[k]))
	}
	fs, fh, fn := share(t.followHits, t.followUps)
	rs, rh, rn := share(t.repeatHits, t.repeats)
	fmt.Fprintf(out, "  %-12s %22s %22s\n", "all", frac(fh, fn), frac(rh, rn))
	fmt.Fprintf(out, "  target: follow-ups >= 95%%: %s (%.2f%%); repeats >= 95%%: %s (%.2f%%)\n", verdict(fs >= followUpTarget), 100*fs, verdict(rs >= repeatTarget), 100*rs)
	for _, m := range t.misses {
		fmt.Fprintf(out, "    missed %s\n", m)
	}
	if r.compareErr != nil {
		fmt.Fprintf(out, "  target: belief = cache, 0 missing and 0 extra: MISSED (not compared: %v)\n", r.compareErr)
	} else {
		printDiffs(out, r.diffs)
	}
	when := "not within --settle"
	if r.exactIn >= 0 {
		when = fmt.Sprintf("%.2f s after the traffic stopped", r.exactIn.Seconds())
	}
	if r.compareErr == nil {
		fmt.Fprintf(out, "  target: belief = cache, 0 missing and 0 extra: %s (%s)\n", verdict(r.beliefExact()), when)
	}
	b := r.belief
	if n := b["precise/exact"] + b["precise/over"] + b["precise/under"]; n > 0 {
		fmt.Fprintf(out, "  per answer, the router's precise belief of the chosen engine: exact %.2f%% (%0.f over, %.0f under of %.0f); approximate exact %.2f%%\n",
			100*b["precise/exact"]/n, b["precise/over"], b["precise/under"], n,
			100*b["approximate/exact"]/max(1, b["approximate/exact"]+b["approximate/over"]+b["approximate/under"]))
	}
}

func printDiffs(out io.Writer, ds []diff) {
	fmt.Fprintf(out, "  %-7s %-13s %8s %9s %8s %6s %8s\n", "engine", "stream", "cached", "believed", "missing", "extra", "evicted")
	for _, d := range ds {
		extra := fmt.Sprint(d.extra)
		if d.otherMedium > 0 || d.copiesWrong > 0 || d.notHeld > 0 || d.flagged > 0 {
			extra += fmt.Sprintf(" (+%d other tier; %d copies differ, %d not held, %d folded or aliased)", d.otherMedium, d.copiesWrong, d.notHeld, d.flagged)
		}
		why := ""
		if d.reason != "" {
			why = fmt.Sprintf("  (%.100s)", d.reason)
		}
		fmt.Fprintf(out, "  %-7s %-13s %8d %9d %8d %6s %8d%s\n", d.engine, d.state, d.truth, d.believed, d.missing, extra, d.evicted, why)
	}
}

func frac(h, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d %.1f%%", h, n, 100*float64(h)/float64(n))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
