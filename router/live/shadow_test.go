//go:build linux

package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
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

// shadowPluginPolicy builds cmd/plugin-example and writes a policy file
// whose round-robin policy "live" has the plugin's queue-depth scorer
// (policy "queue") as its shadow, over two mock workers a and b. It
// returns the file and the plugin binary.
func shadowPluginPolicy(t *testing.T) (policy, bin string) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, "shadow-plugin-example")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/plugin-example").CombinedOutput(); err != nil {
		t.Fatalf("building cmd/plugin-example: %v\n%s", err, out)
	}
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	policy = filepath.Join(dir, "policy.hcl")
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
	return policy, bin
}

// TestDaemonShadowPlugin runs the daemon with a round-robin policy whose
// shadow is cmd/plugin-example's queue-depth scorer, a real plugin
// process. Every request is answered by the live policy's worker while
// the plugin serves, while it is stopped (SIGSTOP: the shadow times out
// or is dropped) and after it is killed; /metrics counts the shadow's
// decisions by result, the failed ones included, and the failures are
// logged as the shadow's (logger "shadow"), not as failed plugin calls.
func TestDaemonShadowPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a plugin process")
	}
	policy, bin := shadowPluginPolicy(t)
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
	// The failing shadow is logged as the shadow's, never as a failing
	// plugin call of a live policy.
	if logs := rd.logs.String(); !strings.Contains(logs, "shadow: shadow decision failed; live decisions are unaffected") ||
		strings.Contains(logs, "plugin call failed") {
		t.Errorf("logs of the failing shadow:\n%s", logs)
	}

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	send(20)
	wait()
}

// TestDaemonShadowPluginConcurrent: 16 clients at once through the
// daemon whose shadow is a real plugin process: the shadow is asked about
// every decision (none dropped, none sampled out: its workers keep up),
// and GET /debug/shadow shows the counts, the sample rate 1 and, for the
// last requests, where the live policy and the shadow sent each.
func TestDaemonShadowPluginConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a plugin process")
	}
	policy, _ := shadowPluginPolicy(t)
	dln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, Registry: reg, DebugListener: dln})
	rd.waitWorkers(t, "a", "b")

	const clients, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				resp, err := post(t, context.Background(), rd.base+"/v1/chat/completions", chatBody("m", false, fmt.Sprintf("hello %d %d", c, i)),
					"X-Request-Id", fmt.Sprintf("client-%d-%d", c, i))
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("client %d request %d: status %d: %s", c, i, resp.StatusCode, body)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	const total = clients * each
	var counts map[string]int
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		counts = shadowCounts(t, reg)
		n := 0
		for _, v := range counts {
			n += v
		}
		if n == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shadow outcomes %v after 60s, want %d", counts, total)
		}
	}
	if counts["agree"]+counts["disagree"] != total {
		t.Errorf("shadow outcomes %v: want every one of %d answered (none dropped, sampled out or failed)", counts, total)
	}

	resp, err := http.Get("http://" + dln.Addr().String() + "/debug/shadow")
	if err != nil {
		t.Fatal(err)
	}
	var v router.ShadowView
	err = json.NewDecoder(resp.Body).Decode(&v)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/shadow: %d %v", resp.StatusCode, err)
	}
	if v.Mode != "async" || v.Decisions != total || v.SampleRate != 1 || v.SampleEvery != 1 || v.Failures != 0 ||
		v.Results["agree"] != int64(counts["agree"]) || v.Results["dropped"] != 0 || v.Results["sampled_out"] != 0 {
		t.Errorf("/debug/shadow: %+v, metrics %v", v, counts)
	}
	if len(v.Recent) != router.DefaultShadowRecent || v.Latency.Samples != total || v.Latency.P50us <= 0 || v.Latency.P99us < v.Latency.P50us {
		t.Fatalf("/debug/shadow: %d recent, latency %+v", len(v.Recent), v.Latency)
	}
	seen := map[string]bool{}
	for _, rec := range v.Recent {
		if !strings.HasPrefix(rec.RequestID, "client-") || seen[rec.RequestID] || rec.Policy != "live" || rec.Shadow != "queue" ||
			rec.LiveWorkerName != "a" && rec.LiveWorkerName != "b" || rec.ShadowWorker == nil ||
			rec.ShadowWorkerName != "a" && rec.ShadowWorkerName != "b" ||
			(rec.Result == "agree") != (rec.LiveWorkerName == rec.ShadowWorkerName) || rec.ElapsedUS <= 0 {
			t.Errorf("recent decision %+v", rec)
		}
		seen[rec.RequestID] = true
	}
}
