// Package inputfile opens the files a user names for the router to read
// (policy files, workers files, traces) so that a path which is not a
// regular file is refused at once, with its name, instead of hanging or
// exhausting memory: a named pipe (FIFO) with no writer would block the
// open forever, and /dev/zero, or a symbolic link to it, never ends.
//
// Symbolic links to regular files are followed: a Kubernetes ConfigMap or
// Secret volume mounts each key as a symlink (policy.hcl ->
// ..data/policy.hcl). Standard input is not a path: the callers that read
// it (router replay --trace -) do so themselves.
package inputfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// MaxConfigSize is the largest policy file or workers file the router
// reads, in bytes (4 MiB): config.LoadFile, config.LoadWorkers and the
// file watch of router serve refuse a larger one. The largest example
// policy is under 4 KiB and a workers file lists about 200 bytes per
// worker, so this leaves room for some 20,000 workers while bounding the
// memory and parse time a mistaken path can cost.
const MaxConfigSize = 4 << 20

// ErrNotRegular is wrapped by Open and ReadFile for a path that is not a
// regular file (after following symbolic links): a directory, a named
// pipe, a device, a socket.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by ReadFile for a file larger than its limit.
var ErrTooLarge = errors.New("file too large")

// Open opens path for reading, following symbolic links, and returns the
// file when it is a regular file. Any other kind is closed again and
// refused with an error wrapping ErrNotRegular that names path (and the
// link's target when path is a symbolic link), for example
// "p.hcl (a symbolic link to /dev/zero) is a character device, not a
// regular file". The
// open itself never blocks: it uses O_NONBLOCK, which makes a FIFO with no
// writer open at once (and is then refused) and changes nothing for a
// regular file; the file's kind is checked both before the open (a socket
// cannot be opened) and on the opened file. Errors of the open itself are returned as os.Open's
// (*fs.PathError, so errors.Is(err, fs.ErrNotExist) works).
func Open(path string) (*os.File, error) {
	// Stat first, for the kinds an open fails on (a socket); the open's
	// own Stat below covers a file replaced in between.
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, notRegular(path, fi.Mode())
	}
	return f, nil
}

// notRegular is Open's error for path, of mode m.
func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s, %w", describe(path), kind(m), ErrNotRegular)
}

// ReadFile reads the regular file at path (see Open) whole, refusing one
// of more than limit bytes with an error wrapping ErrTooLarge that names
// path and the limit ("p.hcl: file too large: over the 4 MiB limit"). A file that says it is small but reads longer (a
// file of /proc, one that grows while read) is cut off at limit+1 bytes
// and refused the same way, so at most limit+1 bytes are ever read.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tooLarge := func() error {
		return fmt.Errorf("%s: %w: over the %s limit", path, ErrTooLarge, size(limit))
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, tooLarge()
	}
	return b, nil
}

// describe is path, followed by its resolved target when it is a
// symbolic link.
func describe(path string) string {
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return path
	}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		return path + " (a symbolic link to " + target + ")"
	}
	return path
}

// kind names a file mode that is not a regular file, with its article.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	default:
		return "an irregular file (mode " + m.String() + ")"
	}
}

// size words a byte count in the largest binary unit that divides it.
func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
