package main

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestPluginsCheckSocketDirLeft: a plugin that exits on its parent's death
// but leaves its socket directory passes the parent-death check with a
// warning (the router sweeps such directories at start), and the check
// removes the directory.
func TestPluginsCheckSocketDirLeft(t *testing.T) {
	private := privateSocketDirs(t)
	code, out, errOut := routerRun(t, "plugins", "check", examplePlugin(t, "faulty"), "--env", "SY_TEST_MODE=leavedir", "--type", "t-lowest")
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !regexp.MustCompile(`(?m)^PASS parent death \(gone [0-9.]+m?s after its parent's SIGKILL\)$`).MatchString(out) {
		t.Errorf("output lacks the parent-death pass:\n%s", out)
	}
	re := regexp.MustCompile(`(?m)^WARNING parent death: the plugin exited but left its socket directory (/\S+) \(docs/plugin-protocol.md §6 asks it to remove it\); the next router to start on this machine removes such a directory, since its router is dead$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output lacks %v:\n%s", re, out)
	}
	if _, err := os.Stat(m[1]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket directory %s left behind by the check: %v", m[1], err)
	}
	if !strings.HasPrefix(m[1], private+"/") {
		t.Errorf("socket directory %s outside the test's own %s", m[1], private)
	}
}

// privateSocketDirs points TMPDIR, for the rest of the test (which must
// not be parallel), at a fresh directory of its own under /tmp, short
// enough to hold plugin sockets: the plugin socket directories the test
// makes there are out of the way of every other router starting on the
// machine meanwhile (another package's tests), whose start-up sweep
// removes the socket directories of dead routers from its temporary
// directory, the directories a parent-death check leaves on purpose. It
// returns the directory.
func privateSocketDirs(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "syt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	t.Setenv("TMPDIR", dir)
	return dir
}
