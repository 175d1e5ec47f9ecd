//go:build unix

package shared

import "syscall"

// killOwnGroup SIGKILLs the process group this process leads, itself
// included, in one call (no race with a member forking meanwhile). It does
// nothing when the process does not lead its group: the group is then not
// the plugin's to kill.
func killOwnGroup() {
	if pid := syscall.Getpid(); syscall.Getpgrp() == pid {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
