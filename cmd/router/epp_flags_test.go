package main

import (
	"bytes"
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

// TestRuntimeFlagsOnBothCommands: every flag of the live runtime
// (runtimeFlags.register) is on both `router serve` and `router epp`, with
// the same type, default, usage and accepted values.
func TestRuntimeFlagsOnBothCommands(t *testing.T) {
	var rf runtimeFlags
	runtime := pflag.NewFlagSet("runtime", pflag.ContinueOnError)
	rf.register(runtime)
	var names []string
	runtime.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	for _, want := range []string{"policy", "workers-file", "watch", "request-timeout", "drain-timeout", "chars-per-token",
		"debug-listen", "shadow-max-inflight", "pool-selector", "pool-port", "kubeconfig"} {
		if !slices.Contains(names, want) {
			t.Errorf("runtime flags lack --%s; have %q", want, names)
		}
	}
	for _, cmd := range []*pflag.FlagSet{newServeCmd().Flags(), newEPPCmd().Flags()} {
		runtime.VisitAll(func(want *pflag.Flag) {
			got := cmd.Lookup(want.Name)
			switch {
			case got == nil:
				t.Errorf("%s: no --%s", cmd.Name(), want.Name)
			case got.Value.Type() != want.Value.Type() || got.DefValue != want.DefValue || got.Usage != want.Usage ||
				!slices.Equal(got.Annotations[wantAnnotation], want.Annotations[wantAnnotation]):
				t.Errorf("%s: --%s is (%s, default %q, %q, want %q); the runtime's is (%s, default %q, %q, want %q)", cmd.Name(), want.Name,
					got.Value.Type(), got.DefValue, got.Usage, got.Annotations[wantAnnotation],
					want.Value.Type(), want.DefValue, want.Usage, want.Annotations[wantAnnotation])
			}
		})
	}
}

// TestEPPRuntimeFlagErrors: epp checks the runtime's flags as serve does,
// --shadow-max-inflight among them.
func TestEPPRuntimeFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--shadow-max-inflight", "0"}, "--shadow-max-inflight 0: want " + shadowInFlightWant},
		{[]string{"--chars-per-token", "0"}, "--chars-per-token 0: want " + charsPerTokenWant},
	} {
		args := append([]string{"epp", "--policy", rrPolicy, "--listen", "127.0.0.1:0"}, tt.args...)
		var out, errb bytes.Buffer
		if code := runContext(canceled(), args, &out, &errb); code != 2 || errb.String() != "router: "+tt.want+"\n" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), "router: "+tt.want+"\n")
		}
	}
}

// TestEPPBodyFlags: --max-body-bytes takes 1 KiB to serve's parser bound
// (32 MiB), --max-body-bytes-in-flight at least --max-body-bytes; other
// values are a usage error naming the flag and its range.
func TestEPPBodyFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-body-bytes", "1023"}, "--max-body-bytes 1023: want a whole number of bytes from 1024 to 33554432"},
		{[]string{"--max-body-bytes", "33554433"}, "--max-body-bytes 33554433: want a whole number of bytes from 1024 to 33554432"},
		{[]string{"--max-body-bytes-in-flight", "33554431"}, "--max-body-bytes-in-flight 33554431: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 33554432)"},
		{[]string{"--max-body-bytes", "4096", "--max-body-bytes-in-flight", "0"}, "--max-body-bytes-in-flight 0: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 4096)"},
		{[]string{"--max-body-bytes", "4096", "--max-body-bytes-in-flight", "-1"}, "--max-body-bytes-in-flight -1: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 4096)"},
	} {
		args := append([]string{"epp", "--policy", rrPolicy, "--listen", "127.0.0.1:0"}, tt.args...)
		var out, errb bytes.Buffer
		if code := runContext(canceled(), args, &out, &errb); code != 2 || errb.String() != "router: "+tt.want+"\n" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), "router: "+tt.want+"\n")
		}
	}
}
