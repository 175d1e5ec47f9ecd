//go:build linux

package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeE2ETokenize404IsNoFailure: the README's quick start, one mock
// engine started without --tokenizer (its /tokenize answers 404): chat,
// completions and chat requests through `router serve` are all answered,
// keyed by characters, and switchyard_tokenize_failures_total stays
// unset — the first 404 of each form starts the back-off and is not a
// failure, as the back-off's answers are not (it used to count 2). The
// two calls made (one per form, each 404) are timed; the third request,
// in the back-off, made none.
func TestServeE2ETokenize404IsNoFailure(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(policy, []byte(workerBlocks([]string{"a"}, map[string]string{"a": mock.url})), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "the worker ready", allReady("a"))
	for i, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatJSON(false, 4, "hello")},
		{"/v1/completions", `{"model":"mock","prompt":"hello there","max_tokens":4}`},
		{"/v1/chat/completions", chatJSON(false, 4, "hello again")},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, router.url+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d (%s): status %d", i, tc.path, resp.StatusCode)
		}
	}
	m := waitMetrics(t, c, router, time.Minute, "three requests counted", func(m map[string]float64) bool {
		return requestsCounted(m) == 3
	})
	for k, v := range m {
		if strings.HasPrefix(k, "switchyard_tokenize_failures_total") {
			t.Errorf("%s = %v, want no tokenizer failure (a 404 is the engine lacking /tokenize)", k, v)
		}
	}
	if got := m[`switchyard_tokenize_duration_seconds_count{model="mock"}`]; got != 2 {
		t.Errorf("tokenize calls timed: %v, want 2 (the first chat and the completion, each answered 404)", got)
	}
}
