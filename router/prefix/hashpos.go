package prefix

import "math/rand/v2"

// hashPos maps a block hash to its index in a recency list (lru.hash):
// open addressing with linear probing, at most half full, backward-shift
// deletion (Knuth's algorithm R, TAOCP vol. 3, 6.4), so a list at
// capacity that evicts one block for each it records builds up no
// tombstones (a Go map in that churn probes longer and longer runs of
// deleted slots for an absent key between its rehashes, and a new
// prompt's blocks are all absent keys). Home slots are a seeded mix of
// the hash, as in posTable: hashes derive from request text, and without
// the seed a client could make them collide into long runs. Not safe for
// concurrent use: the list's mutex guards it. The hash 0 cannot be a key
// word (0 marks an empty slot), so it is held beside the table.
type hashPos struct {
	keys    []uint64 // 0: empty
	vals    []int32
	mask    uint64
	seed    uint64
	n       int   // entries in the table (the zero hash not counted)
	zero    int32 // the zero hash's value, when hasZero
	hasZero bool
}

// newHashPos returns an empty map.
func newHashPos() hashPos {
	return hashPos{keys: make([]uint64, minTableSize), vals: make([]int32, minTableSize), mask: minTableSize - 1, seed: rand.Uint64()}
}

// len returns the number of entries.
func (t *hashPos) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

func (t *hashPos) home(h uint64) uint64 { return mix(h^t.seed) & t.mask }

// get returns h's value and whether h is present.
func (t *hashPos) get(h uint64) (int32, bool) {
	if h == 0 {
		if !t.hasZero {
			return 0, false
		}
		return t.zero, true
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case h:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put sets h's value to v, adding h when absent.
func (t *hashPos) put(h uint64, v int32) {
	if h == 0 {
		t.zero, t.hasZero = v, true
		return
	}
	if 2*(t.n+1) > len(t.keys) {
		t.grow()
	}
	i := t.home(h)
	for ; t.keys[i] != 0; i = (i + 1) & t.mask {
		if t.keys[i] == h {
			t.vals[i] = v
			return
		}
	}
	t.keys[i], t.vals[i] = h, v
	t.n++
}

// del removes h, if present, shifting back the entries of its probe run
// that would otherwise be cut off from their home slots.
func (t *hashPos) del(h uint64) {
	if h == 0 {
		t.hasZero = false
		return
	}
	i := t.home(h)
	for ; t.keys[i] != h; i = (i + 1) & t.mask {
		if t.keys[i] == 0 {
			return
		}
	}
	for j := (i + 1) & t.mask; t.keys[j] != 0; j = (j + 1) & t.mask {
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if home := t.home(t.keys[j]); (j-home)&t.mask >= (j-i)&t.mask {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, 0
	t.n--
}

// grow doubles the table and reinserts every entry.
func (t *hashPos) grow() {
	keys, vals := t.keys, t.vals
	size := 2 * len(keys)
	t.keys, t.vals, t.mask = make([]uint64, size), make([]int32, size), uint64(size-1)
	for k, h := range keys {
		if h == 0 {
			continue
		}
		i := t.home(h)
		for t.keys[i] != 0 {
			i = (i + 1) & t.mask
		}
		t.keys[i], t.vals[i] = h, vals[k]
	}
}
