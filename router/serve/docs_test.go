package serve

import (
	"os"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/live"
)

// TestDocsNameEveryEndpoint: docs/serve.md's endpoints table names every
// POST endpoint of live.Endpoints, and its "Engine utilities" section
// every utility path (live.APIUtility): a path added to the table is
// documented where a reader looks for it.
func TestDocsNameEveryEndpoint(t *testing.T) {
	b, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	section := func(title string) string {
		_, rest, ok := strings.Cut(doc, "\n"+title+"\n")
		if !ok {
			t.Fatalf("docs/serve.md has no %q", title)
		}
		if i := strings.Index(rest, "\n## "); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.Index(rest, "\n### "); i >= 0 {
			rest = rest[:i]
		}
		return rest
	}
	table := section("## Endpoints")
	utilities := section("### Engine utilities")
	n := 0
	for _, e := range live.Endpoints() {
		if !strings.Contains(table, "`"+e.Path+"`") && !strings.Contains(table, "`POST "+e.Path+"`") {
			t.Errorf("the endpoints table of docs/serve.md does not name %s", e.Path)
		}
		if e.API == live.APIUtility {
			n++
			if !strings.Contains(utilities, "`"+e.Path+"`") {
				t.Errorf("docs/serve.md's Engine utilities section does not name %s", e.Path)
			}
		}
	}
	if n != 5 {
		t.Errorf("%d utility endpoints, want 5 (tokenize, detokenize, their /v1/ forms, count_tokens)", n)
	}
}
