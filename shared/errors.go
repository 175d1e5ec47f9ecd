package shared

import (
	"errors"
	"fmt"
	"math"
	"time"
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

// NoHeadroomError is a selection refused because no candidate is predicted
// to meet the request's latency targets and its SLO.OnMiss is
// SLOMissReject. The faces answer 429 with a Retry-After header of
// RetryAfter rounded up to whole seconds (RFC 9110, section 10.2.3).
type NoHeadroomError struct {
	// RetryAfter is when the best candidate is predicted to have headroom
	// again (> 0).
	RetryAfter time.Duration
	// TTFT and TPOT are the best candidate's predictions, in seconds.
	TTFT, TPOT float64
	// TTFTLeft, when HasTTFTLeft, is what was left of the TTFT target
	// when the request was refused (the target less its time in the
	// router), in seconds; <= 0 when that time alone used it up.
	TTFTLeft    float64
	HasTTFTLeft bool
}

func (e *NoHeadroomError) Error() string {
	left := ""
	if e.HasTTFTLeft {
		left = fmt.Sprintf(" against %.0f ms left of the TTFT target", max(e.TTFTLeft, 0)*1e3)
		if e.TTFTLeft <= 0 {
			left = " against a TTFT target its time in the router already used up"
		}
	}
	return fmt.Sprintf("no worker is predicted to meet the request's latency targets (best: TTFT %.0f ms, TPOT %.1f ms%s); retry after %v",
		e.TTFT*1e3, e.TPOT*1e3, left, e.RetryAfter)
}

// NonFiniteCostError reports a scorer whose cost, or whose weighted cost
// added to the earlier scorers' sum, is NaN or ±Inf (the Scorer contract).
// It belongs to the SDK because it is what an author's scorer is reported
// with: Serve produces it in the plugin process (its message is what the
// router reports for the failed call), and the router's pipeline returns it,
// for errors.As, when an in-process (built-in) scorer breaks the contract.
type NonFiniteCostError struct {
	Scorer int     // index of the scorer in the policy, 0-based
	Name   string  // the scorer's block name, when known
	Row    int     // candidate row
	Cost   float64 // the cost the scorer wrote
	Sum    float64 // the running weighted sum it produced
}

func (e *NonFiniteCostError) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("#%d", e.Scorer)
	}
	if math.IsNaN(e.Cost) || math.IsInf(e.Cost, 0) {
		return fmt.Sprintf("scorer %s wrote non-finite cost %v at row %d", name, e.Cost, e.Row)
	}
	return fmt.Sprintf("scorer %s: cost %v at row %d overflows the weighted sum (%v)", name, e.Cost, e.Row, e.Sum)
}

// RowOutOfRangeError reports a picker (or a view accessor) given or
// returning a row outside [0, Count) (the Picker contract). It belongs to
// the SDK for the reason NonFiniteCostError does: Serve reports an author's
// picker with it, and the router's pipeline and hosted path report an
// in-process picker with the same error.
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
