package supervisor

import (
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
)

func TestRestartFromConfig(t *testing.T) {
	got := restartFromConfig(config.DefaultRestartPolicy())
	want := RestartPolicy{MaxRestarts: 5, Window: time.Minute, BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second}
	if got != want {
		t.Fatalf("default block: %+v, want %+v", got, want)
	}
	if got := restartFromConfig(config.RestartPolicy{MaxRestarts: 0, Window: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Second}); got.MaxRestarts >= 0 {
		t.Fatalf("max_restarts = 0 must mean never restart, got %+v", got)
	}
}

// TestStatusString: /readyz reports each plugin by Status.String, one
// lowercase word per status.
func TestStatusString(t *testing.T) {
	want := map[Status]string{
		StatusUnknown:    "unknown",
		StatusUp:         "up",
		StatusRestarting: "restarting",
		StatusBackoff:    "backoff",
		StatusFailed:     "failed",
		StatusStopped:    "stopped",
	}
	for s, w := range want {
		if got := s.String(); got != w {
			t.Errorf("Status(%d).String() = %q, want %q", s, got, w)
		}
	}
	if got := Status(99).String(); got != "unknown" {
		t.Errorf("Status(99).String() = %q, want unknown", got)
	}
}
