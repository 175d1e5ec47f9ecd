package main

import (
	"bytes"
	"strings"
	"testing"
)

// runRouter runs the CLI in-process; it returns the exit code and output.
func runRouter(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayDisaggregatedUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"prefill only", []string{"--prefill-workers", "2"}, "both --prefill-workers and --decode-workers"},
		{"decode only", []string{"--decode-workers", "2"}, "both --prefill-workers and --decode-workers"},
		{"zero decode", []string{"--prefill-workers", "2", "--decode-workers", "0"}, "--decode-workers 0"},
		{"zero prefill", []string{"--prefill-workers", "0", "--decode-workers", "2"}, "--prefill-workers 0"},
		{"with workers", []string{"--workers", "8", "--prefill-workers", "1", "--decode-workers", "1"}, "--workers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runRouter(append([]string{"replay", "--limit", "10"}, tt.args...)...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, errOut, tt.want)
			}
		})
	}
}
