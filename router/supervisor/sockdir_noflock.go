//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package supervisor

import (
	"errors"
	"io"
	"io/fs"
)

// lockDir cannot lock here: socket directories are not locked, and so
// never swept.
func lockDir(string) (io.Closer, error) {
	return nil, errors.New("flock is not available on this system")
}

// ownedByMe cannot tell here: nothing is swept.
func ownedByMe(fs.FileInfo) bool { return false }
