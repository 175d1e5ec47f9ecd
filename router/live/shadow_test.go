//go:build linux

package live

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shadowCounts reads switchyard_shadow_decisions_total from reg by
// result.
func shadowCounts(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_shadow_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["role"] != "aggregated" || labels["policy"] != "live" || labels["shadow"] != "queue" {
				t.Errorf("shadow series %v", labels)
			}
			out[labels["result"]] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

// processOf returns the one live process whose executable is bin.
func processOf(t *testing.T, bin string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == bin {
			pid, _ := strconv.Atoi(e.Name())
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("processes of %s: %v, want one", bin, pids)
	}
	return pids[0]
}

// TestDaemonShadowPlugin runs the daemon with a round-robin policy whose
// shadow is cmd/plugin-example's queue-depth scorer, a real plugin
// process. Every request is answered by the live policy's worker while
// the plugin serves, while it is stopped (SIGSTOP: the shadow times out
// or is dropped) and after it is killed; /metrics counts the shadow's
// decisions by result, the failed ones included.
func TestDaemonShadowPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a plugin process")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "shadow-plugin-example")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/plugin-example").CombinedOutput(); err != nil {
		t.Fatalf("building cmd/plugin-example: %v\n%s", err, out)
	}
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf(`plugin "example" {
  command      = %q
  call_timeout = "2s"
}

policy "live" {
  picker "rr" { type = "round-robin" }
  shadow = "queue"
}

policy "queue" {
  scorer "depth" { type = "queue-depth" }
  picker "pick" { type = "min-cost" }
}

worker_selection { aggregated = "live" }
`, bin)+workerBlocks("a="+a.URL, "b="+b.URL))
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, Registry: reg})
	rd.waitWorkers(t, "a", "b")

	total := 0
	send := func(n int) {
		t.Helper()
		// Round-robin splits them evenly whatever the shadow does.
		if got := rd.split(t, n); got["a"] != n/2 || got["b"] != n/2 {
			t.Fatalf("requests per worker %v, want %d each", got, n/2)
		}
		total += n
	}
	// wait waits (60 s at most) until the counts hold total outcomes.
	wait := func() map[string]int {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			c := shadowCounts(t, reg)
			n := 0
			for _, v := range c {
				n += v
			}
			if n == total {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("shadow outcomes %v after 60s, want %d", c, total)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	send(20)
	healthy := wait()
	if healthy["agree"]+healthy["disagree"] == 0 || healthy["failed"] != 0 {
		t.Fatalf("healthy plugin: shadow outcomes %v", healthy)
	}

	pid := processOf(t, bin)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Signals are delivered asynchronously: wait until it is stopped.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'T' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin not stopped after a minute: %s", st)
		}
	}
	send(20)
	hung := wait()
	if hung["agree"]+hung["disagree"] != healthy["agree"]+healthy["disagree"] || hung["failed"] == 0 {
		t.Fatalf("stopped plugin: shadow outcomes %v after %v", hung, healthy)
	}

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	send(20)
	wait()
}
