package builtin

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// sloRows builds candidates with the given predicted TTFTs and TPOTs (seconds).
func sloRows(ttft, tpot []float64) *shared.Candidates {
	c := &shared.Candidates{IDs: make([]shared.WorkerID, len(ttft)), PredictedTTFT: ttft, PredictedTPOT: tpot}
	for i := range c.IDs {
		c.IDs[i] = shared.WorkerID(i + 1)
	}
	return c
}

func sloFilter(t *testing.T, p shared.Params) *SLO {
	t.Helper()
	s, err := NewSLO(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func runSLO(t *testing.T, s *SLO, req *shared.Request, c *shared.Candidates) ([]bool, error) {
	t.Helper()
	keep := make([]bool, c.Len())
	for i := range keep {
		keep[i] = true
	}
	err := s.Filter(context.Background(), req, c, keep)
	return keep, err
}

func TestSLOKeepsRowsWithHeadroom(t *testing.T) {
	s := sloFilter(t, shared.Params{ParamTTFTHeadroom: 0.25, ParamTPOTHeadroom: 0.25})
	// Targets 500 ms TTFT (100 ms waited: 400 left) and 50 ms TPOT.
	req := &shared.Request{SLO: shared.SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, Waited: 100 * time.Millisecond}}
	// Row 0: 0.32 s x 1.25 = 0.4 <= 0.4 and 0.04 x 1.25 = 0.05 <= 0.05: meets, exactly.
	// Row 1: TTFT 0.33 x 1.25 > 0.4: misses. Row 2: TPOT 0.041 x 1.25 > 0.05: misses.
	// Row 3: both well within.
	c := sloRows([]float64{0.32, 0.33, 0.1, 0.05}, []float64{0.04, 0.01, 0.041, 0.01})
	keep, err := runSLO(t, s, req, c)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true}; !slices.Equal(keep, want) {
		t.Fatalf("keep %v, want %v", keep, want)
	}
	// No targets: every row kept, whatever the predictions.
	keep, err = runSLO(t, s, &shared.Request{}, c)
	if err != nil || !slices.Equal(keep, []bool{true, true, true, true}) {
		t.Fatalf("without targets: keep %v, err %v", keep, err)
	}
}

