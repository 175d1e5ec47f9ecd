package live

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/shared"
)

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
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

// daemonPolicy is a round-robin policy file named policy with worker
// blocks for each name=URL pair of workers.
func daemonPolicy(policy string, workers ...string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "policy %q {\n  picker \"rr\" {\n    type = \"round-robin\"\n  }\n}\n\nworker_selection {\n  aggregated = %q\n}\n", policy, policy)
	sb.WriteString(workerBlocks(workers...))
	return sb.String()
}

// workerBlocks is a worker block of model "m" for each name=URL pair.
func workerBlocks(workers ...string) string {
	var sb strings.Builder
	for _, w := range workers {
		name, url, _ := strings.Cut(w, "=")
		fmt.Fprintf(&sb, "\nworker %q {\n  url             = %q\n  models          = [\"m\"]\n  total_kv_blocks = 1000\n}\n", name, url)
	}
	return sb.String()
}

// replaceFile writes content to path the way editors do: a temporary
// file renamed over it.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// runningDaemon is a Daemon running on a loopback listener.
type runningDaemon struct {
	d    *Daemon
	base string
	logs *lockedBuffer
	stop func() error // ends Run and returns its result
}

// startDaemon runs a Daemon with o on a loopback listener, its logs in
// a buffer and workers probed every 50ms, and waits until it is ready. The
// test's cleanup stops it.
func startDaemon(t *testing.T, o DaemonOptions) *runningDaemon {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	o.Listener = ln
	o.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	o.ScrapeInterval = 200 * time.Millisecond // also each probe's timeout: a loaded machine needs room
	if o.Face == nil {
		o.Face = newTestFace
	}
	ready := make(chan struct{})
	o.OnReady = func() { close(ready) }
	d, err := NewDaemon(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Run returned %v before it was ready; logs:\n%s", err, logs)
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("not ready after a minute; logs:\n%s", logs)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				runErr = errors.New("Run did not return within a minute of its context's end")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &runningDaemon{d: d, base: "http://" + ln.Addr().String(), logs: logs, stop: stop}
}

// waitWorkers waits until /readyz lists exactly want (sorted), each ready.
func (rd *runningDaemon) waitWorkers(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, a := getReadyz(t, rd.base)
		var got []string
		allReady := true
		for _, w := range a.Workers {
			got = append(got, w.Name)
			allReady = allReady && w.Ready
		}
		if allReady && slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz workers %+v a minute on, want %v ready; logs:\n%s", a.Workers, want, rd.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// split sends n chat requests and counts the answers per worker.
func (rd *runningDaemon) split(t *testing.T, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		resp, err := post(t, context.Background(), rd.base+"/v1/chat/completions", chatBody("m", i%2 == 0, fmt.Sprintf("hello %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
		out[resp.Header.Get("X-Switchyard-Worker")]++
	}
	return out
}

// policyName is the running policy of the aggregated role.
func (rd *runningDaemon) policyName() string {
	if b := loader.Current(rd.d.r); b != nil {
		return b.PolicyName(shared.RoleAggregated)
	}
	return ""
}

// TestDaemonWorkersAndReloads drives a Daemon without the command line:
// its workers are the policy file's worker blocks plus the workers
// file's; a workers file change applies by itself; Reload and a reload
// signal apply a changed policy file and its worker blocks; a file that
// does not load changes nothing (ErrReloadFailed); a reload whose
// workers cannot be set applies the policies only and says so
// (ErrPartialReload), and the next good workers file completes it.
func TestDaemonWorkersAndReloads(t *testing.T) {
	dir := t.TempDir()
	a, b, c := newMock(t, "", 50), newMock(t, "", 50), newMock(t, "", 50)
	policy, workersFile := filepath.Join(dir, "policy.hcl"), filepath.Join(dir, "workers.hcl")
	replaceFile(t, policy, daemonPolicy("one", "a="+a.URL))
	replaceFile(t, workersFile, workerBlocks("b="+b.URL))
	hup := make(chan os.Signal, 1)
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, WorkersFile: workersFile, Signals: hup})

	rd.waitWorkers(t, "a", "b")
	if got := rd.split(t, 6); got["a"] != 3 || got["b"] != 3 {
		t.Errorf("round-robin split %v, want 3 each on a and b", got)
	}
	code, ra := getReadyz(t, rd.base)
	if code != http.StatusOK || ra.Policy != (PolicyReadiness{State: "loaded", File: policy}) {
		t.Errorf("/readyz %d policy %+v, want 200 and %s loaded", code, ra.Policy, policy)
	}

	// The workers file alone changes: b leaves, c joins.
	replaceFile(t, workersFile, workerBlocks("c="+c.URL))
	rd.waitWorkers(t, "a", "c")

	// Reload: the policy file's new policy and its worker blocks apply.
	replaceFile(t, policy, daemonPolicy("two", "b="+b.URL))
	if err := rd.d.Reload(context.Background()); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := rd.policyName(); got != "two" {
		t.Errorf("after Reload the policy is %q, want two", got)
	}
	rd.waitWorkers(t, "b", "c")
	if got := rd.split(t, 4); got["b"] != 2 || got["c"] != 2 {
		t.Errorf("split after Reload %v, want 2 each on b and c", got)
	}

	// A policy file that does not load changes nothing.
	replaceFile(t, policy, "policy \"three\" {\n")
	err := rd.d.Reload(context.Background())
	if !errors.Is(err, ErrReloadFailed) || !strings.Contains(err.Error(), policy+":") {
		t.Errorf("Reload of a broken file: %v, want ErrReloadFailed naming %s", err, policy)
	}
	if got := rd.policyName(); got != "two" {
		t.Errorf("after a failed reload the policy is %q, want two", got)
	}

	// A reload signal reloads too.
	replaceFile(t, policy, daemonPolicy("four", "a="+a.URL))
	hup <- syscall.SIGHUP
	rd.waitWorkers(t, "a", "c")
	if got := rd.policyName(); got != "four" {
		t.Errorf("after the signal the policy is %q, want four", got)
	}

	// The policy file reloads but its workers cannot be set (the
	// workers file repeats its worker's name): the new policies decide,
	// the workers stay, and the error and the log say so.
	replaceFile(t, workersFile, workerBlocks("a="+c.URL))
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(rd.logs.String(), "workers file change not applied") {
		if time.Now().After(deadline) {
			t.Fatalf("the clashing workers file was not refused; logs:\n%s", rd.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	replaceFile(t, policy, daemonPolicy("five", "a="+a.URL))
	err = rd.d.Reload(context.Background())
	if !errors.Is(err, ErrPartialReload) || !strings.Contains(err.Error(), `duplicate worker "a"`) {
		t.Errorf("Reload with clashing workers: %v, want ErrPartialReload naming the duplicate", err)
	}
	if got := rd.policyName(); got != "five" {
		t.Errorf("after the partial reload the policy is %q, want five", got)
	}
	if !strings.Contains(rd.logs.String(), "policy reload half-applied") {
		t.Errorf("the partial reload is not logged; logs:\n%s", rd.logs)
	}
	rd.waitWorkers(t, "a", "c")
	replaceFile(t, workersFile, workerBlocks("b="+b.URL))
	rd.waitWorkers(t, "a", "b")

	if err := rd.stop(); err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	if err := rd.d.Reload(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Reload after Run returned: %v, want ErrNotRunning", err)
	}
}

// TestDaemonSIGHUP: without DaemonOptions.Signals a real SIGHUP reloads
// the policy file, and does not end the process.
func TestDaemonSIGHUP(t *testing.T) {
	dir := t.TempDir()
	a := newMock(t, "", 50)
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, daemonPolicy("one", "a="+a.URL))
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy})
	replaceFile(t, policy, daemonPolicy("two", "a="+a.URL))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for rd.policyName() != "two" {
		if time.Now().After(deadline) {
			t.Fatalf("policy %q a minute after SIGHUP, want two; logs:\n%s", rd.policyName(), rd.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(rd.logs.String(), "signal hangup") {
		t.Errorf("the reload is not logged as the signal's; logs:\n%s", rd.logs)
	}
}

// TestDaemonWarnsOfOneURLAcrossFiles: a workers file's worker at the url
// of a policy file's worker (one engine counted twice) is warned about
// at the workers file's block, naming the policy file's: at start on
// Diagnostics, and in the log when the workers file changes to one; both
// workers serve either way.
func TestDaemonWarnsOfOneURLAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	policy, workersFile := filepath.Join(dir, "policy.hcl"), filepath.Join(dir, "workers.hcl")
	replaceFile(t, policy, daemonPolicy("one", "a="+a.URL))
	replaceFile(t, workersFile, workerBlocks("c="+a.URL))
	warning := func(name string) string {
		return fmt.Sprintf("%s:2:1: warning: Two workers at one URL; Worker %q (here) and worker \"a\" (%s:", workersFile, name, policy)
	}
	var diags lockedBuffer
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, WorkersFile: workersFile, Diagnostics: &diags})
	rd.waitWorkers(t, "a", "c")
	if !strings.HasPrefix(diags.String(), warning("c")) {
		t.Errorf("diagnostics at start %q, want the warning at c: %q...", diags.String(), warning("c"))
	}

	// Distinct urls: no warning; then one at a's again: logged.
	replaceFile(t, workersFile, workerBlocks("d="+b.URL))
	rd.waitWorkers(t, "a", "d")
	if strings.Contains(rd.logs.String(), "Two workers at one URL") {
		t.Errorf("a warning for distinct urls; logs:\n%s", rd.logs)
	}
	replaceFile(t, workersFile, workerBlocks("e="+a.URL))
	rd.waitWorkers(t, "a", "e")
	deadline := time.Now().Add(time.Minute)
	for want := strconv.Quote(warning("e")); ; time.Sleep(10 * time.Millisecond) {
		if logs := rd.logs.String(); strings.Contains(logs, "workers file loaded with warnings") && strings.Contains(logs, want[1:len(want)-1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warning logged for e at a's url; logs:\n%s", rd.logs)
		}
	}
}

// TestDaemonStartErrors: a policy or workers file that does not load
// ends Run with ErrNotLoaded naming the file, its diagnostics at
// file:line:col on Diagnostics, before StartPods is called (a Kubernetes
// error would hide them); the listener is closed; Reload before Run is
// ErrNotRunning. With files that load, StartPods' error is Run's, as is.
func TestDaemonStartErrors(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.hcl"), filepath.Join(dir, "bad.hcl")
	replaceFile(t, good, daemonPolicy("one"))
	replaceFile(t, bad, "router {\n  block_size = \"x\"\n}\n")
	badWorkers := filepath.Join(dir, "workers.hcl")
	replaceFile(t, badWorkers, "worker \"a\" {\n")
	for _, tt := range []struct {
		name          string
		o             DaemonOptions
		file, diagPos string
	}{
		{"policy", DaemonOptions{PolicyFile: bad}, bad, bad + ":2:"},
		{"workers file", DaemonOptions{PolicyFile: good, WorkersFile: badWorkers}, badWorkers, badWorkers + ":1:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var diags lockedBuffer
			tt.o.Listener, tt.o.Diagnostics, tt.o.Face = ln, &diags, newTestFace
			tt.o.OnReady = func() { t.Error("ready with a file that does not load") }
			tt.o.StartPods = func() (WorkerSource, error) {
				t.Error("StartPods called with a file that does not load")
				return nil, errors.New("pods")
			}
			d, err := NewDaemon(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Reload(context.Background()); !errors.Is(err, ErrNotRunning) {
				t.Errorf("Reload before Run: %v, want ErrNotRunning", err)
			}
			err = d.Run(context.Background())
			if !errors.Is(err, ErrNotLoaded) || err.Error() != tt.file+" does not load" {
				t.Errorf("Run: %v, want %q (ErrNotLoaded)", err, tt.file+" does not load")
			}
			if !strings.HasPrefix(diags.String(), tt.diagPos) || !strings.Contains(diags.String(), ": error: ") {
				t.Errorf("diagnostics %q, want an error at %s", diags.String(), tt.diagPos)
			}
			if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("listener after Run: Accept %v, want closed", err)
			}
			if err := d.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Run called twice") {
				t.Errorf("second Run: %v", err)
			}
		})
	}
	t.Run("pods", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var diags lockedBuffer
		podsErr := errors.New("--kubeconfig: no such file")
		calls := 0
		d, err := NewDaemon(DaemonOptions{PolicyFile: good, Listener: ln, Diagnostics: &diags, Face: newTestFace,
			OnReady:   func() { t.Error("ready although the pods did not start") },
			StartPods: func() (WorkerSource, error) { calls++; return nil, podsErr }})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Run(context.Background()); err != podsErr || calls != 1 || diags.String() != "" {
			t.Errorf("Run: %v after %d StartPods calls, diagnostics %q; want %v after 1, none", err, calls, diags.String(), podsErr)
		}
	})
	if _, err := NewDaemon(DaemonOptions{Listener: nil, PolicyFile: good}); err == nil {
		t.Error("NewDaemon without a listener: no error")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := NewDaemon(DaemonOptions{Listener: ln, PolicyFile: good}); err == nil || !strings.Contains(err.Error(), "no face") {
		t.Errorf("NewDaemon without a face: %v, want no face", err)
	}
}

// TestDaemonDebugListener: the profiler answers on DebugListener only,
// and the listener is closed when Run returns.
func TestDaemonDebugListener(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, daemonPolicy("one"))
	dln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, DebugListener: dln})
	get := func(url string) int {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("http://" + dln.Addr().String() + "/debug/pprof/cmdline"); code != http.StatusOK {
		t.Errorf("profiler: %d, want 200", code)
	}
	if code := get(rd.base + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("profiler on the API listener: %d, want 404", code)
	}
	if err := rd.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := dln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("debug listener after Run: Accept %v, want closed", err)
	}
}

// TestDaemonClosesDepartedConnections: a worker moved to another URL by a
// reload has the connections to its old address closed as it leaves (not
// when a request to that address comes again, which none does).
func TestDaemonClosesDepartedConnections(t *testing.T) {
	dir := t.TempDir()
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, daemonPolicy("one", "w="+a.URL))
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy})
	rd.waitWorkers(t, "w")
	// Requests to a leave connections to it in the pool (they would
	// close by themselves after upstream.DefaultIdleTimeout unused:
	// fill again until one is seen, then move w at once).
	deadline := time.Now().Add(time.Minute)
	for rd.split(t, 2)["w"] != 2 || rd.d.tr.IdleTo(a.URL) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no idle connection to %s after requests to it", a.URL)
		}
	}
	replaceFile(t, policy, daemonPolicy("one", "w="+b.URL))
	if err := rd.d.Reload(context.Background()); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if n := rd.d.tr.IdleTo(a.URL); n != 0 {
		t.Fatalf("%d idle connections to w's old address %s after it moved, want 0", n, a.URL)
	}
	rd.waitWorkers(t, "w")
	if got := rd.split(t, 2); got["w"] != 2 {
		t.Fatalf("split %v after the move, want 2 on w", got)
	}
}
