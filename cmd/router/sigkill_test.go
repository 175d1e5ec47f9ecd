//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRouterSIGKILLLeavesNothing runs `router replay` with a plugin that
// starts a grandchild, SIGKILLs the router part way through, and checks
// that within a second no process of the plugin's binary (the plugin or
// its grandchild) is alive and no socket directory is left in the router's
// TMPDIR. The router gives plugins SIGTERM as their parent-death signal;
// the SDK's Serve then removes its socket directory and kills its process
// group.
func TestRouterSIGKILLLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router and a plugin binary")
	}
	bin := t.TempDir()
	routerBin, pluginBin := filepath.Join(bin, "router"), filepath.Join(bin, "plugin")
	for _, b := range [][]string{{routerBin, "."}, {pluginBin, "../../router/supervisor/testdata/plugin"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", b[1], err, out)
		}
	}
	// Kill whatever of the plugin's binary survives a failed test.
	t.Cleanup(func() {
		for _, pid := range running(pluginBin) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	// The router's private temporary directory, short enough for the
	// router to put its socket directories in it (see socketDir).
	tmp := t.TempDir()
	if len(tmp) > 50 {
		var err error
		if tmp, err = os.MkdirTemp("/tmp", "sk-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	}
	work := t.TempDir()
	childFile := filepath.Join(work, "child.pid")
	policy := writeFile(t, "sigkill.hcl", fmt.Sprintf(`
router {
  block_size = 512
  seed       = 7
}

plugin "t" {
  command      = %q
  env          = { SY_TEST_MODE = "child", SY_CHILD = %q }
  call_timeout = "1s"
}

policy "p" {
  scorer "active" {
    type  = "t-active"
    delay = "1ms" # keeps the replay running well past the kill
  }
  picker "pick" {
    type = "min-cost"
    seed = 7
  }
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "p"
}
`, pluginBin, childFile))

	cmd := exec.Command(routerBin, "replay", "--policy", policy, "--trace", filepath.Join(traceDir, "mooncake_conversation_trace.jsonl"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stderr := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})

	// Wait (bounded) for the plugin and its grandchild to run and for the
	// plugin to listen on its socket.
	var plugin, child int
	ready := func() bool {
		b, err := os.ReadFile(childFile)
		if err != nil || len(b) == 0 {
			return false
		}
		if child, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return false
		}
		plugin = 0
		for _, pid := range running(pluginBin) {
			if pid != child {
				plugin = pid
			}
		}
		return plugin != 0 && alive(child) && len(sockets(tmp)) > 0
	}
	for deadline := time.Now().Add(30 * time.Second); !ready(); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-waited:
			waited <- err
			t.Fatalf("the router exited (%v) before its plugin was up:\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no plugin with a grandchild and a socket after 30s (plugin %d, child %d, sockets %v):\n%s",
				plugin, child, sockets(tmp), stderr.String())
		}
	}
	t.Logf("plugin %d, grandchild %d, socket directories %v", plugin, child, socketDirs(tmp))

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case err := <-waited:
		waited <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the router ended with %v, not by the SIGKILL (did the replay finish first?):\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the router did not die within a minute of SIGKILL")
	}

	var left []int
	var dirs []string
	for deadline := killed.Add(30 * time.Second); ; {
		left, dirs = running(pluginBin), socketDirs(tmp)
		if len(left) == 0 && len(dirs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the router's SIGKILL: processes %v of the plugin binary alive (plugin %d, grandchild %d), socket directories %v left",
				left, plugin, child, dirs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("plugin, grandchild and socket directory gone %v after the SIGKILL", time.Since(killed).Round(time.Millisecond))
}

// lockedBuffer is a bytes.Buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// running lists the live (not zombie) processes whose executable is exe.
func running(exe string) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/exe")
	var pids []int
	for _, f := range stats {
		target, err := os.Readlink(f)
		if err != nil || target != exe {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err == nil && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// socketDirs lists the router's socket directories (sy-*) in dir.
func socketDirs(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "sy-*"))
	return m
}

// sockets lists the files in the socket directories in dir.
func sockets(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "sy-*", "*"))
	return m
}

// TestValidateBrokenPipeCleansUp runs `router validate POLICY --log-level
// debug 2>&1 | head -1`: the reader of the router's stdout and stderr goes
// away after the first line, while the plugin starts. The router catches
// SIGPIPE, so it is not killed by it: it stops the plugin, removes its
// socket directory and exits with status 141.
func TestValidateBrokenPipeCleansUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router and a plugin binary")
	}
	routerBin := filepath.Join(t.TempDir(), "router")
	if out, err := exec.Command("go", "build", "-o", routerBin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the router: %v\n%s", err, out)
	}
	policy := policyWith(t, "plugin-example.hcl", "plugin-example")
	pluginBin := examplePlugin(t, "plugin-example")
	tmp, err := os.MkdirTemp("/tmp", "bp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(routerBin, "validate", policy, "--log-level", "debug")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})
	// head -1: read the first line, then go away.
	var first []byte
	for b := make([]byte, 1); !bytes.HasSuffix(first, []byte("\n")); first = append(first, b[0]) {
		if _, err := r.Read(b); err != nil {
			t.Fatalf("reading the router's first line: %v (got %q)", err, first)
		}
	}
	_ = r.Close()
	t.Logf("first line: %s", first)

	select {
	case err := <-waited:
		waited <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("the router exited with %v, want status 141", err)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			t.Fatalf("the router was killed by %v: its cleanup did not run", ws.Signal())
		}
		if ws.ExitStatus() != 141 {
			t.Errorf("the router exited with status %d, want 141 (128 + SIGPIPE)", ws.ExitStatus())
		}
	case <-time.After(time.Minute):
		t.Fatal("the router did not exit within a minute of its output pipe closing")
	}
	// The router removes the directory before it exits; the plugin
	// process is gone once stopped.
	if dirs := socketDirs(tmp); len(dirs) > 0 {
		t.Errorf("socket directories left: %v", dirs)
	}
	for deadline := time.Now().Add(30 * time.Second); len(running(pluginBin)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin processes %v alive 30s after the router exited", running(pluginBin))
		}
	}
}
