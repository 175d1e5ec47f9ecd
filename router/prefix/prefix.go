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
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

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
// concurrent use, with no index-wide lock on the selection path: each
// worker's recency list has its own mutex (Record, Overlap); the map from
// block hash to holders is a concurrent hash map whose reads take no lock
// and write nothing (github.com/puzpuzpuz/xsync, a cache-line hash table),
// holding immutable holder lists that writers replace; membership
// (AddWorker, RemoveWorker) replaces an immutable map that selections read
// with one atomic load. Lock order: membership, then a worker's list.
type Index struct {
	mu sync.Mutex // serialises membership changes
	// byID maps the tracked workers to their lists: an immutable map,
	// replaced (copy on write) by AddWorker and RemoveWorker, so a lookup
	// is one atomic load with no lock and no shared write.
	byID atomic.Pointer[map[shared.WorkerID]*lru]
	// holders maps a block hash to the workers holding it, each once.
	// The slices are never modified once stored.
	holders *xsync.Map[uint64, []shared.WorkerID]
}

// New returns an empty index.
func New() *Index {
	x := &Index{holders: xsync.NewMap[uint64, []shared.WorkerID]()}
	x.byID.Store(&map[shared.WorkerID]*lru{})
	return x
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
	old := *x.byID.Load()
	if l := old[id]; l != nil {
		x.purge(l)
	}
	m := make(map[shared.WorkerID]*lru, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[id] = newLRU(id, capacity)
	x.byID.Store(&m)
	return nil
}

// RemoveWorker purges every entry of the worker. Unknown ids are ignored.
func (x *Index) RemoveWorker(id shared.WorkerID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.byID.Load()
	l := old[id]
	if l == nil {
		return
	}
	m := make(map[shared.WorkerID]*lru, len(old))
	for k, v := range old {
		if k != id {
			m[k] = v
		}
	}
	x.byID.Store(&m)
	x.purge(l)
}

// purge drops every entry of l and marks it dead, so a Record that looked
// it up before it left records nothing.
func (x *Index) purge(l *lru) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := l.head; i >= 0; i = l.next[i] {
		x.dropHolder(l.hash[i], l.owner)
	}
	l.dead = true
}

func (x *Index) dropHolder(h uint64, id shared.WorkerID) {
	x.holders.Compute(h, func(hs []shared.WorkerID, loaded bool) ([]shared.WorkerID, xsync.ComputeOp) {
		i := slices.Index(hs, id)
		switch {
		case i < 0:
			return hs, xsync.CancelOp
		case len(hs) == 1:
			return nil, xsync.DeleteOp
		}
		return slices.Delete(slices.Clone(hs), i, i+1), xsync.UpdateOp
	})
}

func (x *Index) addHolder(h uint64, id shared.WorkerID) {
	x.holders.Compute(h, func(hs []shared.WorkerID, loaded bool) ([]shared.WorkerID, xsync.ComputeOp) {
		out := make([]shared.WorkerID, len(hs)+1)
		copy(out, hs)
		out[len(hs)] = id
		return out, xsync.UpdateOp
	})
}

// worker returns id's list, nil when untracked.
func (x *Index) worker(id shared.WorkerID) *lru {
	return (*x.byID.Load())[id]
}

// Record notes that the worker was sent a prompt with these chained block
// hashes: each becomes most recently used, the first block most recent of
// all, so eviction takes suffixes before the prefixes they extend (as vLLM
// frees blocks tail-first). Blocks beyond capacity evict the least recently
// used. Unknown workers are ignored.
func (x *Index) Record(id shared.WorkerID, hashes []uint64) { x.RecordOverlap(id, hashes) }

// RecordOverlap is Record, also returning what Overlap returned just
// before it: the leading blocks of hashes the worker held, under one lock
// of the worker's list instead of two. 0 for unknown workers.
func (x *Index) RecordOverlap(id shared.WorkerID, hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	l := x.worker(id)
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return 0
	}
	// Counted before recording: recording a long prompt can evict its own
	// leading blocks before it reaches them.
	overlap := l.leading(hashes)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if l.touch(h) {
			continue
		}
		if evicted, ok := l.insert(h); ok {
			x.dropHolder(evicted, id)
		}
		x.addHolder(h, id)
	}
	return overlap
}

// Overlap returns how many leading blocks of hashes the worker holds.
func (x *Index) Overlap(id shared.WorkerID, hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	l := x.worker(id)
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading(hashes)
}

// Fill writes into overlap[i] the leading blocks of hashes held by ids[i].
// ids must be sorted ascending (the candidate order); len(overlap) ==
// len(ids). Cost: O(sum over the leading blocks of their holders ×
// log len(ids)), independent of workers that hold nothing; it stops at
// the first block no candidate extends. It takes no lock: a Record
// running meanwhile may be seen in part (the index is a belief either
// way).
func (x *Index) Fill(ids []shared.WorkerID, hashes []uint64, overlap []int32) {
	clear(overlap)
	for k, h := range hashes {
		advanced := false
		hs, _ := x.holders.Load(h)
		for _, w := range hs {
			if i, ok := slices.BinarySearch(ids, w); ok && overlap[i] == int32(k) {
				overlap[i] = int32(k + 1)
				advanced = true
			}
		}
		if !advanced {
			return
		}
	}
}

// Len returns the number of blocks the worker is believed to hold.
func (x *Index) Len(id shared.WorkerID) int {
	l := x.worker(id)
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return 0
	}
	return len(l.pos)
}
