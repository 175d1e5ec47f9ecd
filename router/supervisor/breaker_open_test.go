package supervisor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestLateWaveCountsOnceForTheBreaker: calls that were in flight together
// and all came back late (one batched message, one slow spell) count as
// one failure for the circuit breaker, so a burst of concurrent timeouts
// does not open it; timeouts of calls made one after another still do.
func TestLateWaveCountsOnceForTheBreaker(t *testing.T) {
	h, _ := faultHost(t, Options{Health: HealthPolicy{StallTimeout: -1}})
	b := block("slow", "slow")
	b.CallTimeout = 50 * time.Millisecond
	b.Env["SY_SLOW"] = (3 * b.CallTimeout).String()
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", nil).(shared.Scorer)
	const wave = 4 * DefaultBreakerConsecutiveFailures
	var late atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range wave {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := s.Score(context.Background(), request, candidates(), make([]float64, 4)); errors.Is(err, ErrCallTimeout) {
				late.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := late.Load(); n < DefaultBreakerConsecutiveFailures {
		t.Fatalf("only %d of %d concurrent calls timed out: the test proves nothing", n, wave)
	}
	if h.BreakerOpen("slow") {
		t.Fatalf("%d concurrent late calls opened the breaker; they are one late wave", late.Load())
	}
	// One after another, each late call is a failure of its own.
	for call := 1; !h.BreakerOpen("slow"); call++ {
		if call > 100 {
			t.Fatal("100 late calls in a row did not open the breaker")
		}
		_ = s.Score(context.Background(), request, candidates(), make([]float64, 4))
	}
}
