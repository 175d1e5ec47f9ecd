//go:build unix

// Package inputfiletest makes, for tests, the paths that router/inputfile
// refuses: a named pipe with no writer, a symbolic link to /dev/zero, a
// directory and a file one byte over a size limit. Each helper creates
// dir/name, fails the test on error, and returns the path.
package inputfiletest

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FIFO makes the named pipe dir/name. Nothing writes to it, so a reader
// that opened it as a file would block for ever.
func FIFO(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// DevZero makes dir/name a symbolic link to /dev/zero, a file that never
// ends.
func DevZero(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Symlink("/dev/zero", p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Dir makes the directory dir/name.
func Dir(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// Oversized writes dir/name, limit+1 bytes of one comment line ("#" and
// spaces): a valid policy or workers file but for its size.
func Oversized(t testing.TB, dir, name string, limit int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, append([]byte("#"), bytes.Repeat([]byte(" "), limit)...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
