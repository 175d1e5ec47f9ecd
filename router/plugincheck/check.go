package plugincheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// Result is one check: passed, or what was expected and what came back.
type Result struct {
	Name     string `json:"name"`
	Pass     bool   `json:"pass"`
	Expected string `json:"expected,omitempty"`
	Got      string `json:"got,omitempty"`
	// Note is what a passing check measured or skipped, for the reader.
	Note string `json:"note,omitempty"`
	// Warning, on a passing check, is something the router would do to
	// the plugin that its author should know (latency over call_timeout).
	Warning string `json:"warning,omitempty"`
	// Skipped: the check was not run (Pass is false); Note says why.
	Skipped bool `json:"skipped,omitempty"`
}

// Options say what to check and how.
type Options struct {
	// Plugin is how to start the binary: Name, Command (or Path), Args,
	// Env, PassEnv and StartTimeout (0: config.DefaultStartTimeout) are
	// used, as `router plugins describe` does.
	Plugin config.Plugin
	// Config are PARAM=VALUE values, unparsed (ParseConfig), for every
	// checked type declaring PARAM: needed for required parameters.
	Config map[string]string
	// Type, when set, checks only the component type of that name.
	Type string
	// Role is the worker role instances are configured and decide for;
	// "" means shared.RoleAggregated.
	Role shared.Role
	// CallTimeout is the call_timeout latency is compared with; 0 means
	// config.DefaultCallTimeout (20 ms).
	CallTimeout time.Duration
	// Logger receives the host's logs and the plugin's stderr; nil
	// discards them.
	Logger hclog.Logger
	// Report, when set, is given each result as soon as its check
	// completes, in the order Run returns them.
	Report func(Result)
	// Replay, when set, is a trace (a file router replay reads, or
	// BundledTrace) that each filter, scorer and picker type is replayed
	// on last, in a policy of its own, with router replay's
	// --fail-on-fallback rule: a replay in which any selection fell back
	// fails (checkReplay).
	Replay string
	// ReplayLimit is how many of the trace's first requests are replayed;
	// 0 means DefaultReplayLimit.
	ReplayLimit int
}

// rows are the candidate counts every filter, scorer and picker is asked
// to decide over (issue #13: 1, 8 and 4,096 rows).
var rows = []int{1, 8, 4096}

// idBase is the first worker id sent: above 2^53, so a plugin that keeps
// ids as doubles (JSON numbers, JavaScript Numbers) gets them wrong.
const idBase = 1<<63 + 12345

// identifierRE is what a parameter name must look like: a policy file
// writes it as an HCL attribute name.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// typeNameRule is the policy loader's rule for a type name
// (catalog.ValidName), as the schema check states it.
const typeNameRule = `a name of letters, digits, '_', '.' and '-', not "default"`

// builtins are the router's built-in types, whose names a plugin's types
// must not take.
var builtins = catalog.Default()

// stopGrace is how long the shutdown check lets a plugin take to exit once
// asked to: generous (the router's own is 500 ms), and below the 2 s after
// which go-plugin kills it.
const stopGrace = 1500 * time.Millisecond

// concurrent is how many Decide calls the concurrent check makes at once.
const concurrent = 32

// ParseConfig splits PARAM=VALUE strings (the --config flags); the values
// are parsed per type once the declared types are known. A string without
// '=' or with an empty name, or a name given twice, is an error.
func ParseConfig(kvs []string) (map[string]string, error) {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--config %q: want PARAM=VALUE", kv)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--config %q: %s is given twice", kv, name)
		}
		out[name] = value
	}
	return out, nil
}

