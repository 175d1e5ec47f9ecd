//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClassifierUnknownClassIsAFileError: a request_classifier whose
// default_class names no queue class used to pass validate and start serve,
// which then refused every request without a class header with 400
// classification_failed. Every command that loads a policy file now exits 1
// with the error at default_class's value (line 6, column 19).
func TestClassifierUnknownClassIsAFileError(t *testing.T) {
	bin, _ := e2eBinaries(t)
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	src := `queue {
  class "a" { weight = 1 }
}
request_classifier {
  type          = "header-priority"
  default_class = "zzz"
}
worker "w" {
  url = "http://127.0.0.1:8001"
}
`
	if err := os.WriteFile(policy, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	want := policy + `:6:19: error: Unknown queue class; default_class names queue class "zzz", which the queue block does not have (classes: a); ` +
		`every request so classified would be refused. Name one of them, or add class "zzz" to the queue.`
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"validate", []string{"validate", policy}},
		{"replay", []string{"replay", "--policy", policy}},
		{"serve", []string{"serve", "--policy", policy, "--listen", "127.0.0.1:0"}},
		{"epp", []string{"epp", "--policy", policy, "--listen", "127.0.0.1:0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr := runBinary(t, bin, tt.args...)
			if code != 1 || !hasLinePrefix(stderr, want) {
				t.Errorf("exit %d, stderr\n%.2000s\nwant exit 1 and a line starting\n%s", code, stderr, want)
			}
		})
	}
}
