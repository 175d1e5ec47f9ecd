//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// nodePluginDir is examples/node-plugin: a plugin in Node.js written from
// docs/plugin-protocol.md alone (plugin.js), its package.json and
// package-lock.json, and node_modules once `make sdk-deps` ran.
const nodePluginDir = "../../examples/node-plugin"

// nodePluginScript is plugin.js as the repository's root names it: the
// tests run the router there, as examples/node-plugin/README.md does.
const nodePluginScript = "examples/node-plugin/plugin.js"

// nodeExample checks that node is Node.js 20 or later and that
// examples/node-plugin/node_modules holds the packages package.json pins,
// and returns node's path and the repository's root; otherwise it fails
// the test naming `make sdk-deps` (never a skip: `make test` installs them
// first).
func nodeExample(t *testing.T) (node, root string) {
	t.Helper()
	node = nodePackages(t, nodePluginDir, "examples/node-plugin", "npm ci in examples/node-plugin", "@grpc/grpc-js", "@grpc/proto-loader")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return node, root
}

// nodePluginProcs returns the live processes running plugin.js in dir (the
// working directory the test gave the router), by their command line and
// working directory, so that other checkouts' runs are not counted.
func nodePluginProcs(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(nodePluginScript+"\x00")) {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err != nil || cwd != dir {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// The state follows the parenthesised command name.
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// runRouterIn runs the router binary with args in dir, within limit, and
// returns its exit code and output.
func runRouterIn(t *testing.T, bin, dir string, limit time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("router %s did not end within %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), limit, out.String(), errb.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("router %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// TestPluginsCheckNodeExample: the Node.js example plugin, written from
// docs/plugin-protocol.md alone, passes `router plugins check` run from the
// repository's root exactly as its README says, `router plugins check --
// node examples/node-plugin/plugin.js`: every check named below passes,
// for both of its types, and no process of it is left afterwards.
func TestPluginsCheckNodeExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the router and runs node as a process")
	}
	_, root := nodeExample(t)
	routerBin := testkit.BuildNamed(t, ".", "router")
	t.Cleanup(func() {
		deadline := time.Now().Add(30 * time.Second)
		for left := nodePluginProcs(root); len(left) > 0; left = nodePluginProcs(root) {
			if time.Now().After(deadline) {
				t.Errorf("plugin.js processes left behind: %v", left)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// A busy machine makes node start slowly: a minute rather than 5 s.
	code, out, errOut := runRouterIn(t, routerBin, root, 5*time.Minute,
		"plugins", "check", "--start-timeout", "1m", "--", "node", nodePluginScript)
	t.Logf("router plugins check (exit %d):\n%s%s", code, out, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "PASS "), l == stdoutSkip,
			// A busy machine may slow a call past call_timeout or a
			// health check past 2 s: a warning, not a failure.
			strings.HasPrefix(l, `WARNING latency "`), strings.HasPrefix(l, "WARNING health: "),
			// plugin.js removes its own socket, not the directory the
			// router made for it: the router sweeps that, and the check
			// reports it as a warning.
			strings.HasPrefix(l, "WARNING parent death"):
		default:
			t.Errorf("line %q is not a PASS", l)
		}
	}
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	for _, w := range []string{
		"PASS handshake (2 component types)", "PASS schema",
		`PASS configure "node-least-active"`, `PASS configure "node-least-active" wrong type`,
		`PASS configure "node-least-active" inputs (ACTIVE_REQUESTS, a subset of its type's)`,
		`PASS decide "node-least-active" rows=1`, `PASS decide "node-least-active" rows=8`, `PASS decide "node-least-active" rows=4096`,
		`PASS decide "node-least-active" concurrent=32 (calls of 1 to 32 rows at once)`,
		`PASS configure "node-max-active"`, `PASS configure "node-max-active" wrong type`,
		`PASS configure "node-max-active" inputs (ACTIVE_REQUESTS, a subset of its type's)`,
		`PASS decide "node-max-active" rows=1`, `PASS decide "node-max-active" rows=8`, `PASS decide "node-max-active" rows=4096`,
		`PASS decide "node-max-active" concurrent=32 (calls of 1 to 32 rows at once)`,
		// plugin.js serves no go-plugin stdio service.
		stdoutSkip,
	} {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output lacks %q", w)
		}
	}
	for _, w := range []string{
		`PASS configure "node-least-active" boundaries of "active_weight" (`,
		`PASS configure "node-least-active" boundaries of "waiting_weight" (`,
		`PASS configure "node-max-active" boundaries of "max_active_requests" (`,
		`PASS latency "node-least-active" (`, `PASS latency "node-max-active" (`,
		"PASS health (", "PASS decide batch (", "PASS decide streams=4 (",
	} {
		if !strings.Contains(out, "\n"+w) {
			t.Errorf("output lacks a line starting %q", w)
		}
	}
	if !shutdownPass.MatchString(out) {
		t.Error("output lacks a passed shutdown check")
	}
	if !strings.Contains(out, "\nPASS parent death") && !strings.Contains(out, "\nWARNING parent death") {
		t.Error("output lacks the parent death check")
	}
}

// TestReplayNodeExample: `router replay --fail-on-fallback` of 300 requests
// with examples/policies/node-example.hcl, run from the repository's root
// as its README says: it exits 0, every selection was the plugin's (no
// fallback), and each request was charged the plugin block's simulated
// decision latency (replay_decision_latency, default 100 us) exactly once:
// its filter and scorer ran in one call into plugin.js.
func TestReplayNodeExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the router and runs node as a process")
	}
	node, root := nodeExample(t)
	routerBin := testkit.BuildNamed(t, ".", "router")
	for _, listen := range []string{"unix", "tcp"} {
		t.Run(listen, func(t *testing.T) { replayNodeExample(t, routerBin, node, root, listen) })
	}
}

// replayNodeExample replays with the example policy, its plugin listening
// on a Unix socket (the example as shipped) or, with listen "tcp", on
// loopback TCP (NODE_PLUGIN_LISTEN in the block's env): the protocol's two
// transports, both on Linux (docs/plugin-protocol.md, section 2).
func replayNodeExample(t *testing.T, routerBin, node, root, listen string) {
	policy := "examples/policies/node-example.hcl"
	src := string(readFile(t, filepath.Join(root, policy)))
	out := src
	if _, err := os.Stat("/usr/bin/node"); err != nil {
		// The example names Debian's /usr/bin/node; run the one on PATH.
		out = strings.Replace(out, `command = "/usr/bin/node"`, fmt.Sprintf("command = %q", node), 1)
		if out == src {
			t.Fatal(`node-example.hcl does not run "/usr/bin/node"`)
		}
	}
	if listen == "tcp" {
		with := strings.Replace(out, `start_timeout = "30s"`, `start_timeout = "30s"
  env           = { NODE_PLUGIN_LISTEN = "tcp" }`, 1)
		if with == out {
			t.Fatal(`node-example.hcl has no start_timeout = "30s" line to add env after`)
		}
		out = with
	}
	if out != src {
		policy = writeFile(t, "node-example.hcl", out)
	}
	dir := t.TempDir()
	per, rep := filepath.Join(dir, "requests.jsonl"), filepath.Join(dir, "report.json")
	code, out, errOut := runRouterIn(t, routerBin, root, 5*time.Minute, "replay", "--policy", policy,
		"--trace", "testdata/traces/mooncake_arxiv_trace_first1000.jsonl",
		"--limit", "300", "--workers", "4", "--per-request", per, "--report", rep, "--fail-on-fallback")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	sum := reportFields(t, readFile(t, rep))
	for k, want := range map[string]any{
		"policy": "node-example", "requests": 300.0, "completed": 300.0, "selections": 300.0,
		"fallbacks": 0.0, "plugin_restarts": 0.0,
	} {
		if sum[k] != want {
			t.Errorf("report %s = %v, want %v", k, sum[k], want)
		}
	}
	n := 0
	workers := map[int]int{}
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, per)))
	for sc.Scan() {
		var line struct {
			Worker     int      `json:"worker"`
			DecisionMS *float64 `json:"decision_ms"`
			Status     string   `json:"status"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("per-request line %d: %v: %s", n, err, sc.Bytes())
		}
		if line.DecisionMS == nil || *line.DecisionMS != 0.1 || line.Status != "ok" {
			t.Errorf("per-request line %d: %s; want status ok and decision_ms 0.1 (one plugin call)", n, sc.Bytes())
		}
		workers[line.Worker]++
		n++
	}
	if n != 300 {
		t.Errorf("%d per-request lines, want 300", n)
	}
	// Least active requests spreads a burst over every worker.
	if len(workers) != 4 {
		t.Errorf("the decisions used %d of 4 workers: %v", len(workers), workers)
	}
}

// TestNodeExampleUnitTests runs examples/node-plugin/plugin.test.js (`node
// --test`): what `router plugins check` leaves unchecked (section 9 of
// docs/plugin-protocol.md, "Not checked"), namely a task whose deadline
// passed answered with an error, a DecideBatch and an answer over gRPC's
// 4 MiB default limits, results split at the 64 MiB limit, Classify and
// Events (undeclared) answering UNIMPLEMENTED, and that Shutdown and
// SIGTERM end the process leaving the router's socket directory (and
// anything else it did not create) in place.
func TestNodeExampleUnitTests(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node as a process")
	}
	node, root := nodeExample(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "examples/node-plugin/")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test examples/node-plugin/: %v\n%s", err, out)
	}
	for _, want := range []string{"# pass 8\n", "# fail 0\n"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("node --test output lacks %q:\n%s", want, out)
		}
	}
}
