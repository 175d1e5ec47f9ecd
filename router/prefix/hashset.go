package prefix

import "sync/atomic"

// hashSet is a fixed-size open-addressing set of block hashes (linear
// probing) whose lookups take no lock and allocate nothing: slots are
// atomic words. Writers (add, del) are serialised by the owner's mutex.
// Deletion shifts later entries of a probe run back, so a lookup racing a
// deletion can miss an entry (a belief is allowed to lag) but never finds
// one that is not there. The hash 0 marks an empty slot, so a hash of 0
// is stored as zeroKey.
type hashSet struct {
	slots []atomic.Uint64
	mask  uint64
	n     int
}

// zeroKey stands for the hash 0 (an empty slot is 0).
const zeroKey = 0x9e3779b97f4a7c15

func newHashSet(capacity int) *hashSet {
	size := 16
	for size < 2*capacity {
		size <<= 1
	}
	return &hashSet{slots: make([]atomic.Uint64, size), mask: uint64(size - 1)}
}

func key(h uint64) uint64 {
	if h == 0 {
		return zeroKey
	}
	return h
}

// has reports whether h is in the set. Lock-free.
func (s *hashSet) has(h uint64) bool {
	h = key(h)
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		switch s.slots[i].Load() {
		case h:
			return true
		case 0:
			return false
		}
	}
}

// add inserts h. The owner keeps n below half the slots.
func (s *hashSet) add(h uint64) {
	h = key(h)
	i := h & s.mask
	for ; ; i = (i + 1) & s.mask {
		switch s.slots[i].Load() {
		case h:
			return
		case 0:
			s.slots[i].Store(h)
			s.n++
			return
		}
	}
}

// del removes h, shifting back the entries after it in its probe run
// (Knuth's algorithm R, TAOCP vol. 3, 6.4).
func (s *hashSet) del(h uint64) {
	h = key(h)
	i := h & s.mask
	for {
		v := s.slots[i].Load()
		if v == 0 {
			return
		}
		if v == h {
			break
		}
		i = (i + 1) & s.mask
	}
	s.n--
	for j := (i + 1) & s.mask; ; j = (j + 1) & s.mask {
		v := s.slots[j].Load()
		if v == 0 {
			break
		}
		home := v & s.mask
		// v may move to i when its home is not in the cyclic range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			s.slots[i].Store(v)
			i = j
		}
	}
	s.slots[i].Store(0)
}

// reset empties the set.
func (s *hashSet) reset() {
	for i := range s.slots {
		s.slots[i].Store(0)
	}
	s.n = 0
}

// leading returns how many leading hashes the set holds. Lock-free.
func (s *hashSet) leading(hashes []uint64) int {
	for n, h := range hashes {
		if !s.has(h) {
			return n
		}
	}
	return len(hashes)
}
