package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestPosTableMatchesMap: random inserts, flag changes and deletes on a
// small table (long probe runs that wrap around) agree with a Go map.
func TestPosTableMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := newPosTable(16)
	type entry struct {
		slot  int32
		flags uint64
	}
	want := map[uint64]entry{}
	// Hashes differing only in their low two bits are one key; 0 and
	// zeroKey's top bits are too: keys are multiples of 4, and 0 is one.
	key := func() uint64 { return uint64(r.IntN(40)) * 4 << (r.IntN(2) * 40) }
	for step := range 20000 {
		h := key()
		e, ok := want[h]
		switch {
		case ok && r.IntN(3) == 0:
			s.del(s.find(h))
			delete(want, h)
		case ok:
			f := uint64(1 + r.IntN(2))
			on := r.IntN(2) == 0
			s.setFlag(s.find(h|uint64(r.IntN(4))), f, on)
			if on {
				e.flags |= f
			} else {
				e.flags &^= f
			}
			want[h] = e
		case !s.full():
			f := uint64(r.IntN(4))
			s.insert(h, int32(step), f)
			want[h] = entry{slot: int32(step), flags: f}
		}
		held := [2]int{}
		for _, e := range want {
			held[0] += int(e.flags & 1)
			held[1] += int(e.flags >> 1)
		}
		if s.n != len(want) || s.held != held {
			t.Fatalf("step %d: n %d, held %v; want %d, %v", step, s.n, s.held, len(want), held)
		}
		for k := uint64(0); k < 40*4; k += 4 {
			for _, hi := range []uint64{0, 40} {
				h := k << hi
				e, ok := want[h]
				if j := s.find(h); (j >= 0) != ok || ok && s.vals[j] != e.slot {
					t.Fatalf("step %d: find(%x) = %d, want present %v, slot %d", step, h, j, ok, e.slot)
				}
				if s.has(h, flagGPU) != (e.flags&flagGPU != 0) || s.has(h, flagCPU) != (e.flags&flagCPU != 0) {
					t.Fatalf("step %d: has(%x) disagrees with flags %b", step, h, e.flags)
				}
			}
		}
	}
}

// TestEngTableMatchesMap: random puts and deletes, with growth, agree with
// a Go map, key 0 included; each visits every entry once while deleting.
func TestEngTableMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := newEngTable(minTableSize)
	want := map[uint64]uint64{}
	for step := range 20000 {
		k := uint64(r.IntN(300))
		if r.IntN(3) == 0 {
			s.del(k)
			delete(want, k)
		} else {
			s.put(k, uint64(step))
			want[k] = uint64(step)
		}
		if s.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, s.len(), len(want))
		}
		if step%97 == 0 {
			for k := uint64(0); k < 300; k++ {
				v, ok := s.get(k)
				w, wok := want[k]
				if ok != wok || v != w {
					t.Fatalf("step %d: get(%d) = %d, %v; want %d, %v", step, k, v, ok, w, wok)
				}
			}
		}
		if step%1000 == 999 { // drop the odd keys while walking
			seen := map[uint64]int{}
			s.each(func(k, v uint64) {
				seen[k]++
				if want[k] != v {
					t.Fatalf("step %d: each gave %d: %d, want %d", step, k, v, want[k])
				}
				if k%2 == 1 {
					s.del(k)
				}
			})
			for k := range want {
				if seen[k] != 1 {
					t.Fatalf("step %d: each visited %d %d times", step, k, seen[k])
				}
				if k%2 == 1 {
					delete(want, k)
				}
			}
		}
	}
}
