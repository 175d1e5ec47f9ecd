package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/shared"
)

// perClassMeans replays recs on workers workers of the given speeds with
// policy src and returns the mean TTFT and E2E (ms) of the completed
// requests per speed, and the report's Speeds.
func perClassMeans(t *testing.T, src string, recs int, speeds []float64, workers int) (ttft, e2e map[float64]float64, counts map[float64]int, repSpeeds []float64) {
	t.Helper()
	b := loadPolicy(t, src)
	var out bytes.Buffer
	o := Options{PolicyName: "p", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:recs], Workers: workers, Speeds: speeds, PerRequest: &out}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != recs {
		t.Fatalf("%d of %d completed", rep.Completed, recs)
	}
	ttft, e2e, counts = map[float64]float64{}, map[float64]float64{}, map[float64]int{}
	for line := range strings.Lines(out.String()) {
		var oc Outcome
		if err := json.Unmarshal([]byte(line), &oc); err != nil {
			t.Fatal(err)
		}
		v := speeds[oc.Worker]
		ttft[v] += oc.TTFTMs
		e2e[v] += oc.E2EMs
		counts[v]++
	}
	for v, n := range counts {
		ttft[v] /= float64(n)
		e2e[v] /= float64(n)
	}
	return ttft, e2e, counts, rep.Speeds
}

// TestSpeedsFastWorkersFinishSooner: on a fleet of 2,1,2,1 round-robin
// sends each class half the requests, and the speed-2 workers serve
// theirs in much less time, first token and last; the report lists the
// speeds.
func TestSpeedsFastWorkersFinishSooner(t *testing.T) {
	speeds := CycleSpeeds([]float64{2, 1}, 4)
	ttft, e2e, counts, got := perClassMeans(t, roundRobin, 400, speeds, 4)
	if counts[2] != 200 || counts[1] != 200 {
		t.Fatalf("requests per class %v, want 200 each (round-robin)", counts)
	}
	t.Logf("mean TTFT %v ms, E2E %v ms by speed", ttft, e2e)
	// Same requests, half the step time: well under the slow class's,
	// not necessarily half (queueing is not linear in speed).
	if !(e2e[2] < 0.75*e2e[1]) || !(ttft[2] < 0.75*ttft[1]) {
		t.Errorf("speed 2: TTFT %.1f ms, E2E %.1f ms; speed 1: TTFT %.1f ms, E2E %.1f ms; want the fast class under 3/4 of the slow",
			ttft[2], e2e[2], ttft[1], e2e[1])
	}
	if !slices.Equal(got, []float64{2, 1, 2, 1}) {
		t.Errorf("Report.Speeds %v, want [2 1 2 1]", got)
	}
}

// TestSpeedsOnesAreTheDefault: Speeds of all 1 replay byte for byte as
// nil, and the report then lists none.
func TestSpeedsOnesAreTheDefault(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:300]
	lines := func(speeds []float64) (string, []float64) {
		// Fresh and seeded: components keep state between runs, and an
		// unseeded file draws a seed of its own.
		b := loadPolicy(t, "router { seed = 3 }")
		var out bytes.Buffer
		o := Options{PolicyName: "d", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: 4, Speeds: speeds, PerRequest: &out}
		rep, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return out.String(), rep.Speeds
	}
	none, s0 := lines(nil)
	ones, s1 := lines([]float64{1, 1, 1, 1})
	if none != ones || s0 != nil || s1 != nil {
		t.Errorf("speeds 1,1,1,1 changed the replay (or the report lists speeds %v, %v)", s0, s1)
	}
	fast, _ := lines([]float64{2, 2, 2, 2})
	if fast == none {
		t.Error("speeds 2,2,2,2 replayed as speed 1")
	}
}

// TestSpeedsClassLabel: every worker carries its class label, in
// aggregated and disaggregated fleets (prefill, then decode, by index).
func TestSpeedsClassLabel(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:20]
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"aggregated", Options{Workers: 3, Speeds: []float64{0.5, 1, 2}}, []string{"speed-0.5", "speed-1", "speed-2"}},
		{"default", Options{Workers: 2}, []string{"speed-1", "speed-1"}},
		{"disaggregated", Options{PrefillWorkers: 2, DecodeWorkers: 1, Speeds: []float64{2, 1, 1.5}}, []string{"speed-2", "speed-1", "speed-1.5"}},
	} {
		b := loadPolicy(t, "")
		o := tc.o
		o.PolicyName, o.BlockSize, o.TraceName, o.Records = "d", b.BlockSize, "t", recs
		o.Roles = map[shared.Role]*policy.Policy{shared.RoleAggregated: b.Roles[shared.RoleAggregated],
			shared.RolePrefill: b.Roles[shared.RoleAggregated], shared.RoleDecode: b.Roles[shared.RoleAggregated]}
		rep, d, err := execute(context.Background(), o)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for _, w := range d.reps[0].workers {
			v, _ := w.AllLabels.Get(shared.LabelClass)
			got = append(got, v)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: class labels %q, want %q", tc.name, got, tc.want)
		}
		if tc.o.Speeds != nil && !slices.Equal(rep.Speeds, tc.o.Speeds) {
			t.Errorf("%s: Report.Speeds %v, want %v", tc.name, rep.Speeds, tc.o.Speeds)
		}
	}
}

// TestSpeedsInvalid: a list of the wrong length or a speed out of range is
// refused before anything runs, naming the worker.
func TestSpeedsInvalid(t *testing.T) {
	b := loadPolicy(t, "")
	for _, tc := range []struct {
		speeds []float64
		want   string
	}{
		{[]float64{2, 1}, "2 speeds for 4 workers"},
		{[]float64{2, 1, 0, 1}, "worker 2: sim: invalid config: speed 0"},
		{[]float64{2, 1, 1, -1}, "worker 3: sim: invalid config: speed -1"},
		{[]float64{2, 1, 1, sim.MaxSpeed * 10}, "worker 3: sim: invalid config: speed 1000"},
	} {
		o := Options{PolicyName: "d", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Workers: 4, Speeds: tc.speeds}
		if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("speeds %v: %v, want an error containing %q", tc.speeds, err, tc.want)
		}
	}
}

// TestCycleSpeeds: the pattern repeats over the workers; all 1 is nil.
func TestCycleSpeeds(t *testing.T) {
	if got := CycleSpeeds([]float64{2, 1}, 5); !slices.Equal(got, []float64{2, 1, 2, 1, 2}) {
		t.Errorf("CycleSpeeds(2,1; 5) = %v", got)
	}
	if got := CycleSpeeds([]float64{1, 1}, 4); got != nil {
		t.Errorf("CycleSpeeds(1,1; 4) = %v, want nil", got)
	}
	if got := fleetSpeeds([]float64{2, 1}, Fleet{Prefill: 3, Decode: 2}); !slices.Equal(got, []float64{2, 1, 2, 2, 1}) {
		t.Errorf("fleetSpeeds(2,1; 3P+2D) = %v, want each pool cycled from its first worker", got)
	}
	if ClassOf(2) != "speed-2" || ClassOf(0.25) != "speed-0.25" {
		t.Errorf("ClassOf: %q, %q", ClassOf(2), ClassOf(0.25))
	}
}