// parseParamValue parses a --config value as a parameter of type t (a
// list as comma-separated entries; "" is the empty list).
func parseParamValue(t shared.ParamType, s string) (any, error) {
	switch t {
	case shared.Number:
		return strconv.ParseFloat(s, 64)
	case shared.Int:
		return strconv.ParseInt(s, 10, 64)
	case shared.Bool:
		return strconv.ParseBool(s)
	case shared.String:
		return s, nil
	case shared.Duration:
		return time.ParseDuration(s)
	case shared.StringList:
		if s == "" {
			return []string{}, nil
		}
		return strings.Split(s, ","), nil
	case shared.NumberList:
		out := []float64{}
		if s == "" {
			return out, nil
		}
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown parameter type %v", t)
}

// Failed reports whether any of results failed (a skipped check did not).
func Failed(results []Result) bool {
	return slices.ContainsFunc(results, func(r Result) bool { return !r.Pass && !r.Skipped })
}

// Run starts the plugin o.Plugin describes and runs every check in order;
// it stops after a failed handshake. It returns one Result per check (a
// check that finds several problems returns one each), each also given to
// o.Report as it completes. Once the plugin process is gone (it exited, or
// the host killed it), the first failure says how it went and the checks
// that need the process are reported skipped. The plugin is stopped before
// it returns; ctx bounds the whole run.
func Run(ctx context.Context, o Options) []Result {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Role == "" {
		o.Role = shared.RoleAggregated
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = config.DefaultCallTimeout
	}
	if o.Plugin.Name == "" {
		o.Plugin.Name = "plugin"
	}
	var stdout stdoutTap
	var stray strayLines
	r := &run{report: o.Report, firstStop: make(chan struct{})}
	host := supervisor.NewHost(supervisor.Options{
		Logger: o.Logger,
		// Answers are checked here, and latency measured: only a wedged
		// call fails.
		CallTimeout: supervisor.ReplayCallTimeout,
		// Every call is checked on its own; none is refused because an
		// earlier one failed.
		Breaker: supervisor.BreakerPolicy{Disabled: true},
		// A process that exits is not restarted: the checks after it are
		// skipped.
		Restart:   supervisor.RestartPolicy{MaxRestarts: -1},
		StopGrace: stopGrace,
		Stopped:   r.stopped,
		Stdout:    &stdout,
		// Lines before the handshake fail the handshake check, and are
		// skipped so that the rest is checked too.
		StrayStdout: stray.add,
	})
	defer shutdownHost(host)
	types, err := host.Start(ctx, o.Plugin)
	if res, ok := stray.result(err == nil); ok {
		r.add(res)
	}
	if err != nil {
		r.add(fail("handshake", "the handshake line, then a usable Describe answer", err.Error()))
		return r.out
	}
	if len(types) == 0 {
		r.add(fail("handshake", "a Describe answer declaring at least one component type", "none: nothing to check"))
		return r.out
	}
	r.add(pass("handshake", fmt.Sprintf("%d component types", len(types))))
	r.add(checkSchema(types)...)

	if o.Type != "" {
		i := slices.IndexFunc(types, func(t shared.TypeInfo) bool { return t.Name == o.Type })
		if i < 0 {
			names := make([]string, len(types))
			for j, t := range types {
				names[j] = strconv.Quote(t.Name)
			}
			r.add(fail("type "+o.Type, "one of the types the plugin declares ("+strings.Join(names, ", ")+")", strconv.Quote(o.Type)))
			return r.out
		}
		types = types[i : i+1]
	}
	types = uniqueTypes(types)
	for name := range o.Config {
		if !slices.ContainsFunc(types, func(t shared.TypeInfo) bool { _, ok := t.Param(name); return ok }) {
			r.add(fail("config "+name, "a parameter of a checked type", "no checked type declares "+strconv.Quote(name)))
		}
	}
	proc, err := host.Process(o.Plugin.Name)
	if err != nil {
		r.add(fail("process", "the plugin running after its start", err.Error()))
		return r.out
	}
	r.exited = proc.Exited
	relayed := servesStdio(ctx, proc.Conn)
	w := newWire(proc.Conn, o.Role, o.Plugin.StartTimeout)
	var deciders []configured
	for _, t := range types {
		var (
			comp   shared.Component
			params shared.Params
		)
		configureName := fmt.Sprintf("configure %q", t.Name)
		r.step(func() []Result {
			var results []Result
			comp, params, results = checkConfigure(t, o.Config, o.Role)
			if comp == nil {
				return results
			}
			results = append(results, w.checkInputs(ctx, t, params))
			return append(results, w.checkBoundaries(ctx, t, params)...)
		}, configureName)
		if comp == nil {
			continue
		}
		switch t.Kind {
		case shared.KindFilter, shared.KindScorer, shared.KindPicker:
			r.step(func() []Result { return checkDecide(ctx, t, comp, o.Role) }, fmt.Sprintf("decide %q", t.Name))
			r.step(func() []Result {
				return []Result{checkLatency(ctx, t, params, o.Role, o.CallTimeout, proc.ExpectedDecideP99)}
			}, fmt.Sprintf("latency %q", t.Name))
			deciders = append(deciders, configured{t, instanceName(t.Name)})
		case shared.KindClassifier:
			r.step(func() []Result { return w.checkClassify(ctx, t, params) }, fmt.Sprintf("classify %q", t.Name))
		}
	}
	if len(deciders) > 0 {
		r.step(func() []Result { return []Result{w.checkBatch(ctx, deciders)} }, "decide batch")
		r.step(func() []Result { return []Result{w.checkStreams(ctx, deciders)} }, fmt.Sprintf("decide streams=%d", streams))
	}
	r.step(func() []Result { return []Result{checkHealth(ctx, host, o.Plugin.Name)} }, "health")
	r.step(func() []Result {
		r.mu.Lock()
		r.shuttingDown = true
		r.mu.Unlock()
		shutdownHost(host)
		r.mu.Lock()
		defer r.mu.Unlock()
		return []Result{shutdownResult(r.stops)}
	}, "shutdown")
	r.add(stdoutResult(&stdout, relayed))
	r.add(checkParentDeath(ctx, o.Plugin))
	if o.Replay != "" {
		r.add(checkReplay(ctx, o, types)...)
	}
	return r.out
}

// strayLines are the lines a plugin wrote on stdout before its handshake
// line (supervisor.Options.StrayStdout), which the router would have read
// as its handshake.
type strayLines struct {
	mu    sync.Mutex
	n     int
	first []byte
}

func (s *strayLines) add(line []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		s.first = line
	}
	s.n++
}

