package serve

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/internal/testkit"

	"github.com/switchyard-router/switchyard/router/live"
)

// TestDaemonPredictorLearnsFromAnswers serves a policy whose slo filter
// declares LATENCY through `router serve`'s face to two mock engines: the
// predictor learns from the streamed answers only (a non-streamed one's
// first byte is its whole answer), and /metrics exports its accuracy: one
// TTFT comparison per streamed request after the first and finite
// relative errors.
func TestDaemonPredictorLearnsFromAnswers(t *testing.T) {
	a, b := newMock(t, "", 50), newMock(t, "", 50)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf(`policy "slo" {
  filter "headroom" { type = "slo" }
  scorer "cost" { type = "kv-affinity" }
  picker "pick" { type = "min-cost" }
}

worker_selection { aggregated = "slo" }

worker "a" {
  url    = %q
  models = ["m"]
  labels = { "switchyard.io/class" = "h100" }
}
worker "b" {
  url    = %q
  models = ["m"]
  labels = { "switchyard.io/class" = "h100" }
}
`, a.URL, b.URL))
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy, Registry: reg})
	rd.waitWorkers(t, "a", "b")
	const n = 30
	for i := range n {
		req, err := http.NewRequest(http.MethodPost, rd.base+"/v1/chat/completions",
			strings.NewReader(chatBody("m", i%2 == 0, fmt.Sprintf("tell me about %d", i))))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, out)
		}
	}
	// Only the 15 streamed answers are timed (a whole answer's first byte
	// is no first token: admission.Untimed); the first of them had
	// nothing to be predicted from.
	if got := testkit.MetricValue(t, reg, "switchyard_predictor_comparisons_total", "target", "ttft"); got != n/2-1 {
		t.Errorf("TTFT comparisons %v, want %d (every streamed request after the first)", got, n/2-1)
	}
	if got := testkit.MetricValue(t, reg, "switchyard_predictor_classes"); got != 1 {
		t.Errorf("classes %v, want 1 (both workers labelled h100)", got)
	}
	med := testkit.MetricValue(t, reg, "switchyard_predictor_relative_error", "target", "ttft", "quantile", "0.5")
	if math.IsNaN(med) || med < 0 {
		t.Errorf("TTFT median relative error %v, want a finite fraction", med)
	}
	t.Logf("TTFT median relative error after %d answers: %.3f", n, med)
}
