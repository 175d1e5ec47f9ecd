package config

import (
	"os"
	"regexp"
	"testing"
)

// TestDocs loads every HCL example of docs/policy-file.md: the docs must
// show files that load without errors.
func TestDocs(t *testing.T) {
	md, err := os.ReadFile("../../docs/policy-file.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```hcl\n(.*?)```").FindAllSubmatch(md, -1)
	if len(blocks) == 0 {
		t.Fatal("no hcl examples found")
	}
	cat := testCatalog(t)
	for _, m := range blocks {
		if _, diags := Load("docs/policy-file.md", m[1], cat); diags.HasErrors() {
			t.Errorf("example does not load:\n%s\n%s", m[1], FormatDiagnostics(diags))
		}
	}
}
