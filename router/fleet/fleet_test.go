package fleet

import (
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/shared"
)

func add(t *testing.T, f *Fleet, id shared.WorkerID, role shared.Role) *Worker {
	t.Helper()
	w, err := f.AddWorker(Spec{ID: id, Role: role, TotalKVBlocks: 100})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestPartitionsSortedByRole(t *testing.T) {
	f := New()
	for _, id := range []shared.WorkerID{9, 3, 7, 1} {
		add(t, f, id, shared.RoleAggregated)
	}
	add(t, f, 5, shared.RolePrefill)
	s := f.Snapshot()
	if diff := cmp.Diff([]shared.WorkerID{1, 3, 7, 9}, s.Partition(shared.RoleAggregated).IDs); diff != "" {
		t.Fatalf("aggregated ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]shared.WorkerID{5}, s.Partition(shared.RolePrefill).IDs); diff != "" {
		t.Fatalf("prefill ids (-want +got):\n%s", diff)
	}
	if s.Partition(shared.RoleDecode) != nil {
		t.Fatal("decode partition should be nil")
	}
	if s.Partition(shared.RoleAggregated).Key == s.Partition(shared.RolePrefill).Key {
		t.Fatal("two roles share a candidate-set key")
	}
	before := s.Partition(shared.RoleAggregated).Key
	if err := f.RemoveWorker(3, 0); err != nil {
		t.Fatal(err)
	}
	after := f.Snapshot().Partition(shared.RoleAggregated)
	if after.Key == before {
		t.Fatal("membership change kept the candidate-set key")
	}
	if diff := cmp.Diff([]shared.WorkerID{1, 7, 9}, after.IDs); diff != "" {
		t.Fatalf("after removal (-want +got):\n%s", diff)
	}
	if err := f.RemoveWorker(3, 0); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("second removal: err = %v, want ErrUnknownWorker", err)
	}
}

func TestBookingReleasedExactlyOnce(t *testing.T) {
	f := New()
	w := add(t, f, 1, shared.RoleAggregated)
	const n = 200
	bookings := make([]*Booking, n)
	for i := range bookings {
		bookings[i] = Book(w, 100, 4)
	}
	if got := w.Load(true); got.ActiveRequests != n || got.ActivePrefillTokens != 100*n || got.ActiveDecodeBlocks != 4*n {
		t.Fatalf("after booking: %+v", got)
	}
	// Every booking is released by up to four racing paths (completion,
	// error, cancel, removal) and first-token by two; exactly one release
	// counts per booking.
	var wg sync.WaitGroup
	var released sync.Map
	for i, b := range bookings {
		for range 2 {
			wg.Go(b.PrefillDone)
		}
		for range 4 {
			wg.Go(func() {
				if b.Release() {
					if _, dup := released.LoadOrStore(i, true); dup {
						t.Errorf("booking %d released twice", i)
					}
				}
			})
		}
	}
	wg.Wait()
	if got := w.Load(true); got != (shared.Load{Available: true}) {
		t.Fatalf("after release: %+v, want all zero", got)
	}
}

func TestRejoinNeverGoesNegative(t *testing.T) {
	f := New()
	old := add(t, f, 1, shared.RoleAggregated)
	b := Book(old, 10, 1)
	if err := f.RemoveWorker(1, 0); err != nil {
		t.Fatal(err)
	}
	rejoined := add(t, f, 1, shared.RoleAggregated)
	if rejoined == old || rejoined.Generation <= old.Generation {
		t.Fatalf("rejoin must be a new generation: old %d new %d", old.Generation, rejoined.Generation)
	}
	b.Release() // the request that was in flight on the old generation ends
	if got := rejoined.ActiveRequests(); got != 0 {
		t.Fatalf("rejoined worker count = %d, want 0", got)
	}
	if got := old.ActiveRequests(); got != 0 {
		t.Fatalf("old generation count = %d, want 0", got)
	}
	if p := f.Snapshot().Partition(shared.RoleAggregated); p.Workers[0] != rejoined || p.ActiveAt(0) != 0 {
		t.Fatal("snapshot must hold the rejoined worker")
	}
}

func TestAddWorkerValidates(t *testing.T) {
	f := New()
	if _, err := f.AddWorker(Spec{ID: 1, Role: "both", TotalKVBlocks: 1}); err == nil {
		t.Error("want an error for an invalid role")
	}
	if _, err := f.AddWorker(Spec{ID: 1, Role: shared.RoleDecode, TotalKVBlocks: -1}); err == nil {
		t.Error("want an error for a negative capacity")
	}
	// Capacity 0 is unknown: the worker joins and is a candidate.
	w, err := f.AddWorker(Spec{ID: 2, Role: shared.RoleDecode})
	if err != nil {
		t.Fatalf("unknown capacity: %v", err)
	}
	p := f.Snapshot().Partition(shared.RoleDecode)
	if len(p.Workers) != 1 || p.Workers[0] != w || p.Infos[0].TotalKVBlocks != 0 {
		t.Errorf("unknown-capacity worker not a candidate with capacity 0: %+v", p.Infos)
	}
}

func TestEngineLoadMakesAvailable(t *testing.T) {
	f := New()
	w := add(t, f, 1, shared.RoleAggregated)
	if w.Load(false).Available {
		t.Fatal("no observation must read as unavailable, not idle")
	}
	w.SetEngineLoad(&EngineLoad{KVUsage: 0.5, HasKVUsage: true})
	if l := w.Load(false); !l.Available || l.KVUsage != 0.5 || !l.HasKVUsage {
		t.Fatalf("after report: %+v", l)
	}
}

// FillLoads overwrites every field of a reused column: a row whose engine
// has not reported keeps none of the last selection's engine figures.
func TestFillLoadsOverwritesTheColumn(t *testing.T) {
	f := New()
	reported, silent := add(t, f, 1, shared.RoleAggregated), add(t, f, 2, shared.RoleAggregated)
	reported.SetEngineLoad(&EngineLoad{KVUsage: 0.25, HasKVUsage: true, Waiting: 3, HasWaiting: true})
	var b Booking
	if BookOver(&b, silent, 100, 700, 9) == nil {
		t.Fatal("no booking")
	}
	stale := shared.Load{ActivePrefillTokens: 1, ActiveDecodeBlocks: 1, ActiveRequests: 1, Available: true, KVUsage: 0.9, HasKVUsage: true, Waiting: 8, HasWaiting: true}
	loads := []shared.Load{stale, stale, stale}
	FillLoads([]*Worker{reported, silent}, loads, false)
	want := []shared.Load{
		{Available: true, KVUsage: 0.25, HasKVUsage: true, Waiting: 3, HasWaiting: true},
		{ActivePrefillTokens: 700, ActiveDecodeBlocks: 9, ActiveRequests: 1},
		stale, // past the workers: untouched
	}
	if diff := cmp.Diff(want, loads); diff != "" {
		t.Fatalf("loads (-want +got):\n%s", diff)
	}
	for i, w := range []*Worker{reported, silent} {
		if got := w.Load(false); got != want[i] {
			t.Errorf("worker %d: Load = %+v, FillLoads wrote %+v", w.ID, got, want[i])
		}
	}
}

func TestAddWorkersAllOrNothing(t *testing.T) {
	f := New()
	ws, err := f.AddWorkers(
		Spec{ID: 3, Role: shared.RoleAggregated, TotalKVBlocks: 1},
		Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 1},
		Spec{ID: 2, Role: shared.RoleDecode, TotalKVBlocks: 1},
	)
	if err != nil || len(ws) != 3 {
		t.Fatalf("AddWorkers = %d workers, %v", len(ws), err)
	}
	if diff := cmp.Diff([]shared.WorkerID{1, 3}, f.Snapshot().Partition(shared.RoleAggregated).IDs); diff != "" {
		t.Fatalf("aggregated ids (-want +got):\n%s", diff)
	}
	if ws[0].Generation >= ws[1].Generation || ws[1].Generation >= ws[2].Generation {
		t.Fatalf("generations not increasing: %d %d %d", ws[0].Generation, ws[1].Generation, ws[2].Generation)
	}
	if _, err := f.AddWorkers(Spec{ID: 9, Role: shared.RoleDecode, TotalKVBlocks: 1}, Spec{ID: 10, Role: "x", TotalKVBlocks: 1}); err == nil {
		t.Fatal("an invalid spec was accepted")
	}
	if p := f.Snapshot().Partition(shared.RoleDecode); len(p.IDs) != 1 {
		t.Fatalf("a failed AddWorkers joined %v", p.IDs)
	}
}

