//go:build unix

package prefix

import (
	"syscall"
	"time"
)

// cpuTime is the process's user+system CPU time so far (getrusage), to
// report a benchmark's rate per CPU second, which other processes on a
// shared machine do not dilute as they do wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
