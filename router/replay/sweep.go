package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// Fleet is one fleet size of a sweep: Workers aggregated workers, or
// Prefill prefill and Decode decode workers (Workers 0).
type Fleet struct{ Workers, Prefill, Decode int }

// String is the fleet as router replay's header line says it: "8", or
// "2 prefill + 4 decode".
func (fl Fleet) String() string {
	if fl.Workers > 0 {
		return strconv.Itoa(fl.Workers)
	}
	return fmt.Sprintf("%d prefill + %d decode", fl.Prefill, fl.Decode)
}

// Disaggregated reports whether fl has prefill and decode pools.
func (fl Fleet) Disaggregated() bool { return fl.Workers == 0 }

// LoadFunc loads the policy file at path (the built-in default policy
// when path is "") with o for one run of a sweep, writing the file's
// diagnostics and warnings to warnings. The Sweep fills o's seeds and
// SimulatedTime; the function adds what the caller owns (a Logger for the
// plugins' logs). Its error need not name the file: the Sweep prefixes
// the name.
type LoadFunc func(ctx context.Context, path string, o loader.LoadOptions, warnings io.Writer) (*loader.Bundle, error)

// Sweep is a replay experiment: every policy file on every fleet, in
// every prefix mode and sync delay, each such cell run Seeds times on the
// same trace. Run replays it; the cells' table, baselines and goodput
// verdicts are Comparison's (WriteComparison, SmallestFleets).
type Sweep struct {
	// Trace is the trace every run replays (trace.Open).
	Trace *trace.Opened
	// Policies are the policy files, in table order; "" is the built-in
	// default policy. At least one.
	Policies []string
	// Fleets are the fleet sizes, in table order (the outermost loop).
	// At least one, all aggregated or all disaggregated.
	Fleets []Fleet
	// Modes are the prefix modes each policy runs in, in table order; nil
	// is PrefixApproximate alone.
	Modes []PrefixMode
	// KVEventDelay is the precise runs' Options.KVEventDelay.
	KVEventDelay time.Duration
	// Replicas is the number of router replicas (Options.Replicas); 0 or
	// 1 is one router.
	Replicas int
	// Delays are the replicas' sync delays (Options.SyncDelay), one run
	// each; nil is one run with none.
	Delays []time.Duration
	// Seeds is the number of runs of each cell: run k adds k to every
	// seed of the policy (loader.LoadOptions.SeedOffset). 0 is 1.
	Seeds int
	// Seed, when set, replaces every file's router.seed; a file without
	// one is seeded with DefaultSeed, so a sweep repeats exactly.
	Seed *int64
	// SLO, Timeline and PerRequest are each run's Options fields of the
	// same name. PerRequest suits a sweep of one run only.
	SLO        report.SLO
	Timeline   bool
	PerRequest io.Writer
	// Canary is every run's Options.Canary: the zero value runs the
	// files' canaries as declared.
	Canary Canary
	// Speeds is the fleets' speed pattern: on each fleet, worker i of
	// each pool (the aggregated workers; or the prefill workers, and the
	// decode workers, each counted from 0) runs at Speeds[i mod
	// len(Speeds)] (CycleSpeeds, Options.Speeds). nil, or all 1, is every
	// worker at speed 1.
	Speeds []float64
	// Failures are every run's engine failures (Options.Failures), their
	// Seed replaced by each run's policy seed (router.seed with the run's
	// offset, DefaultSeed without), so runs of other seeds draw other
	// random failures; nil: none.
	Failures *Failures
	// Load loads a policy file for a run. Required.
	Load LoadFunc
	// Warnings receives the policy files' diagnostics (their first load)
	// and a warning for each role a policy file leaves to the built-in
	// default policy (its worker_selection does not set the role); nil
	// discards them.
	Warnings io.Writer
	// StartRun, when set, is told before each run its index (0-based, in
	// table order) and label: its row's (NAME, NAME+precise, NAME/N@D),
	// with " on F workers" when there are several fleets and " seed +k"
	// when there are several seeds. Progress is each run's
	// Options.Progress.
	StartRun func(run int, label string)
	Progress func(Progress)
}

