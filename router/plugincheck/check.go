package plugincheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
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
}

// rows are the candidate counts every filter, scorer and picker is asked
// to decide over (issue #13: 1, 8 and 4,096 rows).
var rows = []int{1, 8, 4096}

// idBase is the first worker id sent: above 2^53, so a plugin that keeps
// ids as doubles (JSON numbers, JavaScript Numbers) gets them wrong.
const idBase = 1<<63 + 12345

// identifierRE is what a type or parameter name must look like: a policy
// file writes it as an HCL attribute name or a quoted type name.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

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

// parseParamValue parses a --config value as a parameter of type t.
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
	}
	return nil, fmt.Errorf("unknown parameter type %v", t)
}

// Failed reports whether any of results failed.
func Failed(results []Result) bool {
	return slices.ContainsFunc(results, func(r Result) bool { return !r.Pass })
}

// Run starts the plugin o.Plugin describes and runs every check in order;
// it stops after a failed handshake. It returns one Result per check (a
// check that finds several problems returns one each). The plugin is
// stopped before it returns; ctx bounds the whole run.
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
	var (
		stdout  stdoutTap
		mu      sync.Mutex
		stopped []supervisor.StopReport
	)
	host := supervisor.NewHost(supervisor.Options{
		Logger: o.Logger,
		// Answers are checked here, and latency measured: only a wedged
		// call fails.
		CallTimeout: supervisor.ReplayCallTimeout,
		// Every call is checked on its own; none is refused because an
		// earlier one failed.
		Breaker:   supervisor.BreakerPolicy{Disabled: true},
		StopGrace: stopGrace,
		Stopped: func(r supervisor.StopReport) {
			mu.Lock()
			stopped = append(stopped, r)
			mu.Unlock()
		},
		Stdout: &stdout,
	})
	defer shutdownHost(host)
	var out []Result
	types, err := host.Start(ctx, o.Plugin)
	if err != nil {
		return append(out, fail("handshake", "the handshake line, then a usable Describe answer", err.Error()))
	}
	out = append(out, pass("handshake", fmt.Sprintf("%d component types", len(types))))
	out = append(out, checkSchema(types)...)

	if o.Type != "" {
		i := slices.IndexFunc(types, func(t shared.TypeInfo) bool { return t.Name == o.Type })
		if i < 0 {
			names := make([]string, len(types))
			for j, t := range types {
				names[j] = strconv.Quote(t.Name)
			}
			return append(out, fail("type "+o.Type, "a type the plugin declares", strings.Join(names, ", ")))
		}
		types = types[i : i+1]
	}
	for name := range o.Config {
		if !slices.ContainsFunc(types, func(t shared.TypeInfo) bool { _, ok := t.Param(name); return ok }) {
			out = append(out, fail("config "+name, "a parameter of a checked type", "no checked type declares "+strconv.Quote(name)))
		}
	}
	proc, err := host.Process(o.Plugin.Name)
	if err != nil {
		return append(out, fail("process", "the plugin running after its start", err.Error()))
	}
	w := newWire(proc.Conn, o.Role)
	var deciders []configured
	for _, t := range types {
		comp, params, results := checkConfigure(t, o.Config, o.Role)
		out = append(out, results...)
		if comp == nil {
			continue
		}
		out = append(out, w.checkBoundaries(ctx, t, params)...)
		switch t.Kind {
		case shared.KindFilter, shared.KindScorer, shared.KindPicker:
			out = append(out, checkDecide(ctx, t, comp, o.Role)...)
			out = append(out, checkLatency(ctx, t, params, o.Role, o.CallTimeout))
			deciders = append(deciders, configured{t, instanceName(t.Name)})
		case shared.KindClassifier:
			out = append(out, w.checkClassify(ctx, t, params)...)
		}
	}
	if len(deciders) > 0 {
		out = append(out, w.checkBatch(ctx, deciders))
		out = append(out, w.checkStreams(ctx, deciders))
	}
	out = append(out, checkHealth(ctx, host, o.Plugin.Name))

	shutdownHost(host)
	mu.Lock()
	expected := fmt.Sprintf("an exit within %v of plugin.GRPCController/Shutdown", stopGrace)
	switch {
	case len(stopped) != 1:
		out = append(out, fail("shutdown", expected, fmt.Sprintf("%d stops reported", len(stopped))))
	case !stopped[0].WasRunning:
		out = append(out, fail("shutdown", expected, "the plugin had already exited"))
	case !stopped[0].Exited:
		out = append(out, fail("shutdown", expected, "still running after "+stopGrace.String()+"; its process group was killed"))
	default:
		out = append(out, pass("shutdown", "exited "+stopped[0].After.Round(time.Millisecond).String()+" after the stop began"))
	}
	mu.Unlock()
	if n, first := stdout.written(); n > 0 {
		out = append(out, fail("stdout", "nothing on stdout after the handshake (log to stderr)", fmt.Sprintf("%d bytes, starting %q", n, first)))
	} else {
		out = append(out, pass("stdout", "as relayed by go-plugin's stdio service"))
	}
	return append(out, checkParentDeath(ctx, o.Plugin))
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

