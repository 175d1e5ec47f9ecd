package hosted

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// HostedWorkerPicker is a shared.Picker that can also pick straight from a
// WorkerInputView, without the router building Candidates columns. Built-in
// pickers that read at most ACTIVE_REQUESTS implement it; out-of-process
// plugin pickers never do.
//
// PickHosted returns a row in [0, v.Len()). It is called only with a
// non-empty view whose block size is positive and, when the picker declares
// ACTIVE_REQUESTS, whose accessor is set (Select checks all three). Like
// io.Writer with its buffer, PickHosted must not retain v, or anything
// reached through it, after it returns: the view lives on the caller's stack.
type HostedWorkerPicker interface {
	shared.Picker
	PickHosted(v *WorkerInputView) (row int, err error)
}

// Errors Select and WorkerInputView return; callers branch on them with
// errors.Is. An empty view fails with shared.ErrNoWorkers and a bad row with a
// *shared.RowOutOfRangeError.
var (
	// ErrNoActiveRequests: the picker declares ACTIVE_REQUESTS but the view
	// was built without an active-requests accessor.
	ErrNoActiveRequests = errors.New("hosted: ACTIVE_REQUESTS declared but no active-requests accessor given")
	// ErrZeroBlockSize: the view was built with a block size of 0 (or a
	// negative one); the router's block_size is always > 0.
	ErrZeroBlockSize = errors.New("hosted: block size must be > 0")
	// ErrUnsorted: the worker ids are not strictly ascending. Select checks
	// this only in builds with the switchyard_debug tag; CheckAscending
	// checks it always.
	ErrUnsorted = errors.New("hosted: worker ids not strictly ascending")
)

// Select runs one hosted selection: it checks the view (non-empty, block
// size > 0, an accessor when p declares ACTIVE_REQUESTS, and under the
// switchyard_debug build tag ascending ids), asks p for a row and checks the
// row is in range. It returns the row of the chosen worker in v, or
// shared.ErrNoWorkers, ErrZeroBlockSize, ErrNoActiveRequests, ErrUnsorted,
// a *shared.RowOutOfRangeError, or the picker's own error unchanged.
//
// Select does not allocate unless p does or an error is returned, and v may
// live on the caller's stack (see HostedWorkerPicker for the contract that
// makes this safe).
func Select(p HostedWorkerPicker, v *WorkerInputView) (int, error) {
	n := len(v.ids)
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	if v.blockSize <= 0 {
		return -1, ErrZeroBlockSize
	}
	if v.active == nil && p.Inputs().Normalize().Has(shared.InputActiveRequests) {
		return -1, ErrNoActiveRequests
	}
	if debugChecks {
		if err := CheckAscending(v.ids); err != nil {
			return -1, err
		}
	}
	row, err := p.PickHosted(noescape(v))
	if err != nil {
		return -1, err
	}
	if uint(row) >= uint(n) {
		return -1, &shared.RowOutOfRangeError{Row: row, Count: n}
	}
	return row, nil
}

// IntoHosted returns the policy's picker as a HostedWorkerPicker when the
// policy may take the hosted path: it has no filter and no scorer, its
// picker implements HostedWorkerPicker (so it runs in-process), and the
// policy's normalised inputs are at most ACTIVE_REQUESTS (OCCUPANCY counts
// as ACTIVE_REQUESTS). Otherwise it returns (nil, false) and the caller
// keeps running the full policy. The policy's fallback is not consulted.
func IntoHosted(p *policy.Policy) (HostedWorkerPicker, bool) {
	if p == nil || p.Picker == nil || !p.PickerOnly() {
		return nil, false
	}
	hp, ok := p.Picker.(HostedWorkerPicker)
	if !ok {
		return nil, false
	}
	if p.Inputs()&^shared.InputActiveRequests != 0 {
		return nil, false
	}
	return hp, true
}

// CheckAscending returns nil when ids are strictly ascending (the order the
// router guarantees: ascending WorkerID without duplicates), or an error
// wrapping ErrUnsorted naming the first offending row.
func CheckAscending(ids []shared.WorkerID) error {
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			return fmt.Errorf("%w: row %d id %d follows row %d id %d", ErrUnsorted, i, ids[i], i-1, ids[i-1])
		}
	}
	return nil
}

// noescape hides v from escape analysis so that a view on the caller's
// stack stays there although it is passed to an interface method (which the
// compiler must otherwise assume retains it). It is sound because
// HostedWorkerPicker.PickHosted must not retain v; the conversion round-trips
// through memory so that no uintptr arithmetic is involved. The same idea is
// runtime.noescape.
func noescape(v *WorkerInputView) *WorkerInputView {
	x := uintptr(unsafe.Pointer(v))
	return *(**WorkerInputView)(unsafe.Pointer(&x))
}
