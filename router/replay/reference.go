package replay

import (
	"math/bits"

	"github.com/switchyard-router/switchyard/internal/ilist"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

// kvRef replays a trace's requests, fed in arrival order by add, through
// one LRU cache of capacity engine blocks of engineBlock tokens, and
// through an unbounded one, with the simulated engines' cache rules
// (router/sim): a request's prompt is keyed like sim.Request.PrefixHashes,
// at groupTokens tokens per trace hash id (chained with
// prefix.ChainHashes), each group's engine blocks keyed (hash, j); only
// whole engine blocks are cached; a hit is the longest cached run of
// leading engine blocks, capped at ⌊(input_length−1)/engineBlock⌋ blocks
// because the engine always computes the block of the prompt's last token.
// After the lookup the request's blocks become the most recently used, its
// first group most recent of all (vLLM frees a request's blocks tail
// first, so its later blocks are evicted before its earlier ones).
//
// Work is linear in the trace's hash ids: each request touches its groups
// once for each lookup and once for each update. Memory: the LRU's
// entries are bounded by capacity; the ceiling keeps one entry per
// distinct prefix group of the trace (groupSet: about 12 bytes).
type kvRef struct {
	groupTokens, engineBlock int
	lru                      *groupLRU
	// ceiling keeps every group: its cached blocks by group hash.
	ceiling          *groupSet
	prompt, hit, cel int64
	hashes           []uint64 // add's buffers
	blocks           []int32
}

func newKVRef(groupTokens, engineBlock int, capacity int64) *kvRef {
	return &kvRef{groupTokens: groupTokens, engineBlock: engineBlock, lru: newGroupLRU(capacity), ceiling: newGroupSet()}
}

// add feeds the next request of the trace and returns its prompt tokens
// and those the reference's LRU cache served.
func (f *kvRef) add(r *trace.Record) (prompt, hit int64) {
	if r.InputLength <= 0 {
		return 0, 0
	}
	prompt = int64(r.InputLength)
	f.prompt += prompt
	if len(r.HashIDs) == 0 || f.groupTokens <= 0 || f.engineBlock <= 0 {
		return prompt, 0
	}
	f.hashes = prefix.ChainHashes(f.hashes[:0], r.HashIDs)
	groups := min(len(f.hashes), (r.InputLength+f.groupTokens-1)/f.groupTokens)
	hashes, blocks := f.hashes[:groups], f.blocks[:0]
	for k := range groups {
		tokens := min(f.groupTokens, r.InputLength-k*f.groupTokens)
		blocks = append(blocks, int32(tokens/f.engineBlock))
	}
	f.blocks = blocks
	limit := int64((r.InputLength - 1) / f.engineBlock)
	hit = min(f.lru.lookup(hashes, blocks), limit) * int64(f.engineBlock)
	f.hit += hit
	f.cel += min(f.ceiling.leading(hashes, blocks), limit) * int64(f.engineBlock)
	f.lru.store(hashes, blocks)
	for k, h := range hashes {
		f.ceiling.raise(h, blocks[k])
	}
	return prompt, hit
}

// result is the reference of the requests fed so far.
func (f *kvRef) result() report.KVReference {
	if f.prompt == 0 {
		return report.KVReference{}
	}
	return report.KVReference{
		HitRatio:     round4(float64(f.hit) / float64(f.prompt)),
		CeilingRatio: round4(float64(f.cel) / float64(f.prompt)),
	}
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
	lru            ilist.List // the entries in use, most recently used first
}

type lruEntry struct {
	key    uint64
	blocks int32
}

func newGroupLRU(capacity int64) *groupLRU {
	return &groupLRU{capacity: capacity, index: make(map[uint64]int32)}
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
			c.lru.PushFront(i)
		} else {
			c.lru.MoveToFront(i)
		}
		if e := &c.entries[i]; blocks[k] > e.blocks {
			c.used += int64(blocks[k] - e.blocks)
			e.blocks = blocks[k]
		}
	}
	for c.used > c.capacity && !c.lru.Empty() {
		i := c.lru.Back()
		e := &c.entries[i]
		over := c.used - c.capacity
		if int64(e.blocks) > over {
			e.blocks -= int32(over)
			c.used -= over
			break
		}
		c.used -= int64(e.blocks)
		c.lru.Remove(i)
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
	c.entries[i] = lruEntry{key: key}
	c.index[key] = i
	return i
}

