//go:build !linux

package benchproc

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
