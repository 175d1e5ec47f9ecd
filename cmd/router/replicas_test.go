package main

import (
	"strings"
	"testing"
)

// Bad replica flags are usage errors worded like the others.
func TestReplayReplicasFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas 0: want a whole number from 1 to 64"},
		{[]string{"--replicas", "65"}, "--replicas 65: want a whole number from 1 to 64"},
		{[]string{"--replicas", "x"}, "--replicas x: want a whole number from 1 to 64"},
		{[]string{"--sync-delay", "10ms"}, "--sync-delay applies to router replicas: give --replicas 2 or more"},
		{[]string{"--replicas", "3", "--sync-delay", "1s,-1s"}, "--sync-delay 1s,-1s: -1s is negative; want durations >= 0"},
		{[]string{"--replicas", "3", "--sync-delay", "fast"}, "--sync-delay fast: want durations >= 0 such as 0,10ms,1s, comma-separated"},
		{[]string{"--replicas", "3", "--sync-delay", "1s,1s"}, "--sync-delay 1s,1s: 1s is listed twice"},
		{[]string{"--replicas", "3", "--sync-delay", ""}, "--sync-delay '': want durations >= 0"},
		{[]string{"--replicas", "3", "--sync-delay", "0,1s", "--per-request", "x.jsonl"}, "--per-request writes the lines of one run"},
	} {
		code, _, errOut := runRouter(append([]string{"replay"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}
