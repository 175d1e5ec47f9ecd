package predict

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// truth is a made-up engine whose latencies are exactly linear in the
// features: the fit must recover it.
func truthTTFT(f *Features) float64 {
	return 0.02 + 0.0001*(f.Prefill+f.Uncached) + 0.000002*f.Active*(f.Prefill+f.Uncached)
}

func truthTPOT(f *Features) float64 { return 0.006 + 0.0002*f.Active + 0.00000005*f.Context }

func randomFeatures(r *rand.Rand) Features {
	p := float64(100 + r.IntN(4000))
	return Features{
		Prompt: p, Uncached: p * r.Float64(), Output: float64(50 + r.IntN(500)),
		Prefill: float64(r.IntN(20000)), Context: float64(r.IntN(300000)), Active: float64(r.IntN(64)),
	}
}

func TestModelRecoversLinearTruth(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := NewSet()
	m := s.Class("gpu-a")
	for range 500 {
		f := randomFeatures(r)
		smp := Sample{Features: f, Model: m}
		s.ObserveTTFT(&smp, truthTTFT(&f))
		s.ObserveEnd(&smp, 100, truthTPOT(&f))
	}
	for range 50 {
		f := randomFeatures(r)
		p := s.Predict(m, &f)
		if !p.Trained {
			t.Fatal("not trained after 500 observations")
		}
		if rel := math.Abs(p.TTFT-truthTTFT(&f)) / truthTTFT(&f); rel > 1e-3 {
			t.Errorf("TTFT %v for %+v, want %v (relative error %v)", p.TTFT, f, truthTTFT(&f), rel)
		}
		if rel := math.Abs(p.TPOT-truthTPOT(&f)) / truthTPOT(&f); rel > 1e-3 {
			t.Errorf("TPOT %v, want %v (relative error %v)", p.TPOT, truthTPOT(&f), rel)
		}
	}
	if got, want := s.ExpectedOutput(), 100.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("ExpectedOutput = %v, want %v", got, want)
	}
}

// A class predicts from the pooled model until it heard MinObservations
// answers; a class twice as slow then predicts twice the latency.
func TestClassesSeparateMixedHardware(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := NewSet()
	fast, slow := s.Class("fast"), s.Class("slow")
	f0 := randomFeatures(r)
	if p := s.Predict(fast, &f0); p.Trained || p.TTFT != 0 || p.TPOT != 0 {
		t.Fatalf("untrained prediction %+v, want zero and not trained", p)
	}
	// The fast class hears enough to be used; the slow class hears less
	// than MinObservations, so it still predicts from the pooled model.
	for i := range 400 {
		f := randomFeatures(r)
		m, k := fast, 1.0
		if i%2 == 1 {
			m, k = slow, 2.0
		}
		if m == slow && i > 2*(MinObservations-1) {
			m = fast
			k = 1
		}
		smp := Sample{Features: f, Model: m}
		s.ObserveTTFT(&smp, k*truthTTFT(&f))
	}
	if n, _ := slow.Observations(); n != MinObservations-1 {
		t.Fatalf("slow heard %d, want %d", n, MinObservations-1)
	}
	f := randomFeatures(r)
	pf, ps := s.Predict(fast, &f), s.Predict(slow, &f)
	if rel := math.Abs(pf.TTFT-truthTTFT(&f)) / truthTTFT(&f); rel > 0.01 {
		t.Errorf("fast class TTFT %v, want %v", pf.TTFT, truthTTFT(&f))
	}
	pooled := s.Predict(nil, &f)
	if ps.TTFT != pooled.TTFT {
		t.Errorf("slow class (under MinObservations) predicted %v, want the pooled %v", ps.TTFT, pooled.TTFT)
	}
	// One more answer at twice the latency: ...and then a few more, so its own fit is used.
	for range 200 {
		f := randomFeatures(r)
		smp := Sample{Features: f, Model: slow}
		slow.ObserveTTFT(&smp.Features, 2*truthTTFT(&f))
	}
	ps = s.Predict(slow, &f)
	if rel := math.Abs(ps.TTFT-2*truthTTFT(&f)) / (2 * truthTTFT(&f)); rel > 0.01 {
		t.Errorf("slow class TTFT %v, want %v (twice the fast)", ps.TTFT, 2*truthTTFT(&f))
	}
}

