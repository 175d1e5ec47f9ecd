package prefix

import (
	"math/rand/v2"
	"sync/atomic"
)

// The precise index's two hash tables: open addressing with linear
// probing, at most half full, backward-shift deletion (Knuth's algorithm
// R, TAOCP vol. 3, 6.4), so no tombstones build up. A key's home slot is
// a seeded mix of it (SplitMix64's finaliser over key ^ seed, the seed
// drawn per table from the runtime's random source): keys come from
// outside (engine hashes), and without the seed a sender cannot make
// them collide into long probe runs. Go maps do the same job about 1.7
// times slower here (one map is probed to look up and again to insert,
// and the index needs one lookup-or-insert per stored block), which is
// what made a million-block snapshot miss its budget.

// mix is SplitMix64's finaliser (a bijection).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// minTableSize is a table's first size, in slots.
const minTableSize = 64

// tableSize is the slots of a posTable for capacity entries: the least
// power of two >= minTableSize and >= 2·capacity.
func tableSize(capacity int) int {
	size := minTableSize
	for size < 2*capacity {
		size <<= 1
	}
	return size
}

// Flags a posTable key word carries in its low two bits.
const (
	flagGPU = 1 // held on the GPU tier
	flagCPU = 2 // held on the CPU tier
	flags   = flagGPU | flagCPU
)

// posTable maps a router hash to its slot in the precise index, and says
// which tiers hold the block. Selections read it without locking or
// allocating: a key word is the hash's top 62 bits and the two tier flags
// (two hashes equal in their top 62 bits are taken for one block, a
// chance of 2^-62), loaded atomically and, once the table is shared,
// stored atomically, so a lookup racing an update sees the word before or
// after it; a lookup racing a deletion's shift can miss an entry (a
// belief is allowed to lag) but never finds one that is not there. Slot
// numbers (vals) are read by the writer only. Writers are serialised by
// the index's mutex. 0 marks an empty slot.
//
// A table is shared once published to selections (Precise.tab); before,
// only its writer sees it, and it stores plainly: an x86 atomic store is
// a full barrier, and a million-block snapshot, applied to a table
// published only when complete, takes a fifth less time without them.
type posTable struct {
	keys   []uint64 // atomic.LoadUint64 by readers
	vals   []int32
	mask   uint64
	seed   uint64
	n      int
	held   [2]int // entries with flagGPU, flagCPU
	shared bool
}

// posKey is the key word of hash h, flags clear.
func posKey(h uint64) uint64 {
	if k := h &^ flags; k != 0 {
		return k
	}
	return zeroKey &^ flags
}

// zeroKey stands for a hash whose top 62 bits are 0 (a key word of 0
// marks an empty slot).
const zeroKey = 0x9e3779b97f4a7c15

func newPosTable(size int) *posTable {
	return &posTable{keys: make([]uint64, size), vals: make([]int32, size), mask: uint64(size - 1), seed: rand.Uint64()}
}

func (t *posTable) home(k uint64) uint64 { return mix(k^t.seed) & t.mask }

// store writes key word w at i: atomically once the table is shared.
func (t *posTable) store(i, w uint64) {
	if t.shared {
		atomic.StoreUint64(&t.keys[i], w)
	} else {
		t.keys[i] = w
	}
}

// find returns the table index of h's entry, -1 when absent. Writer
// only.
func (t *posTable) find(h uint64) int {
	k := posKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		w := t.keys[i]
		if w == 0 {
			return -1
		}
		if w&^flags == k {
			return int(i)
		}
	}
}

// has reports whether h is held on the tiers of flag. Lock-free.
func (t *posTable) has(h, flag uint64) bool {
	k := posKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		w := atomic.LoadUint64(&t.keys[i])
		if w == 0 {
			return false
		}
		if w&^flags == k {
			return w&flag != 0
		}
	}
}

// leading returns how many leading hashes are held on flag's tier.
// Lock-free.
func (t *posTable) leading(hashes []uint64, flag uint64) int {
	for n, h := range hashes {
		if !t.has(h, flag) {
			return n
		}
	}
	return len(hashes)
}

// touch reads h's home slot, so that its cache line is on its way before
// the slot is probed: the index touches a whole event's blocks first, and
// their cache misses overlap instead of coming one by one (a third less
// CPU time for a million-block snapshot, BenchmarkSnapshot).
func (t *posTable) touch(h uint64) uint64 { return t.keys[t.home(posKey(h))] }

// insert adds absent h with slot v and flags f (one atomic store: an
// x86 atomic store is a full barrier, and setting the flags apart would
// make it two); the caller keeps n below half the slots (full reports it
// would not).
func (t *posTable) insert(h uint64, v int32, f uint64) {
	k := posKey(h)
	i := t.home(k)
	for t.keys[i] != 0 {
		i = (i + 1) & t.mask
	}
	t.vals[i] = v
	t.store(i, k|f)
	t.n++
	for ; f != 0; f &= f - 1 {
		t.held[f&-f>>1]++
	}
}

