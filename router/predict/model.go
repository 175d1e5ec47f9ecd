package predict

import (
	"math"
	"sync"
	"sync/atomic"
)

// Features is what the router knows of one request on one candidate at
// decision time. Token counts are tokens (>= 0); Active is requests.
type Features struct {
	// Uncached is the request's prompt tokens the candidate does not hold
	// (its prefill work there).
	Uncached float64
	// Prompt is the request's prompt tokens.
	Prompt float64
	// Output is the request's expected output tokens: its max_tokens, or
	// the learned mean (Set.ExpectedOutput).
	Output float64
	// Prefill is the candidate's booked prefill tokens not yet prefilled
	// (shared.Load.ActivePrefillTokens): work ahead of this request.
	Prefill float64
	// Context is the candidate's booked KV tokens (decode blocks times the
	// block size): what its decodes read every step.
	Context float64
	// Active is the candidate's requests in flight: its batch.
	Active float64
	// Capacity is the candidate's KV capacity in tokens; 0 when unknown.
	// Past it the engine holds the batch at what fits and queues the
	// rest.
	Capacity float64
}

// resident is the part of Context that fits the candidate's KV cache,
// and running the requests of Active that run rather than wait: Active
// scaled by Capacity / Context once the context exceeds the capacity.
// Without a known capacity, all of them.
func (f *Features) resident() (resident, running float64) {
	if f.Capacity <= 0 || f.Context <= f.Capacity {
		return f.Context, f.Active
	}
	return f.Capacity, f.Active * f.Capacity / f.Context
}

// overflow is the KV, in tokens, the candidate must free before this
// request's prompt fits: booked context, booked prefill and the prompt
// beyond the capacity; 0 without a known capacity.
func (f *Features) overflow() float64 {
	if f.Capacity <= 0 {
		return 0
	}
	return max(f.Context+f.Prefill+f.Prompt-f.Capacity, 0)
}

// D is the number of features of each model.
const D = 6

// Vector is one model's feature vector or weights.
type Vector [D]float64

// Scales of the features, chosen so that each is of order one at a
// typical load (thousands of prefill tokens, tens of requests, hundreds of
// thousands of KV tokens): RLS is scale-invariant in exact arithmetic, but
// its initial P = I/δ is not, and neither is float64.
const (
	perKTok   = 1e-3
	perHReq   = 1e-2
	perHKTok  = 1e-5
	perKTokSq = 1e-6
)

// ttft is the TTFT feature vector: a constant (the engine's and the
// network's fixed cost); the tokens to prefill before and including this
// request (chunked prefill drains them at the engine's token rate); that
// times the batch (each step of that prefill also runs the running
// decodes); the request's own uncached tokens times its prompt (causal
// attention is quadratic in the prompt); the batch alone (the step it
// arrives in is not its own); the KV overflow (a full cache admits the
// request only as running answers end and free theirs).
func (f *Features) ttft() Vector {
	work := (f.Prefill + f.Uncached) * perKTok
	return Vector{1, work, work * f.Active * perHReq, f.Uncached * f.Prompt * perKTokSq, f.Active * perHReq, f.overflow() * perHKTok}
}

// tpot is the TPOT feature vector: a constant (the weight-read floor of a
// step); the running batch (per-sequence cost); the KV it reads (decode
// attention is memory-bound, linear in resident context); the booked
// prefill (chunks of other requests' prompts share the decode steps);
// this request's own mean context over its answer; the requests in
// flight (those waiting delay this one's admission and preempt it).
func (f *Features) tpot() Vector {
	resident, running := f.resident()
	return Vector{1, running * perHReq, resident * perHKTok, f.Prefill * perKTok, (f.Prompt + f.Output/2) * perHKTok, f.Active * perHReq}
}

// Prediction is one candidate's predicted latency, in seconds.
type Prediction struct {
	TTFT, TPOT float64
	// Trained is false when no model of the candidate has heard an answer:
	// both predictions are then 0.
	Trained bool
}

// Forgetting is RLS's forgetting factor λ: an observation's weight halves
// after ln 2 / (1 - λ) ≈ 693 later ones, so a model follows a fleet
// whose traffic changes within minutes while averaging over hundreds of
// answers.
const Forgetting = 0.999

// initialP is the diagonal of RLS's initial inverse correlation matrix
// (P = I/δ with δ = 1e-2): large, so the first observations dominate the
// zero prior (Haykin, section 10.3, on the choice of δ).
const initialP = 100

// MinObservations is how many answers a class model hears before its
// predictions replace the pooled model's: a few times D, so the fit is
// determined.
const MinObservations = 4 * D

// rls is one recursive least-squares fit, guarded by the owning Model's
// mutex.
type rls struct {
	w Vector
	n int64 // observations heard
	p [D][D]float64
}

func (r *rls) init() {
	for i := range D {
		r.p[i][i] = initialP
	}
}

