package supervisor

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func sumOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// A plugin's process reports what it runs: its version, the checksums of
// its executable and of the files among its args and in sha256_files,
// and its start time, in Host.Info and in switchyard_plugin_info and
// switchyard_plugin_start_time_seconds.
func TestPluginInfo(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "plugin.conf")
	if err := os.WriteFile(script, []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, reg := faultHost(t, Options{})
	b := block("info", "")
	b.Args = []string{script, "--flag"}
	before := time.Now()
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	info, ok := h.Info("info")
	if !ok {
		t.Fatal("no Info for a running plugin")
	}
	binSum, scriptSum := sumOf(t, testBin), sumOf(t, script)
	if info.Version != "test" || info.SHA256() != binSum || info.PID != currentPID(h, "info") ||
		info.Started.Before(before) || info.Started.After(time.Now()) {
		t.Errorf("Info = %+v, want version test, sha256 %s, pid %d, started after %v", info, binSum, currentPID(h, "info"), before)
	}
	want := []FileSum{{Path: testBin, SHA256: binSum}, {Path: script, SHA256: scriptSum}}
	if fmt.Sprint(info.Files) != fmt.Sprint(want) {
		t.Errorf("Files = %+v, want %+v", info.Files, want)
	}
	exp := fmt.Sprintf(`
# HELP switchyard_plugin_info 1 for what the plugin's current process runs: version (its DescribeResponse.plugin_version), sha256 (of its executable, as sha256sum prints it; empty when unreadable) and files_sha256 (of the files among its args and in sha256_files, comma-separated in /readyz's order, - for an unreadable one).
# TYPE switchyard_plugin_info gauge
switchyard_plugin_info{files_sha256=%q,plugin="info",sha256=%q,version="test"} 1
`, scriptSum, binSum)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "switchyard_plugin_info"); err != nil {
		t.Error(err)
	}
	if got, want := gaugeValue(t, reg, "switchyard_plugin_start_time_seconds"), float64(info.Started.UnixNano())/1e9; got != want {
		t.Errorf("switchyard_plugin_start_time_seconds = %v, want %v", got, want)
	}
	if _, ok := h.Info("nope"); ok {
		t.Error("Info of an unknown plugin is ok")
	}
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "switchyard_plugin_info", "switchyard_plugin_start_time_seconds"); n != 0 {
		t.Errorf("%d info series left after Shutdown, want 0", n)
	}
}

func gaugeValue(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}

