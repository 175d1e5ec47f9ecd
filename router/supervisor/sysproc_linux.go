package supervisor

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// watchPID calls exited once process pid (a child of ours) has exited,
// without reaping it: go-plugin reaps it. It watches a pidfd, so it sees
// the exit even while a descendant holds the plugin's pipes, or after the
// plugin closed its end of the exit pipe. It reports whether it watches
// (or the process is gone already, and exited was called); when no pidfd
// can be had (a kernel before 5.3) it does nothing and returns false: the
// exit pipe is the only watch then.
func watchPID(pid int, exited func()) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			exited()
			return true
		}
		return false
	}
	go func() {
		defer func() { _ = unix.Close(fd) }()
		var info unix.Siginfo
		for {
			// ECHILD: go-plugin has reaped it already.
			if err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
				break
			}
		}
		exited()
	}()
	return true
}

// sysProcAttr puts the plugin in its own process group, so Shutdown can
// kill everything it started, and sends it SIGTERM when the thread that
// started it dies: the SDK's Serve then kills the rest of its process
// group and removes its socket directory (see startPinned).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// startPinned runs start, which forks the plugin, on a goroutine locked to
// its OS thread, and keeps that goroutine (and so the thread) alive until
// until is closed: the plugin's parent-death signal fires when the thread
// that forked it exits (golang/go#27505), not when the router does, so
// the forking thread must outlive the plugin. A locked goroutine that
// returns takes its thread with it; by then the plugin is gone. It costs
// one parked OS thread per running plugin process.
func startPinned(start func() error, until <-chan struct{}) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		errc <- start()
		<-until
	}()
	return <-errc
}

// groupAlive reports whether process group pgid has a member that is not
// a zombie. Killed descendants of a plugin are reparented to init, which
// may take its time to reap them; they no longer run.
func groupAlive(pgid int) bool {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		return false
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return true
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := bytes.Fields(b[i+1:])
		if len(fields) < 3 {
			continue
		}
		if g, err := strconv.Atoi(string(fields[2])); err == nil && g == pgid && fields[0][0] != 'Z' && fields[0][0] != 'X' {
			return true
		}
	}
	return false
}
