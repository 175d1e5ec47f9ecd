package supervisor

import (
	"context"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestBreakerOpenReportsDegraded: a plugin whose every call fails stays
// up (its process answers), but once its breaker opens BreakerOpen says
// its policies decide by fallback; a healthy plugin and an unknown name
// report false.
func TestBreakerOpenReportsDegraded(t *testing.T) {
	h, _ := faultHost(t, Options{})
	b := block("broken", "fail")
	b.Env["SY_FAIL"] = "error"
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if h.BreakerOpen("broken") || h.BreakerOpen("nonesuch") {
		t.Fatal("BreakerOpen before any call failed")
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	for call := 1; call <= DefaultBreakerConsecutiveFailures; call++ {
		if err := s.Score(context.Background(), request, candidates(), make([]float64, 4)); err == nil {
			t.Fatalf("call %d succeeded; the plugin fails every call", call)
		}
		if open := h.BreakerOpen("broken"); open != (call == DefaultBreakerConsecutiveFailures) {
			t.Errorf("after %d failed calls BreakerOpen = %v", call, open)
		}
	}
	if st := h.Status("broken"); st != StatusUp {
		t.Errorf("status %v, want up: the process still answers", st)
	}
}