// full reports whether one more entry would fill it past half.
func (t *posTable) full() bool { return 2*(t.n+1) > len(t.keys) }

// setFlag sets or clears flag on entry i.
func (t *posTable) setFlag(i int, flag uint64, on bool) {
	w := t.keys[i]
	if (w&flag != 0) == on {
		return
	}
	c := &t.held[flag>>1]
	if on {
		t.store(uint64(i), w|flag)
		*c++
	} else {
		t.store(uint64(i), w&^flag)
		*c--
	}
}

// del removes entry i, shifting back the entries after it in its probe
// run.
func (t *posTable) del(i int) {
	w := t.keys[i]
	for f := uint64(flagGPU); f <= flagCPU; f <<= 1 {
		if w&f != 0 {
			t.held[f>>1]--
		}
	}
	t.n--
	u := uint64(i)
	for j := (u + 1) & t.mask; ; j = (j + 1) & t.mask {
		v := t.keys[j]
		if v == 0 {
			break
		}
		home := t.home(v &^ flags)
		// v may move to u when its home is not in the cyclic range (u, j].
		if (j > u && (home <= u || home > j)) || (j < u && home <= u && home > j) {
			t.vals[u] = t.vals[j]
			t.store(u, v)
			u = j
		}
	}
	t.store(u, 0)
}

// engTable maps an engine hash to a router hash, for the writer only.
// Key 0 is kept apart (a key of 0 marks an empty slot).
type engTable struct {
	keys, vals []uint64
	mask, seed uint64
	n          int
	hasZero    bool
	zero       uint64
}

func newEngTable(size int) engTable {
	return engTable{keys: make([]uint64, size), vals: make([]uint64, size), mask: uint64(size - 1), seed: rand.Uint64()}
}

func (t *engTable) home(k uint64) uint64 { return mix(k^t.seed) & t.mask }

// len is its entries.
func (t *engTable) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

// touch is posTable.touch for engine hash k.
func (t *engTable) touch(k uint64) uint64 { return t.keys[t.home(k)] }

func (t *engTable) get(k uint64) (uint64, bool) {
	if k == 0 {
		if !t.hasZero {
			return 0, false
		}
		return t.zero, true
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put maps k to v, growing the table when half full.
func (t *engTable) put(k, v uint64) {
	if k == 0 {
		t.zero, t.hasZero = v, true
		return
	}
	if 2*(t.n+1) > len(t.keys) {
		t.grow()
	}
	i := t.home(k)
	for ; t.keys[i] != 0; i = (i + 1) & t.mask {
		if t.keys[i] == k {
			t.vals[i] = v
			return
		}
	}
	t.keys[i], t.vals[i] = k, v
	t.n++
}

func (t *engTable) grow() {
	old := *t
	*t = newEngTable(max(2*len(old.keys), minTableSize))
	t.hasZero, t.zero = old.hasZero, old.zero
	for i, k := range old.keys {
		if k != 0 {
			j := t.home(k)
			for t.keys[j] != 0 {
				j = (j + 1) & t.mask
			}
			t.keys[j], t.vals[j] = k, old.vals[i]
			t.n++
		}
	}
}

// del removes k, shifting back the entries after it in its probe run.
func (t *engTable) del(k uint64) {
	if k == 0 {
		t.hasZero = false
		return
	}
	if len(t.keys) == 0 {
		return
	}
	i := t.home(k)
	for {
		switch t.keys[i] {
		case 0:
			return
		case k:
		default:
			i = (i + 1) & t.mask
			continue
		}
		break
	}
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		v := t.keys[j]
		if v == 0 {
			break
		}
		home := t.home(v)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.keys[i], t.vals[i] = v, t.vals[j]
			i = j
		}
	}
	t.keys[i] = 0
}

// each calls f for every entry; f may delete the entry it is given (and
// no other).
func (t *engTable) each(f func(k, v uint64)) {
	if t.hasZero {
		f(0, t.zero)
	}
	// Walk from a slot after an empty one, backwards, so a deletion's
	// shift only moves entries already visited.
	start := -1
	for i, k := range t.keys {
		if k == 0 {
			start = i
			break
		}
	}
	if start < 0 {
		return
	}
	for n := range len(t.keys) {
		i := (start - n + len(t.keys)) & int(t.mask)
		if k := t.keys[i]; k != 0 {
			f(k, t.vals[i])
		}
	}
}

// reset empties the table, keeping its size.
func (t *engTable) reset() {
	clear(t.keys)
	t.n, t.hasZero = 0, false
}
