package config

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// fakeHost is the PluginHost seam: Start returns canned types per plugin
// name, and each type's New records the instance it was asked for, as
// Configure in a plugin process would.
type fakeHost struct {
	types map[string][]shared.TypeInfo // by plugin name
	fail  map[string]error             // Start errors by plugin name

	mu         sync.Mutex
	started    []Plugin
	contexts   []context.Context
	configured []string // "NAME ROLE TYPE" per New call
}

func (h *fakeHost) Start(ctx context.Context, p Plugin) ([]shared.TypeInfo, error) {
	h.mu.Lock()
	h.started = append(h.started, p)
	h.contexts = append(h.contexts, ctx)
	h.mu.Unlock()
	if err := h.fail[p.Name]; err != nil {
		return nil, err
	}
	return h.types[p.Name], nil
}

func (h *fakeHost) calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(slices.Values(h.configured))
}

// remote returns a type whose New records the call and then runs refuse,
// when set, which may return ParamErrors or any error.
func (h *fakeHost) remote(name string, kind shared.Kind, params []shared.ParamSpec,
	refuse func(shared.InstanceInfo, shared.Params) error) shared.TypeInfo {
	return shared.TypeInfo{Name: name, Kind: kind, Params: params,
		New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			h.mu.Lock()
			h.configured = append(h.configured, fmt.Sprintf("%s %s %s", info.Name, info.Role, name))
			h.mu.Unlock()
			if refuse != nil {
				if err := refuse(info, p); err != nil {
					return nil, err
				}
			}
			c := testComponent{shared.InputCache, p}
			switch kind {
			case shared.KindFilter:
				return &testFilter{c}, nil
			case shared.KindScorer:
				return &testScorer{c}, nil
			default:
				return &testPicker{c}, nil
			}
		}}
}

// pdHost provides plugin "pd" after examples/disagg-filter-score-pick: a
// min-overlap filter that refuses a negative min_device_overlap_blocks and
// roles other than prefill and decode, two scorers, and a seeded picker.
func pdHost() *fakeHost {
	h := &fakeHost{fail: map[string]error{}}
	overlap := func(info shared.InstanceInfo, p shared.Params) error {
		if info.Role != shared.RolePrefill && info.Role != shared.RoleDecode {
			return fmt.Errorf("role %q is not supported; use prefill or decode", info.Role)
		}
		var errs []error
		if p.Float("min_device_overlap_blocks", 0) < 0 {
			errs = append(errs, &shared.ParamError{Param: "min_device_overlap_blocks", Err: errors.New("must be >= 0")})
		}
		if p.Int("max_blocks", 0) < 0 {
			errs = append(errs, &shared.ParamError{Param: "max_blocks", Err: errors.New("must be >= 0")})
		}
		return errors.Join(errs...)
	}
	h.types = map[string][]shared.TypeInfo{"pd": {
		h.remote("min-overlap", shared.KindFilter, []shared.ParamSpec{
			{Name: "min_device_overlap_blocks", Type: shared.Number, Default: 0.0, Doc: "Least overlap kept."},
			{Name: "max_blocks", Type: shared.Int},
		}, overlap),
		h.remote("prefill-cost", shared.KindScorer, nil, nil),
		h.remote("decode-cost", shared.KindScorer, nil, nil),
		h.remote("lowest-cost", shared.KindPicker, []shared.ParamSpec{{Name: "seed", Type: shared.Int}}, nil),
	}}
	return h
}

func loadWithHost(t *testing.T, h PluginHost, src string) (*PolicyFile, hcl.Diagnostics) {
	t.Helper()
	b, diags := LoadWith("t.hcl", []byte(src), testCatalog(t), Options{Plugins: h})
	if diags.HasErrors() != (b == nil) {
		t.Fatalf("bundle %v with errors %v:\n%s", b != nil, diags.HasErrors(), FormatDiagnostics(diags))
	}
	for _, d := range diags {
		if d.Subject == nil {
			t.Errorf("diagnostic without subject: %v", d)
		}
	}
	return b, diags
}

