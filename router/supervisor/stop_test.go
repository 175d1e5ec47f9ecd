package supervisor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStoppedAndCheckHealth: Options.Stopped reports a plugin that exits
// when asked to as Exited, one that lingers as killed after StopGrace, and
// CheckHealth answers for a running plugin only.
func TestStoppedAndCheckHealth(t *testing.T) {
	var (
		mu      sync.Mutex
		reports = map[string]StopReport{}
	)
	const grace = 1900 * time.Millisecond // generous, under go-plugin's own 2 s
	h := NewHost(Options{Logger: testLogger(), StopGrace: grace, Stopped: func(r StopReport) {
		mu.Lock()
		reports[r.Plugin] = r
		mu.Unlock()
	}})
	t.Cleanup(func() { assertNoLeftovers(t) })
	ctx := context.Background()
	for _, name := range []string{"good", "linger"} {
		if _, err := h.Start(ctx, block(name, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"good", "linger"} {
		if err := h.CheckHealth(ctx, name); err != nil {
			t.Errorf("CheckHealth(%s): %v", name, err)
		}
	}
	if err := h.CheckHealth(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `plugin "nope" is not running`) {
		t.Errorf("CheckHealth(nope): %v", err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	good, linger := reports["good"], reports["linger"]
	if !good.WasRunning || !good.Exited || good.PID <= 0 || good.After <= 0 || good.After > grace {
		t.Errorf("good plugin: %+v, want running, exited within %v", good, grace)
	}
	if !linger.WasRunning || linger.Exited || linger.After != grace {
		t.Errorf("lingering plugin: %+v, want running, not exited, After %v", linger, grace)
	}
	if err := h.CheckHealth(ctx, "good"); err == nil {
		t.Error("CheckHealth after Shutdown: no error")
	}
}
