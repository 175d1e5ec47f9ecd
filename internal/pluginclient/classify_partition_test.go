package pluginclient

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// The plugin makes one classifier per (model, role) partition of an
// instance, on the partition's first request, with the partition's
// PartitionContext.Model and Role; later requests of the partition reach
// the same classifier, each partition keeps its own worker list, and a
// classifier never sees another partition's requests.
func TestRemoteClassifyPartitions(t *testing.T) {
	rc, f := newClassifierClient(t)
	ctx := context.Background()
	type part struct {
		model string
		role  shared.Role
	}
	// Each partition's list has as many workers as its position, so the
	// answer's priority (the workers the classifier sees) tells whose it is.
	order := []part{{"m0", shared.RoleDecode}, {"m1", shared.RoleDecode}, {"m0", shared.RolePrefill}, {"", shared.RoleDecode}}
	for round := range 2 {
		for i, p := range order {
			ws := make([]shared.WorkerInfo, i+1)
			for k := range ws {
				ws[k].ID = shared.WorkerID(10*i + k)
			}
			cl, err := rc.Classify(ctx, ClassifyCall{Instance: "c", Request: &shared.Request{ID: "r", Model: p.model, Role: p.role},
				WorkersVersion: 1, SendWorkers: round == 0, Workers: ws, Now: time.Unix(0, 42e9)})
			if err != nil {
				t.Fatal(err)
			}
			if cl.Priority != i+1 || cl.PolicyClass != string(p.role) {
				t.Errorf("round %d, %+v: %+v, want priority %d (its own workers) and class %s", round, p, cl, i+1, p.role)
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.parts) != len(order) {
		t.Fatalf("%d classifiers made, want %d (one per partition)", len(f.parts), len(order))
	}
	for i, p := range order {
		if pc := f.parts[i].pc; pc.Model != p.model || pc.Role != p.role || pc.BlockSize != 16 {
			t.Errorf("classifier %d: model %q role %q block size %d, want %+v and 16", i, pc.Model, pc.Role, pc.BlockSize, p)
		}
	}
}