// update folds in one observation y > 0 of x, weighted by 1/y² (the
// relative-error fit): it regresses 1 on x/y. It reports false, changing
// nothing, when the update would not be finite.
func (r *rls) update(x Vector, y float64) bool {
	for i := range D {
		x[i] /= y
	}
	// k = P x / (λ + xᵀ P x); w += k (1 - wᵀx); P = (P - k xᵀ P) / λ.
	var px Vector
	for i := range D {
		for j := range D {
			px[i] += r.p[i][j] * x[j]
		}
	}
	den := Forgetting
	for i := range D {
		den += x[i] * px[i]
	}
	if !(den > 0) || math.IsInf(den, 0) {
		return false
	}
	e := 1 - dot(r.w, x)
	var nw Vector
	for i := range D {
		nw[i] = r.w[i] + px[i]/den*e
		if math.IsNaN(nw[i]) || math.IsInf(nw[i], 0) {
			return false
		}
	}
	// P is symmetric: P - (Px)(Px)ᵀ/den, divided by λ.
	for i := range D {
		for j := range D {
			r.p[i][j] = (r.p[i][j] - px[i]*px[j]/den) / Forgetting
		}
	}
	// Against covariance wind-up: a feature that stays 0 (an unknown
	// capacity, an idle fleet) is never excited, so the forgetting
	// divides its part of P by λ at every update without bound and,
	// after about 700,000 answers, overflows it and freezes the fit. A
	// diagonal entry past its initial value is scaled back with its row
	// and column (P ← S P S for a positive diagonal S keeps P positive
	// definite), which leaves the excited directions' gains alone
	// (bounding P: Åström and Wittenmark, Adaptive Control, 2nd ed.,
	// section 11.2).
	for i := range D {
		if d := r.p[i][i]; d > initialP {
			k := math.Sqrt(initialP / d)
			for j := range D {
				r.p[i][j] *= k
				r.p[j][i] *= k
			}
		}
	}
	r.w = nw
	r.n++
	return true
}

// weights is one published state of a Model: immutable, so a prediction
// reads it with one atomic load and never sees half of an update. ttft and
// tpot are the fits' weights with the feature scales folded in (see
// Features.ttft and Features.tpot), so a prediction multiplies raw
// counts.
type weights struct {
	ttft, tpot   Vector
	nTTFT, nTPOT int64
}

// predictTTFT is w's TTFT prediction of f, >= 0: the dot product of
// Features.ttft with the fit's weights, written out with the scales
// folded into the weights.
func (w *weights) predictTTFT(f *Features) float64 {
	work := f.Prefill + f.Uncached
	t := w.ttft[0] + w.ttft[1]*work + w.ttft[2]*work*f.Active + w.ttft[3]*f.Uncached*f.Prompt + w.ttft[4]*f.Active + w.ttft[5]*f.overflow()
	return max(t, 0)
}

// predictTPOT is w's TPOT prediction of f, >= 0 (Features.tpot, folded).
func (w *weights) predictTPOT(f *Features) float64 {
	resident, running := f.resident()
	t := w.tpot[0] + w.tpot[1]*running + w.tpot[2]*resident + w.tpot[3]*f.Prefill + w.tpot[4]*(f.Prompt+f.Output/2) + w.tpot[5]*f.Active
	return max(t, 0)
}

// ttftScales and tpotScales are each feature's scale in Features.ttft and
// Features.tpot: a weight times its scale applies to the raw count.
var (
	ttftScales = Vector{1, perKTok, perKTok * perHReq, perKTokSq, perHReq, perHKTok}
	tpotScales = Vector{1, perHReq, perHKTok, perKTok, perHKTok, perHReq}
)

func scaled(w, s Vector) (out Vector) {
	for i := range D {
		out[i] = w[i] * s[i]
	}
	return out
}

func dot(w, x Vector) float64 {
	var s float64
	for i := range D {
		s += w[i] * x[i]
	}
	return s
}

// Model is one worker class's TTFT and TPOT fits. Safe for concurrent
// use: a prediction reads the published weights with one atomic load;
// Observe serialises on the model's mutex and publishes a new copy (one
// 112-byte allocation per answer, none per prediction).
type Model struct {
	cur        atomic.Pointer[weights]
	mu         sync.Mutex
	ttft, tpot rls
}

// NewModel returns an untrained model.
func NewModel() *Model {
	m := &Model{}
	m.ttft.init()
	m.tpot.init()
	m.cur.Store(&weights{})
	return m
}

// Observations returns how many TTFT and TPOT observations the model heard.
func (m *Model) Observations() (ttft, tpot int64) {
	w := m.cur.Load()
	return w.nTTFT, w.nTPOT
}

// publishLocked publishes the fits' weights; m.mu is held.
func (m *Model) publishLocked() {
	m.cur.Store(&weights{ttft: scaled(m.ttft.w, ttftScales), tpot: scaled(m.tpot.w, tpotScales), nTTFT: m.ttft.n, nTPOT: m.tpot.n})
}

// ObserveTTFT learns that a request with features f (as they were at its
// decision) saw its first token seconds after dispatch. Values that are
// not finite and > 0 are ignored.
func (m *Model) ObserveTTFT(f *Features, seconds float64) {
	if !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	m.mu.Lock()
	if m.ttft.update(f.ttft(), seconds) {
		m.publishLocked()
	}
	m.mu.Unlock()
}

// ObserveTPOT learns that a request with features f saw a mean of seconds
// between its output tokens after the first. Values that are not finite
// and > 0 are ignored.
func (m *Model) ObserveTPOT(f *Features, seconds float64) {
	if !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	m.mu.Lock()
	if m.tpot.update(f.tpot(), seconds) {
		m.publishLocked()
	}
	m.mu.Unlock()
}
