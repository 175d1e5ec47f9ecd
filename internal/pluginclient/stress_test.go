package pluginclient

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// TestDecideStress keeps 64 callers busy: it caught a batch buffer that the
// sender and the callers shared.
func TestDecideStress(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "s", "load", nil)
	configure(t, rc, "p", "lowest", nil)
	req, c := benchRequest(), benchCandidates()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if _, err := rc.Decide(context.Background(), &Task{Request: req, Candidates: c, Stages: []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestSlowLoneTaskDoesNotHoldUpOthers: the plugin runs a lone task on the
// stream's receiving goroutine only while lone tasks are short; once one
// has run long, the next lone task runs while the stream is still read, so
// a fast task sent meanwhile is answered while the held one still waits
// for its gate (released only after the fast answer).
func TestSlowLoneTaskDoesNotHoldUpOthers(t *testing.T) {
	rc := newTestClient(t)
	gate, release := newGate(t)
	configure(t, rc, "slow", "sleepy", shared.Params{"sleep": 300 * time.Millisecond})
	configure(t, rc, "held", "gated", shared.Params{"gate": gate})
	configure(t, rc, "p", "lowest", nil)
	c := &shared.Candidates{IDs: []shared.WorkerID{1}, ActiveRequests: []int64{0}}
	task := func(instance string) *Task {
		return &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: instance}}}
	}
	if _, err := rc.Decide(context.Background(), task("slow")); err != nil { // shows the plugin lone tasks can be slow
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := rc.Decide(context.Background(), task("held"))
		errc <- err
	}()
	for rc.sentTasks.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	fast := make(chan error, 1)
	go func() {
		got, err := rc.Decide(context.Background(), task("p"))
		if err == nil && got.Picked != 0 {
			err = fmt.Errorf("picked %d, want 0", got.Picked)
		}
		fast <- err
	}()
	select {
	case err := <-fast:
		if err != nil {
			t.Fatalf("fast task: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the fast task is still waiting behind the held one after a minute")
	}
	release()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
