package builtin

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

func TestRoundRobinSequence(t *testing.T) {
	r := NewRoundRobin()
	ids := idsN(3)
	var got []int
	for range 7 {
		row, err := pickHosted(r, ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, row)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 0, 1, 2, 0}, got); diff != "" {
		t.Errorf("hosted sequence (-want +got):\n%s", diff)
	}

	// The full path keeps its own cursor per (model, role, ids).
	c := &shared.Candidates{IDs: ids}
	reqA := &shared.Request{Model: "a", Role: shared.RolePrefill}
	reqB := &shared.Request{Model: "a", Role: shared.RoleDecode}
	got = got[:0]
	for _, req := range []*shared.Request{reqA, reqA, reqB, reqA, reqB, reqB, reqA} {
		row, err := r.Pick(context.Background(), req, c)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, row)
	}
	if diff := cmp.Diff([]int{0, 1, 0, 2, 1, 2, 0}, got); diff != "" {
		t.Errorf("per-role sequence (-want +got):\n%s", diff)
	}
}

// TestRoundRobinExactShares: concurrent picks split exactly evenly, and a
// new candidate set (a worker removed) gets a fresh cursor.
func TestRoundRobinExactShares(t *testing.T) {
	r := NewRoundRobin()
	run := func(ids []shared.WorkerID, picks int) map[shared.WorkerID]int {
		const goroutines = 8
		var mu sync.Mutex
		counts := map[shared.WorkerID]int{}
		var wg sync.WaitGroup
		for g := range goroutines {
			share := picks / goroutines
			if g < picks%goroutines {
				share++
			}
			wg.Go(func() {
				local := map[shared.WorkerID]int{}
				for range share {
					row, err := pickHosted(r, ids, nil)
					if err != nil {
						t.Error(err)
						return
					}
					local[ids[row]]++
				}
				mu.Lock()
				for id, n := range local {
					counts[id] += n
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		return counts
	}
	all := []shared.WorkerID{1, 2, 3, 4}
	if diff := cmp.Diff(map[shared.WorkerID]int{1: 1000, 2: 1000, 3: 1000, 4: 1000}, run(all, 4000)); diff != "" {
		t.Errorf("4 workers, 4000 picks (-want +got):\n%s", diff)
	}
	three := []shared.WorkerID{1, 2, 4}
	if diff := cmp.Diff(map[shared.WorkerID]int{1: 500, 2: 500, 4: 500}, run(three, 1500)); diff != "" {
		t.Errorf("3 workers, 1500 picks (-want +got):\n%s", diff)
	}
	// Back to the first set: its cursor resumed where it stopped (4000 % 4 == 0).
	if row, _ := pickHosted(r, all, nil); row != 0 {
		t.Errorf("first set resumed at row %d, want 0", row)
	}
}

// TestRoundRobinSetKeys: sets with different keys never share a cursor,
// even when they alternate and when the table of sets overflows.
func TestRoundRobinSetKeys(t *testing.T) {
	r := NewRoundRobin()
	ids := idsN(4)
	pick := func(key uint64) int {
		v := hosted.NewWorkerInputView(ids, key, nil, 16)
		row, err := hosted.Select(r, &v)
		if err != nil {
			t.Fatal(err)
		}
		return row
	}
	var got []int
	for _, k := range []uint64{7, 8, 7, 8, 7, 9} {
		got = append(got, pick(k))
	}
	if diff := cmp.Diff([]int{0, 0, 1, 1, 2, 0}, got); diff != "" {
		t.Errorf("alternating sets (-want +got):\n%s", diff)
	}
	for k := range uint64(2 * maxRoundRobinSets) {
		if row := pick(1000 + k); row != 0 {
			t.Fatalf("fresh set %d started at row %d, want 0", k, row)
		}
	}
	r.mu.RLock()
	n := len(r.sets)
	r.mu.RUnlock()
	if n > maxRoundRobinSets {
		t.Errorf("%d cursors kept, want <= %d", n, maxRoundRobinSets)
	}
}

func TestRoundRobinEmpty(t *testing.T) {
	r := NewRoundRobin()
	if _, err := r.Pick(context.Background(), &shared.Request{}, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Pick on empty: %v, want ErrNoWorkers", err)
	}
	var v hosted.WorkerInputView
	if _, err := r.PickHosted(&v); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("PickHosted on empty: %v, want ErrNoWorkers", err)
	}
}
