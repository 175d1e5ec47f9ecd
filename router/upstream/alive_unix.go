//go:build unix

package upstream

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether an idle connection can carry a request: its
// socket is neither closed nor reset by the peer and holds no unread
// bytes (an idle HTTP/1.1 connection has nothing to read). It peeks
// without blocking (MSG_PEEK|MSG_DONTWAIT): EAGAIN means alive.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	switch {
	case err != nil:
		return false
	case n > 0: // bytes nobody asked for, or a close notice in HTTP
		return false
	case rerr == nil: // n == 0: the peer closed
		return false
	default:
		return errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
	}
}
