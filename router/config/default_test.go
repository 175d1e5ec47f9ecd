package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
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

// TestShippedPolicies loads every policy file under examples/policies and
// every hcl example in README.md against the real built-in catalog: what we
// ship and show must load without an error or a warning.
func TestShippedPolicies(t *testing.T) {
	files, err := filepath.Glob("../../examples/policies/*.hcl")
	if err != nil || len(files) < 4 {
		t.Fatalf("example policies: %v %v", files, err)
	}
	for _, f := range files {
		b, diags := LoadFile(f, catalog.Default())
		if len(diags) > 0 || b == nil {
			t.Errorf("%s:\n%s", f, FormatDiagnostics(diags))
		}
	}
	md, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```hcl\n(.*?)```").FindAllSubmatch(md, -1) {
		if _, diags := Load("README.md", m[1], catalog.Default()); len(diags) > 0 {
			t.Errorf("README example:\n%s\n%s", m[1], FormatDiagnostics(diags))
		}
	}
}

// Until classifier types exist, a request_classifier block gets a clear
// "not supported yet" error at its type.
func TestClassifierNotSupportedYet(t *testing.T) {
	src := "request_classifier {\n  type = \"header-priority\"\n}\n"
	b, diags := Load("c.hcl", []byte(src), catalog.Default())
	if b != nil || len(diags) != 1 {
		t.Fatalf("bundle %v, diags:\n%s", b, FormatDiagnostics(diags))
	}
	got := FormatDiagnostics(diags)
	want := "c.hcl:2:10: error: Request classifiers not supported yet;"
	if !strings.HasPrefix(got, want) {
		t.Fatalf("got %q, want prefix %q", got, want)
	}
}
