package shared

import (
	"context"
	"sync"
	"testing"
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
