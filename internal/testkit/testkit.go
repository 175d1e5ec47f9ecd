// Package testkit holds the helpers the repository's tests share: waiting
// until a condition holds, with a generous deadline that is never a claim
// about speed, and building a Go binary (a plugin, the router) once per
// test process. The NATS servers replica tests run are in the subpackage
// natskit, so that tests that only wait do not link a NATS server.
//
// It imports nothing of the module: any package's tests may use it.
package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Patience is how long Eventually waits: long enough for a condition that
// will hold to hold on a 2-core machine saturated by stress-ng, so that a
// timeout means it never would.
const Patience = time.Minute

// pollEvery is the poll period: short enough not to slow a test down,
// long enough not to compete with the code under test for the CPUs.
const pollEvery = 5 * time.Millisecond

// Eventually polls cond until it holds, and fails the test, naming what
// was awaited, when it does not within Patience.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Poll(Patience, cond) {
		t.Fatalf("not within %v: %s", Patience, what)
	}
}

// Poll polls cond until it holds or d passes, and reports whether it held.
// For a wait whose failure the caller words itself, or one that is
// expected to time out (then d is the whole claim: keep it short).
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// builds caches the binaries Build made while Main runs the tests.
var builds struct {
	mu   sync.Mutex
	dir  string // made by Main; "" when Main is not in use
	bins map[string]*built
}

type built struct {
	once sync.Once
	path string
	err  error
}

// Main wraps a package's testing.M so that, while its Run runs the tests,
// Build makes each binary once for the whole test process; Run removes
// them after the tests. Use it from TestMain, alone or under goleak:
//
//	func TestMain(m *testing.M) { os.Exit(testkit.Main(m).Run()) }
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testkit.Main(m)) }
func Main(m *testing.M) *M { return &M{m: m} }

// M is a testing.M whose Run shares Build's binaries; see Main.
type M struct{ m *testing.M }

// Run runs the tests (testing.M.Run) and returns their exit code; the
// binaries Build made meanwhile are removed before it returns.
func (x *M) Run() int {
	dir, err := os.MkdirTemp("", "switchyard-testkit-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testkit:", err)
		return 1
	}
	builds.mu.Lock()
	builds.dir, builds.bins = dir, map[string]*built{}
	builds.mu.Unlock()
	code := x.m.Run()
	builds.mu.Lock()
	builds.dir, builds.bins = "", nil
	builds.mu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "testkit:", err)
	}
	return code
}

// Build compiles the Go package pkg (a directory relative to the test's
// package, like "../../cmd/plugin-example", or an import path) with
// `go build` and returns the binary's path. Under Main a package is built
// once per test process and shared by every test that asks; otherwise it is
// built into the test's temporary directory. A failed build fails the
// test with the compiler's output.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	return BuildNamed(t, pkg, filepath.Base(strings.TrimRight(pkg, "/.")))
}

// BuildNamed is Build with the binary's file name given: for a program
// that reads its own name (a plugin is named after its executable). Each
// (pkg, name) pair is built once under Main.
func BuildNamed(t testing.TB, pkg, name string) string {
	t.Helper()
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, filepath.Separator) {
		name = "bin"
	}
	key := pkg + "\x00" + name
	builds.mu.Lock()
	dir := builds.dir
	var b *built
	if dir != "" {
		if b = builds.bins[key]; b == nil {
			b = &built{}
			builds.bins[key] = b
		}
	}
	builds.mu.Unlock()
	if b == nil {
		path, err := goBuild(t.TempDir(), pkg, name)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return path
	}
	b.once.Do(func() { b.path, b.err = goBuild(dir, pkg, name) })
	if b.err != nil {
		t.Fatalf("%v", b.err)
	}
	return b.path
}

// goBuild builds pkg into a file called name in a new folder of dir.
func goBuild(dir, pkg, name string) (string, error) {
	out, err := os.MkdirTemp(dir, name+"-")
	if err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	path := filepath.Join(out, name)
	if msg, err := exec.Command("go", "build", "-o", path, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, msg)
	}
	return path, nil
}
