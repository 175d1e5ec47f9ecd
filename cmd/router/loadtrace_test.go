package main

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/trace"
)

// TestLoadTraceHeldOrStreamed loads the arXiv sample held in memory and
// streamed (more requests than it may hold), with and without --limit,
// and checks both give the same requests, count and prefix-hash note; and
// that a malformed line past the limit fails the load either way.
func TestLoadTraceHeldOrStreamed(t *testing.T) {
	const path = "../../testdata/traces/mooncake_arxiv_trace_first1000.jsonl"
	for _, limit := range []int{0, 250} {
		held, err := loadTrace(path, "", nil, limit, 1000)
		if err != nil {
			t.Fatal(err)
		}
		streamed, err := loadTrace(path, "", nil, limit, 100)
		if err != nil {
			t.Fatal(err)
		}
		want := min(1000, limit)
		if limit == 0 {
			want = 1000
		}
		if held.stream != nil || len(held.records) != want || streamed.records != nil || streamed.stream == nil {
			t.Fatalf("limit %d: held %d records (stream %v), streamed %d records (stream %v); want %d held, and a stream",
				limit, len(held.records), held.stream != nil, len(streamed.records), streamed.stream != nil, want)
		}
		var got []trace.Record
		for rec, err := range streamed.stream {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, *rec)
		}
		if !reflect.DeepEqual(got, held.records) {
			t.Errorf("limit %d: streamed %d records, differ from the %d held", limit, len(got), len(held.records))
		}
		if held.requests != want || streamed.requests != want || !held.hashes || !streamed.hashes || held.name != streamed.name {
			t.Errorf("limit %d: held %+v, streamed %+v; want %d requests with hashes", limit,
				[]any{held.name, held.requests, held.hashes}, []any{streamed.name, streamed.requests, streamed.hashes}, want)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, append(b, "{\"timestamp\": 1}\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, hold := range []int{2000, 100} {
		if _, err := loadTrace(bad, "", nil, 10, hold); err == nil || !strings.Contains(err.Error(), "bad.jsonl:1001: ") {
			t.Errorf("hold %d: a malformed line 1001 with --limit 10: %v", hold, err)
		}
	}
}

// --memory-limit sets the Go runtime's soft memory limit unless GOMEMLIMIT
// is in the environment and the flag was not given; a bad value is a usage
// error. The limit is process-wide: the test restores it.
func TestReplayMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	t.Setenv("GOMEMLIMIT", "") // restored after the test
	os.Unsetenv("GOMEMLIMIT")

	debug.SetMemoryLimit(math.MaxInt64)
	if code, _, errOut := routerRun(t, "replay", "--limit", "20"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := limit(); got != DefaultReplayMemoryLimit<<20 {
		t.Errorf("default: memory limit %d, want %d", got, DefaultReplayMemoryLimit<<20)
	}

	debug.SetMemoryLimit(math.MaxInt64)
	if code, _, errOut := routerRun(t, "replay", "--limit", "20", "--memory-limit", "300"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := limit(); got != 300<<20 {
		t.Errorf("--memory-limit 300: memory limit %d, want %d", got, 300<<20)
	}

	t.Setenv("GOMEMLIMIT", "1GiB")
	debug.SetMemoryLimit(math.MaxInt64)
	if code, _, errOut := routerRun(t, "replay", "--limit", "20"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := limit(); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT in the environment, no flag: memory limit %d, want it left alone", got)
	}

	debug.SetMemoryLimit(math.MaxInt64)
	if code, _, _ := routerRun(t, "replay", "--limit", "20", "--memory-limit", "0"); code != 0 || limit() != math.MaxInt64 {
		t.Errorf("--memory-limit 0: exit %d, memory limit %d; want 0 and none set", code, limit())
	}
	code, _, errOut := routerRun(t, "replay", "--memory-limit", "-5")
	if code != 2 || !strings.Contains(errOut, "--memory-limit -5: want MiB from 0 (no limit)") {
		t.Errorf("--memory-limit -5: exit %d, stderr %q; want 2 and the flag named", code, errOut)
	}
}