// result is the failed "handshake stdout" check when lines came before the
// handshake, saying what the router does (the start fails: go-plugin
// reads the first line as the handshake) and, when started, that the
// other checks ran with them skipped; false when none came.
func (s *strayLines) result(started bool) (Result, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return Result{}, false
	}
	got := fmt.Sprintf("%d lines before it, the first %q: the router would not start this plugin (it reads the first line as the handshake, and this one is not)",
		s.n, bytes.TrimSuffix(s.first[:min(len(s.first), untrusted.MaxLog)], []byte("\n")))
	if started {
		got += "; the other checks ran with those lines skipped"
	}
	return fail("handshake stdout", "the handshake line first on stdout (log to stderr)", got), true
}

// shutdownResult is the shutdown check's result from the stops the host
// reported once asked to shut down.
func shutdownResult(stops []supervisor.StopReport) Result {
	expected := fmt.Sprintf("an exit within %v of plugin.GRPCController/Shutdown", stopGrace)
	switch {
	case len(stops) != 1:
		return fail("shutdown", expected, fmt.Sprintf("%d stops reported", len(stops)))
	case !stops[0].WasRunning:
		return fail("shutdown", expected, "the plugin had already exited")
	case !stops[0].Exited:
		return fail("shutdown", expected, "still running after "+stopGrace.String()+"; its process group was killed")
	}
	return pass("shutdown", "exited "+stops[0].After.Round(time.Millisecond).String()+" after the stop began")
}

// stdioService is the gRPC service go-plugin relays a plugin's stdout by.
const stdioService = "plugin.GRPCStdio"

// servesStdio reports whether the plugin serves stdioService, as its gRPC
// server reflection lists it (go-plugin's server registers both); false
// when it does not say.
func servesStdio(ctx context.Context, conn *grpc.ClientConn) bool {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return false
	}
	if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		return false
	}
	resp, err := s.Recv()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(resp.GetListServicesResponse().GetService(), func(sr *reflectionpb.ServiceResponse) bool {
		return sr.GetName() == stdioService
	})
}

// stdoutResult is the stdout check's result: a failure when the tap saw
// output; a pass when the plugin's stdout is relayed (so nothing was
// written); else skipped, as nothing it writes can be seen.
func stdoutResult(tap *stdoutTap, relayed bool) Result {
	const name = "stdout"
	if n, first := tap.written(); n > 0 {
		return fail(name, "nothing on stdout after the handshake (log to stderr)", fmt.Sprintf("%d bytes, starting %q", n, first))
	}
	if relayed {
		return pass(name, "as relayed by go-plugin's stdio service")
	}
	return skip(name, "not observable: the plugin serves no "+stdioService+" service, and what it writes to stdout after the handshake is read and dropped unseen")
}

// uniqueTypes returns types without the second and later declarations of
// a name (the schema check fails them): each name is checked once.
func uniqueTypes(types []shared.TypeInfo) []shared.TypeInfo {
	seen := make(map[string]bool, len(types))
	return slices.DeleteFunc(slices.Clone(types), func(t shared.TypeInfo) bool {
		dup := seen[t.Name]
		seen[t.Name] = true
		return dup
	})
}

// exitWait bounds how long a check that failed waits for the plugin's exit
// to be known, so that its failure can say the process is gone; the exit
// pipe reports an exit at once.
const exitWait = 2 * time.Second

