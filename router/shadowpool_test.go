package router

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// sleeper picks row 0 after sleeping d (or until its context ends): a
// shadow slower than the live path.
type sleeper struct{ d time.Duration }

func (sleeper) Inputs() shared.Inputs { return 0 }
func (s sleeper) Pick(ctx context.Context, _ *shared.Request, _ *shared.Candidates) (int, error) {
	select {
	case <-time.After(s.d):
		return 0, nil
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// rateTally counts a Router's shadow outcomes by sample rate and result.
type rateTally struct {
	mu sync.Mutex
	by map[float64]map[ShadowResult]int
}

func (t *rateTally) observe(o ShadowOutcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.by[o.SampleRate]
	if m == nil {
		m = map[ShadowResult]int{}
		t.by[o.SampleRate] = m
	}
	m[o.Result]++
}

// totals sums the tally over the rates.
func (t *rateTally) totals() (map[ShadowResult]int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out, n := map[ShadowResult]int{}, 0
	for _, m := range t.by {
		for res, c := range m {
			out[res] += c
			n += c
		}
	}
	return out, n
}

// shadowLoad is the load of the sampling tests: a Router over three
// workers whose round-robin live policy has shadow as its shadow, two
// shadow workers, the default queue (DefaultShadowQueue) and an
// adjustment every 20ms, placed by
// clients goroutines at once (each sleeping 2ms between its requests,
// for a request's time at the engine: the CPUs are not saturated by the
// live path alone) until enough reports true of the tally (60s at
// most). It returns the Router, closed once every outcome was observed,
// the tally, the decisions placed, the logs and the registry.
func shadowLoad(t *testing.T, shadow shared.Picker, enough func(map[ShadowResult]int, int) bool) (*Router, *rateTally, int, string, *prometheus.Registry) {
	t.Helper()
	const clients = 32
	tally := &rateTally{by: map[float64]map[ShadowResult]int{}}
	var logs lockedBuf
	reg := prometheus.NewRegistry()
	live := picker("rr", builtin.NewRoundRobin())
	live.Shadow = picker("trial", shadow)
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: live}, Registerer: reg,
		Shadow: ShadowOptions{MaxInFlight: 2, SampleInterval: 20 * time.Millisecond, Observe: tally.observe,
			Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated}); err != nil {
			t.Fatal(err)
		}
	}
	var stop atomic.Bool
	var placed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				req := request(8, 1)
				req.ID = fmt.Sprintf("req-%d-%d", c, i)
				d, err := r.Place(context.Background(), req, Placement{})
				if err != nil {
					errs <- err
					return
				}
				placed.Add(1)
				d.Booking.Release()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, n := tally.totals()
		if enough(c, n) {
			break
		}
		if time.Now().After(deadline) {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("after 60s: shadow outcomes %v of %d decisions; logs:\n%s", c, placed.Load(), logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for {
		c, n := tally.totals()
		if n == int(placed.Load()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %v shadow outcomes of %d decisions", c, placed.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return r, tally, int(placed.Load()), logs.String(), reg
}

// lockedBuf is a bytes buffer safe for concurrent writes.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// checkCounts checks that every decision has exactly one outcome and that
// the metrics and the view count what Observe saw.
func checkCounts(t *testing.T, r *Router, tally *rateTally, placed int) map[ShadowResult]int {
	t.Helper()
	c, n := tally.totals()
	if n != placed {
		t.Errorf("%d shadow outcomes for %d decisions: %v", n, placed, c)
	}
	asked := c[ShadowAgree] + c[ShadowDisagree] + c[ShadowFailed] + c[ShadowNone]
	if asked+c[ShadowSampledOut]+c[ShadowDropped] != placed {
		t.Errorf("asked %d + sampled out %d + dropped %d != %d decisions", asked, c[ShadowSampledOut], c[ShadowDropped], placed)
	}
	v := r.ShadowView()
	if v.Decisions != int64(placed) {
		t.Errorf("view: %d decisions, placed %d", v.Decisions, placed)
	}
	for _, res := range shadowResults {
		if got := testutil.ToFloat64(r.shadowMetrics.decisions.WithLabelValues("aggregated", "rr", "trial", string(res))); int(got) != c[res] {
			t.Errorf("switchyard_shadow_decisions_total{result=%q} = %v, Observe saw %d", res, got, c[res])
		}
		if v.Results[string(res)] != int64(c[res]) {
			t.Errorf("view: %s = %d, Observe saw %d", res, v.Results[string(res)], c[res])
		}
	}
	if got := testutil.ToFloat64(r.shadowMetrics.rate); got != v.SampleRate || v.SampleRate != 1/float64(v.SampleEvery) {
		t.Errorf("switchyard_shadow_sample_rate = %v, view %v (every %d)", got, v.SampleRate, v.SampleEvery)
	}
	return c
}

// TestShadowSampledWhenSlow: a shadow far slower than the live path (5ms
// a decision, two workers: at most about 400 a second) under 32 clients
// is sampled: every decision is counted once (asked + sampled out +
// dropped == decisions), at each sample rate 1/k the shadow was asked
// about every k-th decision, each rate below 1 was logged, and the
// metrics and /debug view agree with the outcomes.
func TestShadowSampledWhenSlow(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r, tally, placed, logs, _ := shadowLoad(t, sleeper{5 * time.Millisecond}, func(c map[ShadowResult]int, _ int) bool {
		return c[ShadowSampledOut] >= 5000 && c[ShadowAgree]+c[ShadowDisagree] >= 50
	})
	c := checkCounts(t, r, tally, placed)
	if c[ShadowFailed] != 0 || c[ShadowNone] != 0 {
		t.Errorf("outcomes %v: the sleeper never fails", c)
	}
	tally.mu.Lock()
	defer tally.mu.Unlock()
	var changes int
	for rate, m := range tally.by {
		k := math.Round(1 / rate)
		if rate <= 0 || rate > 1 || math.Abs(k*rate-1) > 1e-9 {
			t.Errorf("sample rate %v is not 1/k", rate)
			continue
		}
		n := 0
		for _, v := range m {
			n += v
		}
		asked := n - m[ShadowSampledOut]
		// Every k-th decision: the share is exact but for the decisions
		// of the 32 clients that read k just before it changed.
		if want := float64(n) / k; math.Abs(float64(asked)-want) > 32+2 {
			t.Errorf("at rate 1/%v: asked %d of %d decisions, want %.0f", k, asked, n, want)
		}
		if k > 1 {
			changes++
			if !strings.Contains(logs, fmt.Sprintf("every=%d ", int64(k))) {
				t.Errorf("rate 1/%v never logged:\n%s", k, logs)
			}
		}
	}
	if changes == 0 {
		t.Errorf("never sampled: %v", tally.by)
	}
	if n := strings.Count(logs, "shadow decisions sampled"); n < changes {
		t.Errorf("%d sampling log lines for %d rates below 1:\n%s", n, changes, logs)
	}
	v := r.ShadowView()
	if len(v.Recent) != DefaultShadowRecent || v.Recent[0].Result != string(ShadowAgree) && v.Recent[0].Result != string(ShadowDisagree) ||
		!strings.HasPrefix(v.Recent[0].RequestID, "req-") || v.Recent[0].ShadowWorker == nil || v.Recent[0].ElapsedUS < 5000 {
		t.Errorf("recent: %d, newest %+v", len(v.Recent), v.Recent[0])
	}
	if v.Latency.Samples == 0 || v.Latency.P50us < 5000 || v.Latency.P99us < v.Latency.P50us {
		t.Errorf("latency %+v: the sleeper takes 5ms at least", v.Latency)
	}
}

// TestShadowFastNotSampled: a shadow as fast as the live path, under the
// same load, is asked about every decision: none sampled out, none
// dropped, the rate never below 1 and never logged.
func TestShadowFastNotSampled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r, tally, placed, logs, _ := shadowLoad(t, firstRow{}, func(_ map[ShadowResult]int, n int) bool { return n >= 20000 })
	c := checkCounts(t, r, tally, placed)
	if c[ShadowSampledOut] != 0 || c[ShadowDropped] != 0 || c[ShadowAgree]+c[ShadowDisagree] != placed {
		t.Errorf("outcomes %v of %d decisions; logs:\n%s", c, placed, logs)
	}
	if len(tally.by) != 1 || tally.by[1] == nil {
		t.Errorf("sample rates %v, want 1 only", tally.by)
	}
	if strings.Contains(logs, "sampled") {
		t.Errorf("logs:\n%s", logs)
	}
	// Round-robin over three workers, the shadow always the first: a third
	// agree.
	if a := c[ShadowAgree]; a < placed/3-1 || a > placed/3+1 {
		t.Errorf("%d of %d agree, want a third", a, placed)
	}
	if v := r.ShadowView(); v.Agreement < 0.33 || v.Agreement > 0.34 || v.Failures != 0 {
		t.Errorf("view agreement %v failures %d", v.Agreement, v.Failures)
	}
}
