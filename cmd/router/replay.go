package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/bundled"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// replayFlags are the flags of router replay.
type replayFlags struct {
	policy      string
	trace       string
	traceFormat string
	workers     int
	prefill     int
	decode      int
	seed        int64
	limit       int
	perRequest  string
	report      string
	compare     []string
	// prefix is --prefix: approximate, precise or both; kvEventDelay the
	// precise runs' KV event delay.
	prefix       string
	kvEventDelay time.Duration
	// failOnFallback makes any fallback a failure (exit 1), after the
	// outputs are written.
	failOnFallback bool
	// memoryLimit is --memory-limit, MiB; 0 leaves the Go runtime's.
	memoryLimit int
	// quiet is --quiet: no progress on stderr (see progress).
	quiet bool
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
names (jsonl or csv; required then). --per-request - or --report - writes that
output to standard output, and the table then goes to standard error.

The fleet is at most 4096 simulated workers in all. --per-request and
--report are written atomically, only when the whole run succeeds. Requests
the policy rejects are counted in the table (and summarised on stderr); they
do not change the exit status, which is 0 on success, 1 when the run fails
and 2 on a usage error. Selections a policy's fallback made because the
policy failed (a plugin's error, panic, timeout, restart...) are counted in
the table's fallbacks column, and stderr ends with one line per plugin that
caused them, by cause, with the first error; with --fail-on-fallback any
fallback makes the exit status 1.

--prefix precise routes by the simulated engines' KV events instead of the
router's own record of what it sent: each engine publishes the prefix blocks
it stores and evicts, and the router applies them --kv-event-delay later
through the same precise index router serve uses. --prefix both runs every
policy both ways, in rows NAME and NAME+precise, with a belief column: the
share of requests whose router belief of the chosen worker's cached prefix
equals what the engine served. The full reference is docs/replay.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplay(cmd, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policy, "policy", "", "HCL policy file (default: the built-in default policy)")
	fl.StringVar(&f.trace, "trace", "", "trace file: Mooncake .jsonl, or Azure or BurstGPT .csv, or - for standard input (default: the bundled conversation trace)")
	fl.StringVar(&f.traceFormat, "trace-format", "", "trace format, jsonl (Mooncake) or csv (Azure 2023 or 2024, or BurstGPT: the CSV header tells which), in place of the file's extension; required with --trace -")
	fl.IntVar(&f.workers, "workers", replay.DefaultWorkers,
		fmt.Sprintf("number of simulated aggregated workers, at most %d", replay.MaxWorkers))
	fl.IntVar(&f.prefill, "prefill-workers", 0,
		fmt.Sprintf("number of simulated prefill workers (disaggregated serving; needs --decode-workers; at most %d with them)", replay.MaxWorkers))
	fl.IntVar(&f.decode, "decode-workers", 0,
		fmt.Sprintf("number of simulated decode workers (disaggregated serving; needs --prefill-workers; at most %d with them)", replay.MaxWorkers))
	// The zero default is not used: the flag applies only when given (see
	// loadPolicy), and a zero default keeps pflag from printing "(default 0)".
	fl.Int64Var(&f.seed, "seed", 0,
		fmt.Sprintf("seed for seeded components that set none (default: the file's router.seed, else %d)", replay.DefaultSeed))
	fl.IntVar(&f.limit, "limit", 0, "replay only the first N requests (0: all)")
	fl.StringVar(&f.perRequest, "per-request", "", "write one JSON line per request to FILE, or - for standard output (not with --compare)")
	fl.StringVar(&f.report, "report", "", "write the summary as JSON to FILE, or - for standard output (a JSON array with --compare or --prefix both)")
	fl.StringSliceVar(&f.compare, "compare", nil, "run each policy file FILE,FILE,... on the same trace and print one table (not with --policy)")
	fl.StringVar(&f.prefix, "prefix", "approximate", "how the router learns what the engines cache: approximate (what it sent them), precise (their KV events) or both (each policy twice)")
	fl.DurationVar(&f.kvEventDelay, "kv-event-delay", replay.DefaultKVEventDelay,
		"simulated time from an engine's cache change to the router applying its KV event (--prefix precise or both; default: one engine step)")
	fl.BoolVar(&f.failOnFallback, "fail-on-fallback", false, "exit 1 when any selection was decided by a fallback because its policy failed (outputs are still written)")
	fl.IntVar(&f.memoryLimit, "memory-limit", DefaultReplayMemoryLimit,
		"soft limit on the Go heap in MiB (runtime/debug.SetMemoryLimit), set unless GOMEMLIMIT is in the environment; 0: none")
	fl.BoolVar(&f.quiet, "quiet", false, "show no progress on stderr (shown when a replay takes over 2 s: requests done of total, simulated time, ETA)")
	setWant(fl, "workers", fmt.Sprintf("a whole number from 1 to %d", replay.MaxWorkers))
	for _, name := range []string{"prefill-workers", "decode-workers"} {
		setWant(fl, name, fmt.Sprintf("a whole number from 1 to %d (prefill and decode workers together)", replay.MaxWorkers))
	}
	setWant(fl, "seed", fmt.Sprintf("a whole number from %d to %d", math.MinInt64, math.MaxInt64))
	setWant(fl, "limit", fmt.Sprintf("a whole number from 0 (all) to %d", math.MaxInt))
	setWant(fl, "memory-limit", fmt.Sprintf("MiB, a whole number from 0 (no limit) to %d", 1<<30))
	setWant(fl, "compare", "a comma-separated list of policy files")
	setWant(fl, "kv-event-delay", "a duration >= 0 such as 20ms or 1s")
	return cmd
}

// noArgs rejects positional arguments, saying so: cobra.NoArgs words them
// as an unknown command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q; see '%s --help'", cmd.CommandPath(), args, cmd.CommandPath())
	}
	return nil
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
	} {
		if fs.Changed(c.flag) && c.value == "" {
			return fmt.Errorf("--%s '': want a file name%s", c.flag, c.hint)
		}
	}
	if err := f.checkStreams(cmd); err != nil {
		return err
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
	disagg := f.disaggregated(cmd)
	switch {
	case disagg && fs.Changed("workers"):
		return errors.New("--workers sets aggregated workers: it cannot be combined with --prefill-workers or --decode-workers")
	case disagg && (!fs.Changed("prefill-workers") || !fs.Changed("decode-workers")):
		return errors.New("disaggregated serving needs both --prefill-workers and --decode-workers")
	case disagg && f.prefill < 1:
		return fmt.Errorf("--prefill-workers %d: want a whole number from 1 to %d (prefill and decode workers together)", f.prefill, replay.MaxWorkers)
	case disagg && f.decode < 1:
		return fmt.Errorf("--decode-workers %d: want a whole number from 1 to %d (prefill and decode workers together)", f.decode, replay.MaxWorkers)
	case disagg && f.prefill > replay.MaxWorkers:
		return fmt.Errorf("--prefill-workers %d: want at most %d simulated workers in all", f.prefill, replay.MaxWorkers)
	case disagg && f.decode > replay.MaxWorkers:
		return fmt.Errorf("--decode-workers %d: want at most %d simulated workers in all", f.decode, replay.MaxWorkers)
	case disagg && f.prefill+f.decode > replay.MaxWorkers:
		return fmt.Errorf("--prefill-workers %d + --decode-workers %d = %d simulated workers: want at most %d in all",
			f.prefill, f.decode, f.prefill+f.decode, replay.MaxWorkers)
	case f.memoryLimit < 0 || f.memoryLimit > 1<<30:
		return fmt.Errorf("--memory-limit %d: want MiB from 0 (no limit) to %d", f.memoryLimit, 1<<30)
	case f.workers < 1:
		return fmt.Errorf("--workers %d: want a whole number from 1 to %d", f.workers, replay.MaxWorkers)
	case f.workers > replay.MaxWorkers:
		return fmt.Errorf("--workers %d: want a whole number from 1 to %d", f.workers, replay.MaxWorkers)
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
	case f.perRequest == "-" && f.report == "-":
		return errors.New("--per-request - and --report - cannot both write to standard output: give one of them a file")
	}
	return nil
}

