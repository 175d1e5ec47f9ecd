package main

import (
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

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
