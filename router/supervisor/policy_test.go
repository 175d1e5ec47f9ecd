package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
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

func TestHealthPolicyDefaults(t *testing.T) {
	want := HealthPolicy{ProbeInterval: 2 * time.Second, ProbeTimeout: 2 * time.Second, ProbeFailures: 5, StallTimeout: 30 * time.Second}
	if got := (HealthPolicy{}).withDefaults(); got != want {
		t.Errorf("zero policy: %+v, want %+v", got, want)
	}
	set := HealthPolicy{ProbeInterval: -1, ProbeTimeout: time.Second, ProbeFailures: 2, StallTimeout: -1}
	if got := set.withDefaults(); got != set {
		t.Errorf("%+v with defaults: %+v, want it unchanged (negative: off)", set, got)
	}
}

// TestStallRule: the stall rule on a plugin whose Decide stream never
// answered (the real-process cases, with answers, are in fault_test.go):
// the earliest unanswered call counts, and only once it is StallTimeout
// old does a timeout kill; a negative StallTimeout never kills.
func TestStallRule(t *testing.T) {
	newProc := func() *proc {
		p := &proc{rc: pluginclient.New(context.Background(), nil, pluginclient.Options{})} // pid 0: killGroup only records
		p.ctx, p.cancel = context.WithCancel(context.Background())
		t.Cleanup(p.cancel)
		return p
	}
	now := time.Now()
	off := &managed{health: HealthPolicy{StallTimeout: -1}}
	p := newProc()
	off.checkStall(p, now.Add(-time.Hour))
	if r, s := p.killReason.Load(), p.stallSince.Load(); r != nil || s != nil {
		t.Errorf("StallTimeout -1: kill reason %v, stall since %v; want neither", r, s)
	}

	m := &managed{health: HealthPolicy{StallTimeout: time.Minute}}
	p = newProc()
	steps := []struct {
		sent  time.Time
		since time.Time // the stall's start after the call
		kill  bool
	}{
		{sent: now.Add(-10 * time.Second), since: now.Add(-10 * time.Second)},
		{sent: now.Add(-time.Second), since: now.Add(-10 * time.Second)},      // the earlier call still counts
		{sent: now.Add(-20 * time.Second), since: now.Add(-20 * time.Second)}, // sent earlier, timed out later
		{sent: now.Add(-2 * time.Minute), since: now.Add(-2 * time.Minute), kill: true},
	}
	for i, st := range steps {
		m.checkStall(p, st.sent)
		if s := p.stallSince.Load(); s == nil || !s.Equal(st.since) {
			t.Errorf("call %d: stall since %v, want %v", i, s, st.since)
		}
		r := p.killReason.Load()
		if (r != nil) != st.kill {
			t.Fatalf("call %d: kill reason %v, want a kill: %v", i, r, st.kill)
		}
		if r != nil && *r != "no answer to any decision call for 1m0s" {
			t.Errorf("kill reason %q", *r)
		}
	}
}