// stopWait bounds how long, once the process exited, the host's report of
// how it went (its exit status) is waited for: the host's stop of a gone
// process is bounded by its own kill wait.
const stopWait = 15 * time.Second

// run is one Run's results and what it knows of the plugin process.
type run struct {
	report func(Result)
	out    []Result
	// exited is the process's exit channel, once it started.
	exited <-chan struct{}
	// gone says how the process went ("the plugin exited (exit status
	// 3)"), once it is known to be gone; then checks needing it are
	// skipped.
	gone string
	// goneReported: a failure said so.
	goneReported bool

	mu           sync.Mutex
	shuttingDown bool
	stops        []supervisor.StopReport
	// firstStop is closed at the first stop reported before shutdown:
	// the process went away on its own, or was killed by the host.
	firstStop chan struct{}
	early     *supervisor.StopReport
}

// stopped is the host's Stopped hook.
func (r *run) stopped(rep supervisor.StopReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shuttingDown {
		r.stops = append(r.stops, rep)
		return
	}
	if r.early == nil {
		r.early = &rep
		close(r.firstStop)
	}
}

// add records results and reports each.
func (r *run) add(rs ...Result) {
	for _, res := range rs {
		r.out = append(r.out, res)
		if r.report != nil {
			r.report(res)
		}
	}
}

// step runs f, checks that need the plugin process, unless the process is
// gone: then each of names is reported skipped. When f's results hold a
// failure and the process turns out gone, the first failure says how it
// went and the later ones are reported skipped.
func (r *run) step(f func() []Result, names ...string) {
	if r.gone == "" && r.exited != nil {
		select {
		case <-r.exited:
			r.learnGone()
		default:
		}
	}
	if r.gone != "" {
		for _, n := range names {
			if !r.goneReported {
				// It went between checks: the first check it misses
				// fails, saying so.
				r.add(fail(n, "the plugin process running", r.gone))
				r.goneReported = true
				continue
			}
			r.add(skip(n, "not run: "+r.gone))
		}
		return
	}
	rs := f()
	r.mu.Lock()
	stopping := r.shuttingDown
	r.mu.Unlock()
	// A failed shutdown check is about how the process exits, not a death.
	if !Failed(rs) || stopping || !r.died() {
		r.add(rs...)
		return
	}
	first := true
	for i, res := range rs {
		switch {
		case res.Pass || res.Skipped:
		case first:
			rs[i].Got, first = r.gone, false
			r.goneReported = true
		default:
			rs[i] = skip(res.Name, "not run: "+r.gone)
		}
	}
	r.add(rs...)
}

// died reports whether the process is gone, waiting exitWait for its exit
// to show; it sets r.gone.
func (r *run) died() bool {
	t := time.NewTimer(exitWait)
	defer t.Stop()
	select {
	case <-r.exited:
		r.learnGone()
		return true
	case <-t.C:
		return false
	}
}

// learnGone sets r.gone from the host's report of the process's stop,
// waiting stopWait for it.
func (r *run) learnGone() {
	t := time.NewTimer(stopWait)
	defer t.Stop()
	select {
	case <-r.firstStop:
	case <-t.C:
		r.gone = "the plugin exited"
		return
	}
	r.mu.Lock()
	rep := *r.early
	r.mu.Unlock()
	r.gone = goneText(rep)
}

// goneText says how a process that went before the checks were done went.
func goneText(rep supervisor.StopReport) string {
	switch {
	case rep.KillReason != "":
		return "the plugin was killed by the router (" + rep.KillReason + ")"
	case rep.Status != "":
		return "the plugin exited (" + rep.Status + ")"
	}
	return "the plugin exited"
}

// checkHealth makes as many health checks in a row as the frozen rule
// counts, each under a generous deadline: each must answer SERVING. The
// slowest is printed, with a warning when it took longer than the router's
// probe allows one.
func checkHealth(ctx context.Context, host *supervisor.Host, name string) Result {
	var slowest time.Duration
	for range supervisor.DefaultProbeFailures {
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		start := time.Now()
		err := host.CheckHealth(hctx, name)
		cancel()
		if err != nil {
			return fail("health", `SERVING for service "plugin"`, err.Error())
		}
		slowest = max(slowest, time.Since(start))
	}
	r := pass("health", fmt.Sprintf("%d checks, the slowest %s", supervisor.DefaultProbeFailures, ms(slowest)))
	r.Warning = healthWarning(slowest)
	return r
}