func TestModelPartitions(t *testing.T) {
	f := New()
	if _, err := f.AddWorkers(
		Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 1, Models: []string{"llama", "qwen"}},
		Spec{ID: 2, Role: shared.RoleAggregated, TotalKVBlocks: 1, Models: []string{"llama"}},
		Spec{ID: 3, Role: shared.RoleDecode, TotalKVBlocks: 1, Models: []string{"qwen"}},
	); err != nil {
		t.Fatal(err)
	}
	s := f.Snapshot()
	if diff := cmp.Diff([]string{"llama", "qwen"}, s.Models()); diff != "" {
		t.Fatalf("models (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]shared.WorkerID{1, 2}, s.ModelPartition("llama", shared.RoleAggregated).IDs); diff != "" {
		t.Fatalf("llama (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]shared.WorkerID{1}, s.ModelPartition("qwen", shared.RoleAggregated).IDs); diff != "" {
		t.Fatalf("qwen (-want +got):\n%s", diff)
	}
	if s.ModelPartition("mistral", shared.RoleAggregated) != nil {
		t.Fatal("a model nobody serves has a partition")
	}
	if s.ModelPartition("llama", shared.RoleAggregated).Key == s.ModelPartition("qwen", shared.RoleAggregated).Key {
		t.Fatal("two models share a candidate-set key")
	}
	if s.ModelPartition("", shared.RoleAggregated) != s.Partition(shared.RoleAggregated) {
		t.Fatal(`model "" must be the role's whole partition`)
	}
}

// TestLeftClosesOnLeave: a worker's Left channel closes when it is
// removed, and when a join of its id and rank replaces it; not before.
func TestLeftClosesOnLeave(t *testing.T) {
	f := New()
	a, err := f.AddWorker(Spec{ID: 1, Role: shared.RoleAggregated})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := f.AddWorker(Spec{ID: 2, Role: shared.RoleAggregated})
	closed := func(w *Worker) bool {
		select {
		case <-w.Left():
			return true
		default:
			return false
		}
	}
	if closed(a) || closed(b) {
		t.Fatal("Left closed on join")
	}
	a2, _ := f.AddWorker(Spec{ID: 1, Role: shared.RoleAggregated})
	if !closed(a) || closed(a2) {
		t.Fatalf("replaced: old closed %v, new closed %v", closed(a), closed(a2))
	}
	if err := f.RemoveWorker(2, 0); err != nil {
		t.Fatal(err)
	}
	if !closed(b) || closed(a2) {
		t.Fatalf("removed: %v, other %v", closed(b), closed(a2))
	}
}
