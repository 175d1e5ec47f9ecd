package replay

import (
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/trace"
)

// KVReference is what one shared cache would have served of a trace: the
// yardstick the replay report sets beside a policy's KV hit ratio
// (docs/replay.md, "How much a better policy could gain").
type KVReference struct {
	// HitRatio is the prompt tokens one LRU cache holding the whole
	// fleet's KV capacity would have served, fed every request of the
	// trace in arrival order, over all prompt tokens. A reference, not a
	// bound: a router can beat it (an LRU is not the best eviction order,
	// and the engines' caches are not one pool) and it ignores what the
	// engines' caches also hold (outputs, running requests' blocks).
	HitRatio float64
	// CeilingRatio is the same with a cache that never evicts: every
	// prefix block seen before is served. No placement serves more.
	CeilingRatio float64
}

// kvReference replays records (in arrival order) through one LRU cache of
// capacity engine blocks of engineBlock tokens, and through an unbounded
// one, with the simulated engines' cache rules (router/sim): a request's
// prompt is keyed like sim.Request.PrefixHashes, at groupTokens tokens per
// trace hash id (chained with prefix.ChainHashes), each group's engine
// blocks keyed (hash, j); only whole engine blocks are cached; a hit is the
// longest cached run of leading engine blocks, capped at
// ⌊(input_length−1)/engineBlock⌋ blocks because the engine always computes
// the block of the prompt's last token. After the lookup the request's
// blocks become the most recently used, its first group most recent of
// all (vLLM frees a request's blocks tail first, so its later blocks are
// evicted before its earlier ones).
//
// Work is linear in the trace's hash ids: each request touches its groups
// once for each lookup and once for each update. Memory: the LRU's
// entries are bounded by capacity; the ceiling keeps one map entry (about
// 25 bytes) per distinct prefix group of the trace.
func kvReference(records []trace.Record, groupTokens, engineBlock int, capacity int64) KVReference {
	lru := newGroupLRU(capacity)
	// The ceiling keeps every group: a plain map from group hash to its
	// cached blocks, half the memory of an LRU entry.
	ceiling := make(map[uint64]int32)
	var prompt, hit, ceil int64
	var hashes []uint64
	var blocks []int32
	for i := range records {
		r := &records[i]
		if r.InputLength <= 0 {
			continue
		}
		prompt += int64(r.InputLength)
		if len(r.HashIDs) == 0 || groupTokens <= 0 || engineBlock <= 0 {
			continue
		}
		hashes = prefix.ChainHashes(hashes[:0], r.HashIDs)
		groups := min(len(hashes), (r.InputLength+groupTokens-1)/groupTokens)
		blocks = blocks[:0]
		for k := range groups {
			tokens := min(groupTokens, r.InputLength-k*groupTokens)
			blocks = append(blocks, int32(tokens/engineBlock))
		}
		limit := int64((r.InputLength - 1) / engineBlock)
		hit += min(lru.lookup(hashes[:groups], blocks), limit) * int64(engineBlock)
		ceil += min(leadingSeen(ceiling, hashes[:groups], blocks), limit) * int64(engineBlock)
		lru.store(hashes[:groups], blocks)
		for k, h := range hashes[:groups] {
			ceiling[h] = max(ceiling[h], blocks[k])
		}
	}
	if prompt == 0 {
		return KVReference{}
	}
	return KVReference{
		HitRatio:     round4(float64(hit) / float64(prompt)),
		CeilingRatio: round4(float64(ceil) / float64(prompt)),
	}
}

// leadingSeen is groupLRU.lookup over the ceiling's map.
func leadingSeen(seen map[uint64]int32, hashes []uint64, blocks []int32) int64 {
	var n int64
	for k, h := range hashes {
		have := seen[h]
		n += int64(min(have, blocks[k]))
		if have < blocks[k] {
			break
		}
	}
	return n
}

// groupLRU is an LRU cache of engine blocks kept per prefix group: entry
// g holds blocks (hash, 0..n−1) of one group, n ≤ the group's cacheable
// blocks. Eviction takes blocks from the least recently used group,
// highest first, so what stays of a group is always a prefix of it.
type groupLRU struct {
	capacity, used int64
	index          map[uint64]int32
	entries        []lruEntry
	free           []int32
	head, tail     int32 // head: next to evict; -1 when empty
}

type lruEntry struct {
	key        uint64
	blocks     int32
	prev, next int32
}

func newGroupLRU(capacity int64) *groupLRU {
	return &groupLRU{capacity: capacity, index: make(map[uint64]int32), head: -1, tail: -1}
}

// lookup returns how many leading engine blocks of a prompt with these
// group hashes and cacheable blocks per group are cached.
func (c *groupLRU) lookup(hashes []uint64, blocks []int32) int64 {
	var n int64
	for k, h := range hashes {
		i, ok := c.index[h]
		if !ok {
			break
		}
		have := c.entries[i].blocks
		n += int64(min(have, blocks[k]))
		if have < blocks[k] {
			break
		}
	}
	return n
}

// store caches every group's blocks and makes them the most recently used,
// the first group last (most recent), then evicts down to capacity.
func (c *groupLRU) store(hashes []uint64, blocks []int32) {
	for k := len(hashes) - 1; k >= 0; k-- {
		if blocks[k] == 0 {
			continue
		}
		i, ok := c.index[hashes[k]]
		if !ok {
			i = c.alloc(hashes[k])
		} else {
			c.unlink(i)
		}
		if e := &c.entries[i]; blocks[k] > e.blocks {
			c.used += int64(blocks[k] - e.blocks)
			e.blocks = blocks[k]
		}
		c.pushTail(i)
	}
	for c.used > c.capacity && c.head >= 0 {
		e := &c.entries[c.head]
		over := c.used - c.capacity
		if int64(e.blocks) > over {
			e.blocks -= int32(over)
			c.used -= over
			break
		}
		c.used -= int64(e.blocks)
		i := c.head
		c.unlink(i)
		delete(c.index, e.key)
		c.free = append(c.free, i)
	}
}

func (c *groupLRU) alloc(key uint64) int32 {
	var i int32
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	} else {
		i = int32(len(c.entries))
		c.entries = append(c.entries, lruEntry{})
	}
	c.entries[i] = lruEntry{key: key, prev: -1, next: -1}
	c.index[key] = i
	return i
}

func (c *groupLRU) unlink(i int32) {
	e := &c.entries[i]
	if e.prev >= 0 {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (c *groupLRU) pushTail(i int32) {
	e := &c.entries[i]
	e.prev, e.next = c.tail, -1
	if c.tail >= 0 {
		c.entries[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
}
