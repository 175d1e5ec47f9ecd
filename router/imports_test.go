package router

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestCoreImports: the selection core imports, of this module, only its
// parts fleet, prefix, pipeline and policy, the hosted fast path and the
// plugin SDK (doc.go, "Floors"); loading a policy file (router/loader),
// configuration, the catalog and the plugin supervisor stay out of it.
func TestCoreImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Module.Path}}\n{{join .Imports \"\\n\"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	module, imports := lines[0], lines[1:]
	var got []string
	for _, p := range imports {
		if p == module || strings.HasPrefix(p, module+"/") {
			got = append(got, strings.TrimPrefix(p, module+"/"))
		}
	}
	want := []string{"hosted", "router/fleet", "router/pipeline", "router/policy", "router/predict", "router/prefix", "shared"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the core imports, of module %s, %v; want exactly %v", module, got, want)
	}
	for _, p := range imports {
		if strings.HasPrefix(p, "github.com/hashicorp/hcl") {
			t.Errorf("the core imports %s: reading HCL is router/loader's job", p)
		}
	}
}
