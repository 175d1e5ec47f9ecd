package config

import (
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/catalog"
)

// TestLoadDefaultCatalog loads a file against the real built-in types.
func TestLoadDefaultCatalog(t *testing.T) {
	cat := catalog.Default()
	b, diags := LoadFile("testdata/builtin-types.hcl", cat)
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:\n%s", FormatDiagnostics(diags))
	}
	def := b.Policies[DefaultPolicyName]
	if def == nil || def.PickerType != "min-cost" || len(def.Scorers) != 1 || def.Scorers[0].Type != "kv-cost" {
		t.Fatalf("default policy = %+v", def)
	}
	if def.Fallback == nil || def.Fallback.PickerType != "least-loaded" {
		t.Errorf("default fallback = %+v", def.Fallback)
	}
	if b.Roles["decode"] != def {
		t.Errorf("decode role = %v, want the default policy", b.RolePolicies["decode"])
	}

	_, diags = Load("t.hcl", []byte(`
policy "p" {
  picker "p" {
    type        = "min-cost"
    temperature = -1
  }
}
worker_selection { aggregated = "p" }`), cat)
	if got := short(diags, hcl.DiagError); len(got) != 1 || got[0] != "t.hcl:5:19: Invalid parameter value" {
		t.Errorf("errors = %q\n%s", got, FormatDiagnostics(diags))
	}
}
