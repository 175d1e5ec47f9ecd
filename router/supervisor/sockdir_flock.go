//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package supervisor

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// lockDir takes an exclusive, non-blocking flock(2) on the directory dir
// and returns the open directory that holds it (closing it releases the
// lock). The error wraps errLocked when another open file holds it.
func lockDir(dir string) (io.Closer, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	return f, nil
}

// ownedByMe reports whether fi (from Lstat) is owned by this process's
// user.
func ownedByMe(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}
