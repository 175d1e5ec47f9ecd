package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRestartBlock(t *testing.T) {
	load := func(body string) (*PolicyFile, string) {
		src := "plugin \"p\" {\n  command = \"bin/x\"\n" + body + "}\n"
		b, diags := Load("r.hcl", []byte(src), testCatalog(t))
		return b, FormatDiagnostics(diags)
	}
	b, _ := load("")
	if b == nil || b.Plugins[0].Restart != DefaultRestartPolicy() {
		t.Fatalf("no restart block: %+v", b)
	}
	b, diags := load("  restart {\n    max_restarts = 3\n    window       = \"30s\"\n    backoff_min  = \"1s\"\n    backoff_max  = \"4s\"\n  }\n")
	if b == nil {
		t.Fatal(diags)
	}
	want := RestartPolicy{MaxRestarts: 3, Window: 30 * time.Second, BackoffMin: time.Second, BackoffMax: 4 * time.Second}
	if diff := cmp.Diff(want, b.Plugins[0].Restart); diff != "" {
		t.Fatalf("restart (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ body, want string }{
		{"  restart {\n    max_restarts = -1\n  }\n", "r.hcl:4:20: error: Invalid max_restarts"},
		{"  restart {\n    window = \"0s\"\n  }\n", "r.hcl:4:14: error: Invalid window"},
		{"  restart {\n    backoff_min = \"2s\"\n    backoff_max = \"1s\"\n  }\n", "r.hcl:3:3: error: Invalid restart backoff"},
		{"  restart {\n    jitter = 1\n  }\n", "r.hcl:4:5: error: Unsupported argument"},
		{"  restart {\n  }\n  restart {\n  }\n", "r.hcl:5:3: error: Duplicate restart block"},
	} {
		if _, diags := load(tt.body); !strings.Contains(diags, tt.want) {
			t.Errorf("%q: diagnostics\n%s\nwant %q", tt.body, diags, tt.want)
		}
	}
}
