package shared

import (
	"context"
	"sync"
	"testing"
	"time"
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
// a fast task sent meanwhile is answered without waiting for it.
func TestSlowLoneTaskDoesNotHoldUpOthers(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "slow", "sleepy", Params{"sleep": 300 * time.Millisecond})
	configure(t, rc, "p", "lowest", nil)
	c := &Candidates{IDs: []WorkerID{1}, ActiveRequests: []int64{0}}
	slow := &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}}
	fast := &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}}
	if _, err := rc.Decide(context.Background(), slow); err != nil { // shows the plugin lone tasks can be slow
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := rc.Decide(context.Background(), slow)
		errc <- err
	}()
	for rc.sentTasks.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the slow task is running in the plugin
	start := time.Now()
	if got, err := rc.Decide(context.Background(), fast); err != nil || got.Picked != 0 {
		t.Fatalf("fast task: %+v, %v", got, err)
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Errorf("a fast task waited %v behind a slow one", d)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
