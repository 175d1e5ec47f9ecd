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
)

// sdkCheckDir is scripts/sdk-check: check.mjs, the pinned SDKs'
// package.json and package-lock.json, and node_modules once `make
// sdk-deps` ran.
const sdkCheckDir = "../../scripts/sdk-check"

// sdkSteps are check.mjs's steps (its STEPS), in the order it prints
// them: each is a subtest of TestServeE2ESDKs.
var sdkSteps = []string{
	"models.list",
	"models.retrieve",
	"models.retrieve unknown",
	"chat.completions.create",
	"chat.completions.create stream",
	"embeddings.create",
	"embeddings.create float",
	"responses.create",
	"responses.create previous_response_id",
	"responses.create stream",
	"responses.create stream previous_response_id",
	"messages.create",
	"messages.create stream",
}

// sdkNode returns the path of node after checking that it is Node.js 20 or
// later and that scripts/sdk-check/node_modules holds each SDK at the
// version package.json pins (nodePackages).
func sdkNode(t *testing.T) string {
	t.Helper()
	return nodePackages(t, sdkCheckDir, "scripts/sdk-check", "npm ci of the pinned SDKs", "openai", "@anthropic-ai/sdk")
}

// nodePackages returns the path of node after checking that it is Node.js
// 20 or later and that dir/node_modules (dir named name in messages) holds
// each of pkgs at the version dir/package.json pins; otherwise it fails
// the test naming `make sdk-deps`, which installs them (what: what its
// install step does there), never a skip: `make test` installs them
// first.
func nodePackages(t *testing.T, dir, name, what string, pkgs ...string) string {
	t.Helper()
	fix := "run `make sdk-deps` (scripts/sdk-check/install.sh: " + what + "; Node.js >= 20 and npm)"
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js >= 20) not on PATH: %v; %s", err, fix)
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		t.Fatalf("%s -p process.versions.node: %v; %s", node, err, fix)
	}
	v := strings.TrimSpace(string(out))
	if major, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); err != nil || major < 20 {
		t.Fatalf("%s is Node.js %s, %s needs >= 20; %s", node, v, name, fix)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "package.json")), &pkg); err != nil {
		t.Fatalf("%s/package.json: %v", name, err)
	}
	for _, p := range pkgs {
		want, ok := pkg.Dependencies[p]
		if !ok {
			t.Fatalf("%s/package.json does not pin %s", name, p)
		}
		var got struct {
			Version string `json:"version"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", filepath.FromSlash(p), "package.json"))
		if err == nil {
			err = json.Unmarshal(b, &got)
		}
		if err != nil {
			t.Fatalf("%s is not installed in %s/node_modules (%v); %s", p, name, err, fix)
		}
		if got.Version != want {
			t.Fatalf("%s/node_modules has %s %s, package.json pins %s; %s", name, p, got.Version, want, fix)
		}
	}
	return node
}

// sdkLine is one step's line of check.mjs's output.
type sdkLine struct {
	pass bool
	text string // what the step saw (PASS) or why it failed (FAIL)
}

// parseSDKCheck reads check.mjs's output: "PASS <step> <what>" and
// "FAIL <step>: <why>" lines for the steps, in sdkSteps's order, then
// "ok N steps" or "FAILED <steps>". It returns the steps' lines by name and
// the last line, and an error for a line it cannot place (an unknown
// step, a step twice or out of order).
func parseSDKCheck(out []byte) (map[string]sdkLine, string, error) {
	lines := map[string]sdkLine{}
	next, last := 0, ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		last = l
		pass := strings.HasPrefix(l, "PASS ")
		if !pass && !strings.HasPrefix(l, "FAIL ") {
			continue
		}
		rest := l[len("PASS "):]
		// The longest step name the line starts with: "x" and "x stream"
		// are both steps.
		at := -1
		for i, step := range sdkSteps {
			var match bool
			if pass {
				match = rest == step || strings.HasPrefix(rest, step+" ")
			} else {
				match = strings.HasPrefix(rest, step+": ")
			}
			if match && (at < 0 || len(step) > len(sdkSteps[at])) {
				at = i
			}
		}
		if at < next {
			return lines, last, fmt.Errorf("line %q names no step expected after %d of %d", l, next, len(sdkSteps))
		}
		step := sdkSteps[at]
		text := rest[len(step):] // " what", "" or ": why"
		text = strings.TrimPrefix(strings.TrimPrefix(text, ":"), " ")
		lines[step] = sdkLine{pass: pass, text: text}
		next = at + 1
	}
	return lines, last, sc.Err()
}

// TestParseSDKCheck: the parser places each line on its step, also where
// one step's name is the start of the next's, and refuses a line that
// names no step or repeats one.
func TestParseSDKCheck(t *testing.T) {
	out := "PASS models.list 1 model(s)\nFAIL models.retrieve: 404\nPASS responses.create id r1\n" +
		"FAIL responses.create previous_response_id: served by w2\nPASS responses.create stream id r2 worker w1\n" +
		"FAILED models.retrieve, responses.create previous_response_id\n"
	lines, last, err := parseSDKCheck([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]sdkLine{
		"models.list":                           {true, "1 model(s)"},
		"models.retrieve":                       {false, "404"},
		"responses.create":                      {true, "id r1"},
		"responses.create previous_response_id": {false, "served by w2"},
		"responses.create stream":               {true, "id r2 worker w1"},
	}
	if len(lines) != len(want) {
		t.Errorf("%d lines placed, want %d: %v", len(lines), len(want), lines)
	}
	for k, w := range want {
		if lines[k] != w {
			t.Errorf("%q: %+v, want %+v", k, lines[k], w)
		}
	}
	if last != "FAILED models.retrieve, responses.create previous_response_id" {
		t.Errorf("last line %q", last)
	}
	for _, bad := range []string{"PASS no.such.step x\n", "PASS models.list a\nPASS models.list b\n", "PASS models.retrieve a\nPASS models.list b\n"} {
		if _, _, err := parseSDKCheck([]byte(bad)); err == nil {
			t.Errorf("%q parsed without an error", bad)
		}
	}
}

// TestServeE2ESDKs: the official OpenAI and Anthropic Node SDKs
// (scripts/sdk-check/check.mjs) against `router serve` in front of three
// `router mock-worker` engines, each step a subtest: models (list,
// retrieve, an unknown id's 404), chat completions, embeddings (base64 and
// float), Responses (streamed and not, with previous_response_id
// follow-ups that must reach the engine that issued the response: the
// policy is round-robin, so only the router's binding keeps them there)
// and Anthropic Messages (streamed and not). Afterwards every worker's
// bookings are released.
func TestServeE2ESDKs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router, mock workers and node as processes")
	}
	node := sdkNode(t) // first: a missing SDK fails before the build
	routerBin, _ := e2eBinaries(t)
	script, err := filepath.Abs(filepath.Join(sdkCheckDir, "check.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	mocks := startMocks(t, routerBin, 3, "50")
	names := []string{"a", "b", "c"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url, "c": mocks[2].url}
	policy := filepath.Join(t.TempDir(), "rr.hcl")
	if err := os.WriteFile(policy, []byte(`router {
  block_size = 16
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}

`+workerBlocks(names, urls)), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "every worker ready", allReady(names...))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, "--base-url", router.url, "--model", "mock")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", node, script, runErr, out, stderr.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("check.mjs did not end within 3 minutes\nstdout:\n%s\nstderr:\n%s", out, stderr.String())
	}
	t.Logf("check.mjs (exit %d):\n%s%s", cmd.ProcessState.ExitCode(), out, stderr.String())
	lines, last, perr := parseSDKCheck(out)
	if perr != nil {
		t.Errorf("check.mjs's output: %v", perr)
	}
	failed := 0
	for _, step := range sdkSteps {
		t.Run(step, func(t *testing.T) {
			l, ok := lines[step]
			switch {
			case !ok:
				failed++
				t.Errorf("check.mjs printed no line for this step\nstderr:\n%s", stderr.String())
			case !l.pass:
				failed++
				t.Error(l.text)
			default:
				t.Log(l.text)
			}
		})
	}
	// The exit status and the last line agree with the steps.
	switch {
	case failed == 0 && (runErr != nil || last != fmt.Sprintf("ok %d steps", len(sdkSteps))):
		t.Errorf("every step passed, but check.mjs exited %v with last line %q", runErr, last)
	case failed > 0 && (runErr == nil || !strings.HasPrefix(last, "FAILED ")):
		t.Errorf("%d steps failed, but check.mjs exited %v with last line %q", failed, runErr, last)
	}

	t.Run("bookings released", func(t *testing.T) {
		waitMetrics(t, c, router, time.Minute, "every worker idle after the SDKs' requests", idle)
	})
	if s := router.stderr.String(); strings.Contains(s, "panic") {
		t.Errorf("router stderr has a panic:\n%s", s)
	}
}