// SweepResult is what a Sweep replayed: one Cell per policy file, fleet,
// prefix mode and sync delay, in table order (fleet-major), each with one
// Report per seed, and every Report in run order.
type SweepResult struct {
	Cells   []report.Cell
	Reports []*report.Report
}

// closeTimeout bounds how long a sweep waits for a bundle's plugins to
// stop, whatever context it had.
const closeTimeout = 5 * time.Second

// modes is s.Modes, or PrefixApproximate alone.
func (s *Sweep) modes() []PrefixMode {
	if len(s.Modes) == 0 {
		return []PrefixMode{PrefixApproximate}
	}
	return s.Modes
}

// delays is s.Delays, or one run with none.
func (s *Sweep) delays() []time.Duration {
	if len(s.Delays) == 0 {
		return []time.Duration{0}
	}
	return s.Delays
}

// seeds is s.Seeds, at least 1.
func (s *Sweep) seeds() int { return max(s.Seeds, 1) }

// Runs is how many replays Run makes: policies x fleets x modes x delays
// x seeds.
func (s *Sweep) Runs() int {
	return len(s.Policies) * len(s.Fleets) * len(s.modes()) * len(s.delays()) * s.seeds()
}

// Run replays the sweep. It loads every policy file once before replaying
// any, so that a broken file fails at once and its warnings come before
// the first run; that load serves the file's first run. Every other run
// loads its own copy, so that seeded components start from their seed in
// every run, and each further replica loads the file again, so that it has
// policies (and plugin processes) of its own. A run closes what it loaded,
// stopping its plugin processes, when it ends. ctx cancels between
// requests. Errors: an invalid sweep, the first load or run error, the
// policy file named.
func (s *Sweep) Run(ctx context.Context) (*SweepResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	warnings := s.Warnings
	if warnings == nil {
		warnings = io.Discard
	}
	roles := []shared.Role{shared.RoleAggregated}
	if s.Fleets[0].Disaggregated() {
		roles = []shared.Role{shared.RolePrefill, shared.RoleDecode}
	}
	loaded := make(map[string]*loader.Bundle, len(s.Policies))
	defer func() {
		for _, b := range loaded {
			closeBundle(b)
		}
	}()
	for _, path := range s.Policies {
		b, err := s.load(ctx, warnings, path, 0)
		if err != nil {
			return nil, err
		}
		loaded[path] = b
		if path != "" {
			warnDefaultRoles(warnings, path, b, roles)
		}
	}
	res := &SweepResult{}
	for _, fl := range s.Fleets {
		for _, path := range s.Policies {
			for _, mode := range s.modes() {
				for _, delay := range s.delays() {
					var cell report.Cell
					for k := range s.seeds() {
						if s.StartRun != nil {
							s.StartRun(len(res.Reports), runLabel(path, mode, fl, len(s.Fleets), k, s.seeds())+s.replicasLabel(delay))
						}
						rep, err := s.runOne(ctx, loaded, path, mode, fl, k, delay)
						if err != nil {
							return nil, err
						}
						cell.Runs = append(cell.Runs, rep)
						res.Reports = append(res.Reports, rep)
					}
					res.Cells = append(res.Cells, cell)
				}
			}
		}
	}
	return res, nil
}

// check reports what makes s unable to run.
func (s *Sweep) check() error {
	switch {
	case s.Trace == nil:
		return errors.New("replay sweep: no trace")
	case s.Load == nil:
		return errors.New("replay sweep: no Load function")
	case len(s.Policies) == 0:
		return errors.New("replay sweep: no policy file")
	case len(s.Fleets) == 0:
		return errors.New("replay sweep: no fleet")
	}
	if len(s.Speeds) > MaxWorkers {
		return fmt.Errorf("replay sweep: %d speeds, want at most %d (MaxWorkers)", len(s.Speeds), MaxWorkers)
	}
	for i, v := range s.Speeds {
		if err := sim.CheckSpeed(v); err != nil {
			return fmt.Errorf("replay sweep: speed %d of %d: %w", i+1, len(s.Speeds), err)
		}
	}
	for _, fl := range s.Fleets[1:] {
		if fl.Disaggregated() != s.Fleets[0].Disaggregated() {
			return fmt.Errorf("replay sweep: fleets %s and %s: want all aggregated or all disaggregated", s.Fleets[0], fl)
		}
	}
	return nil
}