// sha256_files pins a file the plugin runs: a match starts it, a
// mismatch, or a pinned file that is gone, refuses the start permanently
// without running it; a restart after the file changed is refused the
// same way and the plugin is failed.
func TestSHA256FilesPin(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "plugin.py")
	if err := os.WriteFile(script, []byte("print('v1')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := sumOf(t, script)
	h := newHost(t)
	b := block("pinned", "")
	b.Args = []string{script}
	b.SHA256Files = map[string]string{script: good}
	b.Restart.MaxRestarts = 3
	b.Restart.Window = time.Minute
	b.Restart.BackoffMin = time.Millisecond
	b.Restart.BackoffMax = time.Millisecond
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatalf("start with a matching pin: %v", err)
	}

	if err := os.WriteFile(script, []byte("print('v2')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := sumOf(t, script)
	b2 := b
	b2.Name = "pinned2"
	_, err := h.Start(context.Background(), b2)
	want := fmt.Sprintf("sha256 mismatch: %s has sha256 %s, sha256_files pins %s for %q; the plugin was not run", script, bad, good, script)
	if err == nil || !IsPermanent(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("start with a mismatching pin: %v (permanent %v), want a permanent error containing %q", err, IsPermanent(err), want)
	}

	// The running one, killed, is restarted from the changed file: refused.
	pid := currentPID(h, "pinned")
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for h.Status("pinned") != StatusFailed {
		if time.Now().After(deadline) {
			t.Fatalf("status %v a minute after the kill, want failed (the restart refused)", h.Status("pinned"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.Stats("pinned").Restarts; n != 1 {
		t.Errorf("%d restart attempts, want 1 (a refused pin is not retried)", n)
	}

	b3 := b
	b3.Name = "pinned3"
	b3.SHA256Files = map[string]string{filepath.Join(dir, "gone.py"): good}
	if _, err := h.Start(context.Background(), b3); err == nil || !IsPermanent(err) || !strings.Contains(err.Error(), "which cannot be hashed") {
		t.Fatalf("start pinning a missing file: %v, want a permanent error saying it cannot be hashed", err)
	}
}

// sockOwnerEnv makes the test binary a socket directory's owner (see
// TestMain): it makes one (socketDir), prints its path and holds it until
// its stdin ends or it is killed.
const sockOwnerEnv = "SY_TEST_SOCKDIR_OWNER"

func runSockOwner() int {
	dir, lock, err := socketDir()
	if err != nil || lock == nil {
		fmt.Printf("error: %v (lock %v)\n", err, lock)
		return 2
	}
	fmt.Println(dir)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// startOwner runs a socket directory owner with TMPDIR tmp and returns its
// command and directory.
func startOwner(t *testing.T, tmp string) (*exec.Cmd, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), sockOwnerEnv+"=1", "TMPDIR="+tmp)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("owner: %v", err)
	}
	dir := strings.TrimSpace(line)
	if want := filepath.Join(tmp, fmt.Sprintf("sy-%d-", cmd.Process.Pid)); !strings.HasPrefix(dir, want) {
		t.Fatalf("owner made %q, want a directory %s*", dir, want)
	}
	return cmd, dir
}

// The sweep removes the socket directory of a router that died (SIGKILL,
// so nothing of it cleaned up) and keeps a live router's, an older
// router's sy-RANDOM, the directory of a live process named in it, and
// anything not a directory.
func TestSweepSocketDirs(t *testing.T) {
	// Short, so that socketDir makes its directories in it, not in /tmp.
	tmp, err := os.MkdirTemp("/tmp", "sweep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	live, liveDir := startOwner(t, tmp)
	dead, deadDir := startOwner(t, tmp)
	if err := dead.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = dead.Wait()
	// A directory named after a live process that holds no lock (this
	// process's parent, say): kept, in case its owner is between its mkdir
	// and its lock.
	ppidDir := filepath.Join(tmp, fmt.Sprintf("sy-%d-123", os.Getppid()))
	// One named after this process: a predecessor with our pid (a
	// restarted container's router), unlocked: removed.
	selfDir := filepath.Join(tmp, fmt.Sprintf("sy-%d-456", os.Getpid()))
	oldDir := filepath.Join(tmp, "sy-1234567890")
	for _, d := range []string{ppidDir, selfDir, oldDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(tmp, "sy-"+strconv.Itoa(dead.Process.Pid)+"-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// What a dead plugin leaves: its socket.
	if err := os.WriteFile(filepath.Join(deadDir, "plugin123"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	removed, err := SweepSocketDirs(tmp, filepath.Join(tmp, "missing"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{deadDir, selfDir}
	slices.Sort(want)
	if fmt.Sprint(removed) != fmt.Sprint(want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, d := range []string{liveDir, ppidDir, oldDir, file} {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("%s: %v; want it kept", d, err)
		}
	}
	for _, d := range want {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v; want it removed", d, err)
		}
	}

	// Once the live owner dies, its directory goes too.
	if err := live.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = live.Wait()
	removed, err = SweepSocketDirs(tmp)
	if err != nil || len(removed) != 1 || removed[0] != liveDir {
		t.Errorf("after its owner's death: removed %v (%v), want [%s]", removed, err, liveDir)
	}
}

func TestSocketDirOwner(t *testing.T) {
	for _, tt := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"sy-42-123", 42, true},
		{"sy-42-", 0, false},
		{"sy-042-1", 0, false},
		{"sy-abc", 0, false},
		{"sy-0-1", 0, false},
		{"xy-42-1", 0, false},
		{"sy-12345678901-1", 0, false},
	} {
		if pid, ok := socketDirOwner(tt.name); pid != tt.pid || ok != tt.ok {
			t.Errorf("socketDirOwner(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}
