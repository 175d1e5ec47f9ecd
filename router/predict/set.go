package predict

import (
	"math"
	"sync"
	"sync/atomic"
)

// Set is a router's models: one per worker class, plus the pooled model
// that hears every answer and predicts for a class until it has heard
// MinObservations. It also learns the mean output length and keeps the
// predictions' accuracy. Safe for concurrent use.
type Set struct {
	mu      sync.Mutex
	classes map[string]*Model

	pooled *Model
	// output is the mean output tokens of completed answers, an
	// exponentially weighted mean (float64 bits) with the models'
	// forgetting; 0 before the first.
	output atomic.Uint64

	// Accuracy is the relative error of the predictions made for the
	// workers that served the requests, against what they observed.
	Accuracy Accuracy
}

// NewSet returns a Set with no class and untrained models.
func NewSet() *Set {
	return &Set{classes: make(map[string]*Model), pooled: NewModel()}
}

// Class returns the model of the class key, creating it on first use:
// the router keys a worker by its switchyard.io/class label
// (shared.LabelClass), or by a key unique to the worker (its name) when
// it has none. Call it when a worker joins, not per request.
func (s *Set) Class(key string) *Model {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.classes[key]
	if !ok {
		m = NewModel()
		s.classes[key] = m
	}
	return m
}

// Classes returns how many class models the Set holds.
func (s *Set) Classes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.classes)
}

// Predict predicts f on a worker of class model m (nil: the pooled
// model): from m once it has heard MinObservations answers of a target,
// else from the pooled model; both 0 and Trained false when neither has
// heard any. Lock-free, no allocation.
func (s *Set) Predict(m *Model, f *Features) Prediction {
	pooled := s.pooled.cur.Load()
	tt, tp := pooled, pooled
	if m != nil {
		if w := m.cur.Load(); w.nTTFT >= MinObservations {
			tt = w
			if w.nTPOT >= MinObservations {
				tp = w
			}
		} else if w.nTPOT >= MinObservations {
			tp = w
		}
	}
	var p Prediction
	if tt.nTTFT > 0 {
		p.TTFT, p.Trained = tt.predictTTFT(f), true
	}
	if tp.nTPOT > 0 {
		p.TPOT, p.Trained = tp.predictTPOT(f), true
	}
	return p
}

// ExpectedOutput is the learned mean output tokens of a completed answer,
// the expected output length of a request that sets no max_tokens; 0
// before the first answer.
func (s *Set) ExpectedOutput() float64 { return math.Float64frombits(s.output.Load()) }

// Sample is what a decision keeps to learn from its answer: the features
// of the chosen worker at decision time, its class model and what was
// predicted for it.
type Sample struct {
	Features  Features
	Model     *Model
	Predicted Prediction
}

// ObserveTTFT learns from a first token seconds after dispatch, and counts
// the prediction's error when one was made.
func (s *Set) ObserveTTFT(smp *Sample, seconds float64) {
	if !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	if smp.Predicted.Trained {
		s.Accuracy.TTFT.add(smp.Predicted.TTFT, seconds)
	}
	if smp.Model != nil {
		smp.Model.ObserveTTFT(&smp.Features, seconds)
	}
	s.pooled.ObserveTTFT(&smp.Features, seconds)
}

// ObserveEnd learns from a completed answer of outputTokens generated
// tokens whose tokens after the first came gap seconds apart on average
// (the caller computes (end - first token) / (outputTokens - 1); pass
// gap 0 for an answer of fewer than two tokens, which teaches only the
// output length).
func (s *Set) ObserveEnd(smp *Sample, outputTokens int64, gap float64) {
	if outputTokens > 0 {
		for {
			old := s.output.Load()
			mean := math.Float64frombits(old)
			next := float64(outputTokens)
			if old != 0 {
				next = Forgetting*mean + (1-Forgetting)*next
			}
			if s.output.CompareAndSwap(old, math.Float64bits(next)) {
				break
			}
		}
	}
	if !(gap > 0) || math.IsInf(gap, 0) {
		return
	}
	if smp.Predicted.Trained {
		s.Accuracy.TPOT.add(smp.Predicted.TPOT, gap)
	}
	if smp.Model != nil {
		smp.Model.ObserveTPOT(&smp.Features, gap)
	}
	s.pooled.ObserveTPOT(&smp.Features, gap)
}
