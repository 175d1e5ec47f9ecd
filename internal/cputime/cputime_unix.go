//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Process is the process's user+system CPU time so far (getrusage
// RUSAGE_SELF, every thread: the garbage collector's too); 0 when the
// call fails.
func Process() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
