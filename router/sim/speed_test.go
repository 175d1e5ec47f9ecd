package sim

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestScaledStepTimes: a speed-2 worker's step takes half as long, to the
// nanosecond (each step rounds once), on every shape of the sanity table;
// speed 1 changes nothing; a speed of 1.5 scales by 2/3 (to the
// coefficients' rounding).
func TestScaledStepTimes(t *testing.T) {
	base := DefaultTiming()
	fast, err := base.Scaled(2)
	if err != nil {
		t.Fatal(err)
	}
	if fast.WeightFloor != 3 || fast.Fixed != 0.25 || fast.DecodeAttn != 3.8e-5 {
		t.Errorf("Scaled(2) = %+v, want every coefficient halved", fast)
	}
	same, err := base.Scaled(1)
	if err != nil || same != base {
		t.Errorf("Scaled(1) = %+v, %v; want the timing unchanged", same, err)
	}
	onePointFive, err := base.Scaled(1.5)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []StepShape{
		{Chunks: 1, PrefillTokens: 1024, PrefillPairs2: 1024 * 1024},
		{Chunks: 1, PrefillTokens: 8192, PrefillPairs2: 8192 * 8192},
		{Decodes: 1, DecodeContext: 1024},
		{Decodes: 64, DecodeContext: 64 * 2048},
		{Decodes: 256, DecodeContext: 256 * 1500},
		{Decodes: 64, DecodeContext: 64 * 2048, Chunks: 1, PrefillTokens: 8128, PrefillPairs2: 8128 * 8128},
	} {
		slow, quick := base.StepTime(s), fast.StepTime(s)
		if d := 2*quick - slow; d < -1 || d > 1 {
			t.Errorf("%+v: %v at speed 1, %v at speed 2; want half to the nanosecond", s, slow, quick)
		}
		// 1.5 does not divide every coefficient's picoseconds: each is
		// rounded (DecodeAttn 76,000 ps → 50,667), a relative error under 1e-5.
		if mid, want := onePointFive.StepTime(s), float64(slow)/1.5; math.Abs(float64(mid)-want) > 1e-5*want {
			t.Errorf("%+v: %v at speed 1.5, want %v ± 0.001%%", s, mid, time.Duration(want))
		}
	}
	// The sanity table's prefill 1k: 24,059,502 ns at speed 1 (TestStepTimeSanity).
	if got := fast.StepTime(StepShape{Chunks: 1, PrefillTokens: 1024, PrefillPairs2: 1024 * 1024}); got != 12029751 {
		t.Errorf("prefill 1k at speed 2: %d ns, want 12,029,751", got)
	}
}

// TestScaledRequestLatency: the same requests on a speed-2 worker and a
// speed-1 one, all submitted at time 0, see their first token and their
// last in half the time (each step's rounding adds at most 1 ns).
func TestScaledRequestLatency(t *testing.T) {
	run := func(speed float64) (map[int]Event, map[int]Event, int64) {
		cfg := DefaultConfig()
		var err error
		if cfg.Timing, err = cfg.Timing.Scaled(speed); err != nil {
			t.Fatal(err)
		}
		w := newWorker(t, cfg)
		for i, r := range []Request{
			{ID: 1, InputLength: 9000, OutputLength: 40},  // chunked prefill
			{ID: 2, InputLength: 1023, OutputLength: 300}, // long decode
			{ID: 3, InputLength: 4000, OutputLength: 1},
			{ID: 4, InputLength: 200, OutputLength: 120},
		} {
			r := r
			if err := w.Submit(0, &r); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		first, done := map[int]Event{}, map[int]Event{}
		for _, e := range w.Drain(nil) {
			if e.Kind == FirstToken {
				first[e.RequestID] = e
			} else {
				done[e.RequestID] = e
			}
		}
		return first, done, w.Stats().Steps
	}
	f1, d1, steps1 := run(1)
	f2, d2, steps2 := run(2)
	if steps1 != steps2 || len(d1) != 4 || len(d2) != 4 {
		t.Fatalf("speed 1: %d steps, %d done; speed 2: %d steps, %d done; want the same 4 requests in the same steps", steps1, len(d1), steps2, len(d2))
	}
	half := func(what string, id int, slow, quick time.Duration) {
		t.Helper()
		if d := 2*quick - slow; d < -time.Duration(steps1) || d > time.Duration(steps1) {
			t.Errorf("request %d %s: %v at speed 1, %v at speed 2; want half (± %d ns)", id, what, slow, quick, steps1)
		}
	}
	for id := 1; id <= 4; id++ {
		half("TTFT", id, f1[id].At, f2[id].At)
		half("E2E", id, d1[id].At, d2[id].At)
	}
	if d1[2].At < 300*6*time.Millisecond {
		t.Errorf("request 2 ended at %v at speed 1; want at least 300 decode steps of 6 ms", d1[2].At)
	}
}

// TestScaledBounds: speeds outside [MinSpeed, MaxSpeed], NaN and
// infinities are refused with ErrInvalidConfig; the bounds themselves
// give a valid Timing.
func TestScaledBounds(t *testing.T) {
	for _, s := range []float64{0, -1, math.NaN(), math.Inf(1), math.Inf(-1), MinSpeed / 2, MaxSpeed * 2} {
		if _, err := DefaultTiming().Scaled(s); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Scaled(%v): %v, want ErrInvalidConfig", s, err)
		}
	}
	for _, s := range []float64{MinSpeed, MaxSpeed} {
		tm, err := DefaultTiming().Scaled(s)
		if err != nil {
			t.Fatalf("Scaled(%v): %v", s, err)
		}
		if err := tm.Validate(); err != nil {
			t.Errorf("Scaled(%v).Validate: %v", s, err)
		}
		if got := tm.compile().pf; got < 10 || got > 105000 {
			t.Errorf("Scaled(%v): PrefillAttn %d ps, want 11 to 105,000", s, got)
		}
	}
}

// TestNewClusterOf: each worker runs its own config; a bad one is named.
func TestNewClusterOf(t *testing.T) {
	slow, fast := DefaultConfig(), DefaultConfig()
	fast.Timing, _ = fast.Timing.Scaled(2)
	c, err := NewClusterOf([]Config{fast, slow})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := c.Submit(0, i, &Request{ID: i, InputLength: 1024, OutputLength: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ev := c.Drain(nil)
	if len(ev) != 4 || ev[0].Worker != 0 || ev[0].At != 12029751 || ev[2].Worker != 1 || ev[2].At != 24059502 {
		t.Errorf("events %+v; want worker 0 done at 12,029,751 ns, worker 1 at 24,059,502", ev)
	}
	bad := DefaultConfig()
	bad.BlockSize = 0
	if _, err := NewClusterOf([]Config{slow, bad}); !errors.Is(err, ErrInvalidConfig) || err.Error()[:8] != "worker 1" {
		t.Errorf("NewClusterOf with a bad second config: %v, want ErrInvalidConfig naming worker 1", err)
	}
	if _, err := NewClusterOf(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewClusterOf(nil): %v, want ErrInvalidConfig", err)
	}
}
