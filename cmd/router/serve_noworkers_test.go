package main

import (
	"bufio"
	"context"
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

// TestEPPWarnsWithoutWorkers: `router epp` warns of no workers on stderr
// as serve does (the same noWorkersWarning), once started; with a
// --workers-file it does not.
func TestEPPWarnsWithoutWorkers(t *testing.T) {
	const noWorkers = "policy \"p\" {\n  picker \"pick\" { type = \"round-robin\" }\n}\nworker_selection { aggregated = \"p\" }\n"
	policy := writeFile(t, "no-workers.hcl", noWorkers)
	workersFile := writeFile(t, "workers.hcl", fmt.Sprintf("worker \"a\" {\n  url = %q\n  models = [\"m\"]\n}\n", startMockWorker(t, "m")))
	want := "[WARN]  router: no workers: " + policy + " declares no worker block and neither --workers-file nor --pool-selector is given"
	for _, tt := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--policy", policy}, true},
		{[]string{"--policy", policy, "--workers-file", workersFile}, false},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		stderr := &serveStderr{}
		exit := make(chan int, 1)
		go func() {
			exit <- runContext(ctx, append([]string{"epp", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--drain-timeout", "5s"}, tt.args...), pw, stderr)
			_ = pw.Close()
		}()
		// Started: the gRPC listening line, printed once the daemon runs.
		sc := bufio.NewScanner(pr)
		started := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "router epp listening on grpc://") {
				started = true
				break
			}
		}
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		cancel()
		if code := <-exit; code != 0 || !started {
			t.Fatalf("%v: exit %d, started %v; stderr:\n%s", tt.args, code, started, stderr.String())
		}
		if got := strings.Contains(stderr.String(), want); got != tt.warn {
			t.Errorf("%v: warned %v, want %v; stderr:\n%s", tt.args, got, tt.warn, stderr.String())
		}
		for _, hint := range []string{"--workers-file FILE", "--pool-selector SELECTOR --pool-port PORT"} {
			if tt.warn && !strings.Contains(stderr.String(), hint) {
				t.Errorf("the warning does not name %q:\n%s", hint, stderr.String())
			}
		}
	}
}
