//go:build !unix

package plugincheck

// parentDeathChecked: this system has no process groups to watch.
const parentDeathChecked = false

func processRunning(int) bool { return false }

func killGroup(int) {}