// healthWarning says what the router does about a health check as slow as
// d; "" when it would not notice.
func healthWarning(d time.Duration) string {
	if d <= supervisor.DefaultProbeTimeout {
		return ""
	}
	return fmt.Sprintf("a check took %s, over the %v the router's probe gives one: %d such in a row and the router kills the plugin as frozen",
		ms(d), supervisor.DefaultProbeTimeout, supervisor.DefaultProbeFailures)
}

// configured is a decision type and the instance the checks configured.
type configured struct {
	t        shared.TypeInfo
	instance string
}

// shutdownHost stops every plugin the host started, bounded by 5 s
// whatever context the run had.
func shutdownHost(h *supervisor.Host) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.Shutdown(ctx)
}

// stdoutTap counts what a plugin writes to stdout after the handshake and
// keeps the start of it. Safe for concurrent use.
type stdoutTap struct {
	mu    sync.Mutex
	n     int
	first []byte
}

// stdoutTapKeep is how much of the plugin's stdout the tap keeps.
const stdoutTapKeep = 80

func (t *stdoutTap) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n += len(b)
	if room := stdoutTapKeep - len(t.first); room > 0 {
		t.first = append(t.first, b[:min(room, len(b))]...)
	}
	return len(b), nil
}

// written returns how many bytes were written and the first of them.
func (t *stdoutTap) written() (int, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, string(t.first)
}

func pass(name, note string) Result { return Result{Name: name, Pass: true, Note: note} }

func fail(name, expected, got string) Result {
	return Result{Name: name, Expected: expected, Got: got}
}

func skip(name, why string) Result { return Result{Name: name, Skipped: true, Note: why} }

// checkSchema checks the declared types: unique identifier-like type names,
// unique identifier-like parameter names per type, none the policy file's
// block reserves (catalog.ValidParam), defaults of the declared type (a
// NUMBER's finite), docs on every type and parameter. One result per problem, or one
// pass.
func checkSchema(types []shared.TypeInfo) []Result {
	var out []Result
	bad := func(what, expected, got string) {
		out = append(out, fail("schema "+what, expected, got))
	}
	seen := make(map[string]bool, len(types))
	for _, t := range types {
		tn := fmt.Sprintf("type %q", t.Name)
		if err := catalog.ValidName(t.Name); err != nil {
			bad(tn, typeNameRule, err.Error())
		} else if e, err := builtins.Lookup(t.Name); err == nil {
			bad(tn, "a name no built-in type has", fmt.Sprintf("the name of the built-in %s type: the router refuses the plugin (Duplicate component type)", e.Kind))
		}
		if seen[t.Name] {
			bad(tn, "type names unique", "a second type of that name")
		}
		seen[t.Name] = true
		if strings.TrimSpace(t.Doc) == "" {
			bad(tn, "a doc", "none")
		}
		params := make(map[string]bool, len(t.Params))
		for _, p := range t.Params {
			pn := fmt.Sprintf("%s parameter %q", tn, p.Name)
			if !identifierRE.MatchString(p.Name) {
				bad(pn, "a name of letters, digits, '_' and '-', not starting with a digit", strconv.Quote(p.Name))
			}
			if params[p.Name] {
				bad(pn, "parameter names unique within the type", "a second parameter of that name")
			}
			params[p.Name] = true
			if strings.TrimSpace(p.Doc) == "" {
				bad(pn, "a doc", "none")
			}
			if p.Default != nil && !valueOfType(p.Default, p.Type) {
				bad(pn, "a default of the declared type "+p.Type.String(), fmt.Sprintf("%T %v", p.Default, p.Default))
			}
			switch err := catalog.ValidParam(t.Kind, p); {
			case errors.Is(err, catalog.ErrReservedParam):
				bad(pn, "a name the policy file's block does not take for itself", err.Error()+": the router refuses the plugin (Invalid plugin type)")
			case err != nil:
				bad(pn, "a finite default", err.Error()+": the router refuses the plugin (Invalid plugin type)")
			}
		}
	}
	if len(out) == 0 {
		out = append(out, pass("schema", ""))
	}
	return out
}

// valueOfType reports whether v is a value of parameter type t as the
// router decodes it (pluginwire.ValueFromProto).
func valueOfType(v any, t shared.ParamType) bool {
	switch v.(type) {
	case float64:
		return t == shared.Number
	case int64:
		return t == shared.Int
	case bool:
		return t == shared.Bool
	case string:
		return t == shared.String
	case time.Duration:
		return t == shared.Duration
	case []string:
		return t == shared.StringList
	case []float64:
		return t == shared.NumberList
	}
	return false
}

