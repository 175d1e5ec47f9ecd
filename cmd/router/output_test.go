package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// An output named by a symbolic link to a file that does not exist yet
// creates the link's target, as os.Create (and a shell's >) would, and
// leaves the link in place.
func TestPendingFileDanglingSymlinkCreatesTarget(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "out.jsonl")
	if err := os.Symlink(filepath.Join("sub", "real.jsonl"), link); err != nil {
		t.Fatal(err)
	}
	p, err := createPending("--out", link, kindGeneratedTrace)
	if err != nil {
		t.Fatalf("createPending: %v", err)
	}
	if _, err := p.Write([]byte("line\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "sub", "real.jsonl"))
	if err != nil || string(got) != "line\n" {
		t.Fatalf("link's target holds %q (%v), want %q", got, err, "line\n")
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s is no longer a symbolic link (%v, %v)", link, fi, err)
	}
}

// A loop of symbolic links is refused with the path named.
func TestPendingFileSymlinkLoop(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.Symlink("b", a); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", b); err != nil {
		t.Fatal(err)
	}
	if p, err := createPending("--out", a, kindGeneratedTrace); err == nil {
		p.abort()
		t.Fatal("createPending of a symlink loop: no error")
	}
}

// pipePath returns a path naming the write end of a new pipe through
// /proc's links (as /dev/stdout does when the output is piped), closed
// with the test; it skips the test where there is no /proc.
func pipePath(t *testing.T) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	path := "/proc/self/fd/" + strconv.Itoa(int(w.Fd()))
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	return path
}

// A path to a pipe through /proc's links (as /dev/stdout is when the
// output is piped) is refused as not a regular file, as the kernel
// resolves it, not by its link's text ("pipe:[N]").
func TestPendingFilePipeThroughProcLink(t *testing.T) {
	path := pipePath(t)
	p, err := createPending("--out", path, kindGeneratedTrace)
	if err == nil {
		p.abort()
		t.Fatalf("createPending(%s): no error", path)
	}
	if !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("createPending(%s): %v, want it refused as not a regular file", path, err)
	}
}
