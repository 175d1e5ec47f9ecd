package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestHashPosModel runs random puts, gets and deletes against a Go map
// and checks every answer and the size after each step: small key spaces
// (long probe runs, deletions inside them, the zero hash) and a growing
// one.
func TestHashPosModel(t *testing.T) {
	for _, keys := range []uint64{4, 64, 1000, 1 << 20} {
		rng := rand.New(rand.NewPCG(keys, 7))
		hp := newHashPos()
		model := map[uint64]int32{}
		for step := range 200_000 {
			h := rng.Uint64N(keys) // 0 included
			switch rng.IntN(3) {
			case 0:
				v := int32(rng.IntN(1 << 20))
				hp.put(h, v)
				model[h] = v
			case 1:
				hp.del(h)
				delete(model, h)
			}
			got, ok := hp.get(h)
			want, wok := model[h]
			if ok != wok || got != want {
				t.Fatalf("keys %d, step %d: get(%d) = %d, %v; want %d, %v", keys, step, h, got, ok, want, wok)
			}
			if hp.len() != len(model) {
				t.Fatalf("keys %d, step %d: len %d, want %d", keys, step, hp.len(), len(model))
			}
		}
		for h, want := range model {
			if got, ok := hp.get(h); !ok || got != want {
				t.Fatalf("keys %d: get(%d) = %d, %v at the end; want %d", keys, h, got, ok, want)
			}
		}
		if 2*hp.n > len(hp.keys) {
			t.Fatalf("keys %d: %d entries in %d slots, over half full", keys, hp.n, len(hp.keys))
		}
	}
}
