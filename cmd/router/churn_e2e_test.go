//go:build linux

package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServeE2EWorkerMovesLeaveNoConnections: `router serve` with a
// workers file of one worker "w" under load; w moves to a new mock-worker
// process four times (the workers file edited, the old process stopped
// after), as a pod replaced under --pool-selector does. Each time, the
// router's sockets to the departed address close (the pool's idle
// connections to it are closed when it leaves; before, they stayed open
// for ever, 32 a move here), and its open descriptors come back to what
// they were before the first move.
func TestServeE2EWorkerMovesLeaveNoConnections(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	dir := t.TempDir()
	src, err := os.ReadFile("../../examples/policies/round-robin.hcl")
	if err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "rr.hcl")
	if err := os.WriteFile(policy, src, 0o644); err != nil {
		t.Fatal(err)
	}
	startMock := func() *e2eProc {
		return startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50")
	}
	workersFile := filepath.Join(dir, "workers.hcl")
	cur := startMock()
	writeAtomic(t, workersFile, workerBlocks([]string{"w"}, map[string]string{"w": cur.url}))
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "w ready", allReady("w"))
	pid := router.cmd.Process.Pid
	listenPort := portOf(t, router.url)

	// load sends 32 requests at a time, four rounds: the pool holds about
	// 32 connections to w's engine afterwards.
	const concurrency = 32
	load := func(want string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, concurrency)
		for range concurrency {
			wg.Go(func() {
				for range 4 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					r, err := doChat(ctx, c, router.url, chatJSON(false, 4, "hello"))
					cancel()
					if err == nil && (r.status != 200 || r.worker != "w") {
						err = fmt.Errorf("status %d from worker %q: %s", r.status, r.worker, r.body)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("load on %s: %v", want, err)
		}
	}
	load(cur.url)
	baseline := len(fdLinks(t, pid))
	if n := socketsTo(t, pid, listenPort, portOf(t, cur.url)); n < 1 {
		t.Fatalf("%d router sockets to the engine after the load, want some (the pool)", n)
	}

	var departed []int
	for move := 1; move <= 4; move++ {
		next := startMock()
		writeAtomic(t, workersFile, workerBlocks([]string{"w"}, map[string]string{"w": next.url}))
		waitFor(t, "the router to take w's new address "+next.url, func() bool {
			return strings.Contains(router.stderr.String(), "url="+next.url)
		}, router)
		waitMetrics(t, c, router, time.Minute, "w ready at its new address", allReady("w"))
		load(next.url)
		old := portOf(t, cur.url)
		cur.stop(t)
		cur = next
		departed = append(departed, old)
		// The departed port is checked before another mock may take it.
		waitFor(t, fmt.Sprintf("move %d: no router socket to the departed port %d", move, old), func() bool {
			return socketsTo(t, pid, listenPort, old) == 0
		}, router)
		// Open descriptors come back to the level before the first move
		// (slack for the probe's and the clients' connections).
		waitFor(t, fmt.Sprintf("move %d: the router's descriptors back to %d + 16", move, baseline), func() bool {
			return len(fdLinks(t, pid)) <= baseline+16
		}, router)
	}
	curPort := portOf(t, cur.url)
	for _, p := range departed {
		if p == curPort {
			continue // taken again by the current engine
		}
		if n := socketsTo(t, pid, listenPort, p); n != 0 {
			t.Errorf("%d router sockets to the departed port %d", n, p)
		}
	}
}

// waitFor polls ok for up to a minute (a deadline, not a speed claim) and
// fails with what and the router's descriptors when it never holds.
func waitFor(t *testing.T, what string, ok func() bool, router *e2eProc) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			links := fdLinks(t, router.cmd.Process.Pid)
			t.Fatalf("not within a minute: %s; the router has %d descriptors, sockets by remote port %v\nrouter stderr:\n%s",
				what, len(links), socketPorts(t, router.cmd.Process.Pid), router.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// portOf is the port of a URL or host:port.
func portOf(t *testing.T, s string) int {
	t.Helper()
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		s = u.Host
	}
	i := strings.LastIndexByte(s, ':')
	p, err := strconv.Atoi(s[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("no port in %q", s)
	}
	return p
}

// fdLinks returns the targets of pid's open descriptors.
func fdLinks(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, l)
		}
	}
	return out
}

// socketPorts counts pid's TCP sockets by remote port (from
// /proc/PID/net/tcp and tcp6, matched to its descriptors by inode),
// keyed "local->remote".
func socketPorts(t *testing.T, pid int) map[string]int {
	t.Helper()
	inodes := map[string]bool{}
	for _, l := range fdLinks(t, pid) {
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	out := map[string]int{}
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			local, remote := hexPort(fs[1]), hexPort(fs[2])
			out[fmt.Sprintf("%d->%d", local, remote)]++
		}
	}
	return out
}

// socketsTo counts pid's TCP sockets whose remote port is port, other
// than those accepted on its own listenPort (a client's port may be any).
func socketsTo(t *testing.T, pid, listenPort, port int) int {
	t.Helper()
	n := 0
	for k, v := range socketPorts(t, pid) {
		l, r, _ := strings.Cut(k, "->")
		if r == strconv.Itoa(port) && l != strconv.Itoa(listenPort) {
			n += v
		}
	}
	return n
}

// hexPort is the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	p, _ := strconv.ParseUint(addr[i+1:], 16, 32)
	return int(p)
}
