package sim

import (
	"time"

	"github.com/switchyard-router/switchyard/internal/ilist"
)

// kvCache is the worker's paged KV store at the granularity of prefix
// groups: one node per chained prefix hash (a Request's PrefixBlockTokens-
// token block, 32 engine blocks for Mooncake's 512 tokens over 16-token
// blocks) instead of one per engine block. A node holds the engine blocks
// (k, 0..blocks-1) of hash k that are computed and cached.
//
// Blocks are in one of four states, and
//
//	total = freePlain + lruBlocks + Σ pinned node blocks + Σ running private blocks
//
// always holds (checkInvariants):
//   - freePlain: never used since start (vLLM's initial free queue head).
//   - in the LRU list with reference count 0, either a cached node or a
//     "private" run of freed uncached blocks (prompt partials, outputs,
//     duplicates). Together these are vLLM's free block queue: allocation
//     pops from its head, evicting cached blocks, and a freed request
//     appends its blocks tail-first (private run, then groups last to first).
//   - pinned: in a node with refs > 0.
//   - private to a running request (allocated, not published in a node).
//
// Approximations (README.md): reference counts and LRU position are per
// node, so a node referenced by any running request pins all its cached
// blocks; within a node, eviction removes the highest sub-blocks first,
// which is exact for vLLM's tail-first free order.
type kvCache struct {
	total     int
	freePlain int
	lruBlocks int
	// lruPrivate is the part of lruBlocks in private runs.
	lruPrivate int
	nodes      []node
	freeNodes  []int32
	lru        ilist.List       // the nodes with refs 0, front next to evict
	index      map[uint64]int32 // chained prefix hash → node
	evicted    int64            // cached engine blocks evicted

	// copies is vLLM's block pool without deduplication (TrackBlockCopies):
	// every cached copy of a hash is its own node, index maps a hash to
	// one published copy and more holds the others; a node is in neither
	// until its block is cached.
	copies bool
	more   map[uint64][]int32

	// hook, when set, is told of stored and removed groups (KVEvent);
	// at is the simulated time of the change in progress and worker the
	// owner's index.
	hook   func(KVEvent)
	at     time.Duration
	worker int
}

type node struct {
	key     uint64
	blocks  int32 // engine blocks cached (a prefix j = 0..blocks-1), or the run length
	refs    int32 // running requests referencing the node
	inLRU   bool  // on kvCache.lru
	private bool  // an anonymous run of freed uncached blocks
}

func newKVCache(total int) *kvCache {
	return &kvCache{
		total:     total,
		freePlain: total,
		index:     make(map[uint64]int32),
	}
}

// available is the number of blocks an allocation can take: never-used
// blocks plus every reference-count-0 block (vLLM's num_free_blocks).
func (c *kvCache) available() int { return c.freePlain + c.lruBlocks }

func (c *kvCache) newNode() int32 {
	if n := len(c.freeNodes); n > 0 {
		i := c.freeNodes[n-1]
		c.freeNodes = c.freeNodes[:n-1]
		return i
	}
	c.nodes = append(c.nodes, node{})
	return int32(len(c.nodes) - 1)
}

func (c *kvCache) releaseNode(i int32) {
	c.nodes[i] = node{}
	c.freeNodes = append(c.freeNodes, i)
}

func (c *kvCache) pushTail(i int32) {
	n := &c.nodes[i]
	n.inLRU = true
	c.lru.PushBack(i)
	c.lruBlocks += int(n.blocks)
}

func (c *kvCache) unlink(i int32) {
	n := &c.nodes[i]
	n.inLRU = false
	c.lru.Remove(i)
	c.lruBlocks -= int(n.blocks)
}

// take removes n <= available() blocks from the free pool for a request:
// never-used blocks first, then from the LRU head, evicting cached blocks
// from the end of each node.
func (c *kvCache) take(n int) {
	x := min(n, c.freePlain)
	c.freePlain -= x
	n -= x
	for n > 0 {
		i := c.lru.Front()
		nd := &c.nodes[i]
		x := min(n, int(nd.blocks))
		nd.blocks -= int32(x)
		c.lruBlocks -= x
		n -= x
		if nd.private {
			c.lruPrivate -= x
		} else {
			c.evicted += int64(x)
		}
		if nd.blocks == 0 {
			c.unlinkEmpty(i)
		}
	}
}

// unlinkEmpty removes an emptied LRU node and forgets it.
func (c *kvCache) unlinkEmpty(i int32) {
	c.unlink(i) // blocks is 0, lruBlocks unchanged
	if nd := &c.nodes[i]; !nd.private {
		if c.copies {
			c.indexRemove(nd.key, i)
		} else {
			delete(c.index, nd.key)
		}
		if c.hook != nil {
			c.hook(KVEvent{Kind: KVBlockRemoved, Worker: c.worker, At: c.at, Hash: nd.key})
		}
	}
	c.releaseNode(i)
}

// freePrivate appends n freed uncached blocks at the LRU tail, merging
// with a private run already there.
func (c *kvCache) freePrivate(n int) {
	if n <= 0 {
		return
	}
	c.lruPrivate += n
	if t := c.lru.Back(); t >= 0 && c.nodes[t].private {
		c.nodes[t].blocks += int32(n)
		c.lruBlocks += n
		return
	}
	i := c.newNode()
	c.nodes[i] = node{blocks: int32(n), private: true}
	c.pushTail(i)
}

// ref takes a reference on node i, pinning it (vLLM touch()).
func (c *kvCache) ref(i int32) {
	if c.nodes[i].inLRU {
		c.unlink(i)
	}
	c.nodes[i].refs++
}

// unref drops a reference; at zero the node joins the LRU tail, or is
// forgotten when it caches nothing.
func (c *kvCache) unref(i int32) {
	n := &c.nodes[i]
	n.refs--
	if n.refs > 0 {
		return
	}
	if n.blocks == 0 {
		if !c.copies { // a copy is indexed only once cached
			delete(c.index, n.key)
		}
		c.releaseNode(i)
		return
	}
	c.pushTail(i)
}

// create makes a referenced, empty node for key, which must be absent
// (with copies, the node is indexed once its block is cached: indexAdd).
func (c *kvCache) create(key uint64) int32 {
	i := c.newNode()
	c.nodes[i] = node{key: key, refs: 1}
	if !c.copies {
		c.index[key] = i
	}
	return i
}

// indexAdd makes node i, just cached, findable under key, next to the
// copies of key already cached (copies only).
func (c *kvCache) indexAdd(key uint64, i int32) {
	if _, ok := c.index[key]; !ok {
		c.index[key] = i
		return
	}
	if c.more == nil {
		c.more = make(map[uint64][]int32)
	}
	c.more[key] = append(c.more[key], i)
}

// indexRemove forgets node i, a cached copy of key being evicted; another
// copy, if any, stays findable (copies only). Cost: the copies of key.
func (c *kvCache) indexRemove(key uint64, i int32) {
	rest := c.more[key]
	if c.index[key] == i {
		if len(rest) == 0 {
			delete(c.index, key)
			return
		}
		c.index[key] = rest[len(rest)-1]
		rest = rest[:len(rest)-1]
	} else {
		for j, x := range rest {
			if x == i {
				rest = append(rest[:j], rest[j+1:]...)
				break
			}
		}
	}
	if len(rest) == 0 {
		delete(c.more, key)
	} else {
		c.more[key] = rest
	}
}
