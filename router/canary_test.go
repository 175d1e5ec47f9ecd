package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// canaryPick always picks row k (or fails from the moment fail is set),
// counting its picks.
type canaryPick struct {
	row   int
	fail  atomic.Bool
	picks atomic.Int64
}

func (*canaryPick) Inputs() shared.Inputs { return 0 }
func (p *canaryPick) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	p.picks.Add(1)
	if p.fail.Load() {
		return -1, errors.New("candidate broke")
	}
	return p.row, nil
}

// fakeClock is a settable clock for the canaries' windows.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// canaryRouter is a Router over workers 1..4 whose aggregated policy
// "live" always picks worker 1 and whose canary "trial" (with a
// least-loaded fallback "safe") picks worker 4 until trial.fail is set.
func canaryRouter(t testing.TB, weight float64, rb policy.CanaryRollback, o Options) (*Router, *canaryPick) {
	t.Helper()
	trial := &canaryPick{row: 3}
	live := &policy.Policy{Name: "live", PickerName: "pick", Picker: &canaryPick{row: 0}}
	cand := &policy.Policy{Name: "trial", PickerName: "pick", Picker: trial,
		Fallback: &policy.Policy{Name: "safe", PickerName: "pick", Picker: builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(1)})}}
	live.Canary = &policy.Canary{Policy: cand, Weight: weight, Key: policy.CanaryKeySession, Rollback: rb}
	o.BlockSize = 4
	o.Roles = map[shared.Role]*policy.Policy{shared.RoleAggregated: live}
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for i := range 4 {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return r, trial
}

var testRollback = policy.CanaryRollback{MaxFallbackShare: 0.05, MaxTTFTP90: 2 * time.Second, Window: 10 * time.Second, MinRequests: 20}