// disaggregated reports whether the flags ask for prefill and decode pools.
func (f *replayFlags) disaggregated(cmd *cobra.Command) bool {
	fs := cmd.Flags()
	return fs.Changed("prefill-workers") || fs.Changed("decode-workers")
}

// checkPaths refuses an output that would overwrite an input or the other
// output. "-" (standard input or output) is no path.
func (f *replayFlags) checkPaths() error {
	type named struct{ flag, path string }
	var inputs, outputs []named
	for _, in := range []named{{"--trace", f.trace}, {"--policy", f.policy}} {
		if in.path != "" && in.path != "-" {
			inputs = append(inputs, in)
		}
	}
	for _, p := range f.compare {
		inputs = append(inputs, named{"--compare", p})
	}
	for _, out := range []named{{"--per-request", f.perRequest}, {"--report", f.report}} {
		if out.path != "" && out.path != "-" {
			outputs = append(outputs, out)
		}
	}
	for i, out := range outputs {
		for _, in := range inputs {
			if samePath(out.path, in.path) {
				return fmt.Errorf("%s %s is the %s input %s: choose another output file", out.flag, out.path, in.flag, in.path)
			}
		}
		for _, other := range outputs[i+1:] {
			if samePath(out.path, other.path) {
				return fmt.Errorf("%s %s and %s %s are the same file: choose two files", out.flag, out.path, other.flag, other.path)
			}
		}
	}
	return nil
}

