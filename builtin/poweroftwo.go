package builtin

import (
	"context"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// TypePowerOfTwo is the type name of the PowerOfTwo picker.
const TypePowerOfTwo = "power-of-two"

// PowerOfTwo draws two distinct candidates uniformly at random and picks the
// one with fewer in-flight requests (ACTIVE_REQUESTS); a tie goes to the
// first draw, and a single candidate is returned directly. It reads exactly
// two counts, so it is O(1) in the number of candidates ("the power of two
// choices", Mitzenmacher, IEEE TPDS 2001).
type PowerOfTwo struct {
	rng *rng
}

// PowerOfTwoType describes the power-of-two picker.
func PowerOfTwoType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypePowerOfTwo,
		Kind:   shared.KindPicker,
		Inputs: shared.InputActiveRequests,
		Params: []shared.ParamSpec{seedSpec()},
		Doc: "Draws two distinct candidates uniformly and picks the one with fewer in-flight " +
			"requests (ACTIVE_REQUESTS); ties go to the first draw. O(1) in the number of " +
			"candidates. A picker-only policy runs on the hosted path.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewPowerOfTwo(p), nil },
	}
}

// NewPowerOfTwo returns a power-of-two picker; p may hold the seed
// parameter.
func NewPowerOfTwo(p shared.Params) *PowerOfTwo { return &PowerOfTwo{rng: newRNG(p)} }

// Inputs returns ACTIVE_REQUESTS.
func (*PowerOfTwo) Inputs() shared.Inputs { return shared.InputActiveRequests }

// Pick returns the less loaded of two distinct uniform rows of c. It fails
// with shared.ErrNoWorkers when c is empty and with hosted.ErrNoActiveRequests
// when c has several rows but no ActiveRequests column.
func (p *PowerOfTwo) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	switch {
	case n == 0:
		return -1, shared.ErrNoWorkers
	case n == 1:
		return 0, nil
	case len(c.ActiveRequests) != n:
		return -1, hosted.ErrNoActiveRequests
	}
	a, b := p.draw(n)
	if c.ActiveRequests[b] < c.ActiveRequests[a] {
		return b, nil
	}
	return a, nil
}

// PickHosted is Pick over the view: it reads the counts of the two drawn
// rows only.
func (p *PowerOfTwo) PickHosted(v *hosted.WorkerInputView) (int, error) {
	n := v.Len()
	switch {
	case n == 0:
		return -1, shared.ErrNoWorkers
	case n == 1:
		return 0, nil
	}
	a, b := p.draw(n)
	la, err := v.ActiveRequests(a)
	if err != nil {
		return -1, err
	}
	lb, err := v.ActiveRequests(b)
	if err != nil {
		return -1, err
	}
	if lb < la {
		return b, nil
	}
	return a, nil
}

// draw returns two distinct uniform rows of [0, n), n >= 2: a uniform a,
// then a uniform b among the other n-1 rows.
func (p *PowerOfTwo) draw(n int) (a, b int) {
	g := p.rng.stream()
	a = g.intn(n)
	b = g.intn(n - 1)
	if b >= a {
		b++
	}
	return a, b
}

// Interface guards.
var (
	_ shared.Picker             = (*PowerOfTwo)(nil)
	_ hosted.HostedWorkerPicker = (*PowerOfTwo)(nil)
)
