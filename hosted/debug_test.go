//go:build switchyard_debug

package hosted

import (
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestSelectChecksOrderInDebug runs only with -tags switchyard_debug.
func TestSelectChecksOrderInDebug(t *testing.T) {
	p := &fakePicker{pick: func(*WorkerInputView) (int, error) { return 0, nil }}
	v := NewWorkerInputView([]shared.WorkerID{1, 3, 2}, 0, nil, 16)
	if _, err := Select(p, &v); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("Select over unsorted ids: error = %v, want ErrUnsorted", err)
	}
	v = NewWorkerInputView([]shared.WorkerID{1, 2, 3}, 0, nil, 16)
	if _, err := Select(p, &v); err != nil {
		t.Fatalf("Select over sorted ids: %v", err)
	}
}
