package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestServeWarnsWithoutWorkers: `router serve` with a policy file that
// declares no worker, and no --workers-file or --pool-selector, starts
// but warns on stderr, naming the file and the three ways to give
// workers; what the warning says then holds (/readyz 503, a chat 404
// model_not_found). A policy with a worker block, or a --workers-file,
// starts without it.
func TestServeWarnsWithoutWorkers(t *testing.T) {
	const noWorkers = "policy \"p\" {\n  picker \"pick\" { type = \"round-robin\" }\n}\nworker_selection { aggregated = \"p\" }\n"
	policy := writeFile(t, "no-workers.hcl", noWorkers)
	base, stderr, stop := startServe(t, "--policy", policy)
	want := "[WARN]  router: no workers: " + policy + " declares no worker block and neither --workers-file nor --pool-selector is given"
	if got := stderr.String(); !strings.Contains(got, want) {
		t.Errorf("stderr lacks %q:\n%s", want, got)
	}
	for _, hint := range []string{`worker "NAME" { url = "http://HOST:PORT" }`, "--workers-file FILE", "--pool-selector SELECTOR --pool-port PORT"} {
		if !strings.Contains(stderr.String(), hint) {
			t.Errorf("the warning does not name %q:\n%s", hint, stderr.String())
		}
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d, want 503", resp.StatusCode)
	}
	resp, err = http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "model_not_found") {
		t.Errorf("chat = %d %s, want 404 model_not_found", resp.StatusCode, b)
	}
	stop()

	mw := startMockWorker(t, "m")
	withWorker := writeFile(t, "w.hcl", noWorkers+fmt.Sprintf("worker \"a\" {\n  url = %q\n  models = [\"m\"]\n}\n", mw))
	workersFile := writeFile(t, "workers.hcl", fmt.Sprintf("worker \"a\" {\n  url = %q\n  models = [\"m\"]\n}\n", mw))
	for _, args := range [][]string{{"--policy", withWorker}, {"--policy", policy, "--workers-file", workersFile}} {
		_, stderr, stop := startServe(t, args...)
		stop()
		if strings.Contains(stderr.String(), "no workers") {
			t.Errorf("%v: warned of no workers:\n%s", args, stderr.String())
		}
	}
}