// instanceName is the name of the instance of type typ every check but the
// boundary one configures.
func instanceName(typ string) string { return "check/" + typ }

// checkInfo is the instance every check configures for role, with a block
// size of 16 tokens.
func checkInfo(name string, role shared.Role) shared.InstanceInfo {
	return shared.InstanceInfo{Name: name, Role: role, BlockSize: 16}
}

// checkConfigure configures t with its defaults plus cfg, then checks that
// a value of the wrong type for its first parameter is refused with a
// diagnostic naming it. It returns the configured instance and its
// parameters, nil when that failed.
func checkConfigure(t shared.TypeInfo, cfg map[string]string, role shared.Role) (shared.Component, shared.Params, []Result) {
	name := fmt.Sprintf("configure %q", t.Name)
	params := shared.Params{}
	for _, p := range t.Params {
		s, ok := cfg[p.Name]
		if !ok {
			continue
		}
		v, err := parseParamValue(p.Type, s)
		if err != nil {
			return nil, nil, []Result{fail(name, fmt.Sprintf("--config %s=VALUE %s", p.Name, withArticle(p.Type.String())), fmt.Sprintf("%q: %v", s, err))}
		}
		params[p.Name] = v
	}
	configured := "the instance configured with its defaults"
	if len(params) > 0 {
		configured += " and --config values"
	}
	params = t.WithDefaults(params)
	for _, p := range t.Params {
		if _, ok := params[p.Name]; p.Required && !ok {
			return nil, nil, []Result{fail(name, "a value for required parameter "+strconv.Quote(p.Name), "none (give --config "+p.Name+"=VALUE)")}
		}
	}
	comp, err := t.New(checkInfo(instanceName(t.Name), instanceRole(t, role)), params)
	if err != nil {
		return nil, nil, []Result{fail(name, configured, err.Error())}
	}
	out := []Result{pass(name, "")}
	if len(t.Params) == 0 {
		return comp, params, out
	}
	p := t.Params[0]
	wrong := maps.Clone(params)
	wrong[p.Name] = "not " + withArticle(p.Type.String())
	if p.Type == shared.String {
		wrong[p.Name] = int64(1)
	}
	wname := fmt.Sprintf("configure %q wrong type", t.Name)
	expected := fmt.Sprintf("a diagnostic naming parameter %q", p.Name)
	_, err = t.New(checkInfo(instanceName(t.Name)+"-wrong", instanceRole(t, role)), wrong)
	var pe *shared.ParamError
	switch {
	case err == nil:
		out = append(out, fail(wname, expected, fmt.Sprintf("%s %#v accepted for %s parameter", withArticle(valueKind(wrong[p.Name])), wrong[p.Name], withArticle(p.Type.String()))))
	case !errors.As(err, &pe) || pe.Param != p.Name:
		out = append(out, fail(wname, expected, err.Error()))
	default:
		out = append(out, pass(wname, ""))
	}
	return comp, params, out
}

// withArticle puts "a" or "an" before word.
func withArticle(word string) string {
	if word != "" && strings.ContainsRune("aeiouAEIOU", rune(word[0])) {
		return "an " + word
	}
	return "a " + word
}

// valueKind names the kind of a wrong-type value the configure check sends.
func valueKind(v any) string {
	if _, ok := v.(string); ok {
		return "string"
	}
	return "int"
}

// instanceRole is the role an instance of t is configured for: none for a
// request classifier, as the router does.
func instanceRole(t shared.TypeInfo, role shared.Role) shared.Role {
	if t.Kind == shared.KindClassifier {
		return ""
	}
	return role
}

// candidates returns n rows with worker ids above 2^53, ascending, and
// finite, distinct costs (the sum a picker reads), with only the columns of
// declared set, as the router's pipeline allocates them
// (pipeline.Scratch.Candidates): a component gets only what it declared
// (and what other components of its policy did). shared.AllInputs sets
// every column.
func candidates(n int, declared shared.Inputs) *shared.Candidates {
	c := new(pipeline.Scratch).Candidates(n, declared, false)
	c.Costs = make([]float64, n)
	for i := range n {
		c.IDs[i] = shared.WorkerID(idBase + uint64(i)*7919)
		if c.ActiveRequests != nil {
			c.ActiveRequests[i] = int64(i % 13)
		}
		if c.Load != nil {
			c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: int64(i%7) * 512, ActiveDecodeBlocks: int64(i % 11),
				ActiveRequests: int64(i % 13), KVUsage: float64(i%10) / 10, HasKVUsage: true, Waiting: int64(i % 3), HasWaiting: true}
		}
		if c.OverlapBlocks != nil {
			c.OverlapBlocks[i] = int32(i % 5)
		}
		if c.TotalKVBlocks != nil {
			c.TotalKVBlocks[i] = 10000
		}
		if c.Names != nil {
			c.Names[i] = "check-" + strconv.Itoa(i)
			c.Labels[i] = checkLabels[i%len(checkLabels)]
		}
		c.Costs[i] = float64((i*37)%101) / 10
	}
	return c
}

