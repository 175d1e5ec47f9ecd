package hosted

import "github.com/switchyard-router/switchyard/shared"

// CandidateSetKey returns a non-zero 64-bit key for a candidate set: the
// partition it belongs to (model and role; either may be empty) and its
// ascending worker ids. Equal inputs give equal keys; different sets collide
// with probability about 2^-64 per pair. The router computes it once per
// partition and membership change; pickers that keep per-set state (the
// round-robin cursor) use it to tell sets apart.
//
// Each id is folded in with the SplitMix64 finaliser (a bijection on
// uint64), one step per id: not cryptographic, and cheap enough (a few ns
// per id) to recompute when the key is unknown.
func CandidateSetKey(model string, role shared.Role, ids []shared.WorkerID) uint64 {
	h := uint64(0x243f6a8885a308d3) // pi, an arbitrary non-zero start
	h = mixString(h, model)
	h = mixString(h, string(role))
	h = mix(h, uint64(len(ids)))
	for _, id := range ids {
		h = mix(h, uint64(id))
	}
	if h == 0 {
		h = 1
	}
	return h
}

// mix folds x into h: h' = fmix(h ^ x + golden), with SplitMix64's
// finaliser fmix and golden-ratio increment (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014).
func mix(h, x uint64) uint64 {
	z := (h ^ x) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// mixString folds s into h, eight bytes at a time, then its length.
func mixString(h uint64, s string) uint64 {
	for len(s) >= 8 {
		x := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = mix(h, x)
		s = s[8:]
	}
	var x uint64
	for i := 0; i < len(s); i++ {
		x |= uint64(s[i]) << (8 * i)
	}
	return mix(h, x^uint64(len(s))<<56)
}
