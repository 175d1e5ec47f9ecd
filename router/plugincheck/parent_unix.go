//go:build unix

package plugincheck

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// parentDeathChecked: processes can be watched and killed here.
const parentDeathChecked = true

// processRunning reports whether pid is a process that has not exited: it
// exists and (where /proc tells) is not a zombie waiting for its new
// parent to reap it.
func processRunning(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// killGroup SIGKILLs the process group pid leads (the plugin's).
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }
