package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// --replicas with a list of --sync-delay values sweeps the delays, crossed
// with --compare and --workers: one row per (fleet, policy, delay), each
// labelled NAME/N@D, and --report names the replicas and the delay of
// every run.
func TestReplayReplicasSweep(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	kv := filepath.Join(policyDir, "kv-affinity.hcl")
	arxiv := filepath.Join("..", "..", "testdata", "traces", "mooncake_arxiv_trace_first1000.jsonl")
	code, out, errOut := runRouter("replay", "--trace", arxiv, "--limit", "200", "--compare", rrPolicy+","+kv, "--workers", "2,4",
		"--replicas", "3", "--sync-delay", "0,1s", "--baseline", "round-robin", "--columns", "kv_hit,ttft_p90", "--report", report, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	fields := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	if want := "trace mooncake_arxiv_trace_first1000.jsonl: 200 requests on 2 and 4 simulated workers; 3 router replicas, sync delay 0s and 1s"; lines[0] != want {
		t.Errorf("header line %q, want %q", lines[0], want)
	}
	labels := []string{"round-robin/3@0s 2 ", "round-robin/3@1s 2 ", "kv-affinity/3@0s 2 ", "kv-affinity/3@1s 2 ",
		"round-robin/3@0s 4 ", "round-robin/3@1s 4 ", "kv-affinity/3@0s 4 ", "kv-affinity/3@1s 4 "}
	for i, prefix := range labels {
		row := fields(lines[2+i])
		if !strings.HasPrefix(row, prefix) {
			t.Errorf("row %d %q, want it to start %q", i, lines[2+i], prefix)
		}
		// Each row's baseline is round-robin's with the same fleet and delay.
		if base := strings.HasSuffix(row, " base"); base != strings.HasPrefix(row, "round-robin") {
			t.Errorf("row %d %q: baseline mark %v", i, row, base)
		}
	}
	if !strings.Contains(out, "\nNAME/N@D = routed by N router replicas") {
		t.Errorf("no legend for the replicas' labels:\n%s", out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var runs []struct {
		Policy string `json:"policy"`
		Sync   *struct {
			Replicas int     `json:"replicas"`
			DelayMs  float64 `json:"delay_ms"`
			Mirrored int64   `json:"mirrored"`
		} `json:"sync"`
	}
	if err := json.Unmarshal(b, &runs); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 8 {
		t.Fatalf("%d runs in the report, want 2 fleets x 2 policies x 2 delays", len(runs))
	}
	for i, r := range runs {
		if r.Sync == nil || r.Sync.Replicas != 3 || r.Sync.DelayMs != []float64{0, 1000}[i%2] || r.Sync.Mirrored != 400 {
			t.Errorf("run %d (%s): sync %+v, want 3 replicas, delay %v ms, 400 mirrored bookings", i, r.Policy, r.Sync, []float64{0, 1000}[i%2])
		}
	}
}

// Each replica loads the policy file itself, so its components are its
// own: with two replicas of round-robin that sync late, requests 0, 2, 4
// (replica 0) and 1, 3, 5 (replica 1) each go round the two workers from
// worker 0, and every worker gets one request of each replica.
func TestReplayReplicasOwnPolicies(t *testing.T) {
	arxiv := filepath.Join("..", "..", "testdata", "traces", "mooncake_arxiv_trace_first1000.jsonl")
	code, out, errOut := runRouter("replay", "--trace", arxiv, "--limit", "6", "--workers", "2", "--policy", rrPolicy,
		"--replicas", "2", "--sync-delay", "1h", "--per-request", "-", "--quiet")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var workers []int
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var line struct {
			Worker int `json:"worker"`
		}
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		workers = append(workers, line.Worker)
	}
	if got, want := workers, []int{0, 0, 1, 1, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("workers %v, want %v", got, want)
	}
}

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
