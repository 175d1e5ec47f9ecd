package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m).Run()) }

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if !Poll(Patience, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("a condition that holds on the third poll was not seen")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("polled %d times, want 3 (stop at the first hold)", got)
	}
	n.Store(0)
	if Poll(20*time.Millisecond, func() bool { n.Add(1); return false }) {
		t.Fatal("a condition that never holds was reported held")
	}
	if n.Load() < 2 {
		t.Fatalf("polled %d times in 20 ms, want at least 2", n.Load())
	}
}

// fakeT records a fatal failure instead of ending the goroutine's test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func TestBuildSharesOneBinary(t *testing.T) {
	a := Build(t, "./testdata/hello")
	b := Build(t, "./testdata/hello")
	if a != b {
		t.Fatalf("built twice under Main: %s and %s", a, b)
	}
	out, err := exec.Command(a).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "hello from testkit" {
		t.Fatalf("the built binary printed %q", got)
	}
}

func TestBuildNamed(t *testing.T) {
	a := BuildNamed(t, "./testdata/hello", "greeter")
	if filepath.Base(a) != "greeter" {
		t.Fatalf("built %s, want a file named greeter", a)
	}
	if b := Build(t, "./testdata/hello"); b == a || filepath.Base(b) != "hello" {
		t.Fatalf("Build gave %s after BuildNamed gave %s: want another binary named hello", b, a)
	}
}

func TestBuildFailureNamesThePackage(t *testing.T) {
	f := &fakeT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != f {
				panic(r)
			}
		}()
		Build(f, "./testdata/nosuchpackage")
	}()
	if !strings.Contains(f.failed, "building ./testdata/nosuchpackage") {
		t.Fatalf("building a missing package failed with %q, want the package named", f.failed)
	}
}
