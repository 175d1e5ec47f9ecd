package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// TestReplayRoutesByNameWithAPlugin: a plugin picker that declares LABELS
// and takes a list(string) parameter from the policy file routes by
// worker name in router replay: every request goes to sim-2, named in
// `prefer`, with no fallback (the plugin fails a task whose row ids are
// not WorkerIDOf their names, which --fail-on-fallback would turn into
// exit 1).
func TestReplayRoutesByNameWithAPlugin(t *testing.T) {
	bin := testkit.BuildNamed(t, "../../internal/pluginclient/testdata/labels", "labels")
	file := writeFile(t, "names.hcl", fmt.Sprintf(`plugin "names" {
  command = %q
}

policy "p" {
  picker "pick" {
    type   = "prefer-name"
    prefer = ["sim-9", "sim-2", "sim-0"]
  }
}

worker_selection {
  aggregated = "p"
}
`, bin))
	rep := filepath.Join(t.TempDir(), "rep.json")
	code, _, errOut := routerRun(t, "replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
		"--limit", "40", "--workers", "4", "--report", rep, "--fail-on-fallback")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Completed         int   `json:"completed"`
		RequestsPerWorker []int `json:"requests_per_worker"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Completed != 40 || !slices.Equal(r.RequestsPerWorker, []int{0, 0, 40, 0}) {
		t.Errorf("completed %d, requests per worker %v; want 40, all on sim-2: [0 0 40 0]", r.Completed, r.RequestsPerWorker)
	}
}
