package benchproc

import "syscall"

// sysProcAttr makes the kernel SIGKILL a child when this process dies, so
// a killed bench leaves no mock worker or router behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
