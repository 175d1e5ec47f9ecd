package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// TestLoadDefaultCatalog loads a file against the real built-in types.
func TestLoadDefaultCatalog(t *testing.T) {
	cat := catalog.Default()
	b, diags := LoadFile("testdata/builtin-types.hcl", cat)
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:\n%s", FormatDiagnostics(diags))
	}
	def := b.Policies[DefaultPolicyName]
	if def == nil || def.PickerType != "min-cost" || len(def.Scorers) != 1 || def.Scorers[0].Type != "kv-affinity" {
		t.Fatalf("default policy = %+v", def)
	}
	if def.Fallback == nil || def.Fallback.PickerType != "least-loaded" {
		t.Errorf("default fallback = %+v", def.Fallback)
	}
	if b.Roles["decode"] == nil || b.Roles["decode"].Name != DefaultPolicyName {
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

// TestShippedPolicies loads every policy file under examples/policies and its
// peers/ subdirectory, and every hcl example in README.md, against the real
// built-in catalog: what we ship and show must load without an error or a
// warning. Plugin types are stood in for by shapeHost; the example plugins'
// own tests load these files with the real binaries.
func TestShippedPolicies(t *testing.T) {
	files, err := filepath.Glob("../../examples/policies/*.hcl")
	if err != nil || len(files) < 4 {
		t.Fatalf("example policies: %v %v", files, err)
	}
	// The peers' baselines (issue #30) live one level down.
	peers, err := filepath.Glob("../../examples/policies/peers/*.hcl")
	if err != nil || len(peers) < 4 {
		t.Fatalf("peer policies: %v %v", peers, err)
	}
	files = append(files, peers...)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		host := shapeHost(t, f, src, catalog.Default())
		b, diags := LoadWith(f, src, catalog.Default(), Options{Plugins: host})
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

// The built-in classifiers load through request_classifier, with their
// parameters checked at file:line:col.
func TestBuiltinClassifierLoads(t *testing.T) {
	src := "queue {\n  class \"batch\" {\n  }\n}\nrequest_classifier {\n  type          = \"header-priority\"\n  default_class = \"batch\"\n}\n"
	b, diags := Load("c.hcl", []byte(src), catalog.Default())
	if b == nil || len(diags) != 0 {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if b.Classifier == nil || b.Classifier.Type != "header-priority" || b.Classifier.Instance == nil {
		t.Fatalf("classifier %+v", b.Classifier)
	}
	src = "request_classifier {\n  type    = \"prompt-length-class\"\n  buckets = \"short:100,medium:50,long\"\n}\n"
	if _, diags := Load("c.hcl", []byte(src), catalog.Default()); !strings.Contains(FormatDiagnostics(diags), "c.hcl:3:13: error:") {
		t.Fatalf("bad buckets: %s", FormatDiagnostics(diags))
	}
}

// shapeHost returns a PluginHost whose first plugin provides, for every
// component type of src that cat lacks, a type of the block's kind that
// accepts the parameters the file gives it (typed by their literal values).
// It checks a shipped file's structure without the plugin binaries.
func shapeHost(t *testing.T, filename string, src []byte, cat *catalog.Catalog) *fakeHost {
	t.Helper()
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s: %s", filename, diags)
	}
	h := &fakeHost{types: map[string][]shared.TypeInfo{}}
	first := ""
	seen := map[string]bool{}
	kinds := map[string]shared.Kind{"filter": shared.KindFilter, "scorer": shared.KindScorer, "picker": shared.KindPicker,
		"request_classifier": shared.KindClassifier}
	for _, blk := range file.Body.(*hclsyntax.Body).Blocks {
		if blk.Type == "plugin" && first == "" && len(blk.Labels) == 1 {
			first = blk.Labels[0]
		}
		var comps []*hclsyntax.Block
		switch blk.Type {
		case "policy":
			comps = blk.Body.Blocks
		case "request_classifier":
			comps = []*hclsyntax.Block{blk}
		}
		for _, cb := range comps {
			attr := cb.Body.Attributes["type"]
			if attr == nil || kinds[cb.Type] == 0 {
				continue
			}
			v, _ := attr.Expr.Value(nil)
			if v.Type() != cty.String || seen[v.AsString()] {
				continue
			}
			if _, err := cat.Lookup(v.AsString()); err == nil {
				continue
			}
			seen[v.AsString()] = true
			var params []shared.ParamSpec
			for name, a := range cb.Body.Attributes {
				pv, _ := a.Expr.Value(nil)
				pt := shared.String
				switch {
				case name == "type" || name == "weight":
					continue
				case pv.Type() == cty.Number:
					pt = shared.Number
				case pv.Type() == cty.Bool:
					pt = shared.Bool
				}
				params = append(params, shared.ParamSpec{Name: name, Type: pt})
			}
			h.types[first] = append(h.types[first], h.remote(v.AsString(), kinds[cb.Type], params, nil))
		}
	}
	return h
}
