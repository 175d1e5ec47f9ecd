package builtin

import (
	"context"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// TypeRandom is the type name of the Random picker.
const TypeRandom = "random"

// Random picks a candidate uniformly at random from its own generator.
type Random struct {
	rng *rng
}

// RandomType describes the random picker.
func RandomType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeRandom,
		Kind:   shared.KindPicker,
		Params: []shared.ParamSpec{seedSpec()},
		Doc: "Picks a candidate uniformly at random. Reads no input, so a picker-only policy runs " +
			"on the hosted path.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewRandom(p), nil },
	}
}

// NewRandom returns a random picker; p may hold the seed parameter.
func NewRandom(p shared.Params) *Random { return &Random{rng: newRNG(p)} }

// Inputs returns 0: random reads nothing but the ids.
func (*Random) Inputs() shared.Inputs { return 0 }

// Pick returns a uniform row of c, or shared.ErrNoWorkers when c is empty.
func (r *Random) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	if c.Len() == 0 {
		return -1, shared.ErrNoWorkers
	}
	return r.rng.intn(c.Len()), nil
}

// PickHosted returns a uniform row of v, or shared.ErrNoWorkers when v is
// empty.
func (r *Random) PickHosted(v *hosted.WorkerInputView) (int, error) {
	if v.Len() == 0 {
		return -1, shared.ErrNoWorkers
	}
	return r.rng.intn(v.Len()), nil
}

// Interface guards.
var (
	_ shared.Picker             = (*Random)(nil)
	_ hosted.HostedWorkerPicker = (*Random)(nil)
)