func TestSLOMissActions(t *testing.T) {
	// Nobody meets 200 ms TTFT: predictions 0.3, 0.25 (least late), 0.4.
	c := func() *shared.Candidates { return sloRows([]float64{0.3, 0.25, 0.4}, []float64{0.01, 0.01, 0.01}) }
	target := shared.SLO{TTFT: 200 * time.Millisecond}

	t.Run("least-late by default", func(t *testing.T) {
		// Lateness 0.5, 0.25 and 1 (of the 200 ms target): within the
		// default tolerance 0.5 of the least late, rows 0 and 1.
		keep, err := runSLO(t, sloFilter(t, nil), &shared.Request{SLO: target}, c())
		if err != nil || !slices.Equal(keep, []bool{true, true, false}) {
			t.Fatalf("keep %v, err %v; want the rows within tolerance of the least late", keep, err)
		}
		keep, err = runSLO(t, sloFilter(t, shared.Params{ParamLateness: 0.0}), &shared.Request{SLO: target}, c())
		if err != nil || !slices.Equal(keep, []bool{false, true, false}) {
			t.Fatalf("tolerance 0: keep %v, err %v; want only the least late row", keep, err)
		}
	})
	t.Run("wait while the target can still be met", func(t *testing.T) {
		s := sloFilter(t, shared.Params{ParamOnMiss: "wait"})
		_, err := runSLO(t, s, &shared.Request{SLO: target}, c())
		if !errors.Is(err, shared.ErrAllBusy) {
			t.Fatalf("err %v, want ErrAllBusy", err)
		}
		late := target
		late.Waited = 250 * time.Millisecond // past the target: waiting cannot help
		keep, err := runSLO(t, sloFilter(t, shared.Params{ParamOnMiss: "wait", ParamLateness: 0.0}), &shared.Request{SLO: late}, c())
		if err != nil || !slices.Equal(keep, []bool{false, true, false}) {
			t.Fatalf("past the target: keep %v, err %v; want the least late row", keep, err)
		}
	})
	t.Run("the request's own action wins", func(t *testing.T) {
		own := target
		own.OnMiss = shared.SLOMissReject
		_, err := runSLO(t, sloFilter(t, shared.Params{ParamOnMiss: "wait", ParamTTFTHeadroom: 0.0}), &shared.Request{SLO: own}, c())
		var nh *shared.NoHeadroomError
		if !errors.As(err, &nh) {
			t.Fatalf("err %v, want *NoHeadroomError", err)
		}
		if nh.TTFT != 0.25 || nh.RetryAfter != time.Second {
			t.Fatalf("%+v: want the best row's TTFT 0.25 and the 1 s minimum Retry-After", nh)
		}
	})
	t.Run("retry after the best row's excess", func(t *testing.T) {
		long := shared.SLO{TTFT: time.Second, OnMiss: shared.SLOMissReject}
		_, err := runSLO(t, sloFilter(t, shared.Params{ParamTTFTHeadroom: 0.0}), &shared.Request{SLO: long}, sloRows([]float64{4, 3.5}, []float64{0, 0}))
		var nh *shared.NoHeadroomError
		if !errors.As(err, &nh) || nh.RetryAfter != 2500*time.Millisecond {
			t.Fatalf("err %v, want Retry-After 2.5s (3.5 s predicted for 1 s)", err)
		}
	})
	t.Run("negative priority sheds first", func(t *testing.T) {
		_, err := runSLO(t, sloFilter(t, shared.Params{ParamOnMiss: "wait"}), &shared.Request{SLO: target, Priority: -1}, c())
		var nh *shared.NoHeadroomError
		if !errors.As(err, &nh) {
			t.Fatalf("err %v, want *NoHeadroomError for priority -1", err)
		}
	})
	t.Run("no wait when a row meets the TTFT target", func(t *testing.T) {
		// Row 1 meets 200 ms TTFT but misses the 10 ms TPOT: waiting would
		// spend the TTFT, so the least late rows go now.
		both := shared.SLO{TTFT: 200 * time.Millisecond, TPOT: 10 * time.Millisecond}
		s := sloFilter(t, shared.Params{ParamOnMiss: "wait", ParamLateness: 0.0})
		keep, err := runSLO(t, s, &shared.Request{SLO: both}, sloRows([]float64{0.3, 0.1}, []float64{0.011, 0.011}))
		if err != nil || !slices.Equal(keep, []bool{false, true}) {
			t.Fatalf("keep %v, err %v; want row 1 at once", keep, err)
		}
	})
	t.Run("no wait for a TPOT target alone", func(t *testing.T) {
		s := sloFilter(t, shared.Params{ParamOnMiss: "wait", ParamLateness: 0.0})
		tp := shared.SLO{TPOT: 5 * time.Millisecond}
		keep, err := runSLO(t, s, &shared.Request{SLO: tp}, sloRows([]float64{0, 0}, []float64{0.02, 0.01}))
		if err != nil || !slices.Equal(keep, []bool{false, true}) {
			t.Fatalf("keep %v, err %v; want the least late row at once", keep, err)
		}
	})
	t.Run("no wait on an idle fleet", func(t *testing.T) {
		s := sloFilter(t, shared.Params{ParamOnMiss: "wait", ParamLateness: 0.0})
		cs := c()
		cs.Load = make([]shared.Load, 3) // nothing in flight anywhere
		keep, err := runSLO(t, s, &shared.Request{SLO: target}, cs)
		if err != nil || !slices.Equal(keep, []bool{false, true, false}) {
			t.Fatalf("keep %v, err %v; want the least late row at once", keep, err)
		}
		// One idle row is enough: no row gets faster than idle, so waiting
		// cannot bring this request its target.
		cs = c()
		cs.Load = make([]shared.Load, 3)
		cs.Load[0].ActiveRequests, cs.Load[1].ActiveRequests = 2, 1
		keep, err = runSLO(t, s, &shared.Request{SLO: target}, cs)
		if err != nil || !slices.Equal(keep, []bool{false, true, false}) {
			t.Fatalf("row 2 idle: keep %v, err %v; want the least late row at once", keep, err)
		}
		cs.Load[2].ActiveRequests = 1
		if _, err := runSLO(t, s, &shared.Request{SLO: target}, cs); !errors.Is(err, shared.ErrAllBusy) {
			t.Fatalf("err %v, want ErrAllBusy with requests in flight on every row", err)
		}
	})
}

