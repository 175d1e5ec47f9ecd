package cputime

import (
	"runtime"
	"testing"
	"time"
)

// TestProcessAdvancesWithWork: spinning for 50 ms of CPU moves the
// process's CPU time forward (by some positive amount: how much depends
// on the machine's load, so only the direction is asserted).
func TestProcessAdvancesWithWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no getrusage")
	}
	t0 := Process()
	if t0 <= 0 {
		t.Fatalf("CPU time %v at start, want > 0", t0)
	}
	for spent := time.Duration(0); spent < 50*time.Millisecond; spent = Process() - t0 {
		x := 0
		for i := range 1_000_000 {
			x += i
		}
		_ = x
	}
	if d := Process() - t0; d <= 0 {
		t.Fatalf("CPU time moved by %v, want > 0", d)
	}
}
