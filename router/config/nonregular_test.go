//go:build unix

package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/inputfile/inputfiletest"
)

// TestLoadRefusesNonRegularFiles: a policy or workers file that is not a
// regular file, or is over inputfile.MaxConfigSize, is one error
// diagnostic at FILE:1:1 saying why, for LoadFile and LoadWorkers alike;
// so is "-", which is no file.
// The named pipe has no writer: reading it would block for ever.
func TestLoadRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := inputfiletest.FIFO(t, dir, "fifo.hcl")
	zero := inputfiletest.DevZero(t, dir, "zero.hcl")
	sub := inputfiletest.Dir(t, dir, "dir.hcl")
	big := inputfiletest.Oversized(t, dir, "big.hcl", inputfile.MaxConfigSize)
	for _, tt := range []struct{ path, why string }{
		{fifo, fifo + " is a named pipe (FIFO), not a regular file."},
		{zero, zero + " (a symbolic link to /dev/zero) is a character device, not a regular file."},
		{sub, sub + " is a directory, not a regular file."},
		{big, big + ": file too large: over the 4 MiB limit."},
		{"-", `"-" is not standard input here: a %s file is read from a named file (write ./- for a file named -).`},
	} {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			b, diags := LoadFile(tt.path, testCatalog(t))
			if want := tt.path + ":1:1: error: Failed to read policy file; " + strings.Replace(tt.why, "%s", "policy", 1) + "\n"; b != nil || FormatDiagnostics(diags) != want {
				t.Errorf("LoadFile: bundle %v, diagnostics\n%s\nwant\n%s", b, FormatDiagnostics(diags), want)
			}
			ws, diags := LoadWorkers(tt.path)
			if want := tt.path + ":1:1: error: Failed to read workers file; " + strings.Replace(tt.why, "%s", "workers", 1) + "\n"; ws != nil || FormatDiagnostics(diags) != want {
				t.Errorf("LoadWorkers: workers %v, diagnostics\n%s\nwant\n%s", ws, FormatDiagnostics(diags), want)
			}
		})
	}
}
