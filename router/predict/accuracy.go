package predict

import (
	"math"
	"sync/atomic"
)

// Accuracy is the relative error of the TTFT and TPOT predictions, each a
// histogram of |predicted - observed| / observed.
type Accuracy struct {
	TTFT, TPOT ErrorHistogram
}

// The relative-error histogram's bins are log-spaced: binsPerDecade per
// factor of ten from 10^minDecade (0.1%) to 10^maxDecade (100x), plus one
// bin below and one above. A quantile read from it is exact to within
// one bin: a factor of 10^(1/20) ≈ 1.12.
const (
	binsPerDecade = 20
	minDecade     = -3
	maxDecade     = 2
	nBins         = (maxDecade-minDecade)*binsPerDecade + 2
)

// ErrorHistogram counts relative errors in log-spaced bins; lock-free.
type ErrorHistogram struct {
	n    atomic.Int64
	bins [nBins]atomic.Int64
}

func (h *ErrorHistogram) add(predicted, observed float64) {
	r := math.Abs(predicted-observed) / observed
	if math.IsNaN(r) {
		return
	}
	h.bins[binOf(r)].Add(1)
	h.n.Add(1)
}

func binOf(r float64) int {
	if !(r >= math.Pow(10, minDecade)) {
		return 0
	}
	b := 1 + int(math.Floor((math.Log10(r)-minDecade)*binsPerDecade))
	return min(b, nBins-1)
}

// upper is the upper edge of bin b (the lower for the last, open bin).
func upper(b int) float64 {
	return math.Pow(10, minDecade+float64(min(b, nBins-2))/binsPerDecade)
}

// AddTo adds h's counts to dst (another router replica's, for one
// figure over several). Not atomic as a whole: call it when h is not
// being added to.
func (h *ErrorHistogram) AddTo(dst *ErrorHistogram) {
	for i := range h.bins {
		dst.bins[i].Add(h.bins[i].Load())
	}
	dst.n.Add(h.n.Load())
}

// Count is how many predictions were compared.
func (h *ErrorHistogram) Count() int64 { return h.n.Load() }

// Quantile returns the q-quantile (0 < q <= 1) of the relative error, as
// a fraction (0.12 = 12%): the upper edge of the bin that holds it, so
// it errs high by at most one bin; NaN when nothing was counted.
func (h *ErrorHistogram) Quantile(q float64) float64 {
	var counts [nBins]int64
	var total int64
	for i := range counts {
		counts[i] = h.bins[i].Load()
		total += counts[i]
	}
	if total == 0 {
		return math.NaN()
	}
	rank := int64(math.Ceil(q * float64(total)))
	var seen int64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			return upper(i)
		}
	}
	return upper(nBins - 1)
}