// With divert = "never" the filter removes no row: every row when some
// meet the targets, every row on a least-late miss; it still holds
// (wait) and refuses (reject, negative priority).
func TestSLONoDivert(t *testing.T) {
	s := sloFilter(t, shared.Params{ParamDivert: DivertNever, ParamOnMiss: "wait"})
	if s.divert != DivertNever || s.Inputs() != shared.InputLatency {
		t.Fatalf("divert %q, inputs %v: want never, LATENCY", s.divert, s.Inputs())
	}
	req := &shared.Request{SLO: shared.SLO{TTFT: 200 * time.Millisecond, TPOT: 20 * time.Millisecond}}
	// Row 1 alone meets both (0.1 s, 0.01 x 1.25): a diverting filter keeps
	// only it (checked below), this one every row.
	c := func() *shared.Candidates {
		return sloRows([]float64{0.3, 0.1, 0.25}, []float64{0.01, 0.01, 0.05})
	}
	keep, err := runSLO(t, s, req, c())
	if err != nil || !slices.Equal(keep, []bool{true, true, true}) {
		t.Fatalf("keep %v, err %v; want every row", keep, err)
	}
	keep, err = runSLO(t, sloFilter(t, shared.Params{ParamOnMiss: "wait"}), req, c())
	if err != nil || !slices.Equal(keep, []bool{false, true, false}) {
		t.Fatalf("divert (default): keep %v, err %v; want row 1 only", keep, err)
	}
	// Nobody meets 50 ms TTFT and every row is busy: it waits.
	tight := &shared.Request{SLO: shared.SLO{TTFT: 50 * time.Millisecond}}
	busyRows := c()
	busyRows.Load = []shared.Load{{ActiveRequests: 1}, {ActiveRequests: 3}, {ActiveRequests: 2}}
	if _, err := runSLO(t, s, tight, busyRows); !errors.Is(err, shared.ErrAllBusy) {
		t.Fatalf("err %v, want ErrAllBusy", err)
	}
	// The same miss with row 0 idle goes at once, to any row: the least
	// late is row 1 (0.1 s), yet every row is kept for the scorers.
	busyRows.Load[0].ActiveRequests = 0
	keep, err = runSLO(t, s, tight, busyRows)
	if err != nil || !slices.Equal(keep, []bool{true, true, true}) {
		t.Fatalf("idle row: keep %v, err %v; want every row", keep, err)
	}
	// Negative priority is still refused.
	neg := &shared.Request{SLO: tight.SLO, Priority: -1}
	var nh *shared.NoHeadroomError
	if _, err := runSLO(t, s, neg, busyRows); !errors.As(err, &nh) {
		t.Fatalf("err %v, want *NoHeadroomError for priority -1", err)
	}
}

