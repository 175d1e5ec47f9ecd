package supervisor

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// sysProcAttr puts the plugin in its own process group, so Shutdown can
// kill everything it started, and kills it when the router's thread dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
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
