package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/replay/report/htmlreport"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/trace"
)

// replayFlags are the flags of router replay.
type replayFlags struct {
	policy      string
	trace       string
	traceFormat string
	// workers, prefill and decode are the fleet sizes: one or more each,
	// a sweep over every size (prefill and decode crossed).
	workers []int
	prefill []int
	decode  []int
	seed    int64
	// seeds is --seeds: each cell runs with seeds seed .. seed+seeds−1.
	seeds int
	// baseline is --baseline NAME[:COLUMN]; slo --slo; columns --columns;
	// html --html FILE; cmd the command, whose flags the report quotes.
	baseline string
	slo      string
	// goodputTarget is --goodput-target, a percent ("95" or "95%").
	goodputTarget string
	columns       string
	html          string
	cmd           *cobra.Command
	limit         int
	perRequest    string
	report        string
	compare       []string
	// prefix is --prefix: approximate, precise or both; kvEventDelay the
	// precise runs' KV event delay.
	prefix       string
	kvEventDelay time.Duration
	// replicas is --replicas, the router replicas; syncDelays --sync-delay,
	// their sync delays, one run each (a sweep).
	replicas   int
	syncDelays []time.Duration
	// failOnFallback makes any fallback a failure (exit 1), after the
	// outputs are written.
	failOnFallback bool
	// canary is --canary: "" runs the policy files' canary blocks as
	// declared; "off", "WEIGHT" or "CANDIDATE=WEIGHT" (replay.ParseCanary).
	canary string
	// memoryLimit is --memory-limit, MiB; 0 leaves the Go runtime's.
	memoryLimit int
	// quiet is --quiet: no progress on stderr (see progress).
	quiet bool
	// speeds is --speeds as given: a comma-separated speed pattern
	// (speedsOf).
	speeds string
	// fail, failRate, restartAfter and migrationLimit are --fail (each
	// value as given), --fail-rate, --restart-after and --migration-limit
	// (replayfail.go).
	fail           []string
	failRate       float64
	restartAfter   time.Duration
	migrationLimit int
}

// DefaultReplayMemoryLimit is --memory-limit's default, MiB: the soft limit
// on the Go heap (runtime/debug.SetMemoryLimit) that router replay sets
// unless GOMEMLIMIT is in the environment. Without one the garbage collector
// lets the heap grow to twice its live data; with it, a 1,010,604-request
// replay with --per-request peaks at 272 MiB of resident memory instead of
// 433 (scripts/replay-memory.sh, BENCHMARKS.md "Replay memory"), for no
// measurable CPU: the simulation, not the collector, is the work. A replay
// whose live data exceeds the limit runs on, with the collector using up
// to half the CPU (the runtime's cap).
const DefaultReplayMemoryLimit = 256