// checkSchema checks the declared types: unique identifier-like type names,
// unique identifier-like parameter names per type, defaults of the declared
// type, docs on every type and parameter. One result per problem, or one
// pass.
func checkSchema(types []shared.TypeInfo) []Result {
	var out []Result
	bad := func(what, expected, got string) {
		out = append(out, fail("schema "+what, expected, got))
	}
	seen := make(map[string]bool, len(types))
	for _, t := range types {
		tn := fmt.Sprintf("type %q", t.Name)
		if !identifierRE.MatchString(t.Name) {
			bad(tn, "a name of letters, digits, '_' and '-', not starting with a digit", strconv.Quote(t.Name))
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
			return nil, nil, []Result{fail(name, fmt.Sprintf("--config %s=VALUE a %s", p.Name, p.Type), fmt.Sprintf("%q: %v", s, err))}
		}
		params[p.Name] = v
	}
	params = t.WithDefaults(params)
	for _, p := range t.Params {
		if _, ok := params[p.Name]; p.Required && !ok {
			return nil, nil, []Result{fail(name, "a value for required parameter "+strconv.Quote(p.Name), "none (give --config "+p.Name+"=VALUE)")}
		}
	}
	comp, err := t.New(checkInfo(instanceName(t.Name), instanceRole(t, role)), params)
	if err != nil {
		return nil, nil, []Result{fail(name, "the instance configured with its defaults", err.Error())}
	}
	out := []Result{pass(name, "")}
	if len(t.Params) == 0 {
		return comp, params, out
	}
	p := t.Params[0]
	wrong := maps.Clone(params)
	wrong[p.Name] = "not a " + p.Type.String()
	if p.Type == shared.String {
		wrong[p.Name] = int64(1)
	}
	wname := fmt.Sprintf("configure %q wrong type", t.Name)
	expected := fmt.Sprintf("a diagnostic naming parameter %q", p.Name)
	_, err = t.New(checkInfo(instanceName(t.Name)+"-wrong", instanceRole(t, role)), wrong)
	var pe *shared.ParamError
	switch {
	case err == nil:
		out = append(out, fail(wname, expected, fmt.Sprintf("%T %v accepted", wrong[p.Name], wrong[p.Name])))
	case !errors.As(err, &pe) || pe.Param != p.Name:
		out = append(out, fail(wname, expected, err.Error()))
	default:
		out = append(out, pass(wname, ""))
	}
	return comp, params, out
}

// instanceRole is the role an instance of t is configured for: none for a
// request classifier, as the router does.
func instanceRole(t shared.TypeInfo, role shared.Role) shared.Role {
	if t.Kind == shared.KindClassifier {
		return ""
	}
	return role
}

