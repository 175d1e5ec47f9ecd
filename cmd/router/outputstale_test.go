package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// deadPID returns the id of a process that has exited (and been reaped).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// backdate sets path's modification time a minute back, older than
// staleTempAge.
func backdate(t *testing.T, path string) {
	t.Helper()
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
}

// TestOutputStaleTemporaries: creating an output removes its target's
// temporaries left by processes that are gone, and only those: old
// enough, a regular file, in the exact pattern, of this target.
func TestOutputStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	dead, self := strconv.Itoa(deadPID(t)), strconv.Itoa(os.Getpid())
	stale := ".r.json." + dead + ".k3z.tmp"
	kept := []string{
		".r.json." + dead + ".k4z.tmp",   // a dead process's, but fresh (not backdated below)
		".r.json." + self + ".k3z.tmp",   // a live process's (this test's)
		".r.json." + dead + ".K3Z.tmp",   // not base 36 in lower case
		".r.json." + dead + ".tmp",       // no random part
		".r.json.0" + dead + ".k3z.tmp",  // a leading zero
		".r.json.x" + dead + ".k3z.tmp",  // not a number
		".r.json." + dead + ".k3z.tmp.1", // not ending in .tmp
		".r.json." + dead + ".a.b.tmp",   // one dot too many
		".r.json.k3z.tmp",                // the old pattern, without the process id
		".s.json." + dead + ".k3z.tmp",   // another target's
		".r." + dead + ".k3z.tmp",        // another target's ("r")
		"r.json." + dead + ".k3z.tmp",    // no leading dot
		"r.json",                         // the target itself
	}
	for _, n := range append([]string{stale}, kept...) {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if n != kept[0] {
			backdate(t, filepath.Join(dir, n))
		}
	}
	// A directory and a symbolic link in the pattern, of a dead process,
	// old: not regular files, left.
	subdir := ".r.json." + dead + ".d1.tmp"
	if err := os.Mkdir(filepath.Join(dir, subdir), 0o755); err != nil {
		t.Fatal(err)
	}
	backdate(t, filepath.Join(dir, subdir))
	link := ".r.json." + dead + ".l1.tmp"
	if err := os.Symlink("r.json", filepath.Join(dir, link)); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, subdir, link)

	p, err := createPending("--report", filepath.Join(dir, "r.json"), kindReport)
	if err != nil {
		t.Fatal(err)
	}
	ours := filepath.Base(p.f.Name())
	if _, ok := tempPID(ours, "r.json"); !ok || !strings.HasPrefix(ours, ".r.json."+self+".") {
		t.Errorf("this run's temporary %q is not .r.json.%s.RAND.tmp", ours, self)
	}
	want := append(slices.Clone(kept), ours)
	slices.Sort(want)
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Errorf("after createPending the directory holds\n%q\nwant\n%q (only %s removed)", got, want, stale)
	}
	p.abort()
}

func TestTempPID(t *testing.T) {
	for _, c := range []struct {
		name, base string
		pid        int
		ok         bool
	}{
		{".out.jsonl.4242.abc09.tmp", "out.jsonl", 4242, true},
		{".a.5.123.xyz.tmp", "a.5", 123, true},
		{".a.5.123.xyz.tmp", "a", 0, false}, // "5.123.xyz": not PID.RAND
		{".out.4242..tmp", "out", 0, false},
		{".out..abc.tmp", "out", 0, false},
		{".out.99999999999.abc.tmp", "out", 0, false}, // over 10 digits
		{".out.-1.abc.tmp", "out", 0, false},
		{".out.1.abc.tmp", "out", 1, true},
	} {
		pid, ok := tempPID(c.name, c.base)
		if pid != c.pid || ok != c.ok {
			t.Errorf("tempPID(%q, %q) = %d, %v; want %d, %v", c.name, c.base, pid, ok, c.pid, c.ok)
		}
	}
}

// TestOutputTempOfKilledReplay runs the router binary: a replay reading
// its trace from a pipe that never ends is SIGKILLed with its --report
// temporary beside the target; a second such replay stays alive. A third
// replay to the same target removes the killed run's temporary (backdated
// past staleTempAge), leaves the live run's alone and writes its report.
func TestOutputTempOfKilledReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router binary")
	}
	bin := testkit.BuildNamed(t, ".", "output-router")
	dir := t.TempDir()
	target := filepath.Join(dir, "report.json")

	// start runs a replay blocked on its trace (stdin, held open) and
	// returns it once its temporary exists, with the temporary's path.
	start := func() (*exec.Cmd, string) {
		t.Helper()
		cmd := exec.Command(bin, "replay", "--trace", "-", "--trace-format", "jsonl", "--report", target)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = stdin.Close()
			_ = cmd.Wait()
		})
		prefix := fmt.Sprintf(".report.json.%d.", cmd.Process.Pid)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			for _, n := range dirNames(t, dir) {
				if strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ".tmp") {
					return cmd, filepath.Join(dir, n)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no temporary %s*.tmp in %s after 30 s: %q", prefix, dir, dirNames(t, dir))
			}
		}
	}
	killed, killedTemp := start()
	if err := killed.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := killed.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the killed replay's end: %v, want killed", err)
	}
	fi, err := os.Stat(killedTemp)
	if err != nil || fi.Size() != 0 {
		t.Fatalf("the killed replay's temporary: %v, %v; want it left, empty", fi, err)
	}
	live, liveTemp := start()
	backdate(t, killedTemp)
	backdate(t, liveTemp)

	out, err := exec.Command(bin, "replay", "--limit", "20", "--quiet", "--report", target).CombinedOutput()
	if err != nil {
		t.Fatalf("the rerun: %v\n%s", err, out)
	}
	if got, want := dirNames(t, dir), []string{filepath.Base(liveTemp), "report.json"}; !slices.Equal(got, want) {
		t.Errorf("after the rerun the directory holds %q, want %q (the killed run's %s removed)", got, want, filepath.Base(killedTemp))
	}
	b, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests  int `json:"requests"`
		Completed int `json:"completed"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || rep.Requests != 20 || rep.Completed != 20 {
		t.Errorf("the report: %+v, %v; want 20 requests, 20 completed", rep, err)
	}
	if err := syscall.Kill(live.Process.Pid, 0); err != nil {
		t.Errorf("the live replay is gone before the test's end: %v", err)
	}
}