func newReplayCmd() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a recorded trace through a policy on simulated workers",
		Long: `Replay drives a trace through a policy on simulated workers, in simulated
time, and prints a summary table. With no flags it replays the bundled Mooncake
conversation trace (12,031 requests) through the built-in default policy
(kv-affinity + min-cost) on 8 simulated workers. The same inputs and seed give
byte-identical --per-request output.

With --prefill-workers N --decode-workers M it replays disaggregated serving:
each request is routed by the policy's prefill role to one of N prefill
workers, which compute its prompt and first token, then by the decode role to
one of M decode workers, which receive its prompt's KV (128 KiB per token at
50 GB/s) and generate the rest. A role the policy file does not select a
policy for runs the built-in default policy, with a warning.

--trace - reads the trace from standard input, in the format --trace-format
names (jsonl or csv; required then). --per-request -, --report - or --html -
writes that output to standard output, and the table then goes to standard error.

The fleet is at most 4096 simulated workers in all. --per-request, --report
and --html are written atomically, only when the whole run succeeds. Requests
the policy rejects are counted in the table (and summarised on stderr); they
do not change the exit status, which is 0 on success, 1 when the run fails
and 2 on a usage error. Selections a policy's fallback made because the
policy failed (a plugin's error, panic, timeout, restart...) are counted in
the table's fallbacks column, and stderr ends with one line per plugin that
caused them, by cause, with the first error; with --fail-on-fallback any
fallback makes the exit status 1.

A policy's canary block (docs/policy-file.md, Canary) splits the requests
as router serve would, by the hash of each trace record's session_id (its
index without one), and rolls the candidate back in simulated time; stderr
then shows each side's TTFT, E2E and fallbacks and whether the rollback
would fire. --canary off runs without canaries, --canary 0.1 sets every
canary's weight and --canary trial=0.1 the weight of candidate "trial".

--prefix precise routes by the simulated engines' KV events instead of the
router's own record of what it sent: each engine publishes the prefix blocks
it stores and evicts, and the router applies them --kv-event-delay later
through the same precise index router serve uses. --prefix both runs every
policy both ways, in rows NAME and NAME+precise, with a belief column: the
share of requests whose router belief of the chosen worker's cached prefix
equals what the engine served.

--replicas N models N router replicas behind a round-robin load balancer:
request i is routed by replica i mod N, each with policies, a queue and a
prefix index of its own, and each sees the others' bookings, first tokens and
releases, and the engines' KV events, --sync-delay later. A list of delays
(0,10ms,1s) sweeps, in rows NAME/N@D.

--speeds 2,1 replays a fleet of mixed hardware: worker i of each pool runs
every engine step at speed 2,1,2,1... (entry i mod the list's length), relative
to the modelled H100, and carries the label switchyard.io/class=speed-2 or
speed-1. The full reference is docs/replay.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.cmd = cmd
			return runReplay(cmd, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policy, "policy", "", "HCL policy file (default: the built-in default policy)")
	fl.StringVar(&f.trace, "trace", "", "trace file: Mooncake .jsonl, or Azure or BurstGPT .csv, or - for standard input (default: the bundled conversation trace)")
	fl.StringVar(&f.traceFormat, "trace-format", "", "trace format, jsonl (Mooncake) or csv (Azure 2023 or 2024, or BurstGPT: the CSV header tells which), in place of the file's extension; required with --trace -")
	fl.IntSliceVar(&f.workers, "workers", []int{replay.DefaultWorkers},
		fmt.Sprintf("number of simulated aggregated workers, at most %d; a comma-separated list sweeps fleet sizes (4,8,16)", replay.MaxWorkers))
	fl.IntSliceVar(&f.prefill, "prefill-workers", nil,
		fmt.Sprintf("number of simulated prefill workers (disaggregated serving; needs --decode-workers; at most %d with them); a list sweeps, crossed with --decode-workers", replay.MaxWorkers))
	fl.IntSliceVar(&f.decode, "decode-workers", nil,
		fmt.Sprintf("number of simulated decode workers (disaggregated serving; needs --prefill-workers; at most %d with them); a list sweeps", replay.MaxWorkers))
	// The zero default is not used: the flag applies only when given (see
	// loadPolicy), and a zero default keeps pflag from printing "(default 0)".
	fl.Int64Var(&f.seed, "seed", 0,
		fmt.Sprintf("seed for seeded components that set none (default: the file's router.seed, else %d)", replay.DefaultSeed))
	fl.IntVar(&f.seeds, "seeds", 1,
		fmt.Sprintf("run every cell N times, adding 0 to N-1 to every seed of the policy (router.seed and each component's own), and show the median with [least–greatest]; at most %d", maxSeeds))
	fl.StringVar(&f.baseline, "baseline", "", "add a delta column against policy NAME on the same fleet (in pp for a share, in percent otherwise): NAME, or NAME:COLUMN for another column than TTFT p90 (goodput with --slo)")
	fl.StringVar(&f.slo, "slo", "", "latency targets for goodput, such as ttft=500ms,tpot=50ms (targets ttft, tpot, e2e): adds the share and rate of requests that met every one")
	fl.StringVar(&f.goodputTarget, "goodput-target", "", "with --slo: the goodput share a policy must reach, in percent (95 or 95%); the table then ends with the smallest fleet on which each policy reaches it")
	fl.StringVar(&f.columns, "columns", "default", "table columns: default, all, or a comma-separated list of names such as default,e2e_p50,imbalance; see docs/replay.md")
	fl.StringVar(&f.html, "html", "", "write a self-contained HTML report with plots (table, TTFT and E2E CDFs, load and KV hit over time, sweeps) to FILE, or - for standard output")
	fl.IntVar(&f.limit, "limit", 0, "replay only the first N requests (0: all)")
	fl.StringVar(&f.perRequest, "per-request", "", "write one JSON line per request to FILE, or - for standard output (one run only: not with --compare, --prefix both, several --workers sizes or --seeds above 1)")
	fl.StringVar(&f.report, "report", "", "write the summary as JSON to FILE, or - for standard output (a JSON array of every run with --compare, --prefix both, several fleet sizes or --seeds above 1)")
	fl.StringSliceVar(&f.compare, "compare", nil, "run each policy file FILE,FILE,... on the same trace and print one table (not with --policy)")
	fl.StringVar(&f.prefix, "prefix", "approximate", "how the router learns what the engines cache: approximate (what it sent them), precise (their KV events) or both (each policy twice)")
	fl.DurationVar(&f.kvEventDelay, "kv-event-delay", replay.DefaultKVEventDelay,
		fmt.Sprintf("simulated time from an engine's cache change to the router applying its KV event (--prefix precise or both; %v is one simulated engine step)", replay.DefaultKVEventDelay))
	fl.IntVar(&f.replicas, "replicas", 1,
		fmt.Sprintf("router replicas sharing the fleet, 1 to %d: request i is routed by replica i mod N, and each sees the others' decisions and the engines' KV events --sync-delay later", replay.MaxReplicas))
	fl.DurationSliceVar(&f.syncDelays, "sync-delay", nil,
		"with --replicas: simulated time before a replica's decisions and the engines' KV events reach every replica; a comma-separated list sweeps (0,10ms,1s)")
	// pflag would print the nil list's default as "(default [])"; a
	// replay without the flag runs with no delay (replayFlags.delays).
	fl.Lookup("sync-delay").DefValue = "0s"
	fl.StringVar(&f.canary, "canary", "", "rehearse the policy files' canaries at another weight: off, WEIGHT or CANDIDATE=WEIGHT (0 to 1, or a percentage); without it they run as declared")
	fl.BoolVar(&f.failOnFallback, "fail-on-fallback", false, "exit 1 when any selection was decided by a fallback because its policy failed (outputs are still written)")
	fl.IntVar(&f.memoryLimit, "memory-limit", DefaultReplayMemoryLimit,
		"soft limit on the Go heap in MiB (runtime/debug.SetMemoryLimit), set unless GOMEMLIMIT is in the environment; 0: none")
	fl.StringVar(&f.speeds, "speeds", "", "simulated workers' speeds relative to the modelled H100, comma-separated, cycling over each fleet's workers: worker i runs at entry i mod N (2,1: half the workers twice as fast); default 1")
	fl.BoolVar(&f.quiet, "quiet", false, "show no progress on stderr (shown when a replay takes over 2 s: requests done of total, simulated time, ETA)")
	addFailureFlags(fl, &f)
	setWant(fl, "workers", fmt.Sprintf("whole numbers from 1 to %d, comma-separated", replay.MaxWorkers))
	for _, name := range []string{"prefill-workers", "decode-workers"} {
		setWant(fl, name, fmt.Sprintf("whole numbers from 1 to %d, comma-separated (prefill and decode workers together)", replay.MaxWorkers))
	}
	setWant(fl, "seeds", fmt.Sprintf("a whole number from 1 to %d", maxSeeds))
	setWant(fl, "seed", fmt.Sprintf("a whole number from %d to %d", math.MinInt64, math.MaxInt64))
	setWant(fl, "limit", fmt.Sprintf("a whole number from 0 (all) to %d", math.MaxInt))
	setWant(fl, "memory-limit", fmt.Sprintf("MiB, a whole number from 0 (no limit) to %d", 1<<30))
	setWant(fl, "compare", "a comma-separated list of policy files")
	setWant(fl, "kv-event-delay", "a duration >= 0 such as 20ms or 1s")
	setWant(fl, "replicas", fmt.Sprintf("a whole number from 1 to %d", replay.MaxReplicas))
	setWant(fl, "sync-delay", "durations >= 0 such as 0,10ms,1s, comma-separated")
	setWant(fl, "speeds", fmt.Sprintf("numbers from %v to %v, comma-separated, at most %d", sim.MinSpeed, sim.MaxSpeed, replay.MaxWorkers))
	return cmd
}

// noArgs rejects positional arguments, saying so: cobra.NoArgs words them
// as an unknown command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q; see '%s --help'", subcommand(cmd), args, cmd.CommandPath())
	}
	return nil
}

// subcommand is cmd's path without the root's name ("trace generate"),
// for an error that main prints after "router: ", which would otherwise
// read "router: router trace generate ..."; the root's own name for the
// root.
func subcommand(cmd *cobra.Command) string {
	if cmd == cmd.Root() {
		return cmd.Name()
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

// check validates the flags; every error it returns is a usage error.
func (f *replayFlags) check(cmd *cobra.Command) error {
	fs := cmd.Flags()
	for _, c := range []struct {
		flag, value, hint string
	}{
		{"trace", f.trace, " (omit the flag for the bundled trace)"},
		{"policy", f.policy, " (omit the flag for the built-in default policy)"},
		{"per-request", f.perRequest, ""},
		{"report", f.report, ""},
		{"html", f.html, ""},
	} {
		if fs.Changed(c.flag) && c.value == "" {
			return fmt.Errorf("--%s '': want a file name%s", c.flag, c.hint)
		}
	}
	if err := f.checkStreams(cmd); err != nil {
		return err
	}
	if fs.Changed("canary") {
		if _, err := replay.ParseCanary(f.canary); err != nil {
			return err
		}
	}
	if fs.Changed("compare") {
		if len(f.compare) == 0 {
			return errors.New("--compare '': want a comma-separated list of policy files")
		}
		for i, p := range f.compare {
			if p == "" {
				return fmt.Errorf("--compare %s: entry %d of %d is empty; want a comma-separated list of policy files",
					strings.Join(f.compare, ","), i+1, len(f.compare))
			}
		}
	}
	if err := f.checkFleets(cmd); err != nil {
		return err
	}
	if _, err := f.speedsOf(cmd); err != nil {
		return err
	}
	if f.memoryLimit < 0 || f.memoryLimit > 1<<30 {
		return fmt.Errorf("--memory-limit %d: want MiB from 0 (no limit) to %d", f.memoryLimit, 1<<30)
	}
	if f.seeds < 1 || f.seeds > maxSeeds {
		return fmt.Errorf("--seeds %d: want a whole number from 1 to %d", f.seeds, maxSeeds)
	}
	if err := f.checkReplicas(cmd); err != nil {
		return err
	}
	if _, err := f.failuresOf(cmd); err != nil {
		return err
	}
	if f.perRequest != "" && f.runsPerPolicy(cmd) > 1 {
		return errors.New("--per-request writes the lines of one run: it cannot be combined with several --workers sizes, --sync-delay values or --seeds above 1")
	}
	if _, err := report.ParseColumns(f.columns); err != nil {
		return err
	}
	if fs.Changed("slo") {
		if _, err := report.ParseSLO(f.slo); err != nil {
			return fmt.Errorf("--%w", err)
		}
	}
	if _, _, err := f.baselineOf(); err != nil {
		return err
	}
	if _, err := f.goodputTargetOf(cmd); err != nil {
		return err
	}
	if f.limit < 0 {
		return fmt.Errorf("--limit %d: want >= 0", f.limit)
	}
	if len(f.compare) > 0 && (f.policy != "" || f.perRequest != "") {
		return errors.New("--compare runs several policies: it cannot be combined with --policy or --per-request")
	}
	if _, err := f.prefixModes(); err != nil {
		return err
	}
	switch {
	case f.kvEventDelay < 0:
		return fmt.Errorf("--kv-event-delay %v: want a duration >= 0 such as 20ms or 1s", f.kvEventDelay)
	case fs.Changed("kv-event-delay") && f.prefix == "approximate":
		return errors.New("--kv-event-delay applies to KV events: give --prefix precise or --prefix both")
	case f.prefix == "both" && f.perRequest != "":
		return errors.New("--prefix both runs each policy twice: it cannot be combined with --per-request (use --prefix precise)")
	}
	return f.checkPaths()
}

// prefixModes returns the prefix modes --prefix asks for, in table
// order; an unknown value is a usage error.
func (f *replayFlags) prefixModes() ([]replay.PrefixMode, error) {
	switch f.prefix {
	case "approximate":
		return []replay.PrefixMode{replay.PrefixApproximate}, nil
	case "precise":
		return []replay.PrefixMode{replay.PrefixPrecise}, nil
	case "both":
		return []replay.PrefixMode{replay.PrefixApproximate, replay.PrefixPrecise}, nil
	}
	v := f.prefix
	if v == "" {
		v = "''"
	}
	return nil, fmt.Errorf("--prefix %s: want approximate, precise or both", v)
}

// checkStreams checks the flags that name standard input or output ("-")
// and --trace-format; every error it returns is a usage error.
func (f *replayFlags) checkStreams(cmd *cobra.Command) error {
	fs := cmd.Flags()
	switch format := trace.Format(f.traceFormat); {
	case fs.Changed("trace-format") && format != trace.Mooncake && format != trace.Azure:
		v := f.traceFormat
		if v == "" {
			v = "''"
		}
		return fmt.Errorf("--trace-format %s: want jsonl (a Mooncake trace) or csv (an Azure 2023 or 2024 or a BurstGPT trace: its header tells which)", v)
	case f.trace == "-" && format == "":
		return errors.New("--trace - reads the trace from standard input: give its format, --trace-format jsonl or --trace-format csv")
	case format != "" && f.trace == "":
		return errors.New("--trace-format needs --trace: the bundled trace is JSON lines")
	case countDash(f.perRequest, f.report, f.html) > 1:
		return errors.New("--per-request, --report and --html cannot write to standard output together: give all but one of them a file")
	}
	return nil
}

// disaggregated reports whether the flags ask for prefill and decode pools.
func (f *replayFlags) disaggregated(cmd *cobra.Command) bool {
	fs := cmd.Flags()
	return fs.Changed("prefill-workers") || fs.Changed("decode-workers")
}

// maxSeeds bounds --seeds: each seed is a whole replay of every cell.
const maxSeeds = 100

// countDash counts the outputs that go to standard output ("-").
func countDash(paths ...string) int {
	n := 0
	for _, p := range paths {
		if p == "-" {
			n++
		}
	}
	return n
}

// fleets lists the fleet sizes the flags ask for, in the order given:
// every --workers size, or every --prefill-workers size crossed with
// every --decode-workers size (prefill-major).
func (f *replayFlags) fleets(cmd *cobra.Command) []replay.Fleet {
	var out []replay.Fleet
	if !f.disaggregated(cmd) {
		for _, n := range f.workers {
			out = append(out, replay.Fleet{Workers: n})
		}
		return out
	}
	for _, p := range f.prefill {
		for _, d := range f.decode {
			out = append(out, replay.Fleet{Prefill: p, Decode: d})
		}
	}
	return out
}

// runsPerPolicy is how many replays each policy file and prefix mode
// takes: one per fleet size, sync delay and seed.
func (f *replayFlags) runsPerPolicy(cmd *cobra.Command) int {
	return len(f.fleets(cmd)) * len(f.delays()) * f.seeds
}

// delays are the sync delays to replay: --sync-delay's, else one run
// with none.
func (f *replayFlags) delays() []time.Duration {
	if len(f.syncDelays) == 0 {
		return []time.Duration{0}
	}
	return f.syncDelays
}

// checkReplicas checks --replicas and --sync-delay; every error it
// returns is a usage error.
func (f *replayFlags) checkReplicas(cmd *cobra.Command) error {
	if f.replicas < 1 || f.replicas > replay.MaxReplicas {
		return fmt.Errorf("--replicas %d: want a whole number from 1 to %d", f.replicas, replay.MaxReplicas)
	}
	if !cmd.Flags().Changed("sync-delay") {
		return nil
	}
	text := func() string {
		parts := make([]string, len(f.syncDelays))
		for i, d := range f.syncDelays {
			parts[i] = d.String()
		}
		return strings.Join(parts, ",")
	}
	switch {
	case len(f.syncDelays) == 0:
		return errors.New("--sync-delay '': want durations >= 0 such as 0,10ms,1s, comma-separated")
	case f.replicas == 1:
		return errors.New("--sync-delay applies to router replicas: give --replicas 2 or more")
	case len(f.syncDelays) > maxFleetSizes:
		return fmt.Errorf("--sync-delay: %d delays; want at most %d", len(f.syncDelays), maxFleetSizes)
	}
	for i, d := range f.syncDelays {
		switch {
		case d < 0:
			return fmt.Errorf("--sync-delay %s: %v is negative; want durations >= 0 such as 0,10ms,1s", text(), d)
		case slices.Contains(f.syncDelays[:i], d):
			return fmt.Errorf("--sync-delay %s: %v is listed twice", text(), d)
		}
	}
	return nil
}

// checkFleets checks --workers, --prefill-workers and --decode-workers;
// every error it returns is a usage error.
func (f *replayFlags) checkFleets(cmd *cobra.Command) error {
	fs := cmd.Flags()
	disagg := f.disaggregated(cmd)
	switch {
	case disagg && fs.Changed("workers"):
		return errors.New("--workers sets aggregated workers: it cannot be combined with --prefill-workers or --decode-workers")
	case disagg && (!fs.Changed("prefill-workers") || !fs.Changed("decode-workers")):
		return errors.New("disaggregated serving needs both --prefill-workers and --decode-workers")
	}
	lists := []struct {
		flag  string
		sizes []int
	}{{"workers", f.workers}}
	if disagg {
		lists = []struct {
			flag  string
			sizes []int
		}{{"prefill-workers", f.prefill}, {"decode-workers", f.decode}}
	}
	for _, l := range lists {
		if len(l.sizes) == 0 {
			return fmt.Errorf("--%s '': want whole numbers from 1 to %d, comma-separated", l.flag, replay.MaxWorkers)
		}
		if len(l.sizes) > maxFleetSizes {
			return fmt.Errorf("--%s: %d sizes; want at most %d", l.flag, len(l.sizes), maxFleetSizes)
		}
		together := ""
		if disagg {
			together = " (prefill and decode workers together)"
		}
		for i, n := range l.sizes {
			switch {
			case n < 1 || (!disagg && n > replay.MaxWorkers):
				return fmt.Errorf("--%s %d: want a whole number from 1 to %d%s", l.flag, n, replay.MaxWorkers, together)
			case n > replay.MaxWorkers:
				return fmt.Errorf("--%s %d: want at most %d simulated workers in all", l.flag, n, replay.MaxWorkers)
			case slices.Contains(l.sizes[:i], n):
				return fmt.Errorf("--%s: %d is listed twice", l.flag, n)
			}
		}
	}
	for _, fl := range f.fleets(cmd) {
		if disagg && fl.Prefill+fl.Decode > replay.MaxWorkers {
			return fmt.Errorf("--prefill-workers %d + --decode-workers %d = %d simulated workers: want at most %d in all",
				fl.Prefill, fl.Decode, fl.Prefill+fl.Decode, replay.MaxWorkers)
		}
	}
	return nil
}

// speedsOf reads --speeds: the speed pattern (replay.Sweep.Speeds), one
// entry per comma-separated value, each a number from sim.MinSpeed to
// sim.MaxSpeed, at most replay.MaxWorkers of them (a longer pattern
// could not reach its last entries). nil without the flag. Every error
// is a usage error naming the entry.
func (f *replayFlags) speedsOf(cmd *cobra.Command) ([]float64, error) {
	if !cmd.Flags().Changed("speeds") {
		return nil, nil
	}
	want := fmt.Sprintf("want numbers from %v to %v, comma-separated, such as 2,1", sim.MinSpeed, sim.MaxSpeed)
	if strings.TrimSpace(f.speeds) == "" {
		return nil, fmt.Errorf("--speeds '': %s", want)
	}
	// Count before splitting, so a huge value is refused without building
	// its list.
	if n := strings.Count(f.speeds, ",") + 1; n > replay.MaxWorkers {
		return nil, fmt.Errorf("--speeds: %d entries; want at most %d, one per simulated worker", n, replay.MaxWorkers)
	}
	parts := strings.Split(f.speeds, ",")
	out := make([]float64, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		entry := fmt.Sprintf("--speeds %s: entry %d of %d", f.speeds, i+1, len(parts))
		if p == "" {
			return nil, fmt.Errorf("%s is empty; %s", entry, want)
		}
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || sim.CheckSpeed(v) != nil {
			return nil, fmt.Errorf("%s, %q, is not a speed; %s (1: the modelled H100)", entry, p, want)
		}
		out[i] = v
	}
	return out, nil
}

// speedsText words --speeds for the header line: "" without it or when
// every speed is 1, else "; worker speeds 2,1, repeating over each pool's
// workers (1: the modelled H100)".
func speedsText(speeds []float64) string {
	if replay.CycleSpeeds(speeds, len(speeds)) == nil {
		return ""
	}
	parts := make([]string, len(speeds))
	for i, v := range speeds {
		parts[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return fmt.Sprintf("; worker speeds %s, repeating over each pool's workers (1: the modelled H100)", strings.Join(parts, ","))
}

// maxFleetSizes bounds each fleet size list of a sweep.
const maxFleetSizes = 64

// baselineOf reads --baseline NAME[:COLUMN]: the policy name, which must
// be the label of exactly one of the policies replayed, and the delta column's metric (TTFT p90, or
// goodput with --slo, when no column is given). "" and a zero Metric
// without --baseline.
func (f *replayFlags) baselineOf() (string, report.Metric, error) {
	if f.baseline == "" {
		return "", report.Metric{}, nil
	}
	name, col, hasCol := strings.Cut(f.baseline, ":")
	if !hasCol {
		col = "ttft_p90"
		if f.slo != "" {
			col = "goodput"
		}
	}
	m, ok := report.MetricByName(col)
	if !ok {
		return "", report.Metric{}, fmt.Errorf("--baseline %s: unknown column %q; want one of %s", f.baseline, col, strings.Join(report.MetricNames(), ", "))
	}
	var names []string
	for _, p := range f.policyPaths() {
		names = append(names, replay.PolicyName(p))
	}
	if !slices.Contains(names, name) {
		return "", report.Metric{}, fmt.Errorf("--baseline %s: %q is not a replayed policy; want one of %s (a policy file's name without its extension)",
			f.baseline, name, strings.Join(names, ", "))
	}
	n := 0
	for _, s := range names {
		if s == name {
			n++
		}
	}
	if n > 1 {
		return "", report.Metric{}, fmt.Errorf("--baseline %s: %d --compare files are labelled %s, so the baseline is not one row per fleet; give one of them another name",
			f.baseline, n, name)
	}
	return name, m, nil
}

// goodputTargetOf reads --goodput-target: a percent above 0 and at most
// 100, with or without "%"; 0 without the flag. It needs --slo.
func (f *replayFlags) goodputTargetOf(cmd *cobra.Command) (float64, error) {
	if !cmd.Flags().Changed("goodput-target") {
		return 0, nil
	}
	if !cmd.Flags().Changed("slo") {
		return 0, errors.New("--goodput-target needs --slo: the targets whose share it sets")
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(f.goodputTarget), "%"), 64)
	if err != nil || !(v > 0 && v <= 100) {
		return 0, fmt.Errorf("--goodput-target %s: want a percent above 0 and at most 100, such as 95 or 99.9%%", f.goodputTarget)
	}
	return v, nil
}

// policyPaths are the policy files replayed: --compare's, or --policy
// ("" for the built-in policy).
func (f *replayFlags) policyPaths() []string {
	if len(f.compare) > 0 {
		return f.compare
	}
	return []string{f.policy}
}

// checkPaths refuses an output that would overwrite an input, a bundled
// default's source or the other output (checkOutputPaths). "-" (standard
// input or output) is no path.
func (f *replayFlags) checkPaths() error {
	inputs := []namedPath{{"--trace", f.trace}, {"--policy", f.policy}}
	for _, p := range f.compare {
		inputs = append(inputs, namedPath{"--compare", p})
	}
	return checkOutputPaths(f.outputs(), inputs)
}

// outputs are the output flags of router replay with their paths ("" when
// not given), in flag order.
func (f *replayFlags) outputs() []namedPath {
	return []namedPath{{"--per-request", f.perRequest}, {"--report", f.report}, {"--html", f.html}}
}

// runReplay runs router replay: it checks the flags, creates the outputs'
// temporary files, opens the trace, runs the sweep (replay.Sweep: every
// policy file checked first, then each cell once per seed), prints the
// table and rejection summaries, and only then writes and renames the
// outputs into place.
func runReplay(cmd *cobra.Command, f *replayFlags) error {
	fs := cmd.Flags()
	if err := f.check(cmd); err != nil {
		return err // a usage error: exit 2
	}
	if _, env := os.LookupEnv("GOMEMLIMIT"); f.memoryLimit > 0 && (fs.Changed("memory-limit") || !env) {
		debug.SetMemoryLimit(int64(f.memoryLimit) << 20)
	}
	stderr := cmd.ErrOrStderr()
	// Create the outputs' temporary files first, so an unwritable output
	// fails before any work, and remove them on every failure below.
	outs, err := f.createOutputs(cmd.OutOrStdout())
	defer outs.abort()
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	tr, err := trace.Open(f.trace, trace.Format(f.traceFormat), cmd.InOrStdin(), f.limit, trace.DefaultHold)
	if err != nil {
		return &exitError{code: 1, err: traceHint(err, f.trace, trace.Format(f.traceFormat))}
	}
	if !tr.Hashes {
		noteNoPrefixHashes(stderr, tr.Name, tr.Source)
	}
	noteFailedRequests(stderr, tr)
	sweep := f.sweep(cmd, tr)
	if outs.perReq != nil {
		sweep.PerRequest = outs.perReq
	}
	var prog *progress // made at the first run, once every policy file loaded
	if !f.quiet {
		sweep.StartRun = func(i int, label string) {
			if prog == nil {
				prog = newProgress(stderr, false, sweep.Runs(), tr.Requests)
			}
			prog.startRun(i, label)
		}
		sweep.Progress = func(p replay.Progress) { prog.update(p) }
	}
	res, err := sweep.Run(cmd.Context())
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	prog.finish()

	out := cmd.OutOrStdout()
	if countDash(f.perRequest, f.report, f.html) > 0 {
		out = stderr // standard output carries the output
	}
	cmp := f.comparison(cmd)
	table := cmp
	table.Width = tableWidth(out)
	if err := f.printTable(out, stderr, tr, sweep, res, table); err != nil {
		return &exitError{code: 1, err: err}
	}
	if err := f.writeOutputs(outs, tr, res, cmp); err != nil {
		return &exitError{code: 1, err: err}
	}
	if outs.html != nil && f.html != "-" {
		fmt.Fprintf(stderr, "router: wrote the HTML report to %s\n", f.html)
	}
	var fellBack int64
	for _, rep := range res.Reports {
		fellBack += rep.Fallbacks
		if err := report.WritePredictor(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
		if err := report.WriteFallbacks(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
		if err := report.WriteShadowFailures(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
		if err := report.WriteCanary(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
	}
	if f.failOnFallback && fellBack > 0 {
		return &exitError{code: 1, err: fmt.Errorf("--fail-on-fallback: %d selections were decided by a fallback policy", fellBack)}
	}
	return nil
}

// replayOutputs are the output files of a replay, each nil when its flag
// is not given.
type replayOutputs struct{ perReq, report, html *pendingFile }

// createOutputs creates the temporary files of --per-request, --report
// and --html ("-" writes to stdout). On an error, the outputs created
// before it are in the result, for abort.
func (f *replayFlags) createOutputs(stdout io.Writer) (*replayOutputs, error) {
	outs := &replayOutputs{}
	for _, o := range []struct {
		flag, path string
		kind       outputKind
		file       **pendingFile
	}{{"--per-request", f.perRequest, kindPerRequest, &outs.perReq}, {"--report", f.report, kindReport, &outs.report}, {"--html", f.html, kindHTML, &outs.html}} {
		if o.path == "" {
			continue
		}
		var err error
		if *o.file, err = createOutput(o.flag, o.path, o.kind, stdout); err != nil {
			return outs, err
		}
	}
	return outs, nil
}

// abort removes every output's temporary file not yet committed.
func (o *replayOutputs) abort() { o.perReq.abort(); o.report.abort(); o.html.abort() }

// sweep is the replay.Sweep the flags ask for, of trace tr, loading
// policy files through loadBundle with the plugins' logs and the files'
// diagnostics on cmd's stderr.
func (f *replayFlags) sweep(cmd *cobra.Command, tr *trace.Opened) *replay.Sweep {
	modes, _ := f.prefixModes() // checked
	var slo report.SLO
	if cmd.Flags().Changed("slo") {
		slo, _ = report.ParseSLO(f.slo) // checked
	}
	stderr := cmd.ErrOrStderr()
	var canary replay.Canary
	if f.canary != "" {
		canary, _ = replay.ParseCanary(f.canary) // checked
	}
	speeds, _ := f.speedsOf(cmd)     // checked
	failures, _ := f.failuresOf(cmd) // checked
	return &replay.Sweep{
		Failures:     failures,
		Canary:       canary,
		Speeds:       speeds,
		Trace:        tr,
		Policies:     f.policyPaths(),
		Fleets:       f.fleets(cmd),
		Modes:        modes,
		KVEventDelay: f.kvEventDelay,
		Replicas:     f.replicas,
		Delays:       f.syncDelays,
		Seeds:        f.seeds,
		Seed:         f.seedOf(cmd.Flags()),
		SLO:          slo,
		Timeline:     f.html != "",
		Warnings:     stderr,
		Load: func(ctx context.Context, path string, o loader.LoadOptions, warnings io.Writer) (*loader.Bundle, error) {
			o.Logger = pluginLogger(ctx, stderr)
			return loadBundle(ctx, warnings, path, o)
		},
	}
}

// comparison is the table's settings the flags ask for: --columns,
// --baseline and --goodput-target.
func (f *replayFlags) comparison(cmd *cobra.Command) report.Comparison {
	var columns []report.Metric // the default columns: the text table fits them to its width
	if cmd.Flags().Changed("columns") {
		columns, _ = report.ParseColumns(f.columns) // checked
	}
	baseline, baselineMetric, _ := f.baselineOf() // checked
	target, _ := f.goodputTargetOf(cmd)           // checked
	return report.Comparison{Columns: columns, Baseline: baseline, BaselineMetric: baselineMetric, GoodputTarget: target}
}

// defaultTableWidth is the text table's width when neither $COLUMNS nor
// a terminal tells it: the README's commands fit it.
const defaultTableWidth = 100

// tableWidth is the width the text table is fitted to
// (report.Comparison.Width): $COLUMNS when it is a whole number from 40,
// else the width of the terminal out is, else defaultTableWidth.
func tableWidth(out io.Writer) int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n >= 40 {
		return n
	}
	if f := terminalFile(out); f != nil && term.IsTerminal(int(f.Fd())) {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols >= 40 {
			return cols
		}
	}
	return defaultTableWidth
}

// printTable prints the header line and the table of res to out, and one
// line per run with rejected requests to stderr.
func (f *replayFlags) printTable(out, stderr io.Writer, tr *trace.Opened, s *replay.Sweep, res *replay.SweepResult, cmp report.Comparison) error {
	fmt.Fprintln(out, report.Wrap(f.headerLine(tr, s.Fleets)+speedsText(s.Speeds), cmp.Width))
	if err := report.WriteComparison(out, res.Cells, cmp); err != nil {
		return err
	}
	for _, rep := range res.Reports {
		if rep.Rejected > 0 {
			reason, n := rep.TopRejection()
			fmt.Fprintf(stderr, "router: %s: %d of %d requests rejected; most common reason (%d): %s\n",
				runName(rep, len(s.Fleets)), rep.Rejected, rep.Requests, n, reason)
		}
	}
	return nil
}

// headerLine is the line above the table: the trace, its requests, the
// fleet sizes, the router replicas and the seeds.
func (f *replayFlags) headerLine(tr *trace.Opened, fleets []replay.Fleet) string {
	return fmt.Sprintf("trace %s: %s on %s%s%s", tr.Name, plural(tr.Requests, "request"), fleetsText(fleets), f.replicasText(), seedsText(f.seeds))
}

// writeOutputs writes --report (one report, or an array of every run
// with --compare or several runs) and --html, then, every output
// complete, commits each output into place.
func (f *replayFlags) writeOutputs(outs *replayOutputs, tr *trace.Opened, res *replay.SweepResult, cmp report.Comparison) error {
	if outs.report != nil {
		var v any = res.Reports
		if len(res.Reports) == 1 && len(f.compare) == 0 {
			v = res.Reports[0]
		}
		buf, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if _, err := outs.report.Write(append(buf, '\n')); err != nil {
			return fmt.Errorf("--report %s: %w", f.report, err)
		}
	}
	if outs.html != nil {
		if err := writeHTML(outs.html, f, tr.Name, tr.Requests, res.Cells, cmp); err != nil {
			return fmt.Errorf("--html %s: %w", f.html, err)
		}
	}
	// Every output is complete: only now replace the targets.
	for _, p := range []*pendingFile{outs.perReq, outs.report, outs.html} {
		if p != nil {
			if err := p.commit(); err != nil {
				return err
			}
		}
	}
	return nil
}

// seedOf is --seed when given, else nil: the file's router.seed, else
// replay.DefaultSeed (loadPolicy).
func (f *replayFlags) seedOf(fs *pflag.FlagSet) *int64 {
	if !fs.Changed("seed") {
		return nil
	}
	return &f.seed
}

// replicasText words --replicas for the header line: "" for one, else
// "; 3 router replicas, sync delay 0s, 10ms and 1s".
func (f *replayFlags) replicasText() string {
	if f.replicas <= 1 {
		return ""
	}
	ds := f.delays()
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	list := parts[0]
	if len(parts) > 1 {
		list = strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
	}
	return fmt.Sprintf("; %d router replicas, sync delay %s", f.replicas, list)
}

// fleetsText words the fleet sizes for the header line: "8 simulated
// workers", "4, 8 and 16 simulated workers", "2 prefill + 4 decode
// simulated workers", "1 simulated worker".
func fleetsText(fleets []replay.Fleet) string {
	parts := make([]string, len(fleets))
	for i, fl := range fleets {
		parts[i] = fl.String()
	}
	if len(parts) == 1 {
		if fleets[0].Workers == 1 {
			return "1 simulated worker"
		}
		return parts[0] + " simulated workers"
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1] + " simulated workers"
}

// plural is "1 request" or "n requests".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// seedsText words --seeds for the header line: "" for one run per cell,
// else "; each cell run with 5 seeds".
func seedsText(seeds int) string {
	if seeds <= 1 {
		return ""
	}
	return fmt.Sprintf("; each cell run with %d seeds (every seed of the policy + 0 to %d)", seeds, seeds-1)
}

// runName names a run in stderr summaries: its row label, with its fleet
// when the replay sweeps fleet sizes and its seed when it has several.
func runName(rep *report.Report, fleets int) string {
	name := rep.Label()
	if fleets > 1 && rep.PrefillWorkers == 0 {
		name += fmt.Sprintf(" on %d workers", rep.Workers)
	}
	if rep.Seed != nil {
		name += fmt.Sprintf(" seed %d", *rep.Seed)
	}
	return name
}

// traceHint is err, an error of trace.Open for the trace at path in
// format, saying what to do where the flags can help: a compressed trace,
// a trace that looks like the other format, an unknown extension, a path
// that is a pipe. Other errors are returned as they are.
func traceHint(err error, path string, format trace.Format) error {
	var (
		fe *trace.FormatError
		ce *trace.CompressedError
	)
	switch {
	case errors.As(err, &ce):
		err = fmt.Errorf("%w; %s", err, decompressHint(ce.Compression, path, format))
	case errors.Is(err, trace.ErrUnknownFormat) && trace.CompressionOf(path) != nil:
		err = fmt.Errorf("%s: a compressed trace; %s", path, decompressHint(*trace.CompressionOf(path), path, format))
	case errors.As(err, &fe) && (format != "" || path == "-"):
		err = fmt.Errorf("%w; use --trace-format %s", err, fe.Looks)
	case errors.As(err, &fe):
		err = fmt.Errorf("%w; use a .%s name or --trace-format %s", err, fe.Looks, fe.Looks)
	case errors.Is(err, trace.ErrUnknownFormat):
		err = fmt.Errorf("%w; or give --trace-format jsonl or --trace-format csv", err)
	case errors.Is(err, inputfile.ErrNotRegular) && !isDir(path):
		err = fmt.Errorf("%w; to replay a stream, pipe it to --trace - (with --trace-format)", err)
	}
	return err
}

// decompressHint tells how to replay a trace compressed with c: decompress
// it into --trace -, in the format given, or the one the name without the
// compression's extension has (t.jsonl.gz: jsonl).
func decompressHint(c trace.Compression, file string, format trace.Format) string {
	path := file
	if format == "" {
		if strings.EqualFold(filepath.Ext(path), c.Ext) {
			path = path[:len(path)-len(c.Ext)]
		}
		format = trace.FormatOf(path)
	}
	formatFlag := "--trace-format " + string(format)
	if format == "" {
		formatFlag = "--trace-format jsonl (or csv)"
	}
	if file == "-" {
		return fmt.Sprintf("decompress it before the router reads it: ... | %s | router replay --trace - %s", c.Decompressor, formatFlag)
	}
	return fmt.Sprintf("decompress it into standard input: %s %s | router replay --trace - %s", c.Decompressor, file, formatFlag)
}

// isDir reports whether path is a directory, symbolic links followed.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// noteNoPrefixHashes notes on w that trace traceName, of family source,
// which has no prefix hashes (an Azure or BurstGPT trace has token counts
// only), gives KV-aware policies nothing to reuse: every prompt misses the
// prefix caches.
func noteNoPrefixHashes(w io.Writer, traceName string, source trace.Source) {
	why := fmt.Sprintf("%s traces have token counts only", source)
	if source == trace.SourceMooncake {
		why = "its requests carry no hash_ids"
	}
	fmt.Fprintf(w, "router: note: trace %s has no prefix hashes (%s): "+
		"KV-aware policies (those reading CACHE, such as the default kv-affinity) cannot use prefix reuse on it, and KV hit is 0%%\n", traceName, why)
}

// writeHTML writes the HTML report of cells to w (htmlreport.Write),
// with the command line that made it.
func writeHTML(w io.Writer, f *replayFlags, traceName string, requests int, cells []report.Cell, cmp report.Comparison) error {
	return htmlreport.Write(w, htmlreport.Input{
		Trace:      traceName,
		Requests:   requests,
		Cells:      cells,
		Comparison: cmp,
		SLO:        f.slo,
		Command:    commandLine(f.cmd),
	})
}

// commandLine is cmd as it was given, to run again from a shell: its path
// and the flags set, in flag order, each --name value (lists
// comma-separated, values quoted for a POSIX shell where needed), a
// boolean one --name, or --name=false.
func commandLine(cmd *cobra.Command) string {
	parts := []string{cmd.CommandPath()}
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		v := fl.Value.String()
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		switch {
		case fl.Value.Type() == "bool" && v == "true":
			parts = append(parts, "--"+fl.Name)
		case fl.Value.Type() == "bool":
			parts = append(parts, "--"+fl.Name+"="+v)
		default:
			parts = append(parts, "--"+fl.Name, shellQuote(v))
		}
	})
	return strings.Join(parts, " ")
}

// shellQuote is s as one word of a POSIX shell: as it is when it holds
// only characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./,:=+@%", r))
	}) < 0
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