// groupSet maps prefix group hashes to the most engine blocks of the
// group any request had (> 0; a group never raised reads 0), in about 10
// bytes a group: the reference's ceiling, which keeps every distinct
// group of the trace. Each hash is mixed by a bijection (so mixed hashes
// are equal exactly when the hashes are) and filed in one of
// 2^groupShardBits open-addressing tables by the mixed hash's top bits;
// a slot keeps the rest of it and the block count in one word, so no
// bit of a hash is lost. A table grows by a quarter when it is 7/8 full,
// one table at a time, so the set stays 70 to 87% full and never holds
// two copies of itself. A count of groupBig blocks or more (none with the
// default 512-token groups of 16-token engine blocks: at most 32) is
// kept in a map.
type groupSet struct {
	shards [1 << groupShardBits]groupShard
	big    map[uint64]int32 // counts >= groupBig, by hash
}

const (
	groupShardBits = 12
	groupRestBits  = 64 - groupShardBits
	groupRestMask  = 1<<groupRestBits - 1
	// groupBig, as a slot's count, says the count is in groupSet.big.
	groupBig = 1<<groupShardBits - 1
)

// groupShard is one table: a slot is 0 when empty, else count<<groupRestBits
// | the mixed hash's low groupRestBits bits. Linear probing.
type groupShard struct {
	slots []uint64
	n     int
}

func newGroupSet() *groupSet { return &groupSet{} }

// groupMix is a bijection of the 64-bit hashes (splitmix64's finalizer):
// its top bits choose a table, its others the slot.
func groupMix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// find returns h's table and its slot's index in it: the slot holding h,
// or the empty slot where h belongs. The table must have an empty slot.
func (s *groupSet) find(h uint64) (*groupShard, int) {
	m := groupMix(h)
	t := &s.shards[m>>groupRestBits]
	rest := m & groupRestMask
	i, _ := bits.Mul64(rest<<groupShardBits, uint64(len(t.slots)))
	for {
		v := t.slots[i]
		if v == 0 || v&groupRestMask == rest {
			return t, int(i)
		}
		if i++; int(i) == len(t.slots) {
			i = 0
		}
	}
}

// get returns h's count, 0 for a group never raised.
func (s *groupSet) get(h uint64) int32 {
	if len(s.shards[groupMix(h)>>groupRestBits].slots) == 0 {
		return 0
	}
	t, i := s.find(h)
	switch c := int32(t.slots[i] >> groupRestBits); c {
	case groupBig:
		return s.big[h]
	default:
		return c
	}
}

// raise sets h's count to at least blocks.
func (s *groupSet) raise(h uint64, blocks int32) {
	if blocks <= 0 {
		return
	}
	if t := &s.shards[groupMix(h)>>groupRestBits]; (t.n+1)*8 > len(t.slots)*7 {
		t.grow()
	}
	t, i := s.find(h)
	v := t.slots[i]
	if v == 0 {
		t.n++
	} else if c := int32(v >> groupRestBits); c == groupBig {
		s.big[h] = max(s.big[h], blocks)
		return
	} else if c >= blocks {
		return
	}
	c := blocks
	if c >= groupBig {
		if s.big == nil {
			s.big = make(map[uint64]int32)
		}
		s.big[h], c = blocks, groupBig
	}
	t.slots[i] = uint64(c)<<groupRestBits | groupMix(h)&groupRestMask
}

// grow makes t a quarter larger (at least 8 slots more) and refiles its
// slots.
func (t *groupShard) grow() {
	old := t.slots
	t.slots = make([]uint64, len(old)+len(old)/4+8)
	for _, v := range old {
		if v == 0 {
			continue
		}
		i, _ := bits.Mul64((v&groupRestMask)<<groupShardBits, uint64(len(t.slots)))
		for t.slots[i] != 0 {
			if i++; int(i) == len(t.slots) {
				i = 0
			}
		}
		t.slots[i] = v
	}
}

// leading is groupLRU.lookup over the set.
func (s *groupSet) leading(hashes []uint64, blocks []int32) int64 {
	var n int64
	for k, h := range hashes {
		have := s.get(h)
		n += int64(min(have, blocks[k]))
		if have < blocks[k] {
			break
		}
	}
	return n
}