// runReplay runs router replay: it checks the flags, creates the outputs'
// temporary files, loads the trace and every policy, replays each policy,
// prints the table and rejection summaries, and only then writes and
// renames the outputs into place.
func runReplay(cmd *cobra.Command, f *replayFlags) error {
	fs := cmd.Flags()
	if err := f.check(cmd); err != nil {
		return err // a usage error: exit 2
	}
	if _, env := os.LookupEnv("GOMEMLIMIT"); f.memoryLimit > 0 && (fs.Changed("memory-limit") || !env) {
		debug.SetMemoryLimit(int64(f.memoryLimit) << 20)
	}
	disagg := f.disaggregated(cmd)
	stderr := cmd.ErrOrStderr()

	// Create the outputs' temporary files first, so an unwritable output
	// fails before any work, and remove them on every failure below.
	var perReq, report *pendingFile
	defer func() { perReq.abort(); report.abort() }()
	var err error
	if f.perRequest != "" {
		if perReq, err = createOutput("--per-request", f.perRequest, cmd.OutOrStdout()); err != nil {
			return &exitError{code: 1, err: err}
		}
	}
	if f.report != "" {
		if report, err = createOutput("--report", f.report, cmd.OutOrStdout()); err != nil {
			return &exitError{code: 1, err: err}
		}
	}

	tr, err := loadTrace(f.trace, trace.Format(f.traceFormat), cmd.InOrStdin(), f.limit, heldRecords)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	traceName := tr.name
	if !tr.hashes {
		noteNoPrefixHashes(stderr, traceName, tr.source)
	}
	noteFailedRequests(stderr, tr)
	var seed *int64
	if fs.Changed("seed") {
		seed = &f.seed
	}
	paths := f.compare
	if len(paths) == 0 {
		paths = []string{f.policy}
	}
	roles := []shared.Role{shared.RoleAggregated}
	if disagg {
		roles = []shared.Role{shared.RolePrefill, shared.RoleDecode}
	}
	modes, _ := f.prefixModes() // checked
	// One run per policy and prefix mode, policy by policy. Load every
	// policy before replaying any, so a broken file fails at once and the
	// warnings come before the table; each run gets its own load, so that
	// seeded components start from their seed in every run. Each file's
	// plugin processes live until the command returns, and are stopped,
	// with their process groups, before it does. Nothing of their Hosts
	// may depend on the wall clock (router.LoadOptions.SimulatedTime).
	type replayRun struct {
		path   string
		mode   replay.PrefixMode
		bundle *router.Bundle
	}
	runs := make([]replayRun, 0, len(paths)*len(modes))
	defer func() {
		for _, r := range runs {
			closeBundle(r.bundle)
		}
	}()
	for _, path := range paths {
		for k, mode := range modes {
			warnings := stderr
			if k > 0 {
				warnings = io.Discard // said once per file
			}
			b, err := loadPolicy(cmd.Context(), warnings, path, seed)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			runs = append(runs, replayRun{path, mode, b})
			if path != "" && k == 0 {
				warnDefaultRoles(stderr, path, b, roles)
			}
		}
	}

	var reports []*replay.Report
	prog := newProgress(stderr, f.quiet, len(runs), tr.requests)
	for i, run := range runs {
		path, b := run.path, run.bundle
		opts := replay.Options{
			PolicyName:   policyName(path),
			Roles:        b.Roles(),
			RolePolicies: b.RolePolicies(),
			BlockSize:    b.BlockSize(),
			TraceName:    traceName,
			Records:      tr.records,
			Trace:        tr.stream,
			Prefix:       run.mode,
		}
		if run.mode == replay.PrefixPrecise {
			opts.KVEventDelay = f.kvEventDelay
		}
		if opts.Queue, opts.Classifier, err = admission(b); err != nil {
			return &exitError{code: 1, err: err}
		}
		opts.DecisionLatency.Policies, opts.DecisionLatency.Classifier = b.ReplayDecisionLatency()
		if disagg {
			opts.PrefillWorkers, opts.DecodeWorkers = f.prefill, f.decode
		} else {
			opts.Workers = f.workers
		}
		if perReq != nil {
			opts.PerRequest = perReq
		}
		if prog != nil {
			label := opts.PolicyName
			if run.mode == replay.PrefixPrecise {
				label += "+precise" // as the table's row
			}
			prog.startRun(i, label)
			opts.Progress = prog.update
		}
		restartsBefore := pluginRestarts(b)
		rep, err := replay.Run(cmd.Context(), opts)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		settlePlugins(cmd.Context(), b)
		rep.PluginRestarts = pluginRestarts(b) - restartsBefore
		reports = append(reports, rep)
	}
	prog.finish()

	out := cmd.OutOrStdout()
	if f.perRequest == "-" || f.report == "-" {
		out = stderr // standard output carries the JSON
	}
	if disagg {
		fmt.Fprintf(out, "trace %s: %d requests on %d prefill + %d decode simulated workers\n", traceName, tr.requests, f.prefill, f.decode)
	} else {
		fmt.Fprintf(out, "trace %s: %d requests on %d simulated workers\n", traceName, tr.requests, f.workers)
	}
	if err := replay.WriteTable(out, reports); err != nil {
		return &exitError{code: 1, err: err}
	}
	for _, rep := range reports {
		if rep.Rejected > 0 {
			reason, n := rep.TopRejection()
			fmt.Fprintf(stderr, "router: %s: %d of %d requests rejected; most common reason (%d): %s\n",
				rep.Label(), rep.Rejected, rep.Requests, n, reason)
		}
	}

	if report != nil {
		var v any = reports
		if len(reports) == 1 && len(f.compare) == 0 {
			v = reports[0]
		}
		buf, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		if _, err := report.Write(append(buf, '\n')); err != nil {
			return &exitError{code: 1, err: fmt.Errorf("--report %s: %w", f.report, err)}
		}
	}
	// Both outputs are complete: only now replace the targets.
	for _, p := range []*pendingFile{perReq, report} {
		if p != nil {
			if err := p.commit(); err != nil {
				return &exitError{code: 1, err: err}
			}
		}
	}
	var fellBack int64
	for _, rep := range reports {
		fellBack += rep.Fallbacks
		if err := replay.WriteFallbacks(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
		if err := replay.WriteShadowFailures(stderr, rep); err != nil {
			return &exitError{code: 1, err: err}
		}
	}
	if f.failOnFallback && fellBack > 0 {
		return &exitError{code: 1, err: fmt.Errorf("--fail-on-fallback: %d selections were decided by a fallback policy", fellBack)}
	}
	return nil
}

// admission returns the queue block and the request classifier of b for
// replay.Options: the queue only when the file has a queue block (the
// default queue has a zero Range), so that a file without one replays
// exactly as before, and the classifier's factory when the file has a
// request_classifier.
func admission(b *router.Bundle) (config.Queue, shared.ClassifierFactory, error) {
	var q config.Queue
	if bq := b.Queue(); bq.Range.Filename != "" {
		q = bq
	}
	f, err := b.Classifier()
	return q, f, err
}

// policyName labels a policy file in the table and the report: its base
// name without the extension, or "default" for the built-in policy.
func policyName(path string) string {
	if path == "" {
		return config.DefaultPolicyName
	}
	return strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
}

// warnDefaultRoles warns when a role the replay routes for runs the
// built-in default policy although a policy file was given, which is what
// happens when the file's worker_selection does not set the role: replaying
// round-robin.hcl disaggregated would otherwise silently compare the
// default policy.
func warnDefaultRoles(w io.Writer, path string, b *router.Bundle, roles []shared.Role) {
	var fell []string
	for _, role := range roles {
		if b.PolicyName(role) == config.DefaultPolicyName {
			fell = append(fell, string(role))
		}
	}
	if len(fell) == 0 {
		return
	}
	subject, them := "role "+fell[0]+" runs", "it"
	if len(fell) > 1 {
		subject, them = "roles "+strings.Join(fell, " and ")+" run", "them"
	}
	fmt.Fprintf(w, "router: warning: %s: %s the built-in default policy %q (%s + %s), not one of the file's policies; "+
		"set %s in worker_selection to replay the file's policy (the table row marks %s %q)\n",
		path, subject, config.DefaultPolicyName, config.DefaultScorerType, config.DefaultPickerType, them, them, config.DefaultPolicyName)
}

// replayTrace is the trace of a replay, read once by loadTrace to check
// it. A trace of at most heldRecords requests, and one from standard
// input (which cannot be read twice), is then held in memory; a longer
// trace file is read again, as a stream, by each run, so that it is never
// held whole.
type replayTrace struct {
	name     string                          // for the table
	records  []trace.Record                  // the requests replayed, when held; else nil
	stream   iter.Seq2[*trace.Record, error] // a file's requests, when not held; else nil
	requests int                             // the number of requests replayed (--limit applied)
	hashes   bool                            // some request replayed has prefix hashes
	source   trace.Source                    // the trace family, as its records say
	failed   int                             // requests replayed that failed in the recording (see failedInRecording)
}

// loadTrace reads the trace at path in format (by path's extension when
// format is empty), stdin when path is "-", or the bundled conversation
// trace when path is empty, and checks every line. limit > 0 keeps only
// the first limit requests (every line is checked all the same); up to
// hold of them are held in memory (see replayTrace). Its
// errors say what to do where the flags can help: a trace that looks like
// the other format, an unknown extension, a path that is a pipe. A file
// that changes between this check and a run's reading fails or replays
// what it then holds.
func loadTrace(path string, format trace.Format, stdin io.Reader, limit, hold int) (*replayTrace, error) {
	tr := &replayTrace{name: filepath.Base(path)}
	var err error
	switch {
	case path == "":
		var b []byte
		if b, err = bundled.ConversationTrace(); err != nil {
			return nil, err
		}
		tr.name = bundled.Name + " (bundled)"
		tr.stream = func(yield func(*trace.Record, error) bool) {
			for rec, err := range trace.Records(bytes.NewReader(b), bundled.Name, trace.Mooncake) {
				if !yield(rec, err) {
					return
				}
			}
		}
	case path == "-":
		tr.name = "stdin"
		tr.records, err = trace.ReadAs(stdin, tr.name, format)
	case format != "":
		tr.stream = trace.FileRecords(path, format)
	default:
		tr.stream = trace.FileRecords(path, trace.FormatOf(path))
	}
	if tr.stream != nil {
		if err = tr.check(limit, hold); tr.records != nil {
			tr.stream = nil
		} else {
			tr.stream = limited(tr.stream, limit)
		}
	} else if err == nil {
		if limit > 0 && limit < len(tr.records) {
			tr.records = tr.records[:limit]
		}
		tr.requests = len(tr.records)
		for i := range tr.records {
			tr.note(&tr.records[i])
		}
	}
	var (
		fe *trace.FormatError
		ce *trace.CompressedError
	)
	switch {
	case errors.As(err, &ce):
		err = fmt.Errorf("%w; %s", err, decompressHint(ce.Compression, path, format))
	case errors.Is(err, trace.ErrUnknownFormat) && compressionOf(path) != nil:
		err = fmt.Errorf("%s: a compressed trace; %s", path, decompressHint(*compressionOf(path), path, format))
	case errors.As(err, &fe) && (format != "" || path == "-"):
		err = fmt.Errorf("%w; use --trace-format %s", err, fe.Looks)
	case errors.As(err, &fe):
		err = fmt.Errorf("%w; use a .%s name or --trace-format %s", err, fe.Looks, fe.Looks)
	case errors.Is(err, trace.ErrUnknownFormat):
		err = fmt.Errorf("%w; or give --trace-format jsonl or --trace-format csv", err)
	case errors.Is(err, inputfile.ErrNotRegular) && !isDir(path):
		err = fmt.Errorf("%w; to replay a stream, pipe it to --trace - (with --trace-format)", err)
	}
	if err != nil {
		return nil, err
	}
	return tr, nil
}

// heldRecords is the most requests of a trace file router replay holds in
// memory after checking it (about 20 MB of Mooncake records), so that a
// trace of that size, such as the bundled one, is parsed once; a longer
// one is read again by each run.
const heldRecords = 1 << 16

// check reads tr.stream through: it returns the first error, and counts
// the requests among the first limit (all when limit <= 0), notes their
// prefix hashes and, when they are at most hold, keeps them in
// tr.records.
func (tr *replayTrace) check(limit, hold int) error {
	for rec, err := range tr.stream {
		if err != nil {
			tr.records = nil
			return err
		}
		if limit <= 0 || tr.requests < limit {
			tr.requests++
			tr.note(rec)
			if tr.requests <= hold {
				tr.records = append(tr.records, *rec)
			} else {
				tr.records = nil
			}
		}
	}
	return nil
}

// limited is seq's first limit records (all of them when limit <= 0).
func limited(seq iter.Seq2[*trace.Record, error], limit int) iter.Seq2[*trace.Record, error] {
	if limit <= 0 {
		return seq
	}
	return func(yield func(*trace.Record, error) bool) {
		n := 0
		for rec, err := range seq {
			if n == limit || !yield(rec, err) {
				return
			}
			n++
		}
	}
}

// compressionOf returns the compression path's extension names
// (t.jsonl.gz: gzip), or nil.
func compressionOf(path string) *trace.Compression {
	ext := strings.ToLower(filepath.Ext(path))
	for i, c := range trace.Compressions {
		if c.Ext == ext {
			return &trace.Compressions[i]
		}
	}
	return nil
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

// loadPolicy loads the policy file at path (the default policy when empty)
// for a replay, printing warnings to stderr. seed, when set, overrides
// router.seed; when neither gives one, replay.DefaultSeed seeds the
// policy, so a replay repeats exactly by default.
func loadPolicy(ctx context.Context, stderr io.Writer, path string, seed *int64) (*router.Bundle, error) {
	def := int64(replay.DefaultSeed)
	b, err := loadBundle(ctx, stderr, path, router.LoadOptions{Seed: seed, DefaultSeed: &def, SimulatedTime: true})
	if err != nil {
		name := path
		if path == "" {
			name = config.DefaultPolicyName
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// pluginRestarts sums the restarts of b's plugins.
func pluginRestarts(b *router.Bundle) int64 {
	var n int64
	for _, p := range b.Plugins() {
		n += p.Stats.Restarts
	}
	return n
}

// settleTimeout bounds how long a replay waits, after its last request,
// for plugins that are restarting.
const settleTimeout = 5 * time.Second

// settlePlugins waits (up to settleTimeout) until none of b's plugins is
// restarting. A replay runs far faster than real time, so a plugin killed
// part way through is often still in its restart backoff when the last
// request is decided; waiting lets the report count the restart the
// failure set off rather than race it.
func settlePlugins(ctx context.Context, b *router.Bundle) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for slices.ContainsFunc(b.Plugins(), func(p router.PluginState) bool { return p.Status == supervisor.StatusRestarting }) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
