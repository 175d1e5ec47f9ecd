package pluginclient

import (
	"fmt"
	"math"
	"strconv"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// Reasons of an InvalidAnswerError: a bounded set, each a metric label
// value (switchyard_plugin_invalid_answers_total's reason).
const (
	// InvalidKept: kept rows outside [0, rows) or not strictly ascending.
	InvalidKept = "kept_out_of_range"
	// InvalidRowCount: a task with a scorer answered a number of costs
	// other than one per kept row.
	InvalidRowCount = "row_count"
	// InvalidCost: a task with a scorer answered a NaN or infinite cost.
	InvalidCost = "non_finite_cost"
	// InvalidPicked: a task ending with a picker answered a row outside
	// [0, rows), or one its filters did not keep.
	InvalidPicked = "picked_out_of_range"
	// InvalidFilteredBy: filtered_by names no filter stage of the task,
	// or comes with kept rows (filtered_by means no row was kept).
	InvalidFilteredBy = "filtered_by"
)

// InvalidAnswerError is a Decide answer that does not fit its task: the
// plugin answered, but with rows, costs or a pick the router cannot use
// (CheckResult). A host treats it as a failed call (its policy's fallback
// decides, and it counts toward the plugin's circuit breaker).
type InvalidAnswerError struct {
	// Reason is one of InvalidKept, InvalidRowCount, InvalidCost,
	// InvalidPicked and InvalidFilteredBy.
	Reason string
	// Detail says what was wrong, such as "3 costs for 4 rows"; what it
	// quotes of the plugin's answer is bounded (untrusted.MaxLog).
	Detail string
}

func (e *InvalidAnswerError) Error() string {
	return "invalid answer (" + e.Reason + "): " + e.Detail
}

// CheckResult checks res as the answer to t, as the router's pipeline
// will use it (docs/plugin-protocol.md, "Decide"), and returns nil or an
// *InvalidAnswerError:
//
//   - filtered_by, when set, must name one of t's filter stages and come
//     without kept rows; nothing else is checked then (no row was kept);
//   - kept rows, when sent, strictly ascending within [0, rows); from a
//     task without a filter, every row (0, 1, ..., rows-1: the same as
//     none, which the router accepts) or none;
//   - with a scorer in t: exactly one cost per kept row (per row when
//     nothing was filtered), each finite;
//   - with a picker in t: picked a row within [0, rows) that was kept.
//
// Fields a task's stages do not produce (costs without a scorer, picked
// without a picker) are not checked: the router ignores them. Kept rows
// are the exception (issue #29): the pipeline compacts the rows by
// whatever kept list it is given, so one that is not every row from a
// task without a filter is refused rather than read two ways. This is
// the one check of an answer: the supervisor applies it to every
// decision call (managed.decide) and `router plugins check` decides
// through the same supervisor and pipeline. Linear in the rows; it
// allocates only for an error.
func CheckResult(t *Task, res TaskResult) error {
	rows := t.Candidates.Len()
	var filters, scores, picks bool
	for _, st := range t.Stages {
		switch st.Kind {
		case shared.KindFilter:
			filters = true
		case shared.KindScorer:
			scores = true
		case shared.KindPicker:
			picks = true
		}
	}
	if res.FilteredBy != "" {
		named := false
		for _, st := range t.Stages {
			named = named || st.Kind == shared.KindFilter && st.Instance == res.FilteredBy
		}
		switch {
		case !named && !filters:
			return &InvalidAnswerError{Reason: InvalidFilteredBy, Detail: `filtered_by "` + untrusted.Text(res.FilteredBy, untrusted.MaxLog) + `" from a task without a filter`}
		case !named:
			return &InvalidAnswerError{Reason: InvalidFilteredBy, Detail: `filtered_by "` + untrusted.Text(res.FilteredBy, untrusted.MaxLog) + `" names no filter of the task`}
		case len(res.Kept) > 0:
			return &InvalidAnswerError{Reason: InvalidFilteredBy, Detail: fmt.Sprintf("filtered_by %q with %d kept rows (filtered_by means no row was kept)", res.FilteredBy, len(res.Kept))}
		}
		return nil
	}
	kept := rows
	if res.Kept != nil {
		for i, k := range res.Kept {
			if int64(k) >= int64(rows) || i > 0 && k <= res.Kept[i-1] {
				return &InvalidAnswerError{Reason: InvalidKept, Detail: fmt.Sprintf("kept rows %v not strictly ascending in [0, %d)", res.Kept[:min(len(res.Kept), 8)], rows)}
			}
		}
		if !filters && len(res.Kept) != rows {
			// Strictly ascending within [0, rows): only a list of every
			// row has rows entries.
			return &InvalidAnswerError{Reason: InvalidKept, Detail: fmt.Sprintf("%d kept rows of %d from a task without a filter (send no kept rows, or every row)", len(res.Kept), rows)}
		}
		kept = len(res.Kept)
	}
	if scores {
		if len(res.Costs) != kept {
			return &InvalidAnswerError{Reason: InvalidRowCount, Detail: fmt.Sprintf("%d costs for %d rows", len(res.Costs), kept)}
		}
		for i, v := range res.Costs {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return &InvalidAnswerError{Reason: InvalidCost, Detail: fmt.Sprintf("cost %v for row %d", v, i)}
			}
		}
	}
	if picks {
		if res.Picked < 0 || res.Picked >= rows {
			return &InvalidAnswerError{Reason: InvalidPicked, Detail: fmt.Sprintf("picked row %d, not in [0, %d)", res.Picked, rows)}
		}
		if filters && res.Kept != nil && !keptRow(res.Kept, res.Picked) {
			return &InvalidAnswerError{Reason: InvalidPicked, Detail: "picked row " + strconv.Itoa(res.Picked) + ", not a kept row"}
		}
	}
	return nil
}

// keptRow reports whether row is in kept, strictly ascending.
func keptRow(kept []uint32, row int) bool {
	lo, hi := 0, len(kept)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if int(kept[m]) < row {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo < len(kept) && int(kept[lo]) == row
}

// ResultFromProto converts a DecideResult as the router's client does for
// a task of the given stages (an empty kept list without filtered_by is
// every row, Kept nil; a filtered_by naming none of stages' instances is
// bounded, untrusted.MaxClient), so that `router plugins check` can apply
// CheckResult to what it reads from the wire.
func ResultFromProto(r *pluginv1.DecideResult, stages []Stage) TaskResult {
	return resultFromProto(r, stages)
}
