package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// lowestActive picks the first row with the fewest requests in flight:
// deterministic, so a test can tell which counts it saw.
type lowestActive struct{}

func (lowestActive) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (lowestActive) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	best := 0
	for i, a := range c.ActiveRequests {
		if a < c.ActiveRequests[best] {
			best = i
		}
	}
	return best, nil
}

// broken fails every pick, or panics when panics is set.
type broken struct{ panics bool }

func (broken) Inputs() shared.Inputs { return 0 }
func (f broken) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	if f.panics {
		panic("shadow picker exploded")
	}
	return -1, errors.New("shadow picker failed")
}

// dropAll keeps no candidate.
type dropAll struct{}

func (dropAll) Inputs() shared.Inputs { return 0 }
func (dropAll) Filter(_ context.Context, _ *shared.Request, _ *shared.Candidates, keep []bool) error {
	clear(keep)
	return nil
}

// blocking holds every pick until its context ends or release is closed,
// counting the picks that started.
type blocking struct {
	started chan struct{}
	release chan struct{}
}

func (*blocking) Inputs() shared.Inputs { return 0 }
func (b *blocking) Pick(ctx context.Context, _ *shared.Request, _ *shared.Candidates) (int, error) {
	b.started <- struct{}{}
	select {
	case <-ctx.Done():
		return -1, ctx.Err()
	case <-b.release:
		return 0, nil
	}
}

func picker(name string, p shared.Picker) *policy.Policy {
	return &policy.Policy{Name: name, PickerName: "pick", Picker: p}
}