// place places one request of session s (id id) and releases it.
func place(t *testing.T, r *Router, id, session string) Decision {
	t.Helper()
	d, err := r.Place(context.Background(), &shared.Request{ID: id, SessionID: session, Role: shared.RoleAggregated, PromptTokens: 4}, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	return d
}

func TestCanarySplitsByShareAndKeepsSessions(t *testing.T) {
	r, _ := canaryRouter(t, 0.1, testRollback, Options{})
	const sessions = 20000
	side := make(map[string]bool, sessions)
	cand := 0
	for i := range sessions {
		s := fmt.Sprintf("session-%d", i)
		d := place(t, r, s+"/0", s)
		if d.Canary == nil {
			t.Fatal("a decision of a canaried role has no Canary")
		}
		wantWorker := shared.WorkerID(1)
		if d.Candidate {
			cand++
			wantWorker = 4
			if d.Policy != "trial" {
				t.Fatalf("candidate decision by %q", d.Policy)
			}
		} else if d.Policy != "live" {
			t.Fatalf("live decision by %q", d.Policy)
		}
		if d.Worker.ID != wantWorker {
			t.Fatalf("candidate %v decided worker %d", d.Candidate, d.Worker.ID)
		}
		if i%97 == 0 {
			// The dry run (/debug/route) takes the same side.
			ex := r.Explain(context.Background(), &shared.Request{ID: s + "/x", SessionID: s, Role: shared.RoleAggregated, PromptTokens: 4}, Placement{})
			if ex.Err != nil || ex.Canary != d.Candidate || ex.Policy != d.Policy || ex.Worker.ID != d.Worker.ID {
				t.Fatalf("session %s: Explain canary %v policy %q worker %v (%v), Place candidate %v policy %q worker %d",
					s, ex.Canary, ex.Policy, ex.Worker, ex.Err, d.Candidate, d.Policy, d.Worker.ID)
			}
		}
		side[s] = d.Candidate
	}
	// 10% of 20,000 is 2,000 with a standard deviation of ~42: 5 sigma.
	if cand < 1790 || cand > 2210 {
		t.Fatalf("%d of %d sessions on the candidate, want 10%% ± 5σ", cand, sessions)
	}
	// Every later turn of a session stays on its side, whatever its
	// request id.
	for i := 0; i < sessions; i += 7 {
		s := fmt.Sprintf("session-%d", i)
		for turn := 1; turn < 4; turn++ {
			if d := place(t, r, fmt.Sprintf("%s/%d", s, turn), s); d.Candidate != side[s] {
				t.Fatalf("session %s turn %d moved to candidate=%v", s, turn, d.Candidate)
			}
		}
	}
	st := r.Canaries()
	if len(st) != 1 || st[0].Policy != "live" || st[0].Candidate != "trial" || !st[0].Active ||
		st[0].CandidateDecisions+st[0].LiveDecisions != sessions+3*((sessions+6)/7) {
		t.Fatalf("status %+v", st)
	}
}

func TestCanaryKeyFallsBackToRequestID(t *testing.T) {
	r, _ := canaryRouter(t, 0.5, testRollback, Options{})
	c := r.Bundle().roles[shared.RoleAggregated].canary
	// Without a session the request id decides, the same as key "request".
	req := &shared.Request{ID: "abc"}
	if c.Key(req) != "abc" {
		t.Fatalf("key %q", c.Key(req))
	}
	req.SessionID = "s1"
	if c.Key(req) != "s1" {
		t.Fatalf("key %q", c.Key(req))
	}
	cand := 0
	for i := range 4000 {
		if c.Candidate(&shared.Request{ID: fmt.Sprintf("r%d", i)}) {
			cand++
		}
	}
	if cand < 1800 || cand > 2200 {
		t.Fatalf("%d of 4000 request ids on the candidate at weight 0.5", cand)
	}
}

func TestCanaryWeightBounds(t *testing.T) {
	for _, w := range []float64{0, 1} {
		r, _ := canaryRouter(t, w, testRollback, Options{})
		for i := range 200 {
			if d := place(t, r, fmt.Sprint(i), fmt.Sprint(i)); d.Candidate != (w == 1) {
				t.Fatalf("weight %v: session %d candidate=%v", w, i, d.Candidate)
			}
		}
	}
	trial := &policy.Policy{Name: "trial", PickerName: "pick", Picker: &canaryPick{}}
	live := &policy.Policy{Name: "live", PickerName: "pick", Picker: &canaryPick{},
		Canary: &policy.Canary{Policy: trial, Weight: 1.5, Rollback: testRollback}}
	if _, err := NewBundle(map[shared.Role]*policy.Policy{shared.RoleAggregated: live}, BundleOptions{}); err == nil ||
		!strings.Contains(err.Error(), "canary: weight 1.5, want 0 to 1") {
		t.Fatalf("err = %v", err)
	}
}

func TestCanaryRollsBackOnFallbackShare(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var got []CanaryRollback
	reg := prometheus.NewRegistry()
	r, trial := canaryRouter(t, 1, testRollback, Options{Registerer: reg,
		Canary: CanaryOptions{Now: clock.Now, OnRollback: func(rb CanaryRollback) { got = append(got, rb) }}})
	// 100 healthy decisions, 1 s apart: the window holds the last ~10.
	for i := range 100 {
		place(t, r, fmt.Sprint(i), fmt.Sprint(i))
		clock.Add(100 * time.Millisecond)
	}
	if len(got) != 0 {
		t.Fatalf("rolled back while healthy: %+v", got)
	}
	trial.fail.Store(true)
	var first, last int
	for i := 100; i < 200; i++ {
		d := place(t, r, fmt.Sprint(i), fmt.Sprint(i))
		if !d.Candidate {
			last = i
			break
		}
		if !d.Fallback || d.Policy != "safe" {
			t.Fatalf("a failing candidate's decision %+v", d)
		}
		if first == 0 {
			first = i
		}
		clock.Add(100 * time.Millisecond)
	}
	if len(got) != 1 || got[0].Reason != CanaryReasonFallbackShare || got[0].Candidate != "trial" || got[0].Policy != "live" {
		t.Fatalf("rollbacks %+v", got)
	}
	// The window is the last 10 buckets of 1 s, the current one partial:
	// the first failure opens a new bucket, so it holds 90 healthy
	// decisions and the k failing ones; k > 5% of 90 + k at k = 5.
	if n := last - first; n != 5 || got[0].Window.Fallbacks != 5 || got[0].Window.Decisions != 95 {
		t.Fatalf("rolled back after %d failing decisions, window %+v", n, got[0].Window)
	}
	// Rolled back: the live policy decides everything, until a new bundle.
	for i := 200; i < 300; i++ {
		if d := place(t, r, fmt.Sprint(i), fmt.Sprint(i)); d.Candidate || d.Policy != "live" {
			t.Fatalf("after rollback: %+v", d)
		}
	}
	st := r.Canaries()[0]
	if st.Active || st.RolledBack == nil || st.RolledBack.Reason != CanaryReasonFallbackShare {
		t.Fatalf("status %+v", st)
	}
	if v := testutil.ToFloat64(r.canaryMetrics.rollbacks.WithLabelValues("aggregated", "live", "trial", "fallback_share")); v != 1 {
		t.Fatalf("rollbacks metric %v", v)
	}
	if n, err := testutil.GatherAndCount(reg, "switchyard_canary_state"); err != nil || n != 1 {
		t.Fatalf("state series %d, %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP switchyard_canary_state 1 while a policy's canary sends its share of requests to the candidate, 0 once it rolled back (until the policy file is loaded again).
# TYPE switchyard_canary_state gauge
switchyard_canary_state{candidate="trial",policy="live",role="aggregated"} 0
`), "switchyard_canary_state"); err != nil {
		t.Fatal(err)
	}
}

func TestCanaryFallbacksAgeOutOfTheWindow(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rolled := 0
	r, trial := canaryRouter(t, 1, testRollback, Options{Canary: CanaryOptions{Now: clock.Now, OnRollback: func(CanaryRollback) { rolled++ }}})
	// 4 fallbacks every 10 s among 100 decisions: at most 4 of the 94
	// decisions of a window (the current bucket partial), below 5%,
	// after a healthy first round.
	for round := range 6 {
		for i := range 100 {
			trial.fail.Store(round > 0 && i < 4)
			place(t, r, fmt.Sprint(round, "-", i), fmt.Sprint(round, "-", i))
			clock.Add(100 * time.Millisecond)
		}
	}
	if rolled != 0 {
		t.Fatalf("rolled back %d times at 5%% fallbacks", rolled)
	}
	// At 1060 s the window is buckets 1051..1060: the last round's
	// fallbacks (1040 s) slid out of it, not out of the totals.
	if st := r.Canaries()[0]; st.Fallbacks != 20 || !st.Active || st.Window.Fallbacks != 0 || st.Window.Decisions != 90 {
		t.Fatalf("status %+v", st)
	}
}

func TestCanaryRollsBackOnTTFTP90(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var got []CanaryRollback
	r, _ := canaryRouter(t, 1, testRollback, Options{Canary: CanaryOptions{Now: clock.Now,
		OnRollback: func(rb CanaryRollback) { got = append(got, rb) }}})
	// 20 first tokens at 100 ms, then 2 at 3 s: at 22, p90 (rank 20) is
	// still 100 ms; the third slow one makes 3 > 23 - 21 slow: rolled back.
	ttft := 100 * time.Millisecond
	for i := range 25 {
		if i >= 20 {
			ttft = 3 * time.Second
		}
		d := place(t, r, fmt.Sprint(i), fmt.Sprint(i))
		r.CanaryTTFT(d, ttft)
		clock.Add(10 * time.Millisecond)
		if i < 22 && len(got) != 0 {
			t.Fatalf("rolled back after %d first tokens: %+v", i+1, got)
		}
		if i == 22 {
			break
		}
	}
	if len(got) != 1 || got[0].Reason != CanaryReasonTTFTP90 || got[0].Window.TTFTs != 23 || got[0].Window.Slow != 3 {
		t.Fatalf("rollbacks %+v", got)
	}
	// The p90 shown is the 3 s bin's upper bound: within 10% above.
	if p := got[0].Window.TTFTP90; p < 3*time.Second || p > 3300*time.Millisecond {
		t.Fatalf("p90 %v", p)
	}
	// A live decision's TTFT never counts.
	r2, _ := canaryRouter(t, 0, testRollback, Options{Canary: CanaryOptions{Now: clock.Now}})
	for i := range 100 {
		r2.CanaryTTFT(place(t, r2, fmt.Sprint(i), fmt.Sprint(i)), time.Minute)
	}
	if st := r2.Canaries()[0]; !st.Active || st.TTFTs != 0 || st.LiveDecisions != 100 {
		t.Fatalf("status %+v", st)
	}
}

func TestCanaryWithoutCanaryAddsNoAllocation(t *testing.T) {
	p := &policy.Policy{Name: "live", PickerName: "pick", Picker: &canaryPick{}}
	r := newRouter(t, p, 4)
	req := &shared.Request{ID: "x", SessionID: "s", Role: shared.RoleAggregated, PromptTokens: 4, BlockSize: 4}
	var b fleet.Booking
	allocs := testing.AllocsPerRun(200, func() {
		d, err := r.Place(context.Background(), req, Placement{Booking: &b})
		if err != nil {
			t.Fatal(err)
		}
		d.Booking.Release()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per selection without a canary", allocs)
	}
	// And a canary's choice allocates nothing either.
	rc, _ := canaryRouter(t, 0.5, testRollback, Options{})
	c := rc.Bundle().roles[shared.RoleAggregated].canary
	if a := testing.AllocsPerRun(200, func() { c.Candidate(req) }); a != 0 {
		t.Fatalf("%v allocations per canary choice", a)
	}
}

func TestCanaryConcurrentRecording(t *testing.T) {
	r, trial := canaryRouter(t, 1, policy.CanaryRollback{MaxFallbackShare: 0.5, Window: time.Minute, MinRequests: 1000}, Options{})
	trial.fail.Store(true)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				d, err := r.Place(context.Background(), &shared.Request{ID: fmt.Sprint(g, "-", i), Role: shared.RoleAggregated, PromptTokens: 4}, Placement{})
				if err != nil {
					t.Error(err)
					return
				}
				r.CanaryTTFT(d, time.Millisecond)
				d.Booking.Release()
			}
		}()
	}
	wg.Wait()
	// 800 decisions, all fallbacks: below min_requests 1000, still active.
	if st := r.Canaries()[0]; !st.Active || st.CandidateDecisions != 800 || st.Fallbacks != 800 || st.Window.Decisions != 800 || st.Window.TTFTs != 800 {
		t.Fatalf("status %+v", st)
	}
}

// BenchmarkCanaryPlace is one selection of a picker-only policy over 4
// workers without a canary, with one (weight 0.5; both sides pick alike),
// and the canary's choice alone.
func BenchmarkCanaryPlace(b *testing.B) {
	run := func(b *testing.B, r *Router) {
		req := &shared.Request{ID: "x", SessionID: "s", Role: shared.RoleAggregated, PromptTokens: 4, BlockSize: 4}
		var bk fleet.Booking
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			req.SessionID = sessionKeys[i&1023]
			d, err := r.Place(context.Background(), req, Placement{Booking: &bk})
			if err != nil {
				b.Fatal(err)
			}
			d.Booking.Release()
		}
	}
	b.Run("no-canary", func(b *testing.B) {
		r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: {Name: "live", PickerName: "pick", Picker: &canaryPick{}}}})
		if err != nil {
			b.Fatal(err)
		}
		for i := range 4 {
			if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
				b.Fatal(err)
			}
		}
		run(b, r)
	})
	b.Run("canary", func(b *testing.B) {
		r, _ := canaryRouter(b, 0.5, policy.CanaryRollback{MaxFallbackShare: 1, Window: time.Minute, MinRequests: 1}, Options{})
		run(b, r)
	})
}

var sessionKeys = func() []string {
	out := make([]string, 1024)
	for i := range out {
		out[i] = fmt.Sprintf("session-%d", i)
	}
	return out
}()
