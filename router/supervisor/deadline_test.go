package supervisor

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestDeclaredP99Warning: a plugin declaring a Decide p99
// (expected_decide_p99_nanos) above its block's call_timeout gets a warning
// at its start naming both, and the process info carries the declaration;
// one declaring a p99 within call_timeout gets none.
func TestDeclaredP99Warning(t *testing.T) {
	for _, tc := range []struct {
		p99     string
		timeout time.Duration
		warn    bool
	}{
		{"50ms", time.Millisecond, true},
		{"50ms", 100 * time.Millisecond, false},
		{"", time.Millisecond, false},
	} {
		var log syncBuf
		h := NewHost(Options{Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: io.MultiWriter(&log, testOutput())})})
		b := block("declared", "")
		b.Env["SY_EXPECTED_P99"] = tc.p99
		b.CallTimeout = tc.timeout
		if _, err := h.Start(context.Background(), b); err != nil {
			t.Fatalf("Start: %v", err)
		}
		info, err := h.Process("declared")
		if err != nil {
			t.Fatal(err)
		}
		want, _ := time.ParseDuration(tc.p99)
		if info.ExpectedDecideP99 != want {
			t.Errorf("p99 %q: ProcessInfo.ExpectedDecideP99 %v, want %v", tc.p99, info.ExpectedDecideP99, want)
		}
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		got := log.String()
		warned := strings.Contains(got, "the plugin declares a Decide p99 above its call_timeout") &&
			strings.Contains(got, "expected_decide_p99=50ms") && strings.Contains(got, "call_timeout=1ms")
		if warned != tc.warn {
			t.Errorf("p99 %q, call_timeout %v: warned %v, want %v; log:\n%s", tc.p99, tc.timeout, warned, tc.warn, got)
		}
	}
	assertNoLeftovers(t)
}
