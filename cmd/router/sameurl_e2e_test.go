//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkersAtOneURLWarned: two worker blocks of different names with one
// url (a copy-paste mistake: one engine counted twice) are warned about at
// load, naming both blocks and where each is, and still loaded: `router
// validate` exits 0 with the warning on stderr and both workers listed;
// `router serve` logs it at start and serves with both workers ready.
func TestWorkersAtOneURLWarned(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	src := "worker \"a\" {\n  url = \"" + mock.url + "\"\n}\n\nworker \"b\" {\n  url = \"" + mock.url + "\"\n}\n"
	if err := os.WriteFile(policy, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	want := policy + ":5:1: warning: Two workers at one URL; Worker \"b\" (here) and worker \"a\" (" + policy + ":1:1) both have url \"" + mock.url +
		"\": one engine counted as two workers, with two capacities and two bookings. Remove one, or give each its engine's URL."
	code, out, errOut := routerRun(t, "validate", policy)
	if code != 0 || !hasLinePrefix(errOut, want) || !strings.Contains(out, "worker      a ") || !strings.Contains(out, "worker      b ") {
		t.Errorf("validate: exit %d, stdout\n%s\nstderr\n%s\nwant exit 0, both workers, and a line starting\n%s", code, out, errOut, want)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	waitMetrics(t, e2eClient(t), router, time.Minute, "both workers ready", allReady("a", "b"))
	if !hasLinePrefix(router.stderr.String(), want) {
		t.Errorf("serve's stderr\n%s\nlacks a line starting\n%s", router.stderr.String(), want)
	}
}

// TestWorkersAtOneURLAcrossFilesWarned: a workers file's worker at the
// url of a policy file's worker (one engine in both files: counted
// twice) is warned about at start, at the workers file's block, naming
// the policy file's block and where it is; `router serve` still serves
// with both workers ready. Before, each file was checked alone.
func TestWorkersAtOneURLAcrossFilesWarned(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	dir := t.TempDir()
	policy, workersFile := filepath.Join(dir, "policy.hcl"), filepath.Join(dir, "workers.hcl")
	if err := os.WriteFile(policy, []byte("worker \"a\" {\n  url = \""+mock.url+"\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(workersFile, []byte("# the same engine\nworker \"c\" {\n  url = \""+mock.url+"/v1\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := workersFile + ":2:1: warning: Two workers at one URL; Worker \"c\" (here) and worker \"a\" (" + policy + ":1:1) both have url \"" + mock.url +
		"\": one engine counted as two workers, with two capacities and two bookings. Remove one, or give each its engine's URL."
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile)
	waitMetrics(t, e2eClient(t), router, time.Minute, "both workers ready", allReady("a", "c"))
	if !hasLinePrefix(router.stderr.String(), want) {
		t.Errorf("serve's stderr\n%s\nlacks a line starting\n%s", router.stderr.String(), want)
	}
}

// TestValidateWorkersFile: `router validate --workers-file` loads the
// workers file beside the policy file as serve does: its workers counted,
// a worker at a policy-file worker's url warned about at its block, and
// a workers file with an error exits 1 with the error at file:line:col.
func TestValidateWorkersFile(t *testing.T) {
	policy := writeFile(t, "policy.hcl", "worker \"a\" {\n  url = \"http://127.0.0.1:8001\"\n}\n")
	workersFile := writeFile(t, "workers.hcl", "worker \"b\" {\n  url = \"http://127.0.0.1:8002\"\n}\n\nworker \"c\" {\n  url = \"http://127.0.0.1:8001/v1\"\n}\n")
	code, stdout, stderr := routerRun(t, "validate", policy, "--workers-file", workersFile)
	want := workersFile + ":5:1: warning: Two workers at one URL; Worker \"c\" (here) and worker \"a\" (" + policy + ":1:1) both have url \"http://127.0.0.1:8001\""
	if code != 0 || !strings.Contains(stdout, workersFile+": ok (2 workers)") || !hasLinePrefix(stderr, want) {
		t.Errorf("validate with a workers file: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 0, %q and a line starting %q", code, stdout, stderr, workersFile+": ok (2 workers)", want)
	}
	bad := writeFile(t, "bad-workers.hcl", "worker \"x\" {\n  url = \"127.0.0.1:8003\"\n}\n")
	code, stdout, stderr = routerRun(t, "validate", policy, "--workers-file", bad)
	if wantErr := bad + ":2:9: error: Invalid URL"; code != 1 || !hasLinePrefix(stderr, wantErr) || strings.Contains(stdout, "ok") {
		t.Errorf("validate with a bad workers file: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 and a line starting %q", code, stdout, stderr, wantErr)
	}
}