// shadowRouter is a Router over workers 1..n of the aggregated role whose
// policy is live with the given shadow.
func shadowRouter(t *testing.T, live, shadow *policy.Policy, n int, o ShadowOptions) *Router {
	t.Helper()
	live.Shadow = shadow
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: live}, BookingsAreLoad: true, Shadow: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for i := range n {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestShadowInline: inline shadows report their outcome in the Decision,
// compared with the live worker, and see the candidates as the live policy
// did, before its booking.
func TestShadowInline(t *testing.T) {
	tests := []struct {
		name   string
		live   *policy.Policy
		shadow *policy.Policy
		want   []ShadowResult
		picks  []shared.WorkerID
	}{
		{
			// Round-robin live (hosted) takes 1, 2, 3, 1; the shadow,
			// seeing the counts before each booking, takes the same.
			name: "agree", live: picker("rr", builtin.NewRoundRobin()), shadow: picker("low", lowestActive{}),
			want:  []ShadowResult{ShadowAgree, ShadowAgree, ShadowAgree, ShadowAgree},
			picks: []shared.WorkerID{1, 2, 3, 1},
		},
		{
			// A second round-robin instance (compiled) keeps its own
			// cursor: it agrees with the live one on every decision.
			name: "round-robin twin", live: picker("rr", builtin.NewRoundRobin()), shadow: picker("rr2", builtin.NewRoundRobin()),
			want:  []ShadowResult{ShadowAgree, ShadowAgree, ShadowAgree, ShadowAgree},
			picks: []shared.WorkerID{1, 2, 3, 1},
		},
		{
			// The first row always: agrees once per round of three.
			name: "disagree", live: picker("rr", builtin.NewRoundRobin()), shadow: picker("first", firstRow{}),
			want:  []ShadowResult{ShadowAgree, ShadowDisagree, ShadowDisagree, ShadowAgree},
			picks: []shared.WorkerID{1, 1, 1, 1},
		},
		{
			name: "failed", live: picker("rr", builtin.NewRoundRobin()), shadow: picker("bad", broken{}),
			want: []ShadowResult{ShadowFailed, ShadowFailed, ShadowFailed, ShadowFailed},
		},
		{
			name: "panicked", live: picker("rr", builtin.NewRoundRobin()), shadow: picker("bad", broken{panics: true}),
			want: []ShadowResult{ShadowFailed, ShadowFailed, ShadowFailed, ShadowFailed},
		},
		{
			name: "no choice", live: picker("rr", builtin.NewRoundRobin()),
			shadow: &policy.Policy{Name: "none", Filters: []policy.NamedFilter{{Name: "drop", Filter: dropAll{}}}, PickerName: "pick", Picker: lowestActive{}},
			want:   []ShadowResult{ShadowNone, ShadowNone, ShadowNone, ShadowNone},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var observed []ShadowOutcome
			r := shadowRouter(t, tt.live, tt.shadow, 3, ShadowOptions{Inline: true, Observe: func(o ShadowOutcome) { observed = append(observed, o) }})
			var got []ShadowResult
			var picks, live []shared.WorkerID
			for range 4 {
				d, err := r.Place(context.Background(), request(8, 1), Placement{})
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, d.Shadow.Result)
				live = append(live, d.Worker.ID)
				if d.Shadow.Result == ShadowAgree || d.Shadow.Result == ShadowDisagree {
					picks = append(picks, d.Shadow.Worker)
				} else if d.Shadow.Err == nil {
					t.Errorf("result %s without an error", d.Shadow.Result)
				}
				if d.Shadow.Policy != "rr" || d.Shadow.Shadow != tt.shadow.Name || d.Shadow.Role != shared.RoleAggregated || d.Shadow.Elapsed != 0 {
					t.Errorf("outcome = %+v", d.Shadow)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("results (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.picks, picks); diff != "" {
				t.Errorf("shadow picks (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]shared.WorkerID{1, 2, 3, 1}, live); diff != "" {
				t.Errorf("live picks (-want +got):\n%s", diff)
			}
			if len(observed) != 4 || observed[3].Result != tt.want[3] {
				t.Errorf("observed %d outcomes: %+v", len(observed), observed)
			}
		})
	}
}

// firstRow picks row 0.
type firstRow struct{}

func (firstRow) Inputs() shared.Inputs { return 0 }
func (firstRow) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

// TestShadowLeavesLiveUnchanged: the live decisions (workers, overlaps,
// loads) are the same with a shadow as without, and the shadow books
// nothing.
func TestShadowLeavesLiveUnchanged(t *testing.T) {
	run := func(shadow *policy.Policy) []Decision {
		r := shadowRouter(t, kvPolicy(t), shadow, 4, ShadowOptions{Inline: true})
		var ds []Decision
		for i := range 40 {
			d, err := r.Place(context.Background(), request(16, uint64(i%5), uint64(i%3), 7), Placement{})
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, d)
			if i%3 == 0 {
				d.Booking.Release()
			}
		}
		return ds
	}
	without, with := run(nil), run(picker("random", builtin.NewRandom(shared.Params{builtin.ParamSeed: int64(3)})))
	var agree int
	for i := range without {
		a, b := without[i], with[i]
		if a.Worker.ID != b.Worker.ID || a.OverlapBlocks != b.OverlapBlocks || a.Worker.Load(true) != b.Worker.Load(true) {
			t.Fatalf("decision %d: without shadow worker %d overlap %d load %+v, with %d %d %+v",
				i, a.Worker.ID, a.OverlapBlocks, a.Worker.Load(true), b.Worker.ID, b.OverlapBlocks, b.Worker.Load(true))
		}
		if a.Shadow.Result != "" {
			t.Fatalf("decision %d: shadow %q without a shadow", i, a.Shadow.Result)
		}
		if b.Shadow.Result == ShadowAgree {
			agree++
		} else if b.Shadow.Result != ShadowDisagree {
			t.Fatalf("decision %d: shadow %+v", i, b.Shadow)
		}
	}
	// A random picker over 4 workers agrees about a quarter of the time.
	if agree == 0 || agree == len(with) {
		t.Errorf("random shadow agreed on %d of %d", agree, len(with))
	}
}

// TestShadowFallbackAndTarget: a decision by the fallback is compared with
// the fallback's worker; a target decision runs no shadow.
func TestShadowFallbackAndTarget(t *testing.T) {
	live := picker("bad", broken{})
	live.Fallback = picker("fb", firstRow{})
	r := shadowRouter(t, live, picker("low", lowestActive{}), 2, ShadowOptions{Inline: true})
	d, err := r.Place(context.Background(), request(8, 1), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Fallback || d.Worker.ID != 1 || d.Shadow.Result != ShadowAgree || d.Shadow.Policy != "bad" {
		t.Errorf("fallback decision %+v, shadow %+v", d, d.Shadow)
	}
	d, err = r.Place(context.Background(), request(8, 1), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1 holds one request: the shadow takes 2, the fallback 1.
	if d.Shadow.Result != ShadowDisagree || d.Shadow.Worker != 2 {
		t.Errorf("second shadow %+v", d.Shadow)
	}
	d, err = r.Place(context.Background(), request(8, 1), Placement{Target: 2, HasTarget: true})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Target || d.Shadow.Result != "" {
		t.Errorf("target decision ran the shadow: %+v", d.Shadow)
	}
}

// TestShadowAsync: a shadow that hangs does not hold up live decisions; it
// runs at most MaxInFlight at once, QueueLen more wait, the rest are
// dropped, and Close cancels the ones running and fails the ones waiting
// without asking the shadow (both failed with context.Canceled) and waits
// for them: no goroutine is left.
func TestShadowAsync(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	bl := &blocking{started: make(chan struct{}, 16), release: make(chan struct{})}
	var mu sync.Mutex
	counts := map[ShadowResult]int{}
	done := make(chan ShadowOutcome, 16)
	// The sample rate stays 1: an adjustment an hour away.
	o := ShadowOptions{MaxInFlight: 2, QueueLen: 3, SampleInterval: time.Hour, Observe: func(o ShadowOutcome) {
		mu.Lock()
		counts[o.Result]++
		mu.Unlock()
		if o.Result != ShadowDropped {
			done <- o
		}
	}}
	live := picker("rr", builtin.NewRoundRobin())
	live.Shadow = picker("slow", bl)
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: live}, Shadow: o})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated}); err != nil {
			t.Fatal(err)
		}
	}
	// Two shadows start and hang, three wait; the live decisions all
	// complete.
	for i := range 10 {
		d, err := r.Place(context.Background(), request(8, 1), Placement{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker.ID != shared.WorkerID(i%3+1) || d.Shadow.Result != "" {
			t.Fatalf("decision %d: worker %d shadow %+v", i, d.Worker.ID, d.Shadow)
		}
		if i == 1 {
			// Both shadows are running before the next decisions.
			<-bl.started
			<-bl.started
		}
	}
	mu.Lock()
	if counts[ShadowDropped] != 5 || len(counts) != 1 {
		t.Errorf("outcomes %v, want 5 dropped", counts)
	}
	mu.Unlock()
	if n := r.Bundle().InFlight(); n != 5 {
		t.Errorf("bundle in flight = %d, want the 5 shadows", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var ran int
	for range 5 {
		out := <-done
		if out.Result != ShadowFailed || !errors.Is(out.Err, context.Canceled) {
			t.Errorf("cancelled shadow = %+v", out)
		}
		if out.Elapsed > 0 {
			ran++
		}
	}
	if ran != 2 {
		t.Errorf("%d cancelled shadows had asked the shadow, want the 2 running", ran)
	}
}

// TestShadowAsyncAgree: an asynchronous shadow sees the candidates as the
// live policy did, although it runs after the booking.
func TestShadowAsyncAgree(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	done := make(chan ShadowOutcome, 6)
	r := shadowRouter(t, picker("rr", builtin.NewRoundRobin()), picker("low", lowestActive{}), 3,
		ShadowOptions{MaxInFlight: 6, Observe: func(o ShadowOutcome) { done <- o }}) // none dropped
	for range 6 {
		if _, err := r.Place(context.Background(), request(8, 1), Placement{}); err != nil {
			t.Fatal(err)
		}
	}
	for range 6 {
		if o := <-done; o.Result != ShadowAgree {
			t.Errorf("outcome %+v", o)
		}
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