func TestObserveIgnoresBadValues(t *testing.T) {
	s := NewSet()
	m := s.Class("w")
	f := Features{Prompt: 100, Uncached: 100}
	smp := Sample{Features: f, Model: m}
	for _, v := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		s.ObserveTTFT(&smp, v)
		s.ObserveEnd(&smp, 0, v)
	}
	if a, b := m.Observations(); a != 0 || b != 0 {
		t.Fatalf("observations %d, %d after bad values, want 0, 0", a, b)
	}
	if s.ExpectedOutput() != 0 {
		t.Fatalf("ExpectedOutput %v, want 0", s.ExpectedOutput())
	}
}

func TestErrorHistogramQuantiles(t *testing.T) {
	var h ErrorHistogram
	if !math.IsNaN(h.Quantile(0.5)) {
		t.Fatal("empty histogram quantile not NaN")
	}
	// 100 errors: 1%, 2%, ..., 100%.
	for i := 1; i <= 100; i++ {
		h.add(1+float64(i)/100, 1)
	}
	if h.Count() != 100 {
		t.Fatalf("Count %d, want 100", h.Count())
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.5}, {0.9, 0.9}, {0.1, 0.1}} {
		got := h.Quantile(c.q)
		// Within one bin above: a factor of 10^(1/20).
		if got < c.want*0.999 || got > c.want*math.Pow(10, 1.0/binsPerDecade)*1.001 {
			t.Errorf("Quantile(%v) = %v, want %v to one bin above", c.q, got, c.want)
		}
	}
	var z ErrorHistogram
	z.add(1, 1)    // exact: below the first edge
	z.add(1000, 1) // 999x: the open top bin
	if got := z.Quantile(0.5); got != 1e-3 {
		t.Errorf("exact prediction's bin edge %v, want 0.001", got)
	}
	if got := z.Quantile(1); got != 100 {
		t.Errorf("top bin %v, want 100", got)
	}
}

// Predictions run while observations update the weights: the race
// detector checks the seqlock, and every prediction is one of the fits'
// (finite, >= 0).
func TestConcurrentPredictObserve(t *testing.T) {
	s := NewSet()
	m := s.Class("w")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for range 2000 {
				f := randomFeatures(r)
				if g%2 == 0 {
					smp := Sample{Features: f, Model: m}
					s.ObserveTTFT(&smp, truthTTFT(&f))
					s.ObserveEnd(&smp, 10, truthTPOT(&f))
					continue
				}
				p := s.Predict(m, &f)
				if math.IsNaN(p.TTFT) || p.TTFT < 0 || math.IsNaN(p.TPOT) || p.TPOT < 0 {
					t.Errorf("prediction %+v", p)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// The folded prediction equals the fit's dot product on scaled features.
func TestFoldedScalesMatchFeatures(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var w weights
	var raw [2]Vector
	for i := range D {
		raw[0][i], raw[1][i] = r.Float64(), r.Float64()
	}
	w.ttft, w.tpot = scaled(raw[0], ttftScales), scaled(raw[1], tpotScales)
	for range 20 {
		f := randomFeatures(r)
		if got, want := w.predictTTFT(&f), dot(raw[0], f.ttft()); math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("TTFT folded %v, unfolded %v", got, want)
		}
		if got, want := w.predictTPOT(&f), dot(raw[1], f.tpot()); math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("TPOT folded %v, unfolded %v", got, want)
		}
	}
}

// A feature that is always 0 (here the KV overflow, with no capacity
// known) is never excited: without a bound on P the forgetting winds it
// up until it overflows (about 700,000 updates) and the fit stops
// learning. Two million updates later the model still follows a change.
func TestNoCovarianceWindup(t *testing.T) {
	m := NewModel()
	f := Features{Prompt: 1000, Uncached: 500, Prefill: 2000, Active: 10, Context: 50000}
	for range 2_000_000 {
		m.ObserveTTFT(&f, 0.2)
	}
	for i := range D {
		for j := range D {
			if v := m.ttft.p[i][j]; math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > D*initialP {
				t.Fatalf("P[%d][%d] = %v after 2e6 updates", i, j, v)
			}
		}
	}
	// The engine slows down: the fit must follow.
	for range 5000 {
		m.ObserveTTFT(&f, 0.4)
	}
	s := &Set{pooled: NewModel()}
	if got := s.Predict(m, &f).TTFT; math.Abs(got-0.4) > 0.01 {
		t.Fatalf("after the change the model predicts %v, want about 0.4", got)
	}
}