// checkLabels are the LABELS rows of candidates, in turn: a worker with
// router-set keys only, and one with labels of its own and a rank.
var checkLabels = []shared.Labels{
	shared.WorkerLabels(nil, shared.RoleAggregated, []string{"check-model"}, false, 0),
	shared.WorkerLabels(map[string]string{"zone": "check-zone", "gpu": "check-gpu"}, shared.RoleAggregated, []string{"check-model"}, true, 1),
}

// request is the request every Decide check routes.
func request(role shared.Role) *shared.Request {
	return &shared.Request{ID: "check-1", Model: "check-model", Role: role, PromptTokens: 64, BlockSize: 16,
		BlockHashes: []uint64{idBase, idBase + 1, idBase + 2, idBase + 3}, SessionID: "check-session"}
}

// checkDecide runs comp (a filter, scorer or picker) over each of rows
// through the router's own pipeline and supervisor (decision), and
// reports what routing would do with every answer: accepted, or "the
// router would fall back on this decision because ..." (kept rows not
// ascending or out of range, not one finite cost per row, a picked row
// out of range: pluginclient.CheckResult, the pipeline's own checks).
//
// Then concurrent calls, of 1 to concurrent rows, are made at once: the
// router's client sends what queues together in one message, and each
// answer must be its own task's.
func checkDecide(ctx context.Context, t shared.TypeInfo, comp shared.Component, role shared.Role) []Result {
	var out []Result
	declared := comp.Inputs()
	d, err := newDecision(t.Kind, t.Name, comp)
	if err != nil {
		return []Result{fail(fmt.Sprintf("decide %q", t.Name), "a component the router's pipeline can run", err.Error())}
	}
	for _, n := range rows {
		name := fmt.Sprintf("decide %q rows=%d", t.Name, n)
		if expected, got := d.decide(ctx, request(role), candidates(n, declared)); expected != "" {
			out = append(out, fail(name, expected, got+undeclaredHint(ctx, d, comp, role, n)))
		} else {
			out = append(out, pass(name, ""))
		}
	}
	type answer struct{ expected, got string }
	answers := make([]answer, concurrent)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i].expected, answers[i].got = d.decide(ctx, request(role), candidates(i+1, declared))
		})
	}
	wg.Wait()
	name := fmt.Sprintf("decide %q concurrent=%d", t.Name, concurrent)
	for i, a := range answers {
		if a.expected != "" {
			return append(out, fail(name, a.expected+" for the call of "+strconv.Itoa(i+1)+" rows", a.got))
		}
	}
	return append(out, pass(name, fmt.Sprintf("calls of 1 to %d rows at once", concurrent)))
}

// undeclaredHint is called after comp failed a call over n rows with only
// the columns it declared. When it fails that call again, then answers it
// well with every column set, it says that comp may be reading a column it
// did not declare; "" otherwise (a failure that does not repeat, or one
// that every column does not cure).
func undeclaredHint(ctx context.Context, d *decision, comp shared.Component, role shared.Role, n int) string {
	if expected, _ := d.decide(ctx, request(role), candidates(n, comp.Inputs())); expected == "" {
		return ""
	}
	if expected, _ := d.decide(ctx, request(role), candidates(n, shared.AllInputs)); expected != "" {
		return ""
	}
	return fmt.Sprintf(" (sent only the columns it declared, %v, as the router does; with every column set it answers well: "+
		"it may be reading a column it did not declare)", comp.Inputs())
}

// decision is a policy of one component under check, compiled by the
// router's own pipeline (pipeline.Compile): comp as its only filter (then
// firstRow picks), its only scorer of weight 1 (then firstRow picks), or
// its picker. A plugin's component is Fusable, so the pipeline runs it as
// a fused run through the supervisor (managed.decide and
// pluginclient.CheckResult) exactly as a live policy of that component
// runs: the check sees every answer as routing does, by the same code.
type decision struct {
	cp *pipeline.Compiled
}

