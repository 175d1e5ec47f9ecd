package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestHashSetMatchesMap: random adds and deletes on a small table (long
// probe runs that wrap around) agree with a Go map.
func TestHashSetMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := newHashSet(8) // 16 slots
	want := map[uint64]bool{}
	for step := range 20000 {
		h := uint64(r.IntN(40)) * 0x10 // shared low bits: collisions
		if r.IntN(3) == 0 {
			h = uint64(r.IntN(40))
		}
		if want[h] || len(want) >= 8 {
			s.del(h)
			delete(want, h)
		} else {
			s.add(h)
			want[h] = true
		}
		if s.n != len(want) {
			t.Fatalf("step %d: n %d, want %d", step, s.n, len(want))
		}
		for k := uint64(0); k < 40*0x10; k++ {
			if s.has(k) != want[k] {
				t.Fatalf("step %d: has(%d) = %v, want %v", step, k, s.has(k), want[k])
			}
		}
	}
}
