package pluginclient

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// TestCheckResult: each way an answer can fail its task is named by its
// reason, and what the task's stages do not produce is not checked.
func TestCheckResult(t *testing.T) {
	f := Stage{Instance: "f", Kind: shared.KindFilter}
	s := Stage{Instance: "s", Kind: shared.KindScorer, Weight: 1}
	p := Stage{Instance: "p", Kind: shared.KindPicker}
	task := func(rows int, stages ...Stage) *Task {
		return &Task{Candidates: &shared.Candidates{IDs: make([]shared.WorkerID, rows)}, Stages: stages}
	}
	for _, tc := range []struct {
		name   string
		t      *Task
		res    TaskResult
		reason string
		detail string
	}{
		{"fused, good", task(4, f, s, p), TaskResult{Kept: []uint32{0, 2}, Costs: []float64{1, 2}, Picked: 2}, "", ""},
		{"every row kept", task(3, f, s, p), TaskResult{Costs: []float64{1, 2, 3}, Picked: 0}, "", ""},
		{"filtered out", task(3, f, s, p), TaskResult{Kept: []uint32{}, FilteredBy: "f", Picked: -1}, "", ""},
		{"filtered_by with rows", task(3, f, p), TaskResult{Kept: []uint32{1}, FilteredBy: "f", Picked: 1}, InvalidFilteredBy,
			`filtered_by "f" with 1 kept rows (filtered_by means no row was kept)`},
		{"filtered_by another", task(3, f, p), TaskResult{FilteredBy: "p", Picked: -1}, InvalidFilteredBy, `filtered_by "p" names no filter of the task`},
		{"filtered_by without a filter", task(3, s), TaskResult{FilteredBy: "x\x1b" + strings.Repeat("y", 1000), Picked: -1}, InvalidFilteredBy,
			`filtered_by "x\x1b` + strings.Repeat("y", 256-5) + `...(1002 bytes)" from a task without a filter`},
		{"kept descending", task(3, f), TaskResult{Kept: []uint32{2, 1}, Picked: -1}, InvalidKept, "kept rows [2 1] not strictly ascending in [0, 3)"},
		{"kept twice", task(3, f), TaskResult{Kept: []uint32{1, 1}, Picked: -1}, InvalidKept, "kept rows [1 1] not strictly ascending in [0, 3)"},
		{"kept out of range", task(3, f), TaskResult{Kept: []uint32{0, 3}, Picked: -1}, InvalidKept, "kept rows [0 3] not strictly ascending in [0, 3)"},
		{"every row kept without a filter: accepted", task(2, s), TaskResult{Kept: []uint32{0, 1}, Costs: []float64{1, 2}, Picked: -1}, "", ""},
		{"kept without a filter, out of range", task(2, s), TaskResult{Kept: []uint32{9}, Costs: []float64{1, 2}, Picked: -1}, InvalidKept, "kept rows [9] not strictly ascending in [0, 2)"},
		{"kept without a filter, descending", task(3, s), TaskResult{Kept: []uint32{2, 1, 0}, Costs: []float64{1, 2, 3}, Picked: -1}, InvalidKept, "kept rows [2 1 0] not strictly ascending in [0, 3)"},
		{"some rows kept without a filter", task(3, s), TaskResult{Kept: []uint32{0, 2}, Costs: []float64{1, 2}, Picked: -1}, InvalidKept, "2 kept rows of 3 from a task without a filter (send no kept rows, or every row)"},
		{"costs short", task(3, s), TaskResult{Costs: []float64{1, 2}, Picked: -1}, InvalidRowCount, "2 costs for 3 rows"},
		{"costs for the rows sent, not kept", task(3, f, s), TaskResult{Kept: []uint32{1}, Costs: []float64{1, 2, 3}, Picked: -1}, InvalidRowCount, "3 costs for 1 rows"},
		{"no costs", task(1, s, p), TaskResult{Picked: 0}, InvalidRowCount, "0 costs for 1 rows"},
		{"NaN", task(2, s), TaskResult{Costs: []float64{1, math.NaN()}, Picked: -1}, InvalidCost, "cost NaN for row 1"},
		{"-Inf", task(2, s), TaskResult{Costs: []float64{math.Inf(-1), 1}, Picked: -1}, InvalidCost, "cost -Inf for row 0"},
		{"costs without a scorer: ignored", task(2, p), TaskResult{Costs: []float64{math.NaN()}, Picked: 1}, "", ""},
		{"picked too far", task(2, p), TaskResult{Picked: 2}, InvalidPicked, "picked row 2, not in [0, 2)"},
		{"picked -1", task(2, s, p), TaskResult{Costs: []float64{1, 2}, Picked: -1}, InvalidPicked, "picked row -1, not in [0, 2)"},
		{"picked not kept", task(4, f, p), TaskResult{Kept: []uint32{0, 3}, Picked: 2}, InvalidPicked, "picked row 2, not a kept row"},
		{"picked without a picker: ignored", task(2, s), TaskResult{Costs: []float64{1, 2}, Picked: 7}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckResult(tc.t, tc.res)
			var ia *InvalidAnswerError
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("CheckResult = %v, want nil", err)
			case tc.reason == "":
			case !errors.As(err, &ia) || ia.Reason != tc.reason || ia.Detail != tc.detail:
				t.Fatalf("CheckResult = %#v, want reason %s, detail %q", err, tc.reason, tc.detail)
			case err.Error() != "invalid answer ("+tc.reason+"): "+tc.detail:
				t.Fatalf("Error() = %q", err.Error())
			}
		})
	}
}

// TestResultFromProtoBoundsFilteredBy: a filtered_by naming one of the
// task's instances is kept whole; any other is bounded and escaped.
func TestResultFromProtoBoundsFilteredBy(t *testing.T) {
	long := "agg/" + strings.Repeat("p", 500) + "/f"
	stages := []Stage{{Instance: long, Kind: shared.KindFilter}}
	if got := ResultFromProto(&pluginv1.DecideResult{FilteredBy: long, Picked: -1}, stages); got.FilteredBy != long {
		t.Errorf("the task's own instance name came back as %q", got.FilteredBy)
	}
	got := ResultFromProto(&pluginv1.DecideResult{FilteredBy: "\x1b[2J" + strings.Repeat("x", 1<<20), Picked: -1}, stages)
	if want := `\x1b[2J` + strings.Repeat("x", 256-len(`\x1b[2J`)) + "...(1048580 bytes)"; got.FilteredBy != want {
		t.Errorf("a 1 MiB filtered_by came back as %d bytes, %.80q...", len(got.FilteredBy), got.FilteredBy)
	}
}
