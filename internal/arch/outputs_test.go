package arch

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoBuildOutputCommitted: no tracked file is a compiled program (an
// ELF, Mach-O or PE executable, or a Go test binary by name). A helper's
// `go build` in the wrong directory once committed a 19 MB plugin binary;
// outputs go to bin/ or a test's temporary directory, never into the
// tree git tracks.
func TestNoBuildOutputCommitted(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	magics := [][]byte{
		[]byte("\x7fELF"),
		{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, // Mach-O
		{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
		[]byte("MZ"), // PE
	}
	n := 0
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		if strings.HasSuffix(name, ".test") || strings.HasSuffix(name, ".exe") {
			t.Errorf("%s is tracked: a build output", name)
			continue
		}
		f, err := os.Open(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree, not yet committed
		}
		head := make([]byte, 4)
		k, _ := io.ReadFull(f, head)
		_ = f.Close()
		n++
		for _, m := range magics {
			if bytes.HasPrefix(head[:k], m) {
				t.Errorf("%s is tracked and is a compiled program (starts %q): build outputs are never committed", name, m)
				break
			}
		}
	}
	if n < 100 {
		t.Fatalf("read %d tracked files; want the whole repository", n)
	}
}
