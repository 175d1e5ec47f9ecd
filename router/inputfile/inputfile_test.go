//go:build unix

package inputfile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile/inputfiletest"
)

// readFile runs ReadFile in a goroutine and fails the test if it has not
// returned within a minute: a safety net so that a regression (an open
// that blocks on a FIFO) fails the test instead of hanging the suite. The
// tests assert what ReadFile returns, not how fast.
func readFile(t *testing.T, path string, limit int64) ([]byte, error) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := ReadFile(path, limit)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-time.After(time.Minute):
		t.Fatalf("ReadFile(%s) did not return", path)
		return nil, nil
	}
}

func TestReadFileRegular(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	if err := os.WriteFile(path, []byte("abcd"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A Kubernetes ConfigMap volume: policy.hcl -> ..data/policy.hcl,
	// ..data -> ..2026_01_02 (a directory).
	cm := filepath.Join(dir, "cm")
	stamp := filepath.Join(cm, "..2026_01_02")
	if err := os.MkdirAll(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stamp, "policy.hcl"), []byte("from the configmap"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..2026_01_02", filepath.Join(cm, "..data")); err != nil {
		t.Fatal(err)
	}
	mounted := filepath.Join(cm, "policy.hcl")
	if err := os.Symlink(filepath.Join("..data", "policy.hcl"), mounted); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.hcl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path  string
		limit int64
		want  string
	}{
		{path, 4, "abcd"}, // exactly at the limit
		{path, MaxConfigSize, "abcd"},
		{mounted, MaxConfigSize, "from the configmap"},
		{empty, 0, ""},
	} {
		b, err := readFile(t, tt.path, tt.limit)
		if err != nil || string(b) != tt.want {
			t.Errorf("ReadFile(%s, %d) = %q, %v; want %q", tt.path, tt.limit, b, err, tt.want)
		}
	}
}

func TestReadFileRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := inputfiletest.FIFO(t, dir, "fifo.hcl")
	zero := inputfiletest.DevZero(t, dir, "zero.hcl")
	sub := inputfiletest.Dir(t, dir, "dir.hcl")
	sock := filepath.Join(dir, "s.hcl")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	big := inputfiletest.Oversized(t, dir, "big.hcl", MaxConfigSize)
	for _, tt := range []struct {
		name, path string
		limit      int64
		sentinel   error
		want       string
	}{
		{"fifo", fifo, MaxConfigSize, ErrNotRegular, fifo + " is a named pipe (FIFO), not a regular file"},
		{"dev zero", zero, MaxConfigSize, ErrNotRegular, zero + " (a symbolic link to /dev/zero) is a character device, not a regular file"},
		{"directory", sub, MaxConfigSize, ErrNotRegular, sub + " is a directory, not a regular file"},
		{"socket", sock, MaxConfigSize, ErrNotRegular, sock + " is a socket, not a regular file"},
		{"over the cap", big, MaxConfigSize, ErrTooLarge, big + ": file too large: over the 4 MiB limit"},
		{"odd limit", big, 1000, ErrTooLarge, big + ": file too large: over the 1000 bytes limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := readFile(t, tt.path, tt.limit)
			if !errors.Is(err, tt.sentinel) || err.Error() != tt.want && !strings.HasSuffix(err.Error(), tt.want) {
				t.Fatalf("ReadFile = %d bytes, %v; want %q (%v)", len(b), err, tt.want, tt.sentinel)
			}
		})
	}
}

// TestReadFileGrowingFile: a file whose size says it is small but that
// reads longer (the files of /proc report size 0) is cut off at the limit.
func TestReadFileGrowingFile(t *testing.T) {
	const maps = "/proc/self/maps"
	fi, err := os.Stat(maps)
	if err != nil || fi.Size() != 0 {
		t.Skipf("%s: %v, size %d; want a file whose size reads 0", maps, err, fi.Size())
	}
	if _, err := readFile(t, maps, 16); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadFile(%s, 16): %v, want ErrTooLarge", maps, err)
	}
}

func TestReadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.hcl")
	_, err := readFile(t, path, MaxConfigSize)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err %v: want fs.ErrNotExist naming %s", err, path)
	}
	// A dangling symlink is a missing file too (a ConfigMap mid-swap).
	link := filepath.Join(t.TempDir(), "link.hcl")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readFile(t, link, MaxConfigSize); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dangling symlink: %v, want fs.ErrNotExist", err)
	}
}

func TestOpenReturnsARegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf [8]byte
	if n, err := f.Read(buf[:]); n != 2 || err != nil || string(buf[:n]) != "x\n" {
		t.Fatalf("Read = %d, %v: %q", n, err, buf[:n])
	}
}
