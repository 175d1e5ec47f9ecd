package builtin

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/bits"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/shared"
)

// ParamSeed is the name of the optional Int parameter that fixes a
// randomised component's draws.
const ParamSeed = "seed"

// seedSpec is the schema entry of the seed parameter shared by every
// randomised type.
func seedSpec() shared.ParamSpec {
	return shared.ParamSpec{
		Name: ParamSeed,
		Type: shared.Int,
		Doc: "Seed of this instance's random generator (any int). When set, draws repeat exactly " +
			"across runs for a single-threaded caller such as replay; when unset (the default) the " +
			"generator is seeded once from crypto/rand.",
	}
}

// golden is SplitMix64's increment, 2^64 / phi rounded to odd.
const golden = 0x9e3779b97f4a7c15

// rng is a lock-free SplitMix64 generator (Steele, Lea and Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014): each draw is one
// atomic add of golden to the state, then the SplitMix64 finaliser. Every
// concurrent caller gets a distinct state value, so draws never repeat
// within a period of 2^64; a single-threaded caller sees the exact SplitMix64
// sequence of the seed.
type rng struct {
	state atomic.Uint64
}

// newRNG returns a generator seeded from the seed parameter when p has it,
// else from crypto/rand.
func newRNG(p shared.Params) *rng {
	r := &rng{}
	if p.Has(ParamSeed) {
		r.state.Store(uint64(p.Int(ParamSeed, 0)))
		return r
	}
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails since Go 1.24; it crashes the program instead
	r.state.Store(binary.LittleEndian.Uint64(b[:]))
	return r
}

// next returns 64 uniform bits.
func (r *rng) next() uint64 { return fmix(r.state.Add(golden)) }

// intn returns a uniform int in [0, n); n must be > 0.
func (r *rng) intn(n int) int {
	un := uint64(n)
	hi, lo := bits.Mul64(r.next(), un)
	if lo < un { // Lemire's rejection step, rarely taken
		t := -un % un
		for lo < t {
			hi, lo = bits.Mul64(r.next(), un)
		}
	}
	return int(hi)
}

// stream returns a non-atomic generator seeded by one draw of r, for a
// single call that needs many draws (a reservoir scan): one atomic add per
// call instead of one per draw, and still deterministic under a seed.
func (r *rng) stream() stream { return stream{s: r.next()} }

// stream is a plain SplitMix64 generator owned by one goroutine.
type stream struct{ s uint64 }

// next returns 64 uniform bits.
func (g *stream) next() uint64 {
	g.s += golden
	return fmix(g.s)
}

// intn returns a uniform int in [0, n) by Lemire's method ("Fast random
// integer generation in an interval", ACM TOMACS 2019); n must be > 0.
func (g *stream) intn(n int) int {
	un := uint64(n)
	hi, lo := bits.Mul64(g.next(), un)
	if lo < un {
		t := -un % un
		for lo < t {
			hi, lo = bits.Mul64(g.next(), un)
		}
	}
	return int(hi)
}

// float64 returns a uniform float64 in [0, 1) with 53 random bits.
func (g *stream) float64() float64 { return float64(g.next()>>11) * 0x1p-53 }

// fmix is the SplitMix64 output function (a bijection of uint64, from
// MurmurHash3's fmix64 with Stafford's "Mix13" constants).
func fmix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// reservoirWinner returns which of k tied rows a uniform reservoir scan
// over g would keep, as an ordinal in [1, k], without drawing for every
// tie. The scan it stands for keeps the first tie and lets tie j (j >= 2)
// replace the kept one when g.intn(j) == 0, tie j taking g's draw number
// skip + j - 2 (0-based; skip draws went to earlier ties that a lower
// value later superseded). SplitMix64 is counter-based (draw m is
// fmix(s + (m+1)·golden)), so any draw can be computed directly: the kept
// tie is the last j that replaces, found by testing j = k, k-1, ... down
// to the first that does, k/2 draws on average instead of k-1, all
// independent of each other and of the rows. It omits Lemire's rejection
// step, so it agrees with that scan except when one of those draws falls
// in the rejection zone (probability below j·2^-64 per draw, under
// 2.3e-13 per scan of 4,096 ties) and is then uniform to within j·2^-64.
// g is not advanced.
func (g stream) reservoirWinner(k, skip int) int {
	for j := k; j >= 2; j-- {
		if hi, _ := bits.Mul64(fmix(g.s+uint64(skip+j-1)*golden), uint64(j)); hi == 0 {
			return j
		}
	}
	return 1
}