const pdSrc = `
plugin "pd" {
  command = "bin/pd"
}
policy "pd" {
  filter "overlap" {
    type                      = "min-overlap"
    min_device_overlap_blocks = 2
  }
  scorer "cost" { type = "prefill-cost" }
  picker "lowest" { type = "lowest-cost" }
  fallback = "lo"
}
policy "lo" {
  picker "p" { type = "lowest-cost" }
  fallback = "lowest-cost"
}
worker_selection {
  prefill = "pd"
  decode  = "pd"
}
`

// A policy used by prefill and decode is configured once per role, under
// "ROLE/POLICY/BLOCK", and each role's fallback chain is its own.
func TestPluginTypesPerRole(t *testing.T) {
	h := pdHost()
	cat := testCatalog(t)
	before := cat.Names(0)
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "load")
	b, diags := LoadWith("t.hcl", []byte(pdSrc), cat, Options{Plugins: h, Context: ctx})
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:\n%s", FormatDiagnostics(diags))
	}

	if len(h.started) != 1 || h.started[0].Name != "pd" || h.started[0].Command != "bin/pd" ||
		h.started[0].OnStartFailure != OnStartFailureError || h.contexts[0].Value(ctxKey{}) != "load" {
		t.Fatalf("started = %+v", h.started)
	}
	want := []string{
		"decode/lo/fallback decode lowest-cost",
		"decode/lo/p decode lowest-cost",
		"decode/pd/cost decode prefill-cost",
		"decode/pd/lowest decode lowest-cost",
		"decode/pd/overlap decode min-overlap",
		"prefill/lo/fallback prefill lowest-cost",
		"prefill/lo/p prefill lowest-cost",
		"prefill/pd/cost prefill prefill-cost",
		"prefill/pd/lowest prefill lowest-cost",
		"prefill/pd/overlap prefill min-overlap",
	}
	if diff := cmp.Diff(want, h.calls()); diff != "" {
		t.Errorf("Configure calls (-want +got):\n%s", diff)
	}

	pre, dec := b.Roles[shared.RolePrefill], b.Roles[shared.RoleDecode]
	if pre == nil || dec == nil || pre == dec || pre.Picker == dec.Picker {
		t.Fatalf("prefill %p and decode %p share instances", pre, dec)
	}
	if b.Policies["pd"] != pre || b.Policies["lo"] != pre.Fallback {
		t.Error("Policies does not hold the first role's instances")
	}
	for role, p := range map[shared.Role]*policy.Policy{shared.RolePrefill: pre, shared.RoleDecode: dec} {
		lo := p.Fallback
		if lo == nil || lo.Name != "lo" || lo != b.Decls[1].Instances[role] {
			t.Errorf("%s fallback = %+v, want its own lo", role, lo)
			continue
		}
		if lo.Fallback == nil || lo.Fallback.PickerType != "lowest-cost" || !lo.Fallback.PickerOnly() {
			t.Errorf("%s lo fallback = %+v", role, lo.Fallback)
		}
	}
	if pre.Fallback == dec.Fallback || pre.Fallback.Fallback == dec.Fallback.Fallback {
		t.Error("roles share a fallback instance")
	}
	if got := pre.Filters[0].Filter.(*testFilter).params["min_device_overlap_blocks"]; got != 2.0 {
		t.Errorf("min_device_overlap_blocks = %v", got)
	}

	var comps []string
	for _, c := range b.Decls[0].Components {
		comps = append(comps, fmt.Sprintf("%s %s %s %s %v %s", c.Kind, c.Name, c.Type, c.Source, c.OutOfProcess, c.InstanceName))
	}
	wantComps := []string{
		"filter overlap min-overlap plugin pd true prefill/pd/overlap",
		"scorer cost prefill-cost plugin pd true prefill/pd/cost",
		"picker lowest lowest-cost plugin pd true prefill/pd/lowest",
	}
	if diff := cmp.Diff(wantComps, comps); diff != "" {
		t.Errorf("pd components (-want +got):\n%s", diff)
	}
	if d := b.Decls[0]; !slices.Equal(d.Roles, []shared.Role{shared.RolePrefill, shared.RoleDecode}) {
		t.Errorf("pd roles = %v", d.Roles)
	}

	// The plugin's types are in the bundle's catalog only.
	if e, err := b.Catalog.Lookup("min-overlap"); err != nil || e.Source != "plugin pd" || !e.OutOfProcess {
		t.Errorf("bundle catalog: %+v, %v", e, err)
	}
	if _, err := cat.Lookup("min-overlap"); err == nil {
		t.Error("the caller's catalog was mutated")
	}
	if diff := cmp.Diff(before, cat.Names(0)); diff != "" {
		t.Errorf("caller's catalog (-before +after):\n%s", diff)
	}
	if b.Plugins[0].Failed != nil || len(b.FailedPlugins()) != 0 {
		t.Errorf("failed plugins = %v", b.FailedPlugins())
	}
}

