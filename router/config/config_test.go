package config

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/shared"
)

// short renders the diagnostics of one severity as "file:line:col: summary",
// sorted by position: the form the table below pins exactly.
func short(diags hcl.Diagnostics, sev hcl.DiagnosticSeverity) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(FormatDiagnostics(diags)), "\n") {
		kind := "error: "
		if sev == hcl.DiagWarning {
			kind = "warning: "
		}
		p, rest, ok := strings.Cut(line, kind)
		if !ok {
			continue
		}
		summary, _, _ := strings.Cut(rest, "; ")
		out = append(out, p+summary)
	}
	return out
}

func TestLoadFiles(t *testing.T) {
	cat := testCatalog(t)
	tests := []struct {
		file   string
		errors []string
		warns  []string
	}{
		{file: "full.hcl"},
		{file: "full.hcl.json"},
		{file: "builtin.hcl", warns: []string{
			"testdata/builtin.hcl:8:1: Unused plugin",
			"testdata/builtin.hcl:26:1: Unused policy",
		}},
		{file: "design.hcl", errors: []string{
			"testdata/design.hcl:10:19: Invalid sha256",
			"testdata/design.hcl:28:33: Plugin types not available",
			"testdata/design.hcl:31:26: Plugin types not available",
			"testdata/design.hcl:32:28: Plugin types not available",
		}, warns: []string{
			"testdata/design.hcl:36:1: Unused policy",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, diags := LoadFile(filepath.Join("testdata", tt.file), cat)
			if diff := cmp.Diff(tt.errors, short(diags, hcl.DiagError)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\n%s", diff, FormatDiagnostics(diags))
			}
			if diff := cmp.Diff(tt.warns, short(diags, hcl.DiagWarning)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s\n%s", diff, FormatDiagnostics(diags))
			}
			if (b == nil) != (len(tt.errors) > 0) {
				t.Errorf("bundle = %v with %d errors", b, len(tt.errors))
			}
		})
	}
}

func TestLoadFull(t *testing.T) {
	b, diags := LoadFile("testdata/full.hcl", testCatalog(t))
	if diags.HasErrors() || len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if b.BlockSize != 16 || !b.BlockSizeSet || b.Seed == nil || *b.Seed != -3 {
		t.Errorf("router = block_size %d (set %v) seed %v, want 16 (set) and -3", b.BlockSize, b.BlockSizeSet, b.Seed)
	}
	if got := slices.Sorted(maps.Keys(b.Policies)); !slices.Equal(got, []string{"default", "kv", "rr", "tuned"}) {
		t.Errorf("policies = %v", got)
	}

	kv := b.Policies["kv"]
	if kv.Name != "kv" || len(kv.Filters) != 1 || len(kv.Scorers) != 2 || kv.PickerName != "pick" || kv.PickerType != "min-cost" {
		t.Errorf("kv = %+v", kv)
	}
	if got := []float64{kv.Scorers[0].Weight, kv.Scorers[1].Weight}; !slices.Equal(got, []float64{2, 0}) {
		t.Errorf("kv weights = %v, want [2 0]", got)
	}
	wantParams := shared.Params{"overlap_credit": 0.5, "prefill_load_scale": 1.0, "decode_request_weight": 1.0}
	if diff := cmp.Diff(wantParams, kv.Scorers[0].Scorer.(*testScorer).params); diff != "" {
		t.Errorf("kv-cost params (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(shared.Params{"max_active_requests": int64(64), "max_kv_usage": 0.95},
		kv.Filters[0].Filter.(*testFilter).params); diff != "" {
		t.Errorf("busy params (-want +got):\n%s", diff)
	}

	// Fallback chain: kv -> rr -> default -> least-loaded.
	rr, def := b.Policies["rr"], b.Policies["default"]
	if kv.Fallback != rr || rr.Fallback != def {
		t.Errorf("fallbacks: kv -> %v, rr -> %v", kv.Fallback, rr.Fallback)
	}
	if def.Fallback == nil || def.Fallback.PickerType != "least-loaded" || !def.Fallback.PickerOnly() {
		t.Errorf("default fallback = %+v, want least-loaded picker-only", def.Fallback)
	}
	if len(def.Scorers) != 1 || def.Scorers[0].Type != DefaultScorerType || def.PickerType != "min-cost" {
		t.Errorf("default = %+v, want kv-cost + min-cost", def)
	}

	// tuned falls back to the round-robin picker type, not the rr policy.
	tuned := b.Policies["tuned"]
	if tuned.Fallback == nil || tuned.Fallback == rr || tuned.Fallback.PickerType != "round-robin" {
		t.Errorf("tuned fallback = %+v", tuned.Fallback)
	}
	wantAll := shared.Params{"ratio": 2.5, "count": int64(3), "enabled": false, "label": "x", "timeout": 90 * time.Second,
		"prefer": []string{"gpu-1", "gpu-0"}, "weights": []float64{0.5, 2, -1}, "tags": []string{"t"}}
	if diff := cmp.Diff(wantAll, tuned.Filters[0].Filter.(*testFilter).params); diff != "" {
		t.Errorf("all-types params (-want +got):\n%s", diff)
	}

	// Each role has its own instances; Policies holds the first role's.
	dec := b.Roles[shared.RoleDecode]
	if b.Roles[shared.RoleAggregated] != kv || dec == kv || dec.Name != "kv" || b.Roles[shared.RolePrefill] != tuned {
		t.Errorf("roles = %v", b.RolePolicies)
	}
	if dec.Picker == kv.Picker || dec.Fallback == kv.Fallback || dec.Fallback.Name != "rr" || dec.Fallback.Fallback.Name != "default" {
		t.Errorf("decode shares instances with aggregated: %+v", dec)
	}
	if got := b.Decls[0].Roles; !slices.Equal(got, []shared.Role{shared.RoleAggregated, shared.RoleDecode}) {
		t.Errorf("kv roles = %v", got)
	}
	if b.Decls[0].Instances[shared.RoleDecode] != dec {
		t.Error("kv decl instances do not hold the decode role's")
	}
	if b.Classifier == nil || b.Classifier.Type != "header-priority" || b.Classifier.Params.String("header", "") != "x-tier" {
		t.Errorf("classifier = %+v", b.Classifier)
	}

	var names []string
	for _, d := range b.Decls {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"kv", "rr", "tuned", "default"}) {
		t.Errorf("decls = %v", names)
	}
	d := b.Decls[0]
	var comps []string
	for _, c := range d.Components {
		comps = append(comps, c.Kind.String()+" "+c.Name+" "+c.Type+" "+c.Source)
	}
	wantComps := []string{"filter busy busy builtin", "scorer cost kv-cost builtin", "scorer again kv-cost builtin", "picker pick min-cost builtin"}
	if diff := cmp.Diff(wantComps, comps); diff != "" {
		t.Errorf("kv components (-want +got):\n%s", diff)
	}
	if d.Fallback != "rr" || d.FallbackPicker || !d.Used || d.Range.Start.Line != 7 {
		t.Errorf("kv decl = %+v", d)
	}
	if td := b.Decls[2]; td.Fallback != "round-robin" || !td.FallbackPicker {
		t.Errorf("tuned decl = %+v", td)
	}
}

