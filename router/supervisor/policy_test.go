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
