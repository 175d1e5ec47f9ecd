// Package prefix is the router's prefix index: for each worker, the chained
// block hashes the router has sent it, bounded by that worker's KV capacity
// with least-recently-used eviction. It answers CACHE: how many leading
// blocks of a request each worker already holds (overlap_blocks).
//
// The index is the router's belief, not the engine's truth: it records what
// was dispatched and evicts on its own LRU clock. Like Dynamo's approximate
// KV router (no KV events), it can be wrong when the engine evicts earlier;
// the simulated worker reports actual cached tokens separately.
package prefix

import (
	"fmt"
	"slices"
	"sync"

	"github.com/switchyard-router/switchyard/shared"
)

// ChainHash returns the hash of a block whose own content id is id and
// whose preceding blocks hash to prev (0 for the first block), so equal
// chained hashes mean equal prefixes. The mixer is SplitMix64's finaliser
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014) over prev*φ + id.
func ChainHash(prev, id uint64) uint64 {
	x := prev*0x9e3779b97f4a7c15 + id + 0x632be59bd9b4e5d7
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ChainHashes appends to dst the chained hashes of ids (ChainHash folded
// left from 0) and returns the extended slice.
func ChainHashes(dst []uint64, ids []uint64) []uint64 {
	var h uint64
	for _, id := range ids {
		h = ChainHash(h, id)
		dst = append(dst, h)
	}
	return dst
}

// Index maps block hashes to the workers believed to hold them. Safe for
// concurrent use; every method takes one mutex.
type Index struct {
	mu      sync.Mutex
	holders map[uint64][]int32 // block hash -> slots of the workers holding it
	slots   []*lru             // by slot; nil when free
	byID    map[shared.WorkerID]int32
	free    []int32
	depth   []int32 // scratch, by slot: leading blocks held so far in a query
	touched []int32 // scratch: slots advanced in a query
}

// New returns an empty index.
func New() *Index {
	return &Index{holders: make(map[uint64][]int32), byID: make(map[shared.WorkerID]int32)}
}

// AddWorker starts tracking a worker whose KV cache holds capacity blocks
// (in the router's block size, > 0). Adding a tracked worker resets its
// entries and capacity.
func (x *Index) AddWorker(id shared.WorkerID, capacity int) error {
	if capacity <= 0 {
		return fmt.Errorf("prefix index: worker %d: capacity %d blocks, want > 0", id, capacity)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if s, ok := x.byID[id]; ok {
		x.purgeLocked(s)
	}
	var s int32
	if n := len(x.free); n > 0 {
		s, x.free = x.free[n-1], x.free[:n-1]
	} else {
		s = int32(len(x.slots))
		x.slots = append(x.slots, nil)
		x.depth = append(x.depth, 0)
	}
	x.slots[s] = newLRU(id, capacity)
	x.byID[id] = s
	return nil
}

// RemoveWorker purges every entry of the worker. Unknown ids are ignored.
func (x *Index) RemoveWorker(id shared.WorkerID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s, ok := x.byID[id]; ok {
		x.purgeLocked(s)
	}
}

func (x *Index) purgeLocked(s int32) {
	l := x.slots[s]
	for i := l.head; i >= 0; i = l.next[i] {
		x.dropHolderLocked(l.hash[i], s)
	}
	delete(x.byID, l.owner)
	x.slots[s] = nil
	x.free = append(x.free, s)
}

func (x *Index) dropHolderLocked(h uint64, s int32) {
	hs := x.holders[h]
	if i := slices.Index(hs, s); i >= 0 {
		hs[i] = hs[len(hs)-1]
		hs = hs[:len(hs)-1]
	}
	if len(hs) == 0 {
		delete(x.holders, h)
	} else {
		x.holders[h] = hs
	}
}

// Record notes that the worker was sent a prompt with these chained block
// hashes: each becomes most recently used, the first block most recent of
// all, so eviction takes suffixes before the prefixes they extend (as vLLM
// frees blocks tail-first). Blocks beyond capacity evict the least recently
// used. Unknown workers are ignored.
func (x *Index) Record(id shared.WorkerID, hashes []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.byID[id]
	if !ok {
		return
	}
	l := x.slots[s]
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if l.touch(h) {
			continue
		}
		if evicted, ok := l.insert(h); ok {
			x.dropHolderLocked(evicted, s)
		}
		x.holders[h] = append(x.holders[h], s)
	}
}

// Overlap returns how many leading blocks of hashes the worker holds.
func (x *Index) Overlap(id shared.WorkerID, hashes []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.byID[id]
	if !ok {
		return 0
	}
	l := x.slots[s]
	n := 0
	for _, h := range hashes {
		if _, ok := l.pos[h]; !ok {
			break
		}
		n++
	}
	return n
}

// Fill writes into overlap[i] the leading blocks of hashes held by ids[i].
// ids must be sorted ascending (the candidate order); len(overlap) ==
// len(ids). Cost: O(sum over blocks of their holders + touched·log len(ids)),
// independent of workers that hold nothing.
func (x *Index) Fill(ids []shared.WorkerID, hashes []uint64, overlap []int32) {
	clear(overlap)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.touched = x.touched[:0]
	for k, h := range hashes {
		advanced := false
		for _, s := range x.holders[h] {
			if x.depth[s] == int32(k) {
				if k == 0 {
					x.touched = append(x.touched, s)
				}
				x.depth[s] = int32(k + 1)
				advanced = true
			}
		}
		if !advanced {
			break
		}
	}
	for _, s := range x.touched {
		if i, ok := slices.BinarySearch(ids, x.slots[s].owner); ok {
			overlap[i] = x.depth[s]
		}
		x.depth[s] = 0
	}
}

// Len returns the number of blocks the worker is believed to hold.
func (x *Index) Len(id shared.WorkerID) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s, ok := x.byID[id]; ok {
		return len(x.slots[s].pos)
	}
	return 0
}