// candidates returns n rows with every column set and worker ids above
// 2^53, ascending; costs finite and distinct.
func candidates(n int) *shared.Candidates {
	c := &shared.Candidates{
		IDs:            make([]shared.WorkerID, n),
		ActiveRequests: make([]int64, n),
		Load:           make([]shared.Load, n),
		OverlapBlocks:  make([]int32, n),
		TotalKVBlocks:  make([]int64, n),
		Costs:          make([]float64, n),
	}
	for i := range n {
		c.IDs[i] = shared.WorkerID(idBase + uint64(i)*7919)
		c.ActiveRequests[i] = int64(i % 13)
		c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: int64(i%7) * 512, ActiveDecodeBlocks: int64(i % 11),
			ActiveRequests: int64(i % 13), KVUsage: float64(i%10) / 10, HasKVUsage: true, Waiting: int64(i % 3), HasWaiting: true}
		c.OverlapBlocks[i] = int32(i % 5)
		c.TotalKVBlocks[i] = 10000
		c.Costs[i] = float64((i*37)%101) / 10
	}
	return c
}

// request is the request every Decide check routes.
func request(role shared.Role) *shared.Request {
	return &shared.Request{ID: "check-1", Model: "check-model", Role: role, PromptTokens: 64, BlockSize: 16,
		BlockHashes: []uint64{idBase, idBase + 1, idBase + 2, idBase + 3}, SessionID: "check-session"}
}

// checkDecide runs comp (a filter, scorer or picker) over each of rows and
// checks every answer as the router does: the supervisor's component
// validates kept rows (ascending, in range) and the number of costs; costs
// must be finite and a picked row in range, as the pipeline requires.
//
// Then concurrent calls, of 1 to concurrent rows, are made at once: the
// router's client sends what queues together in one message, and each
// answer must be its own task's.
func checkDecide(ctx context.Context, t shared.TypeInfo, comp shared.Component, role shared.Role) []Result {
	var out []Result
	for _, n := range rows {
		name := fmt.Sprintf("decide %q rows=%d", t.Name, n)
		if expected, got := decideOnce(ctx, t.Kind, comp, request(role), candidates(n)); expected != "" {
			out = append(out, fail(name, expected, got))
		} else {
			out = append(out, pass(name, ""))
		}
	}
	type answer struct{ expected, got string }
	answers := make([]answer, concurrent)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i].expected, answers[i].got = decideOnce(ctx, t.Kind, comp, request(role), candidates(i+1))
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

// decideOnce runs comp, a filter, scorer or picker, over c and checks its
// answer; expected is "" when it passed, else what was expected, and got
// what came back.
func decideOnce(ctx context.Context, kind shared.Kind, comp shared.Component, req *shared.Request, c *shared.Candidates) (expected, got string) {
	n := c.Len()
	var err error
	switch kind {
	case shared.KindFilter:
		keep := make([]bool, n)
		err = comp.(shared.Filter).Filter(ctx, req, c, keep)
	case shared.KindScorer:
		costs := make([]float64, n)
		if err = comp.(shared.Scorer).Score(ctx, req, c, costs); err == nil {
			if i := slices.IndexFunc(costs, func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }); i >= 0 {
				return "finite costs", fmt.Sprintf("cost %v for row %d", costs[i], i)
			}
		}
	case shared.KindPicker:
		var row int
		if row, err = comp.(shared.Picker).Pick(ctx, req, c); err == nil && (row < 0 || row >= n) {
			return fmt.Sprintf("a picked row in [0, %d)", n), strconv.Itoa(row)
		}
	}
	if err != nil {
		return "a well-formed answer", err.Error()
	}
	return "", ""
}

// Print writes results: one line each ("PASS name (note)", "FAIL name:
// expected X, got Y", and "WARNING name: W" after a passing check with a
// warning), or with asJSON one object {"checks": [Result...]}.
func Print(w io.Writer, results []Result, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Checks []Result `json:"checks"`
		}{results})
	}
	var sb strings.Builder
	for _, r := range results {
		sb.WriteString(r.Line())
		sb.WriteByte('\n')
		if r.Pass && r.Warning != "" {
			fmt.Fprintf(&sb, "WARNING %s: %s\n", r.Name, r.Warning)
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// Line is the result as Print writes it, without its warning.
func (r Result) Line() string {
	switch {
	case !r.Pass:
		return fmt.Sprintf("FAIL %s: expected %s, got %s", r.Name, r.Expected, r.Got)
	case r.Note != "":
		return fmt.Sprintf("PASS %s (%s)", r.Name, r.Note)
	}
	return "PASS " + r.Name
}
