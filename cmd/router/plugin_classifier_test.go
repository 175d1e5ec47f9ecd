package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeSessionTrace writes a Mooncake trace of n requests from sessions
// conversations, turn after turn (request i is a turn of session
// i%sessions), arriving every gapMs so that several run at once and
// least-loaded alone would spread a session's turns. It returns each
// request's session.
func writeSessionTrace(t *testing.T, path string, n, sessions, gapMs int) []int {
	t.Helper()
	var b strings.Builder
	of := make([]int, n)
	for i := range n {
		s := i % sessions
		of[i] = s
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1024, "output_length": 16, "hash_ids": [%d, %d], "session_id": "sess-%d"}`+"\n",
			i*gapMs, 1000*s, 1000*s+1, s)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return of
}

// The sticky-session classifier of the soft-pin-repin plugin, out of
// process, through examples/policies/sticky-session.hcl: on a generated
// 200-request, 20-session trace every later turn of a session goes to the
// worker of its first turn (the plugin learned it from the lifecycle
// events, and the router honoured the advisory target), while the same
// trace under plain least-loaded moves sessions; and the replay repeats
// byte for byte.
func TestReplayPluginClassifierKeepsSessions(t *testing.T) {
	file := policyWith(t, "sticky-session.hcl", "soft-pin-repin")
	dir := t.TempDir()
	tr := filepath.Join(dir, "sessions.jsonl")
	sessionOf := writeSessionTrace(t, tr, 200, 20, 20)

	run := func(policy, name string) []byte {
		t.Helper()
		per := filepath.Join(dir, name)
		code, _, errOut := routerRun(t, "replay", "--policy", policy, "--trace", tr, "--workers", "4", "--per-request", per)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		b, err := os.ReadFile(per)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// moved counts the sessions whose turns did not all go to one worker.
	moved := func(out []byte) int {
		t.Helper()
		first := map[int]int{}
		movedSet := map[int]bool{}
		lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
		if len(lines) != len(sessionOf) {
			t.Fatalf("%d per-request lines, want %d", len(lines), len(sessionOf))
		}
		for _, line := range lines {
			var r struct {
				Index  int    `json:"index"`
				Worker int    `json:"worker"`
				Status string `json:"status"`
			}
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatal(err)
			}
			if r.Status != "ok" {
				t.Fatalf("request %d: %s", r.Index, r.Status)
			}
			s := sessionOf[r.Index]
			if w, ok := first[s]; !ok {
				first[s] = r.Worker
			} else if w != r.Worker {
				movedSet[s] = true
			}
		}
		return len(movedSet)
	}
	a := run(file, "sticky-1.jsonl")
	if n := moved(a); n != 0 {
		t.Fatalf("%d of 20 sessions moved between workers under sticky-session", n)
	}
	if b := run(file, "sticky-2.jsonl"); !bytes.Equal(a, b) {
		t.Fatal("two replays with the out-of-process classifier differ")
	}
	if n := moved(run(filepath.Join(policyDir, "least-loaded.hcl"), "least.jsonl")); n == 0 {
		t.Fatal("least-loaded alone kept every session: the trace does not test stickiness")
	}
}