// A policy no role reaches is decoded against the plugin's schema but its
// out-of-process components are not configured; built-in ones still are.
func TestPluginTypesUnusedPolicy(t *testing.T) {
	h := pdHost()
	b, diags := loadWithHost(t, h, `
plugin "pd" { command = "bin/pd" }
policy "spare" {
  filter "overlap" {
    type                      = "min-overlap"
    min_device_overlap_blocks = -1
  }
  picker "p" { type = "min-cost" }
}
`)
	if got := short(diags, hcl.DiagWarning); !slices.Equal(got, []string{"t.hcl:3:1: Unused policy"}) || diags.HasErrors() {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if got := h.calls(); len(got) != 0 {
		t.Errorf("configured %v", got)
	}
	if _, ok := b.Policies["spare"]; ok {
		t.Error("Policies holds an unused policy with out-of-process components")
	}
	d := b.Decls[0]
	if d.Name != "spare" || d.Used || d.Policy != nil || len(d.Components) != 2 {
		t.Fatalf("decl = %+v", d)
	}
	if c := d.Components[0]; c.Instance != nil || !c.OutOfProcess || c.InstanceName != "spare/overlap" || c.Params.Float("min_device_overlap_blocks", 0) != -1 {
		t.Errorf("filter = %+v", c)
	}
	if c := d.Components[1]; c.Instance == nil || c.OutOfProcess {
		t.Errorf("picker = %+v", c)
	}

	// The schema still applies, and built-in parameters are still checked.
	_, diags = loadWithHost(t, h, `
plugin "pd" { command = "bin/pd" }
policy "spare" {
  filter "overlap" {
    type                     = "min-overlap"
    min_device_overlap_block = 2
  }
  picker "p" {
    type        = "min-cost"
    temperature = -1
  }
}
`)
	want := []string{"t.hcl:6:5: Unsupported argument", "t.hcl:10:19: Invalid parameter value"}
	if diff := cmp.Diff(want, short(diags, hcl.DiagError)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\n%s", diff, FormatDiagnostics(diags))
	}
	if out := FormatDiagnostics(diags); !strings.Contains(out, `Did you mean "min_device_overlap_blocks"?`) {
		t.Errorf("no suggestion:\n%s", out)
	}
}

// On a plugin that fails to start with on_start_failure = "fallback", the
// file loads with a warning and the components its types would have made
// are placeholders failing with ErrPluginUnavailable.
func TestPluginStartFailureFallback(t *testing.T) {
	h := pdHost()
	h.fail["pd"] = errors.New("handshake failed: wrong cookie")
	b, diags := loadWithHost(t, h, `
plugin "pd" {
  command          = "bin/pd"
  on_start_failure = "fallback"
}
policy "pd" {
  filter "overlap" {
    type      = "min-overlap"
    not_known = "parameters of unavailable types are not checked"
  }
  picker "lowest" { type = "lowest-cost" }
}
worker_selection { prefill = "pd" }
`)
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
	}
	if got := short(diags, hcl.DiagWarning); !slices.Equal(got, []string{"t.hcl:2:1: Plugin failed to start"}) {
		t.Errorf("warnings = %q", got)
	}
	out := FormatDiagnostics(diags)
	for _, want := range []string{`Plugin "pd" (command "bin/pd") failed to start: handshake failed: wrong cookie.`, `decide by their fallbacks`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if len(b.FailedPlugins()) != 1 || b.Plugins[0].Failed == nil || !strings.Contains(b.Plugins[0].Failed.Error(), "wrong cookie") {
		t.Errorf("plugins = %+v", b.Plugins)
	}
	p := b.Roles[shared.RolePrefill]
	if p == nil || len(p.Filters) != 1 || p.Picker == nil || p.Fallback == nil || p.Fallback.PickerType != "least-loaded" {
		t.Fatalf("prefill = %+v", p)
	}
	_, err := p.Picker.Pick(context.Background(), nil, nil)
	var ue *UnavailableError
	if !errors.Is(err, ErrPluginUnavailable) || !errors.As(err, &ue) || ue.Type != "lowest-cost" || !slices.Equal(ue.Plugins, []string{"pd"}) ||
		err.Error() != `plugin unavailable: type "lowest-cost" may come from plugin "pd", which failed to start` {
		t.Errorf("Pick error = %v", err)
	}
	if err := p.Filters[0].Filter.Filter(context.Background(), nil, nil, nil); !errors.Is(err, ErrPluginUnavailable) {
		t.Errorf("Filter error = %v", err)
	}
	c := b.Decls[0].Components[0]
	if !c.Unavailable || !c.OutOfProcess || c.Source != "plugin pd" {
		t.Errorf("component = %+v", c)
	}
	if got := h.calls(); len(got) != 0 {
		t.Errorf("configured %v", got)
	}
}

// hostCase is a policy file loaded with pdHost (after its changes).
type hostCase struct {
	name   string
	src    string
	setup  func(h *fakeHost)
	errors []string
	warns  []string
	detail []string
}

var hostCases = []hostCase{
	{name: "unused plugin", src: `
plugin "pd" { command = "bin/pd" }`,
		warns: []string{"t.hcl:2:1: Unused plugin"}},
	{name: "start failure is an error at the block", src: `
plugin "pd" {
  command = "bin/pd"
}
policy "p" {
  filter "f" { type = "min-overlap" }
  picker "p" { type = "round-robin" }
}
worker_selection { prefill = "p" }`,
		setup: func(h *fakeHost) { h.fail["pd"] = errors.New("sha256 mismatch") },
		errors: []string{
			"t.hcl:2:1: Plugin failed to start",
			"t.hcl:6:23: Unknown filter type",
		},
		detail: []string{
			`Plugin "pd" (command "bin/pd") failed to start: sha256 mismatch. Fix the plugin, or set on_start_failure = "fallback"`,
			`It may come from plugin "pd" (t.hcl:2:1), which did not start.`,
		}},
	{name: "a plugin block with errors is not started", src: `
plugin "pd" {
  command      = "bin/pd"
  call_timeout = "0s"
}
policy "p" {
  picker "p" { type = "lowest-cost" }
}
worker_selection { prefill = "p" }`,
		errors: []string{"t.hcl:4:18: Invalid call_timeout", "t.hcl:7:23: Unknown picker type"}},
	{name: "duplicate of a built-in type", src: `
plugin "pd" { command = "bin/pd" }
policy "p" {
  picker "p" { type = "lowest-cost" }
}
worker_selection { prefill = "p" }`,
		setup: func(h *fakeHost) {
			h.types["pd"] = append(h.types["pd"], h.remote("busy", shared.KindFilter, nil, nil))
		},
		errors: []string{"t.hcl:2:1: Duplicate component type"},
		detail: []string{`Plugin "pd" provides type "busy", which the built-in catalog already provides.`}},
	{name: "duplicate between two plugins", src: `
plugin "pd" { command = "bin/pd" }
plugin "pd2" { command = "bin/pd2" }
policy "p" {
  scorer "c" { type = "decode-cost" }
  picker "p" { type = "lowest-cost" }
}
worker_selection { prefill = "p" }`,
		setup: func(h *fakeHost) {
			h.types["pd2"] = []shared.TypeInfo{h.remote("lowest-cost", shared.KindPicker, nil, nil)}
		},
		errors: []string{"t.hcl:3:1: Duplicate component type"},
		warns:  []string{"t.hcl:3:1: Unused plugin"},
		detail: []string{`Plugin "pd2" provides type "lowest-cost", which plugin "pd" (declared at t.hcl:2:1) already provides.`}},
	{name: "invalid plugin type", src: `
plugin "pd" { command = "bin/pd" }`,
		setup: func(h *fakeHost) {
			h.types["pd"] = []shared.TypeInfo{{Name: "no-new", Kind: shared.KindPicker}}
		},
		errors: []string{"t.hcl:2:1: Invalid plugin type"},
		warns:  []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{`Plugin "pd": registering type "no-new" from plugin pd: missing constructor.`}},
	{name: "a scorer parameter named weight", src: `
plugin "pd" { command = "bin/pd" }`,
		setup: func(h *fakeHost) {
			h.types["pd"] = []shared.TypeInfo{h.remote("w-cost", shared.KindScorer, []shared.ParamSpec{{Name: "weight", Type: shared.Number, Doc: "w"}}, nil)}
		},
		errors: []string{"t.hcl:2:1: Invalid plugin type"},
		warns:  []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{`Plugin "pd": registering type "w-cost" from plugin pd: parameter "weight": reserved parameter name: a scorer block's "weight" attribute is the block's own, so the parameter could never be set.`}},
	{name: "a NaN default", src: `
plugin "pd" { command = "bin/pd" }`,
		setup: func(h *fakeHost) {
			h.types["pd"] = []shared.TypeInfo{h.remote("nan-filter", shared.KindFilter, []shared.ParamSpec{{Name: "limit", Type: shared.Number, Default: math.NaN(), Doc: "l"}}, nil)}
		},
		errors: []string{"t.hcl:2:1: Invalid plugin type"},
		warns:  []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{`Plugin "pd": registering type "nan-filter" from plugin pd: parameter "limit": non-finite default NaN: a NUMBER default must be finite.`}},
	{name: "parameters the plugin refuses point at their attributes, once for all roles", src: `
plugin "pd" { command = "bin/pd" }
policy "p" {
  filter "f" {
    type                      = "min-overlap"
    min_device_overlap_blocks = -2
    max_blocks                = -1
  }
  picker "p" { type = "lowest-cost" }
}
worker_selection {
  prefill = "p"
  decode  = "p"
}`,
		errors: []string{"t.hcl:6:33: Invalid parameter value", "t.hcl:7:33: Invalid parameter value"},
		detail: []string{
			`Filter "f" of policy "p" (type "min-overlap" from plugin "pd") refused min_device_overlap_blocks = -2: must be >= 0. min_device_overlap_blocks (number): Least overlap kept.`,
			`refused max_blocks = -1: must be >= 0.`,
		}},
	{name: "other Configure errors point at the block", src: `
plugin "pd" { command = "bin/pd" }
policy "p" {
  filter "f" { type = "min-overlap" }
  picker "p" { type = "lowest-cost" }
}
worker_selection {
  aggregated = "p"
  prefill    = "p"
}`,
		errors: []string{"t.hcl:4:3: Invalid filter configuration"},
		detail: []string{`Filter "f" of policy "p" (type "min-overlap" from plugin "pd"): role "aggregated" is not supported; use prefill or decode.`}},
	{name: "unavailable fallback picker type", src: `
plugin "pd" {
  command          = "bin/pd"
  on_start_failure = "fallback"
}
policy "p" {
  picker "p" { type = "round-robin" }
  fallback = "lowest-cost"
}
worker_selection { prefill = "p" }`,
		setup: func(h *fakeHost) { h.fail["pd"] = errors.New("exit status 1") },
		warns: []string{"t.hcl:2:1: Plugin failed to start"}},
	{name: "unknown types are still errors when no plugin failed", src: `
plugin "pd" { command = "bin/pd" }
policy "p" {
  picker "p" { type = "fastest" }
}
worker_selection { prefill = "p" }`,
		errors: []string{"t.hcl:4:23: Unknown picker type"},
		// Not "Unused plugin": the misspelled type may have meant one of
		// pd's, which the error lists.
		detail: []string{`Available picker types: least-loaded, legacy-least-loaded, lowest-cost, min-cost, round-robin.`}},
	{name: "built-in parameter errors are reported once for three roles", src: `
policy "p" {
  picker "p" {
    type        = "min-cost"
    temperature = -1
  }
}
worker_selection {
  aggregated = "p"
  prefill    = "p"
  decode     = "p"
}`,
		errors: []string{"t.hcl:5:19: Invalid parameter value"}},
}

func TestLoadWithPluginHost(t *testing.T) {
	for _, tt := range hostCases {
		t.Run(tt.name, func(t *testing.T) {
			h := pdHost()
			if tt.setup != nil {
				tt.setup(h)
			}
			_, diags := loadWithHost(t, h, tt.src)
			out := FormatDiagnostics(diags)
			if diff := cmp.Diff(tt.errors, short(diags, hcl.DiagError)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\n%s", diff, out)
			}
			if diff := cmp.Diff(tt.warns, short(diags, hcl.DiagWarning)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s\n%s", diff, out)
			}
			for _, want := range tt.detail {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// Without a host, nothing is started and the caller's catalog is used as is.
func TestLoadWithoutPluginHost(t *testing.T) {
	cat := testCatalog(t)
	b, diags := Load("t.hcl", []byte(`plugin "pd" { command = "./x" }`), cat)
	if diags.HasErrors() || b.Catalog != cat {
		t.Errorf("catalog %p, want the caller's %p\n%s", b.Catalog, cat, FormatDiagnostics(diags))
	}
}

// router replay charges each plugin call of a decision the plugin's
// replay_decision_latency: consecutive components of one plugin are one
// call (one fused Decide message), built-in components and unavailable
// placeholders make none.
func TestReplayDecisionLatency(t *testing.T) {
	src := `
plugin "pd" {
  command                 = "bin/pd"
  replay_decision_latency = "300us"
}
plugin "q" {
  command          = "bin/q"
  on_start_failure = "fallback"
}
policy "fused" {
  filter "overlap" { type = "min-overlap" }
  scorer "cost" { type = "prefill-cost" }
  picker "lowest" { type = "lowest-cost" }
  fallback = "split"
}
policy "split" {
  filter "overlap" { type = "min-overlap" }
  scorer "kv" { type = "kv-cost" }
  picker "lowest" { type = "lowest-cost" }
  fallback = "two"
}
policy "two" {
  scorer "cost" { type = "prefill-cost" }
  scorer "q" { type = "q-cost" }
  picker "min" { type = "min-cost" }
  fallback = "rr"
}
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection {
  prefill = "fused"
  decode  = "two"
}
`
	for _, c := range []struct {
		name  string
		qDown bool
		want  map[string]time.Duration
	}{
		{"both up", false, map[string]time.Duration{"fused": 300 * time.Microsecond, "split": 600 * time.Microsecond,
			"two": 400 * time.Microsecond, "rr": 0, "least-loaded": 0, "nope": 0}},
		{"q failed to start", true, map[string]time.Duration{"fused": 300 * time.Microsecond, "split": 600 * time.Microsecond,
			"two": 300 * time.Microsecond, "rr": 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := pdHost()
			h.types["q"] = []shared.TypeInfo{h.remote("q-cost", shared.KindScorer, nil, nil)}
			if c.qDown {
				h.fail["q"] = errors.New("exec format error")
			}
			b, diags := loadWithHost(t, h, src)
			if diags.HasErrors() {
				t.Fatal(FormatDiagnostics(diags))
			}
			for policy, want := range c.want {
				if got := b.ReplayDecisionLatency(policy); got != want {
					t.Errorf("ReplayDecisionLatency(%q) = %v, want %v", policy, got, want)
				}
			}
			if got := b.ReplayClassifierLatency(); got != 0 {
				t.Errorf("ReplayClassifierLatency() without a classifier = %v, want 0", got)
			}
		})
	}
	// An out-of-process classifier costs its plugin's latency; a built-in
	// one nothing.
	b := &PolicyFile{Plugins: []Plugin{{Name: "cls", ReplayDecisionLatency: 70 * time.Microsecond}},
		Classifier: &Component{Kind: shared.KindClassifier, OutOfProcess: true, Source: "plugin cls"}}
	if got := b.ReplayClassifierLatency(); got != 70*time.Microsecond {
		t.Errorf("out-of-process classifier: %v, want 70µs", got)
	}
	b.Classifier = &Component{Kind: shared.KindClassifier, Source: "builtin"}
	if got := b.ReplayClassifierLatency(); got != 0 {
		t.Errorf("built-in classifier: %v, want 0", got)
	}
}
