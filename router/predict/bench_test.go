package predict

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkPredict times one candidate's prediction (both targets, from a
// trained class model): the timed loop is Set.Predict on features already
// built, the work the router adds per candidate to a selection that
// declares LATENCY.
func BenchmarkPredict(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	s := NewSet()
	m := s.Class("w")
	fs := make([]Features, 1024)
	for i := range fs {
		fs[i] = randomFeatures(r)
		smp := Sample{Features: fs[i], Model: m}
		s.ObserveTTFT(&smp, truthTTFT(&fs[i]))
		s.ObserveEnd(&smp, 10, truthTPOT(&fs[i]))
	}
	b.ReportAllocs()
	var sink float64
	i := 0
	for b.Loop() {
		p := s.Predict(m, &fs[i&1023])
		sink += p.TTFT + p.TPOT
		i++
	}
	_ = sink
}

// BenchmarkObserve times learning from one answer: a TTFT and a TPOT
// update of a class model and of the pooled model.
func BenchmarkObserve(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	s := NewSet()
	m := s.Class("w")
	fs := make([]Features, 1024)
	for i := range fs {
		fs[i] = randomFeatures(r)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		f := &fs[i&1023]
		smp := Sample{Features: *f, Model: m}
		s.ObserveTTFT(&smp, truthTTFT(f))
		s.ObserveEnd(&smp, 10, truthTPOT(f))
		i++
	}
}
