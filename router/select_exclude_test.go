package router

import (
	"context"
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestSelectExclude is serve's decode-hop retry: Select with Exclude never
// picks an excluded worker, books the one it picks, and with every
// candidate excluded fails with ErrAllExcluded (an ErrNoWorkers) and books
// nothing.
func TestSelectExclude(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 3)
	ctx := context.Background()
	hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	first, err := r.Select(ctx, request(32, hashes...))
	if err != nil {
		t.Fatal(err)
	}
	failed := first.Worker.ID
	first.Booking.Release()
	// The prefix index now holds the prompt on failed: the KV-aware policy
	// would pick it again.
	again, err := r.Select(ctx, request(32, hashes...))
	if err != nil {
		t.Fatal(err)
	}
	if again.Worker.ID != failed {
		t.Fatalf("without Exclude the selection went to %d; the test needs the policy to pick %d again", again.Worker.ID, failed)
	}
	again.Booking.Release()
	other, err := r.Select(ctx, request(32, hashes...), Exclude(failed))
	if err != nil {
		t.Fatal(err)
	}
	if other.Worker.ID == failed {
		t.Fatalf("excluding %d selected it", failed)
	}
	if n := other.Worker.ActiveRequests(); n != 1 {
		t.Errorf("selected worker %d: %d active, want 1 (booked)", other.Worker.ID, n)
	}
	other.Booking.Release()
	_, err = r.Select(ctx, request(32, hashes...), Exclude(1, 2), Exclude(3))
	if !errors.Is(err, ErrAllExcluded) || !errors.Is(err, shared.ErrNoWorkers) {
		t.Fatalf("every worker excluded: err = %v, want ErrAllExcluded (an ErrNoWorkers)", err)
	}
	for _, w := range r.Workers("", shared.RoleAggregated) {
		if n := w.ActiveRequests(); n != 0 {
			t.Errorf("worker %d: %d active requests after every booking was released", w.ID, n)
		}
	}
}
