package main

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
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// checkResult is one check of `router plugins check`: passed, or what was
// expected and what came back.
type checkResult struct {
	Name     string `json:"name"`
	Pass     bool   `json:"pass"`
	Expected string `json:"expected,omitempty"`
	Got      string `json:"got,omitempty"`
	// Note is what a passing check measured or skipped, for the reader.
	Note string `json:"note,omitempty"`
}

// checkRows are the candidate counts every filter, scorer and picker is
// asked to decide over (issue #13: 1, 8 and 4,096 rows).
var checkRows = []int{1, 8, 4096}

// checkIDBase is the first worker id sent: above 2^53, so a plugin that
// keeps ids as doubles (JSON numbers, JavaScript Numbers) gets them wrong.
const checkIDBase = 1<<63 + 12345

// identifierRE is what a type or parameter name must look like: a policy
// file writes it as an HCL attribute name or a quoted type name.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

func newPluginsCheckCmd() *cobra.Command {
	var (
		startTimeout time.Duration
		env, passEnv []string
		configKV     []string
		onlyType     string
		role         string
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "check BINARY [ARGS...]",
		Short: "Run a plugin binary through the protocol's conformance checks",
		Long: `Start a plugin binary as the router would, and check it against the plugin
protocol (docs/plugin-protocol.md): the handshake and Describe; the schema
Describe declares (unique identifier-like type and parameter names, defaults
of the declared type, docs on every type and parameter); Configure of every
type with its defaults (plus --config for required parameters), and the
refusal of a parameter of the wrong type as a diagnostic naming it; Decide
of every filter, scorer and picker over 1, 8 and 4,096 rows with worker ids
above 2^53, then 32 calls at once, each answer checked as the router checks
it (kept rows ascending and in range, one finite cost per row, picked row in
range); the health service; an exit within 1.5 s once asked to shut down;
nothing on stdout after the handshake (as go-plugin's stdio service relays
it: a Go plugin's os.Stdout). The plugin is stopped afterwards.

It prints one line per check, "PASS name" or "FAIL name: expected X, got
Y" (with --json one JSON object with a "checks" array), and exits 0 only
when every check passed, 1 otherwise. Calls get a minute each: this checks
answers, not latency.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("%s takes a plugin binary to start (and its arguments); see '%s --help'", cmd.CommandPath(), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if startTimeout <= 0 {
				return fmt.Errorf("--start-timeout %v: want %s", startTimeout, positiveDurationWant)
			}
			b, err := binaryPlugin(args, env, passEnv, startTimeout)
			if err != nil {
				return err
			}
			cfg, err := parseCheckConfig(configKV)
			if err != nil {
				return err
			}
			if !shared.Role(role).Valid() {
				return fmt.Errorf("--role %q: want aggregated, prefill or decode", role)
			}
			results := runPluginChecks(cmd.Context(), pluginLogger(cmd.Context(), cmd.ErrOrStderr()), b, checkOptions{config: cfg, onlyType: onlyType, role: shared.Role(role)})
			if err := printChecks(cmd.OutOrStdout(), results, asJSON); err != nil {
				return err
			}
			for _, r := range results {
				if !r.Pass {
					return &exitError{code: 1, err: errChecksFailed}
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&startTimeout, "start-timeout", config.DefaultStartTimeout, "bound on the plugin's start and handshake")
	f.StringArrayVar(&env, "env", nil, "NAME=VALUE: a variable of the plugin's environment, as in a plugin block's env (repeatable)")
	f.StringArrayVar(&passEnv, "pass-env", nil, "NAME: pass this variable of the router's environment on to the plugin, as a plugin block's pass_env (repeatable)")
	f.StringArrayVar(&configKV, "config", nil, "PARAM=VALUE: a parameter value for every type declaring PARAM, parsed as its declared type (repeatable; needed for required parameters)")
	f.StringVar(&onlyType, "type", "", "check only the component type of this name")
	f.StringVar(&role, "role", string(shared.RoleAggregated), "the worker role instances are configured and decide for: aggregated, prefill or decode")
	f.BoolVar(&asJSON, "json", false, `print one JSON object {"checks": [{"name", "pass", "expected", "got", "note"}...]}`)
	setWant(f, "start-timeout", positiveDurationWant)
	return cmd
}

// errChecksFailed is the command's error when a check failed: the failures
// are already printed.
var errChecksFailed = errors.New("some plugin checks failed")

// parseCheckConfig splits --config PARAM=VALUE flags; the values are parsed
// per type, once the declared types are known.
func parseCheckConfig(kvs []string) (map[string]string, error) {
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

// checkOptions are what the command line gives the checks.
type checkOptions struct {
	config   map[string]string // --config values, unparsed
	onlyType string            // --type; "" checks every type
	role     shared.Role       // --role
}

// runPluginChecks starts the plugin b and runs every check in order; it
// stops after a failed handshake.
func runPluginChecks(ctx context.Context, log hclog.Logger, b config.Plugin, o checkOptions) []checkResult {
	cfg, onlyType := o.config, o.onlyType
	var (
		stdout  stdoutTap
		mu      sync.Mutex
		stopped []supervisor.StopReport
	)
	host := supervisor.NewHost(supervisor.Options{
		Logger: log,
		// Answers are checked here, not latency: only a wedged call fails.
		CallTimeout: supervisor.ReplayCallTimeout,
		// Every call is checked on its own; none is refused because an
		// earlier one failed.
		Breaker:   supervisor.BreakerPolicy{Disabled: true},
		StopGrace: checkStopGrace,
		Stopped: func(r supervisor.StopReport) {
			mu.Lock()
			stopped = append(stopped, r)
			mu.Unlock()
		},
		Stdout: &stdout,
	})
	defer shutdownHost(host)
	var out []checkResult
	types, err := host.Start(ctx, b)
	if err != nil {
		return append(out, fail("handshake", "the handshake line, then a usable Describe answer", err.Error()))
	}
	out = append(out, pass("handshake", fmt.Sprintf("%d component types", len(types))))
	out = append(out, checkSchema(types)...)

	if onlyType != "" {
		i := slices.IndexFunc(types, func(t shared.TypeInfo) bool { return t.Name == onlyType })
		if i < 0 {
			names := make([]string, len(types))
			for j, t := range types {
				names[j] = strconv.Quote(t.Name)
			}
			return append(out, fail("type "+onlyType, "a type the plugin declares", strings.Join(names, ", ")))
		}
		types = types[i : i+1]
	}
	for name := range cfg {
		if !slices.ContainsFunc(types, func(t shared.TypeInfo) bool { _, ok := t.Param(name); return ok }) {
			out = append(out, fail("config "+name, "a parameter of a checked type", "no checked type declares "+strconv.Quote(name)))
		}
	}
	for _, t := range types {
		comp, results := checkConfigure(t, cfg, o.role)
		out = append(out, results...)
		if comp != nil {
			out = append(out, checkDecide(ctx, t, comp, o.role)...)
		}
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := host.CheckHealth(hctx, b.Name); err != nil {
		out = append(out, fail("health", `SERVING for service "plugin"`, err.Error()))
	} else {
		out = append(out, pass("health", ""))
	}

	shutdownHost(host)
	mu.Lock()
	defer mu.Unlock()
	expected := fmt.Sprintf("an exit within %v of plugin.GRPCController/Shutdown", checkStopGrace)
	switch {
	case len(stopped) != 1:
		out = append(out, fail("shutdown", expected, fmt.Sprintf("%d stops reported", len(stopped))))
	case !stopped[0].WasRunning:
		out = append(out, fail("shutdown", expected, "the plugin had already exited"))
	case !stopped[0].Exited:
		out = append(out, fail("shutdown", expected, "still running after "+checkStopGrace.String()+"; its process group was killed"))
	default:
		out = append(out, pass("shutdown", "exited "+stopped[0].After.Round(time.Millisecond).String()+" after the stop began"))
	}
	if n, first := stdout.written(); n > 0 {
		out = append(out, fail("stdout", "nothing on stdout after the handshake (log to stderr)", fmt.Sprintf("%d bytes, starting %q", n, first)))
	} else {
		out = append(out, pass("stdout", "as relayed by go-plugin's stdio service"))
	}
	return out
}

// checkStopGrace is how long the shutdown check lets a plugin take to exit
// once asked to: generous (the router's own is 500 ms), and below the 2 s
// after which go-plugin kills it.
const checkStopGrace = 1500 * time.Millisecond

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

func pass(name, note string) checkResult { return checkResult{Name: name, Pass: true, Note: note} }

func fail(name, expected, got string) checkResult {
	return checkResult{Name: name, Expected: expected, Got: got}
}

// checkSchema checks the declared types: unique identifier-like type names,
// unique identifier-like parameter names per type, defaults of the declared
// type, docs on every type and parameter. One result per problem, or one
// pass.
func checkSchema(types []shared.TypeInfo) []checkResult {
	var out []checkResult
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

// checkInfo is the instance every check configures for role, with a block
// size of 16 tokens.
func checkInfo(name string, role shared.Role) shared.InstanceInfo {
	return shared.InstanceInfo{Name: "check/" + name, Role: role, BlockSize: 16}
}

// checkConfigure configures t with its defaults plus cfg, then checks that
// a value of the wrong type for its first parameter is refused with a
// diagnostic naming it. It returns the configured instance, nil when that
// failed.
func checkConfigure(t shared.TypeInfo, cfg map[string]string, role shared.Role) (shared.Component, []checkResult) {
	name := fmt.Sprintf("configure %q", t.Name)
	params := shared.Params{}
	for _, p := range t.Params {
		s, ok := cfg[p.Name]
		if !ok {
			continue
		}
		v, err := parseParamValue(p.Type, s)
		if err != nil {
			return nil, []checkResult{fail(name, fmt.Sprintf("--config %s=VALUE a %s", p.Name, p.Type), fmt.Sprintf("%q: %v", s, err))}
		}
		params[p.Name] = v
	}
	params = t.WithDefaults(params)
	for _, p := range t.Params {
		if _, ok := params[p.Name]; p.Required && !ok {
			return nil, []checkResult{fail(name, "a value for required parameter "+strconv.Quote(p.Name), "none (give --config "+p.Name+"=VALUE)")}
		}
	}
	comp, err := t.New(checkInfo(t.Name, instanceRole(t, role)), params)
	if err != nil {
		return nil, []checkResult{fail(name, "the instance configured with its defaults", err.Error())}
	}
	out := []checkResult{pass(name, "")}
	if len(t.Params) == 0 {
		return comp, out
	}
	p := t.Params[0]
	wrong := maps.Clone(params)
	wrong[p.Name] = "not a " + p.Type.String()
	if p.Type == shared.String {
		wrong[p.Name] = int64(1)
	}
	wname := fmt.Sprintf("configure %q wrong type", t.Name)
	expected := fmt.Sprintf("a diagnostic naming parameter %q", p.Name)
	_, err = t.New(checkInfo(t.Name+"-wrong", instanceRole(t, role)), wrong)
	var pe *shared.ParamError
	switch {
	case err == nil:
		out = append(out, fail(wname, expected, fmt.Sprintf("%T %v accepted", wrong[p.Name], wrong[p.Name])))
	case !errors.As(err, &pe) || pe.Param != p.Name:
		out = append(out, fail(wname, expected, err.Error()))
	default:
		out = append(out, pass(wname, ""))
	}
	return comp, out
}

// instanceRole is the role an instance of t is configured for: none for a
// request classifier, as the router does.
func instanceRole(t shared.TypeInfo, role shared.Role) shared.Role {
	if t.Kind == shared.KindClassifier {
		return ""
	}
	return role
}

// checkCandidates returns n rows with every column set and worker ids
// above 2^53, ascending; costs finite and distinct.
func checkCandidates(n int) *shared.Candidates {
	c := &shared.Candidates{
		IDs:            make([]shared.WorkerID, n),
		ActiveRequests: make([]int64, n),
		Load:           make([]shared.Load, n),
		OverlapBlocks:  make([]int32, n),
		TotalKVBlocks:  make([]int64, n),
		Costs:          make([]float64, n),
	}
	for i := range n {
		c.IDs[i] = shared.WorkerID(checkIDBase + uint64(i)*7919)
		c.ActiveRequests[i] = int64(i % 13)
		c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: int64(i%7) * 512, ActiveDecodeBlocks: int64(i % 11),
			ActiveRequests: int64(i % 13), KVUsage: float64(i%10) / 10, HasKVUsage: true, Waiting: int64(i % 3), HasWaiting: true}
		c.OverlapBlocks[i] = int32(i % 5)
		c.TotalKVBlocks[i] = 10000
		c.Costs[i] = float64((i*37)%101) / 10
	}
	return c
}

// checkRequest is the request every Decide check routes.
func checkRequest(role shared.Role) *shared.Request {
	return &shared.Request{ID: "check-1", Model: "check-model", Role: role, PromptTokens: 64, BlockSize: 16,
		BlockHashes: []uint64{checkIDBase, checkIDBase + 1, checkIDBase + 2, checkIDBase + 3}, SessionID: "check-session"}
}

// checkDecide runs comp (a filter, scorer or picker) over each of
// checkRows and checks every answer as the router does: the supervisor's
// component validates kept rows (ascending, in range) and the number of
// costs; costs must be finite and a picked row in range, as the pipeline
// requires.
//
// Then checkConcurrent calls, of 1 to checkConcurrent rows, are made at
// once: the router's client sends what queues together in one message, and
// each answer must be its own task's.
func checkDecide(ctx context.Context, t shared.TypeInfo, comp shared.Component, role shared.Role) []checkResult {
	switch t.Kind {
	case shared.KindFilter, shared.KindScorer, shared.KindPicker:
	default:
		return []checkResult{pass(fmt.Sprintf("decide %q", t.Name), fmt.Sprintf("not checked: a %s makes no decision", t.Kind))}
	}
	var out []checkResult
	for _, n := range checkRows {
		name := fmt.Sprintf("decide %q rows=%d", t.Name, n)
		if expected, got := decideOnce(ctx, t.Kind, comp, checkRequest(role), checkCandidates(n)); expected != "" {
			out = append(out, fail(name, expected, got))
		} else {
			out = append(out, pass(name, ""))
		}
	}
	type answer struct{ expected, got string }
	answers := make([]answer, checkConcurrent)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i].expected, answers[i].got = decideOnce(ctx, t.Kind, comp, checkRequest(role), checkCandidates(i+1))
		})
	}
	wg.Wait()
	name := fmt.Sprintf("decide %q concurrent=%d", t.Name, checkConcurrent)
	for i, a := range answers {
		if a.expected != "" {
			return append(out, fail(name, a.expected+" for the call of "+strconv.Itoa(i+1)+" rows", a.got))
		}
	}
	return append(out, pass(name, fmt.Sprintf("calls of 1 to %d rows at once", checkConcurrent)))
}

// checkConcurrent is how many Decide calls the concurrent check makes at
// once.
const checkConcurrent = 32

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

// printChecks writes the results: a line each, or one JSON object.
func printChecks(w io.Writer, results []checkResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Checks []checkResult `json:"checks"`
		}{results})
	}
	var sb strings.Builder
	for _, r := range results {
		switch {
		case !r.Pass:
			fmt.Fprintf(&sb, "FAIL %s: expected %s, got %s\n", r.Name, r.Expected, r.Got)
		case r.Note != "":
			fmt.Fprintf(&sb, "PASS %s (%s)\n", r.Name, r.Note)
		default:
			fmt.Fprintf(&sb, "PASS %s\n", r.Name)
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