func TestLoadDefaults(t *testing.T) {
	b, diags := Load("t.hcl", nil, testCatalog(t))
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if b.BlockSize != DefaultBlockSize || b.BlockSizeSet || b.Seed != nil || b.Classifier != nil || len(b.Plugins) != 0 {
		t.Errorf("bundle = %+v", b)
	}
	for _, r := range Roles {
		if b.Roles[r] == nil || b.Roles[r].Name != "default" || b.RolePolicies[r] != "default" {
			t.Errorf("role %s = %v", r, b.RolePolicies[r])
		}
	}
	if b.Roles[shared.RoleAggregated] != b.Policies["default"] {
		t.Error("Policies[default] is not the aggregated role's instance")
	}

	// Without the default types, an empty file has no policy for any role.
	_, diags = Load("t.hcl", nil, nil)
	want := []string{"t.hcl:1:1: Default policy unavailable", "t.hcl:1:1: Default policy unavailable", "t.hcl:1:1: Default policy unavailable"}
	if diff := cmp.Diff(want, short(diags, hcl.DiagError)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestLoadPlugin(t *testing.T) {
	src := `
plugin "pd" {
  command       = "bin/pd"
  args          = ["--x", "y"]
  env           = { K = "v" }
  pass_env      = ["HOME", "PATH"]
  sha256        = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"
  call_timeout  = "50ms"
  replay_decision_latency = "250us"
}
plugin "other" {
  command          = "bin/other"
  on_start_failure = "fallback"
}
`
	b, diags := Load("t.hcl", []byte(src), testCatalog(t))
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
	}
	want := []Plugin{{
		Name: "pd", Command: "bin/pd", Path: "bin/pd", Args: []string{"--x", "y"}, Env: map[string]string{"K": "v"},
		PassEnv:      []string{"HOME", "PATH"},
		SHA256:       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		StartTimeout: 5 * time.Second, CallTimeout: 50 * time.Millisecond, ReplayDecisionLatency: 250 * time.Microsecond,
		OnStartFailure: "error", Restart: DefaultRestartPolicy(),
	}, {
		Name: "other", Command: "bin/other", Path: "bin/other", StartTimeout: 5 * time.Second, CallTimeout: 20 * time.Millisecond,
		ReplayDecisionLatency: 100 * time.Microsecond, OnStartFailure: "fallback", Restart: DefaultRestartPolicy(),
	}}
	ignoreRanges := cmp.FilterPath(func(p cmp.Path) bool {
		n := p.Last().String()
		return n == ".Range" || n == ".AttrRanges"
	}, cmp.Ignore())
	if diff := cmp.Diff(want, b.Plugins, ignoreRanges); diff != "" {
		t.Errorf("plugins (-want +got):\n%s", diff)
	}
	if r := b.Plugins[0].AttrRanges["call_timeout"]; r.Start.Line != 8 {
		t.Errorf("call_timeout range = %v", r)
	}
	if got := short(diags, hcl.DiagWarning); !slices.Equal(got, []string{"t.hcl:2:1: Unused plugin", "t.hcl:11:1: Unused plugin"}) {
		t.Errorf("warnings = %q", got)
	}
}

// diagCase is one policy-file snippet and the diagnostics it must produce.
type diagCase struct {
	name   string
	src    string
	errors []string // exact, as "file:line:col: summary", in position order
	warns  []string
	detail []string // substrings of FormatDiagnostics
}

// diagCases are shared by TestLoadDiagnostics and the FuzzLoad corpus.
var diagCases = []diagCase{
	// Positive cases.
	{name: "empty file", src: ``},
	{name: "picker-only policy", src: `
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "rr" }`},
	{name: "null parameter means default", src: `
policy "p" {
  picker "p" {
    type        = "min-cost"
    temperature = null
  }
}
worker_selection { aggregated = "p" }`},
	{name: "policy reached only as a fallback is used", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  fallback = "b"
}
policy "b" {
  picker "p" { type = "least-loaded" }
}
worker_selection { decode = "a" }`},

	// Warnings.
	{name: "unused policy", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  fallback = "b"
}
policy "b" {
  picker "p" { type = "round-robin" }
}`,
		warns:  []string{"t.hcl:2:1: Unused policy", "t.hcl:6:1: Unused policy"},
		detail: []string{`Policy "a" is declared but unused`}},
	{name: "deprecated OCCUPANCY", src: `
policy "a" {
  picker "p" { type = "legacy-least-loaded" }
  fallback = "legacy-least-loaded"
}
worker_selection { aggregated = "a" }`,
		warns: []string{"t.hcl:3:3: Deprecated input OCCUPANCY", "t.hcl:4:14: Deprecated input OCCUPANCY"},
		detail: []string{
			`Picker "p" of policy "a" declares input OCCUPANCY, a deprecated alias of ACTIVE_REQUESTS that is removed in v2.0`,
			`Fallback picker "legacy-least-loaded" of policy "a" declares input OCCUPANCY`,
		}},
	{name: "unused plugin", src: `
plugin "pd" { command = "./x" }`,
		warns:  []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{`Plugin "pd" is declared but unused`}},

	// Syntax and structure.
	{name: "syntax error", src: `router {`,
		errors: []string{"t.hcl:1:8: Unclosed configuration block"}},
	{name: "unknown top-level block", src: `routr {}`,
		errors: []string{"t.hcl:1:1: Unsupported block type"},
		detail: []string{`Did you mean "router"?`}},
	{name: "unknown top-level attribute", src: `seed = 1`,
		errors: []string{"t.hcl:1:1: Unsupported argument"}},
	{name: "unknown router attribute", src: "router {\n  blocksize = 5\n}",
		errors: []string{"t.hcl:2:3: Unsupported argument"},
		detail: []string{`An argument named "blocksize" is not expected here. Did you mean "block_size"?`}},
	{name: "unknown policy block", src: `
policy "p" {
  scorrer "c" { type = "kv-cost" }
  picker "p" { type = "round-robin" }
}`,
		errors: []string{"t.hcl:3:3: Unsupported block type"},
		warns:  []string{"t.hcl:2:1: Unused policy"},
		detail: []string{`Did you mean "scorer"?`}},
	{name: "unknown component parameter", src: `
policy "p" {
  picker "p" {
    type       = "min-cost"
    temprature = 1
  }
}`,
		errors: []string{"t.hcl:5:5: Unsupported argument"},
		warns:  []string{"t.hcl:2:1: Unused policy"},
		detail: []string{`Did you mean "temperature"?`}},
	{name: "block inside component", src: `
policy "p" {
  picker "p" {
    type = "min-cost"
    extra {}
  }
}`,
		errors: []string{"t.hcl:5:5: Unsupported block type"},
		warns:  []string{"t.hcl:2:1: Unused policy"}},
	{name: "weight outside a scorer", src: `
policy "p" {
  picker "p" {
    type   = "min-cost"
    weight = 1
  }
}`,
		errors: []string{"t.hcl:5:5: Unsupported argument"},
		warns:  []string{"t.hcl:2:1: Unused policy"}},
	{name: "unknown role", src: `
worker_selection {
  agregated = "default"
}`,
		errors: []string{"t.hcl:3:3: Unsupported argument"},
		detail: []string{`Did you mean "aggregated"?`}},
	{name: "duplicate singleton blocks", src: `
router {}
router {}
worker_selection {}
worker_selection {}
request_classifier { type = "header-priority" }
request_classifier { type = "header-priority" }`,
		errors: []string{
			"t.hcl:3:1: Duplicate router block",
			"t.hcl:5:1: Duplicate worker_selection block",
			"t.hcl:7:1: Duplicate request_classifier block",
		},
		detail: []string{"the first is at t.hcl:2:1"}},
	{name: "missing label", src: `policy {}`,
		errors: []string{"t.hcl:1:8: Missing name for policy"}},

	// Names.
	{name: "bad identifiers", src: `
plugin "a b" { command = "./x" }
policy "p/q" {
  picker "p!" { type = "round-robin" }
}
policy "" {
  picker "p" { type = "round-robin" }
}`,
		errors: []string{
			"t.hcl:2:8: Invalid name",
			"t.hcl:3:8: Invalid name",
			"t.hcl:4:10: Invalid name",
			"t.hcl:6:8: Invalid name",
		},
		detail: []string{`Policy name "p/q" must be made of letters, digits, '_', '.' and '-'`}},
	{name: "reserved default", src: `
plugin "default" { command = "./x" }
policy "default" {
  picker "default" { type = "round-robin" }
}`,
		errors: []string{
			"t.hcl:2:8: Reserved name",
			"t.hcl:3:8: Reserved name",
			"t.hcl:4:10: Reserved name",
		},
		detail: []string{`The name "default" is reserved for the built-in default policy; choose another policy name.`}},
	{name: "duplicate names", src: `
plugin "pd" { command = "./x" }
plugin "pd" { command = "./y" }
policy "p" {
  filter "c" { type = "busy" }
  scorer "c" { type = "kv-cost" }
  picker "p" { type = "round-robin" }
}
policy "p" {
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{
			"t.hcl:3:8: Duplicate plugin",
			"t.hcl:6:10: Duplicate component name",
			"t.hcl:9:8: Duplicate policy",
		},
		warns: []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{
			`Plugin "pd" is already declared at t.hcl:2:1`,
			`Policy "p" already has a component named "c" (filter at t.hcl:5:3)`,
			`Policy "p" is already declared at t.hcl:4:1`,
		}},

	// Types.
	{name: "unknown type lists available sorted", src: `
policy "p" {
  picker "p" { type = "fastest" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:3:23: Unknown picker type"},
		detail: []string{`Picker "p" of policy "p" uses type "fastest", which is not registered. Available picker types: least-loaded, legacy-least-loaded, min-cost, round-robin.`}},
	{name: "missing type", src: `
policy "p" {
  picker "p" { }
}`,
		errors: []string{"t.hcl:3:14: Missing required argument"},
		warns:  []string{"t.hcl:2:1: Unused policy"}},
	{name: "wrong kind", src: `
policy "p" {
  filter "f" { type = "kv-cost" }
  picker "p" { type = "round-robin" }
}
request_classifier { type = "min-cost" }
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:3:23: Wrong component kind", "t.hcl:6:29: Wrong component kind"},
		detail: []string{`uses type "kv-cost", which is a scorer, not a filter. Available filter types: all-types, broken, busy.`}},
	{name: "plugin types without a plugin host", src: `
plugin "pd" { command = "bin/pd" }
policy "p" {
  filter "f" { type = "min-overlap" }
  picker "p" { type = "round-robin" }
}
worker_selection { prefill = "p" }`,
		errors: []string{"t.hcl:4:23: Plugin types not available"},
		detail: []string{`It may come from plugin "pd" (t.hcl:2:1), but this load was not given a plugin host`}},

	// Parameters.
	{name: "parameter out of range", src: `
policy "p" {
  picker "p" {
    type        = "min-cost"
    temperature = -1
  }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:5:19: Invalid parameter value"},
		detail: []string{`Picker "p" of policy "p" (type "min-cost") refused temperature = -1: must be a finite number >= 0, got -1. temperature (number): Softmax temperature`}},
	{name: "parameter error on an absent parameter points at the block", src: `
policy "p" {
  filter "f" { type = "broken" }
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:3:3: Invalid filter configuration"},
		detail: []string{`out of cheese`}},
	{name: "parameter types", src: `
policy "p" {
  filter "f" {
    type    = "all-types"
    ratio   = "much"
    count   = 1.5
    enabled = "maybe"
    label   = ["a"]
    timeout = "5 seconds"
  }
  filter "g" {
    type  = "all-types"
    count = 99999999999999999999
    ratio = 1e400
  }
  filter "h" {
    type = "all-types"
  }
  filter "i" {
    type  = "all-types"
    count = null
  }
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{
			"t.hcl:5:15: Incorrect attribute value type",
			"t.hcl:6:15: Invalid int",
			"t.hcl:7:15: Incorrect attribute value type",
			"t.hcl:8:15: Incorrect attribute value type",
			"t.hcl:9:15: Invalid duration",
			"t.hcl:13:13: Invalid int",
			"t.hcl:14:13: Invalid number",
			"t.hcl:16:14: Missing required argument",
			"t.hcl:21:13: Missing required argument",
		},
		detail: []string{
			`The value of "count" must be a whole number, got 1.5`,
			`The value of "timeout" must be a duration such as "20ms"`,
			`is out of range`,
		}},
	{name: "list parameters", src: `
policy "p" {
  filter "f" {
    type    = "all-types"
    count   = 1
    prefer  = "gpu-0"
    weights = ["x"]
  }
  filter "g" {
    type    = "all-types"
    count   = 1
    prefer  = ["a", null]
    weights = [1, 1e400]
  }
  filter "h" {
    type    = "all-types"
    count   = 1
    prefer  = [["a"]]
    weights = [1, null]
  }
  filter "i" {
    type    = "all-types"
    count   = 1
    prefer  = ["a", 1, true]
    weights = [1, "2"]
  }
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{
			"t.hcl:6:15: Invalid list(string)",
			"t.hcl:7:15: Invalid list(number)",
			"t.hcl:12:15: Invalid list(string)",
			"t.hcl:13:15: Invalid list(number)",
			"t.hcl:18:15: Invalid list(string)",
			"t.hcl:19:15: Invalid list(number)",
			"t.hcl:24:15: Invalid list(string)",
			"t.hcl:25:15: Invalid list(number)",
		},
		detail: []string{
			`The value of "prefer" must be a list(string) such as ["a", "b"], got a string`,
			`The value of "weights" entry 0 is a string; a list(number) holds numbers`,
			`The value of "prefer" has a null entry 1; a list(string) holds strings`,
			`The value of "weights" entry 1 is out of range: 1e+400`,
			`The value of "prefer" entry 0 is a tuple; a list(string) holds strings`,
			`The value of "weights" has a null entry 1; a list(number) holds numbers`,
			// Not converted: a number or a bool in a list(string) is an
			// error, as a string in a list(number) is.
			`The value of "prefer" entry 1 is a number; a list(string) holds strings`,
			`The value of "weights" entry 1 is a string; a list(number) holds numbers`,
		}},
	{name: "empty fallback and canary policy", src: `
policy "p" {
  picker "p" { type = "round-robin" }
  fallback = ""
  canary {
    policy = ""
  }
}
worker_selection { aggregated = "p" }`,
		errors: []string{
			"t.hcl:4:14: Empty fallback",
			"t.hcl:6:14: Empty canary policy",
		}},
	{name: "variables and functions are not allowed", src: `
policy "p" {
  picker "p" {
    type        = var.t
    temperature = abs(1)
  }
}`,
		errors: []string{"t.hcl:4:19: Variables not allowed"},
		warns:  []string{"t.hcl:2:1: Unused policy"}},
	{name: "bad weights", src: `
policy "p" {
  scorer "a" {
    type   = "kv-cost"
    weight = -1
  }
  scorer "b" {
    type   = "kv-cost"
    weight = "heavy"
  }
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:5:14: Invalid weight", "t.hcl:9:14: Incorrect attribute value type"},
		detail: []string{`The weight of scorer "a" of policy "p" must be >= 0, got -1`}},
	{name: "int parameter refused by the type", src: `
policy "p" {
  filter "f" {
    type                = "busy"
    max_active_requests = 0
  }
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:5:27: Invalid parameter value"},
		detail: []string{`refused max_active_requests = 0: must be >= 1`}},

	// Pickers.
	{name: "policy without picker", src: `
policy "p" {
  scorer "c" { type = "kv-cost" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:2:1: Missing picker"}},
	{name: "two pickers", src: `
policy "p" {
  picker "a" { type = "round-robin" }
  picker "b" { type = "least-loaded" }
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:4:3: Duplicate picker"},
		detail: []string{`Policy "p" already has picker "a" at t.hcl:3:3`}},

	// Fallbacks.
	{name: "unknown fallback", src: `
policy "p" {
  picker "p" { type = "round-robin" }
  fallback = "nope"
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:4:14: Unknown fallback"},
		detail: []string{`Policy "p" falls back to "nope", which is neither a policy nor a picker type. Declared policies: "default", "p". Picker types: least-loaded, legacy-least-loaded, min-cost, round-robin.`}},
	{name: "fallback to a scorer type", src: `
policy "p" {
  picker "p" { type = "round-robin" }
  fallback = "kv-cost"
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:4:14: Unknown fallback"}},
	{name: "fallback cycle", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  fallback = "b"
}
policy "b" {
  picker "p" { type = "round-robin" }
  fallback = "c"
}
policy "c" {
  picker "p" { type = "round-robin" }
  fallback = "a"
}
policy "self" {
  picker "p" { type = "round-robin" }
  fallback = "self"
}
worker_selection {
  aggregated = "c"
  prefill    = "self"
}`,
		errors: []string{"t.hcl:4:14: Fallback cycle", "t.hcl:16:14: Fallback cycle"},
		detail: []string{`Policy fallbacks form a cycle: "a" -> "b" -> "c" -> "a".`, `"self" -> "self"`}},

	// Roles.
	{name: "role names an undefined policy", src: `
worker_selection {
  aggregated = "kv"
  decode     = ["kv"]
}`,
		errors: []string{"t.hcl:3:16: Unknown policy", "t.hcl:4:16: Incorrect attribute value type"},
		detail: []string{`Role aggregated names policy "kv", which is not declared. Declared policies: "default".`}},

	// Router.
	{name: "bad block_size and seed", src: `
router {
  block_size = 0
  seed       = 1.5
}`,
		errors: []string{"t.hcl:3:16: Invalid block_size", "t.hcl:4:16: Invalid integer"}},
	{name: "negative block_size", src: `router { block_size = -512 }`,
		errors: []string{"t.hcl:1:23: Invalid block_size"}},

	// Plugins.
	{name: "bad plugin attributes", src: `
plugin "pd" {
  command       = ""
  sha256        = "abc"
  start_timeout = "5"
  call_timeout  = "-1ms"
  env           = { "A=B" = "x" }
  args          = "--x"
  on_start_failure = "ignore"
}`,
		errors: []string{
			"t.hcl:3:19: Invalid plugin command",
			"t.hcl:4:19: Invalid sha256",
			"t.hcl:5:19: Invalid duration",
			"t.hcl:6:19: Invalid call_timeout",
			"t.hcl:7:19: Invalid environment variable name",
			"t.hcl:8:19: Incorrect attribute value type",
			"t.hcl:9:22: Invalid on_start_failure",
		},
		warns:  []string{"t.hcl:2:1: Unused plugin"},
		detail: []string{"sha256 must be the 64 hexadecimal digits", `(units ns, us, ms, s, m, h), got "5"`}},
	{name: "replay_decision_latency out of range", src: `
plugin "a" {
  command                 = "bin/a"
  replay_decision_latency = "-1us"
}
plugin "b" {
  command                 = "bin/b"
  replay_decision_latency = "2s"
}
plugin "c" {
  command                 = "bin/c"
  replay_decision_latency = 100
}`,
		errors: []string{
			"t.hcl:4:29: Invalid replay_decision_latency",
			"t.hcl:8:29: Invalid replay_decision_latency",
			"t.hcl:12:29: Invalid duration",
		},
		warns: []string{"t.hcl:2:1: Unused plugin", "t.hcl:6:1: Unused plugin", "t.hcl:10:1: Unused plugin"},
		detail: []string{`replay_decision_latency must be a duration from "0s" to "1s", such as "100us" (the default), got "-1µs".`,
			`got "2s"`}},
	{name: "plugin without command", src: `plugin "pd" {}`,
		errors: []string{"t.hcl:1:13: Missing required argument"},
		warns:  []string{"t.hcl:1:1: Unused plugin"}},

	// Shadows.
	{name: "unknown shadow", src: `
policy "p" {
  picker "p" { type = "round-robin" }
  shadow = "round-robin"
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:4:12: Unknown shadow"},
		detail: []string{`Policy "p" is shadowed by "round-robin", which is not a policy. Declared policies: "default", "p".`}},
	{name: "misspelled shadow", src: `
policy "live" {
  picker "p" { type = "round-robin" }
  shadow = "Trial"
}
policy "trial" {
  picker "p" { type = "least-loaded" }
}
worker_selection { aggregated = "live" }`,
		// No "Unused policy" for trial: the misspelled shadow meant it.
		errors: []string{"t.hcl:4:12: Unknown shadow"},
		detail: []string{`Policy "live" is shadowed by "Trial", which is not a policy. Declared policies: "default", "live", "trial".`}},
	{name: "shadow of itself", src: `
policy "p" {
  picker "p" { type = "round-robin" }
  shadow = "p"
}
worker_selection { aggregated = "p" }`,
		errors: []string{"t.hcl:4:12: Policy shadows itself"}},
	{name: "shadow chain", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  shadow = "b"
}
policy "b" {
  picker "p" { type = "round-robin" }
  shadow = "c"
}
policy "c" {
  picker "p" { type = "least-loaded" }
}
worker_selection { aggregated = "a" }`,
		errors: []string{"t.hcl:4:12: Shadow chain"},
		detail: []string{`Policy "a" is shadowed by "b", which has a shadow of its own (at t.hcl:8:3)`},
		// No "Unused policy" for b or c beside the error: a shadow in
		// error may have meant either.
	},
	{name: "shadow in the fallback chain", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  fallback = "b"
  shadow   = "b"
}
policy "b" {
  picker "p" { type = "least-loaded" }
}
worker_selection { aggregated = "a" }`,
		errors: []string{"t.hcl:5:14: Shadow in the fallback chain"}},
	{name: "null shadow", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  shadow = null
}
worker_selection { aggregated = "a" }`,
		errors: []string{"t.hcl:4:12: Invalid attribute value"}},

	// All errors are reported, not just the first.
	{name: "many errors at once", src: `
router { block_size = 0 }
policy "p" {
  picker "p" {
    type        = "min-cost"
    temperature = -1
  }
  fallback = "p"
}
worker_selection { aggregated = "q" }`,
		errors: []string{
			"t.hcl:2:23: Invalid block_size",
			"t.hcl:6:19: Invalid parameter value",
			"t.hcl:8:14: Fallback cycle",
			"t.hcl:10:33: Unknown policy",
		},
		// Not "Unused policy" for "p": the role naming "q" may have
		// meant it.
	},
}

func TestLoadDiagnostics(t *testing.T) {
	cat := testCatalog(t)
	for _, tt := range diagCases {
		t.Run(tt.name, func(t *testing.T) {
			b, diags := Load("t.hcl", []byte(tt.src), cat)
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
			if diags.HasErrors() != (b == nil) {
				t.Errorf("bundle %v with errors %v", b != nil, diags.HasErrors())
			}
			for _, d := range diags {
				if d.Subject == nil {
					t.Errorf("diagnostic without subject: %v", d)
				}
			}
		})
	}
}

func TestFormatDiagnostics(t *testing.T) {
	r := func(line, col int) *hcl.Range {
		return &hcl.Range{Filename: "f.hcl", Start: hcl.Pos{Line: line, Column: col}}
	}
	diags := hcl.Diagnostics{
		{Severity: hcl.DiagWarning, Summary: "Later", Detail: "Two\nlines.", Subject: r(3, 1)},
		{Severity: hcl.DiagError, Summary: "No position"},
		{Severity: hcl.DiagError, Summary: "First", Detail: "Fix it.", Subject: r(1, 5)},
		{Severity: hcl.DiagError, Summary: "No detail", Subject: r(1, 7)},
	}
	want := "f.hcl:1:5: error: First; Fix it.\n" +
		"f.hcl:1:7: error: No detail\n" +
		"f.hcl:3:1: warning: Later; Two lines.\n" +
		"error: No position\n"
	if diff := cmp.Diff(want, FormatDiagnostics(diags)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := FormatDiagnostics(nil); got != "" {
		t.Errorf("empty = %q", got)
	}
}

func TestLoadFileMissing(t *testing.T) {
	_, diags := LoadFile("testdata/nope.hcl", testCatalog(t))
	if got := short(diags, hcl.DiagError); !slices.Equal(got, []string{"testdata/nope.hcl:1:1: Failed to read policy file"}) {
		t.Errorf("errors = %q", got)
	}
}

// TestShadowInstances: each role selecting a policy with a shadow gets its
// own instance of the shadow, named by that role, and only the role's own
// policy's shadow is reached (not a fallback's).
func TestShadowInstances(t *testing.T) {
	src := `
policy "live" {
  picker "p" { type = "round-robin" }
  fallback = "fb"
  shadow   = "trial"
}
policy "fb" {
  picker "p" { type = "least-loaded" }
  shadow = "fbtrial"
}
policy "trial" {
  picker "p" { type = "round-robin" }
}
policy "fbtrial" {
  picker "p" { type = "round-robin" }
}
worker_selection {
  prefill = "live"
  decode  = "live"
}`
	b, diags := Load("t.hcl", []byte(src), testCatalog(t))
	if diags.HasErrors() {
		t.Fatal(FormatDiagnostics(diags))
	}
	if got := short(diags, hcl.DiagWarning); !slices.Equal(got, []string{"t.hcl:14:1: Unused policy"}) {
		t.Errorf("warnings = %v, want fbtrial unused", got)
	}
	pre, dec := b.Roles[shared.RolePrefill], b.Roles[shared.RoleDecode]
	if pre.Shadow == nil || dec.Shadow == nil || pre.Shadow.Name != "trial" || dec.Shadow.Name != "trial" {
		t.Fatalf("shadows: prefill %+v, decode %+v", pre.Shadow, dec.Shadow)
	}
	if pre.Shadow == dec.Shadow || pre.Shadow.Picker == dec.Shadow.Picker || pre.Shadow.Picker == pre.Picker {
		t.Error("the roles share a shadow instance, or the shadow shares the live picker")
	}
	var trial *PolicyDecl
	for _, d := range b.Decls {
		if d.Name == "live" && d.Shadow != "trial" {
			t.Errorf("live decl shadow = %q", d.Shadow)
		}
		if d.Name == "trial" {
			trial = d
		}
	}
	if trial == nil || !trial.Used || !slices.Equal(trial.Roles, []shared.Role{shared.RolePrefill, shared.RoleDecode}) ||
		trial.Instances[shared.RoleDecode] != dec.Shadow {
		t.Errorf("trial decl = %+v", trial)
	}
}

// TestShadowDefault: the built-in default policy may be a shadow; it is
// then instantiated for the role like a policy the role selects.
func TestShadowDefault(t *testing.T) {
	src := `
policy "rr" {
  picker "p" { type = "round-robin" }
  shadow = "default"
}
worker_selection { aggregated = "rr" }`
	b, diags := Load("t.hcl", []byte(src), testCatalog(t))
	if len(diags) > 0 {
		t.Fatal(FormatDiagnostics(diags))
	}
	sh := b.Roles[shared.RoleAggregated].Shadow
	if sh == nil || sh.Name != DefaultPolicyName || len(sh.Scorers) != 1 || sh.Scorers[0].Type != DefaultScorerType {
		t.Fatalf("shadow = %+v", sh)
	}
	if sh == b.Roles[shared.RolePrefill] || sh.Scorers[0].Scorer == b.Roles[shared.RolePrefill].Scorers[0].Scorer {
		t.Error("the aggregated role's shadow shares the prefill role's default policy instance")
	}
}

// router.block_size set to the default value is still an override: the
// loader tells "set to 512" from "unset" (BlockSizeSet).
func TestBlockSizeSetAtDefault(t *testing.T) {
	b, diags := Load("t.hcl", []byte("router {\n  block_size = 512\n}\n"), testCatalog(t))
	if diags.HasErrors() {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if b.BlockSize != 512 || !b.BlockSizeSet {
		t.Errorf("block_size = 512: BlockSize %d set %v, want 512 and set", b.BlockSize, b.BlockSizeSet)
	}
	b, diags = Load("t.hcl", []byte("router {\n  seed = 1\n}\n"), testCatalog(t))
	if diags.HasErrors() {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if b.BlockSize != DefaultBlockSize || b.BlockSizeSet {
		t.Errorf("router block without block_size: BlockSize %d set %v, want %d and unset", b.BlockSize, b.BlockSizeSet, DefaultBlockSize)
	}
}

// TestListParamLength: a list parameter of MaxListEntries entries loads
// with every entry in order; one more is an error at the attribute naming
// the count. Each entry is checked once (listValue), so the largest list
// a 4 MiB file can hold loads in linear work: cty's tuple-to-list
// conversion, used before, took 71 s of CPU for 100,000 entries.
func TestListParamLength(t *testing.T) {
	cat := testCatalog(t)
	src := func(n int) []byte {
		var b strings.Builder
		b.WriteString("policy \"p\" {\n  filter \"f\" {\n    type   = \"all-types\"\n    count  = 1\n    prefer = [")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%q", "w"+strconv.Itoa(i))
		}
		b.WriteString("]\n  }\n  picker \"p\" { type = \"round-robin\" }\n}\nworker_selection { aggregated = \"p\" }\n")
		return []byte(b.String())
	}
	b, diags := Load("t.hcl", src(MaxListEntries), cat)
	if diags.HasErrors() {
		t.Fatalf("%d entries: %s", MaxListEntries, FormatDiagnostics(diags))
	}
	got, _ := b.Policies["p"].Filters[0].Filter.(*testFilter).params["prefer"].([]string)
	if len(got) != MaxListEntries || got[0] != "w0" || got[MaxListEntries-1] != "w"+strconv.Itoa(MaxListEntries-1) {
		t.Fatalf("prefer has %d entries (%.3q...), want %d from w0", len(got), got[:min(len(got), 3)], MaxListEntries)
	}
	_, diags = Load("t.hcl", src(MaxListEntries+1), cat)
	want := fmt.Sprintf("t.hcl:5:14: error: Invalid list(string); The value of \"prefer\" has %d entries; a list(string) holds at most %d.", MaxListEntries+1, MaxListEntries)
	if out := FormatDiagnostics(diags); !strings.Contains(out, want) {
		t.Errorf("%d entries: got\n%s\nwant %q", MaxListEntries+1, out, want)
	}
}