// With divert = "classes" the filter keeps every row on a fleet of one
// worker class, and the rows predicted to meet the TTFT target (whatever
// their TPOT) when the candidates span classes.
func TestSLODivertClasses(t *testing.T) {
	s := sloFilter(t, shared.Params{ParamDivert: DivertClasses})
	if s.Inputs() != shared.InputLatency|shared.InputLabels {
		t.Fatalf("inputs %v, want LATENCY|LABELS", s.Inputs())
	}
	req := &shared.Request{SLO: shared.SLO{TTFT: 200 * time.Millisecond, TPOT: 20 * time.Millisecond}}
	// Row 0 misses TTFT (0.3 s); row 1 meets both; row 2 meets TTFT but
	// not TPOT (0.05 x 1.25 > 0.02).
	rows := func(classes ...string) *shared.Candidates {
		c := sloRows([]float64{0.3, 0.1, 0.15}, []float64{0.01, 0.01, 0.05})
		c.Labels = make([]shared.Labels, len(classes))
		for i, cl := range classes {
			if cl != "" {
				c.Labels[i] = shared.LabelsOf(map[string]string{shared.LabelClass: cl, "zone": "a"})
			}
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		classes []string
		want    []bool
	}{
		{"one class", []string{"speed-1", "speed-1", "speed-1"}, []bool{true, true, true}},
		{"unlabelled", []string{"", "", ""}, []bool{true, true, true}},
		{"two classes", []string{"speed-1", "speed-2", "speed-1"}, []bool{false, true, true}},
		{"labelled and not", []string{"", "", "speed-2"}, []bool{false, true, true}},
	} {
		keep, err := runSLO(t, s, req, rows(tc.classes...))
		if err != nil || !slices.Equal(keep, tc.want) {
			t.Errorf("%s: keep %v, err %v; want %v", tc.name, keep, err, tc.want)
		}
	}
	// Without the LABELS columns nothing says the fleet is mixed.
	c := sloRows([]float64{0.3, 0.1, 0.15}, []float64{0.01, 0.01, 0.05})
	if keep, err := runSLO(t, s, req, c); err != nil || !slices.Equal(keep, []bool{true, true, true}) {
		t.Errorf("no labels: keep %v, err %v; want every row", keep, err)
	}
	if _, err := NewSLO(shared.Params{ParamDivert: "sometimes"}); err == nil {
		t.Error("divert \"sometimes\" accepted")
	}
}

func TestSLOParams(t *testing.T) {
	for _, p := range []shared.Params{
		{ParamTTFTHeadroom: -0.1}, {ParamTPOTHeadroom: 11.0}, {ParamLateness: -1.0}, {ParamOnMiss: "later"}, {ParamCachedTPOT: -0.6},
	} {
		if _, err := NewSLO(p); err == nil {
			t.Errorf("NewSLO(%v) accepted", p)
		}
	}
	s := sloFilter(t, nil)
	if s.divert != DivertAlways || s.Inputs() != shared.InputLatency {
		t.Fatalf("divert %q, inputs %v: want DefaultSLODivert (always), LATENCY", s.divert, s.Inputs())
	}
	if s.ttftHead != DefaultTTFTHeadroom || s.tpotHead != DefaultTPOTHeadroom || s.tolerance != DefaultSLOTolerance || s.onMiss != shared.SLOMissLeastLate {
		t.Fatalf("defaults %+v", s)
	}
	if _, err := runSLO(t, s, &shared.Request{SLO: shared.SLO{TTFT: time.Second}}, &shared.Candidates{IDs: []shared.WorkerID{1}}); !errors.Is(err, ErrMissingColumn) {
		t.Fatalf("err %v, want ErrMissingColumn without LATENCY columns", err)
	}
}

// The row holding the request's longest prefix meets the TPOT target with
// cached_tpot_headroom (-0.1 by default) instead of tpot_headroom: the
// cache it holds is worth a TPOT slightly over the plain headroom.
func TestSLOCachedRowTPOT(t *testing.T) {
	s := sloFilter(t, nil)
	req := &shared.Request{SLO: shared.SLO{TPOT: 30 * time.Millisecond}}
	// Row 0 holds 4 blocks: 0.032 x 0.9 = 0.0288 <= 0.03, kept. Row 1 holds
	// 2: 0.025 x 1.25 = 0.03125 > 0.03, dropped. Row 2 holds none and is
	// idle: 0.02 x 1.25 = 0.025, kept.
	c := sloRows([]float64{0.1, 0.1, 0.1}, []float64{0.032, 0.025, 0.02})
	c.OverlapBlocks = []int32{4, 2, 0}
	keep, err := runSLO(t, s, req, c)
	if err != nil || !slices.Equal(keep, []bool{true, false, true}) {
		t.Fatalf("keep %v, err %v; want rows 0 and 2", keep, err)
	}
	// Without a cached prefix anywhere, no row is excepted.
	c.OverlapBlocks = []int32{0, 0, 0}
	keep, err = runSLO(t, s, req, c)
	if err != nil || !slices.Equal(keep, []bool{false, false, true}) {
		t.Fatalf("no cache: keep %v, err %v; want row 2 only", keep, err)
	}
}