// newDecision compiles the policy deciding with comp, a component of kind
// named name; an error when the pipeline refuses to fuse it.
func newDecision(kind shared.Kind, name string, comp shared.Component) (*decision, error) {
	p := &policy.Policy{Name: "plugins-check", PickerName: "check-first-row", PickerType: "check-first-row", Picker: firstRow{}}
	switch kind {
	case shared.KindFilter:
		p.Filters = []policy.NamedFilter{{Name: name, Type: name, Filter: comp.(shared.Filter)}}
	case shared.KindScorer:
		p.Scorers = []policy.WeightedScorer{{Name: name, Type: name, Weight: 1, Scorer: comp.(shared.Scorer)}}
	case shared.KindPicker:
		p.PickerName, p.PickerType, p.Picker = name, name, comp.(shared.Picker)
	default:
		return nil, fmt.Errorf("a %s does not decide", kind)
	}
	cp, err := pipeline.Compile(p)
	if err != nil {
		return nil, err
	}
	return &decision{cp: cp}, nil
}

// decide runs the policy over c (compacted in place by a filter, as
// routing does) and says what the router would do with the answer:
// "", "" when it accepts it (every row filtered out is an answer too: the
// router refuses the request as "all filtered", and no fallback decides);
// else the expected answer and "the router would fall back on this
// decision because ..." with the pipeline's error, as the router logs it
// (router.FallsBack: the rule routing applies).
func (d *decision) decide(ctx context.Context, req *shared.Request, c *shared.Candidates) (expected, got string) {
	var s pipeline.Scratch
	_, err := pipeline.Execute(ctx, d.cp, req, c, &s)
	switch {
	case err == nil, errors.Is(err, shared.ErrAllFiltered):
		return "", ""
	case router.FallsBack(ctx, err):
		return "an answer the router accepts", "the router would fall back on this decision because " + err.Error()
	}
	return "an answer the router accepts", "the router would refuse the request: " + err.Error()
}

// firstRow is the picker of a policy checking a filter or a scorer: it
// picks the first row left, so that the decision depends on the checked
// component's answer alone.
type firstRow struct{}

func (firstRow) Inputs() shared.Inputs { return 0 }

func (firstRow) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

// maxField bounds each field of a Result as WriteText and WriteJSON write
// it, in bytes: what a plugin sent (its errors, its names) is already
// bounded where the router reads it, and a check's own words are short.
const maxField = 4 << 10

// printable returns r with each field bounded to maxField bytes and its
// control characters escaped (untrusted.Text): a plugin's text must not
// reach a terminal as escape sequences.
func (r Result) printable() Result {
	for _, f := range []*string{&r.Name, &r.Expected, &r.Got, &r.Note, &r.Warning} {
		*f = untrusted.Text(*f, maxField)
	}
	return r
}

// WriteText writes r as one line ("PASS name (note)", "FAIL name:
// expected X, got Y", "SKIP name: why"), followed by "WARNING name: W"
// when it passed with a warning. Each field is bounded to 4 KiB and its
// control characters are escaped (`\x1b`).
func WriteText(w io.Writer, r Result) error {
	r = r.printable()
	line := r.Line() + "\n"
	if r.Pass && r.Warning != "" {
		line += fmt.Sprintf("WARNING %s: %s\n", r.Name, r.Warning)
	}
	_, err := io.WriteString(w, line)
	return err
}

// Report is the JSON document of a run: its checks, and Error when the
// run could not start (a usage error; the checks are then empty).
type Report struct {
	Checks []Result `json:"checks"`
	Error  string   `json:"error,omitempty"`
}

// WriteJSON writes rep as one indented JSON object, each field of a check
// bounded and escaped as WriteText writes it.
func WriteJSON(w io.Writer, rep Report) error {
	checks := make([]Result, len(rep.Checks))
	for i, r := range rep.Checks {
		checks[i] = r.printable()
	}
	rep.Checks = checks
	rep.Error = untrusted.Text(rep.Error, maxField)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Line is the result as WriteText writes it, without its warning, and
// with its fields as they are (WriteText bounds and escapes them).
func (r Result) Line() string {
	switch {
	case r.Skipped:
		return fmt.Sprintf("SKIP %s: %s", r.Name, r.Note)
	case !r.Pass:
		return fmt.Sprintf("FAIL %s: expected %s, got %s", r.Name, r.Expected, r.Got)
	case r.Note != "":
		return fmt.Sprintf("PASS %s (%s)", r.Name, r.Note)
	}
	return "PASS " + r.Name
}
