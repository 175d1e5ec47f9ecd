//go:build unix && !linux

package supervisor

import (
	"errors"
	"syscall"
)

// sysProcAttr puts the plugin in its own process group, so Shutdown can
// kill everything it started. Parent-death signals are Linux-only; the SDK's
// parent-pid watch covers the rest.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// groupAlive reports whether process group pgid has a member left.
func groupAlive(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// startPinned runs start: without parent-death signals the forking
// thread does not matter.
func startPinned(start func() error, _ <-chan struct{}) error { return start() }

// watchPID does nothing here and returns false: the exit pipe is the only
// exit watch.
func watchPID(int, func()) bool { return false }
