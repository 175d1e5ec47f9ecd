package hosted

import "github.com/switchyard-router/switchyard/shared"

// WorkerInputView is what a hosted picker sees of one request's candidate
// set: the worker ids in strictly ascending order, the set's key, and, when
// the policy declares ACTIVE_REQUESTS, an accessor for each worker's
// in-flight request count. Row i is worker ids[i].
//
// A view is meant to be built per request as a stack value with
// NewWorkerInputView and passed by pointer to Select; nothing allocates
// unless Candidates is called. A view is not safe for concurrent use, and
// it must not outlive the ids slice and accessor it was built from.
type WorkerInputView struct {
	ids       []shared.WorkerID
	key       uint64
	active    func(row int) int64
	blockSize int
	cands     *shared.Candidates // built by Candidates on first use
}

// NewWorkerInputView returns a view over ids, which must be strictly
// ascending (see CheckAscending) and which the view aliases, not copies.
//
// key identifies the candidate set: the router computes it once per
// partition (model and role) and membership change, e.g. with
// CandidateSetKey. Zero means unknown; pickers that need a key then hash the
// ids themselves (see SetKey). active returns the ACTIVE_REQUESTS count of
// row, for rows in [0, len(ids)); it may be nil when the picker does not
// declare ACTIVE_REQUESTS. blockSize is the router's tokens per KV block and
// must be > 0.
func NewWorkerInputView(ids []shared.WorkerID, key uint64, active func(row int) int64, blockSize int) WorkerInputView {
	return WorkerInputView{ids: ids, key: key, active: active, blockSize: blockSize}
}

// Len is the number of candidate rows.
func (v *WorkerInputView) Len() int { return len(v.ids) }

// IsEmpty reports whether the view has no candidate.
func (v *WorkerInputView) IsEmpty() bool { return len(v.ids) == 0 }

// ID returns the worker id of row, which must be in [0, Len()).
func (v *WorkerInputView) ID(row int) shared.WorkerID { return v.ids[row] }

// IDs returns the ascending worker ids. The slice is the view's own; callers
// must not modify it.
func (v *WorkerInputView) IDs() []shared.WorkerID { return v.ids }

// BlockSize is the router's tokens per KV block.
func (v *WorkerInputView) BlockSize() int { return v.blockSize }

// HasActiveRequests reports whether the view carries an ACTIVE_REQUESTS
// accessor.
func (v *WorkerInputView) HasActiveRequests() bool { return v.active != nil }

// ActiveRequests returns the in-flight request count of row. It fails with a
// *shared.RowOutOfRangeError when row is outside [0, Len()), and with
// ErrNoActiveRequests when the view has no accessor.
func (v *WorkerInputView) ActiveRequests(row int) (int64, error) {
	if uint(row) >= uint(len(v.ids)) {
		return 0, &shared.RowOutOfRangeError{Row: row, Count: len(v.ids)}
	}
	if v.active == nil {
		return 0, ErrNoActiveRequests
	}
	return v.active(row), nil
}

// ActiveRequestsFunc returns the raw accessor (nil when absent) for pickers
// that scan every row and have already checked Len: calling it skips the
// per-row checks of ActiveRequests. Rows outside [0, Len()) are the
// caller's bug.
func (v *WorkerInputView) ActiveRequestsFunc() func(row int) int64 { return v.active }

// SetKey returns the key of the candidate set: the one given to
// NewWorkerInputView, or, when that was zero, CandidateSetKey("", "", ids),
// computed once and remembered in the view. The result is never zero.
func (v *WorkerInputView) SetKey() uint64 {
	if v.key == 0 {
		v.key = CandidateSetKey("", "", v.ids)
	}
	return v.key
}

// Candidates returns the view as full candidate rows: IDs (aliasing the
// view's ids) and, when the view has an accessor, an ActiveRequests column
// read once per row. It is built on first use and cached, so every call
// returns the same pointer; this is the one method of the view that
// allocates. Callers must not modify the columns.
func (v *WorkerInputView) Candidates() *shared.Candidates {
	if v.cands != nil {
		return v.cands
	}
	c := &shared.Candidates{IDs: v.ids}
	if v.active != nil {
		c.ActiveRequests = make([]int64, len(v.ids))
		for i := range c.ActiveRequests {
			c.ActiveRequests[i] = v.active(i)
		}
	}
	v.cands = c
	return c
}