// load loads the policy file at path for a run (s.Load), writing its
// warnings to warnings: seeded by s.Seed, else the file's router.seed,
// else DefaultSeed, every seed moved by offset (run k of Seeds loads with
// offset k), with SimulatedTime set.
func (s *Sweep) load(ctx context.Context, warnings io.Writer, path string, offset int64) (*loader.Bundle, error) {
	def := int64(DefaultSeed)
	b, err := s.Load(ctx, path, loader.LoadOptions{Seed: s.Seed, DefaultSeed: &def, SeedOffset: offset, SimulatedTime: true}, warnings)
	if err != nil {
		name := path
		if path == "" {
			name = config.DefaultPolicyName
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// runOne replays the trace once: policy file path in prefix mode on fleet
// fl, with run k's seeds, with sync delay delay between the replicas. The
// run takes the file's bundle from loaded when it is there (the first run
// of each file), else loads its own; either is closed when the run ends,
// as are the other replicas' loads of the file.
func (s *Sweep) runOne(ctx context.Context, loaded map[string]*loader.Bundle, path string,
	mode PrefixMode, fl Fleet, k int, delay time.Duration) (*report.Report, error) {
	b, ok := loaded[path]
	if ok && k == 0 {
		delete(loaded, path)
	} else {
		var err error
		// The file's warnings were said by its first load.
		if b, err = s.load(ctx, io.Discard, path, int64(k)); err != nil {
			return nil, err
		}
	}
	defer closeBundle(b)
	opts, err := s.options(b, path, mode, fl)
	if err != nil {
		return nil, err
	}
	var more []*loader.Bundle // the other replicas' loads of the file
	defer func() {
		for _, b := range more {
			closeBundle(b)
		}
	}()
	if s.Replicas > 1 {
		opts.Replicas, opts.SyncDelay = s.Replicas, delay
		opts.Replica = func(int) (Replica, error) {
			rb, err := s.load(ctx, io.Discard, path, int64(k))
			if err != nil {
				return Replica{}, err
			}
			more = append(more, rb)
			_, cls, err := bundleAdmission(rb)
			return Replica{Roles: rb.Roles(), Classifier: cls}, err
		}
	}
	restartsBefore := pluginRestarts(b)
	rep, err := Run(ctx, opts)
	if err != nil {
		return nil, err
	}
	settlePlugins(ctx, b)
	rep.PluginRestarts = pluginRestarts(b) - restartsBefore
	for _, rb := range more { // loaded by this run: every restart is its
		settlePlugins(ctx, rb)
		rep.PluginRestarts += pluginRestarts(rb)
	}
	if s.seeds() > 1 {
		rep.Seed = b.PolicyFile().Seed
	}
	return rep, nil
}

// options are the Options of one run of policy file path, loaded as b, in
// prefix mode on fleet fl.
func (s *Sweep) options(b *loader.Bundle, path string, mode PrefixMode, fl Fleet) (Options, error) {
	opts := Options{
		PolicyName:     PolicyName(path),
		Roles:          b.Roles(),
		RolePolicies:   b.RolePolicies(),
		BlockSize:      b.BlockSize(),
		TraceName:      s.Trace.Name,
		Records:        s.Trace.Records,
		Trace:          s.Trace.Stream,
		Prefix:         mode,
		Workers:        fl.Workers,
		PrefillWorkers: fl.Prefill,
		DecodeWorkers:  fl.Decode,
		SLO:            s.SLO,
		Timeline:       s.Timeline,
		PerRequest:     s.PerRequest,
		Progress:       s.Progress,
		Canary:         s.Canary,
		Speeds:         fleetSpeeds(s.Speeds, fl),
	}
	if mode == PrefixPrecise {
		opts.KVEventDelay = s.KVEventDelay
	}
	if s.Failures != nil {
		f := *s.Failures
		if seed := b.PolicyFile().Seed; seed != nil {
			f.Seed = *seed
		}
		opts.Failures = &f
	}
	var err error
	if opts.Queue, opts.Classifier, err = bundleAdmission(b); err != nil {
		return Options{}, err
	}
	opts.DecisionLatency.Policies, opts.DecisionLatency.Classifier = b.ReplayDecisionLatency()
	return opts, nil
}

// fleetSpeeds is the per-worker Options.Speeds of fleet fl with speed
// pattern p (Sweep.Speeds): cycled over the aggregated workers, or over
// the prefill workers and again over the decode workers. nil when every
// speed is 1.
func fleetSpeeds(p []float64, fl Fleet) []float64 {
	if !fl.Disaggregated() {
		return CycleSpeeds(p, fl.Workers)
	}
	pre := CycleSpeeds(p, fl.Prefill)
	if pre == nil {
		return nil
	}
	return append(pre, CycleSpeeds(p, fl.Decode)...)
}

// replicasLabel is what a run's label adds for its replicas: "/3@10ms" as
// the table's row says it, "" with one replica.
func (s *Sweep) replicasLabel(delay time.Duration) string {
	if s.Replicas <= 1 {
		return ""
	}
	return fmt.Sprintf("/%d@%v", s.Replicas, delay)
}

// runLabel names a run for a progress line: its table row's label (NAME,
// NAME+precise), with its fleet when there are several (fleets > 1) and
// its seed offset k when there are several seeds.
func runLabel(path string, mode PrefixMode, fl Fleet, fleets, k, seeds int) string {
	label := PolicyName(path)
	if mode == PrefixPrecise {
		label += "+precise"
	}
	if fleets > 1 {
		label += " on " + fl.String() + " workers"
	}
	if seeds > 1 {
		label += fmt.Sprintf(" seed +%d", k)
	}
	return label
}

// bundleAdmission returns the queue block and the request classifier of b for
// Options: the queue only when the file has a queue block (the default
// queue has a zero Range), so that a file without one replays exactly as
// before, and the classifier's factory when the file has a
// request_classifier.
func bundleAdmission(b *loader.Bundle) (config.Queue, shared.ClassifierFactory, error) {
	var q config.Queue
	if bq := b.Queue(); bq.Range.Filename != "" {
		q = bq
	}
	f, err := b.Classifier()
	return q, f, err
}

// PolicyName labels a policy file in the table and the report: its base
// name without the extension, or config.DefaultPolicyName ("default") for
// the built-in policy ("").
func PolicyName(path string) string {
	if path == "" {
		return config.DefaultPolicyName
	}
	return strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
}

// warnDefaultRoles warns on w when a role the replay routes for runs the
// built-in default policy although a policy file (path, loaded as b) was
// given, which is what happens when the file's worker_selection does not
// set the role: replaying round-robin.hcl disaggregated would otherwise
// silently compare the default policy.
func warnDefaultRoles(w io.Writer, path string, b *loader.Bundle, roles []shared.Role) {
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

// closeBundle closes b, stopping its plugins, bounded by closeTimeout.
func closeBundle(b *loader.Bundle) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = b.Close(ctx)
}

// pluginRestarts sums the restarts of b's plugins.
func pluginRestarts(b *loader.Bundle) int64 {
	var n int64
	for _, p := range b.Plugins() {
		n += p.Stats.Restarts
	}
	return n
}

// settleTimeout bounds how long a run waits, after its last request, for
// plugins that are restarting.
const settleTimeout = 5 * time.Second

// settlePlugins waits (up to settleTimeout) until none of b's plugins is
// restarting. A replay runs far faster than real time, so a plugin killed
// part way through is often still in its restart backoff when the last
// request is decided; waiting lets the report count the restart the
// failure set off rather than race it.
func settlePlugins(ctx context.Context, b *loader.Bundle) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for slices.ContainsFunc(b.Plugins(), func(p loader.PluginState) bool { return p.Status == supervisor.StatusRestarting }) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
