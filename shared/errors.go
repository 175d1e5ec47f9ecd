package shared

import (
	"errors"
	"fmt"
)

// Selection errors callers branch on with errors.Is.
var (
	// ErrNoWorkers: the role (or model) has no worker at all.
	ErrNoWorkers = errors.New("no workers")
	// ErrAllFiltered: the filters dropped every candidate.
	ErrAllFiltered = errors.New("all candidates filtered out")
	// ErrAllBusy: every candidate is at capacity; the request may queue.
	ErrAllBusy = errors.New("all workers busy")
)

// NonFiniteCostError reports a scorer that wrote NaN or ±Inf.
type NonFiniteCostError struct {
	Scorer int     // index of the scorer in the policy, 0-based
	Name   string  // the scorer's block name, when known
	Row    int     // candidate row
	Cost   float64 // the offending value
}

func (e *NonFiniteCostError) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("#%d", e.Scorer)
	}
	return fmt.Sprintf("scorer %s wrote non-finite cost %v at row %d", name, e.Cost, e.Row)
}

// RowOutOfRangeError reports a picker (or a view accessor) given or
// returning a row outside [0, Count).
type RowOutOfRangeError struct {
	Row   int
	Count int
}

func (e *RowOutOfRangeError) Error() string {
	return fmt.Sprintf("row %d out of range [0, %d)", e.Row, e.Count)
}

// ParamError is a component parameter the factory refused. The policy loader
// maps Param back to the file:line:col of the HCL attribute.
type ParamError struct {
	Param string
	Err   error
}

func (e *ParamError) Error() string { return fmt.Sprintf("parameter %q: %v", e.Param, e.Err) }

// Unwrap returns the underlying reason.
func (e *ParamError) Unwrap() error { return e.Err }
