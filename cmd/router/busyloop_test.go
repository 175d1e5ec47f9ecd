package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

// Environment of the busy-loop helper (busyLoopChild, in a child
// process): how many threads spin, and for how long.
const (
	busyThreadsEnv = "SY_BUSY_LOOP_THREADS"
	busyForEnv     = "SY_BUSY_LOOP_FOR"
)

// busyLoopChild is the busy-loop helper, run by TestMain in a child
// process that startBusyLoop started (SY_BUSY_LOOP_THREADS set): it spins
// that many threads (each locked to its OS thread) for SY_BUSY_LOOP_FOR,
// then returns. ok is false in any other process.
func busyLoopChild() (ok bool, err error) {
	n, err := strconv.Atoi(os.Getenv(busyThreadsEnv))
	if err != nil {
		return false, nil
	}
	d, err := time.ParseDuration(os.Getenv(busyForEnv))
	if err != nil {
		return true, fmt.Errorf("%s: %w", busyForEnv, err)
	}
	runtime.GOMAXPROCS(n + 1)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			for spins := 0; ; spins++ {
				if spins%(1<<20) == 0 && time.Now().After(end) {
					return
				}
			}
		})
	}
	wg.Wait()
	return true, nil
}
