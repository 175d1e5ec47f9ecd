// Package prefix is the router's prefix index. It answers CACHE: how many
// leading blocks of a request each candidate (a worker, or one
// data-parallel rank of it) already holds (overlap_blocks).
//
// Every candidate has an approximate index: the chained block hashes the
// router has sent it, at the router's block size, bounded by its KV
// capacity with least-recently-used eviction. That is the router's belief,
// not the engine's truth (Dynamo's approximate KV router, without events):
// it can be wrong when the engine evicts earlier.
//
// A candidate whose engine publishes KV events (router/kvevents) also has
// a precise index (Precise): the blocks the engine reports it holds, with
// their copies per tier, keyed at the engine's block size by the router's
// own chained hash of their token ids and extra keys (LoRA adapter, cache
// salt, multimodal items), which a request's Key builds the same way.
// While its event stream is live, the candidate is scored by the precise
// index; while cold (not yet synced, or after a gap it could not replay),
// by the approximate one. See Precise for the rules.
package prefix

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/switchyard-router/switchyard/internal/ilist"
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

// Candidate names one routing candidate: a worker and its data-parallel
// rank (0 for an engine without ranks). Candidates order by (ID, Rank), as
// fleet partitions do.
type Candidate struct {
	ID   shared.WorkerID
	Rank uint32
}

// DefaultUnknownCapacity is the approximate index's bound, in router
// blocks, for a candidate whose KV capacity is unknown (0: its engine has
// not reported it yet): 65,536 blocks, 32 Mi tokens at the default
// 512-token router block, more than one GPU's KV cache, so such a
// candidate is not made to forget blocks it holds. The list does not
// preallocate: this is a ceiling on its memory. (Its precise index is
// bounded by MaxPreciseBlocks then.)
const DefaultUnknownCapacity = 1 << 16

// member is one candidate's state: its approximate list and, in precise
// mode, its precise index.
type member struct {
	// slot is the candidate's dense number in the index: the unit of the
	// holder lists and of Fill's slots column. Kept while it is tracked
	// (re-adding it keeps it), reused after it leaves.
	slot    int32
	cand    Candidate
	lru     *lru
	precise *Precise // nil in approximate mode
	// capacity is the candidate's KV capacity in blocks of its hashes,
	// 0 when unknown (the list is then bounded by DefaultUnknownCapacity);
	// capTokens is twice it in tokens, its precise index's bound (0:
	// unknown).
	capacity, capTokens int
}

// Index maps block hashes to the candidates believed to hold them. Safe
// for concurrent use, with no index-wide lock on the selection path: each
// candidate's recency list has its own mutex (Record, Overlap); the maps
// from block hash to holders are concurrent hash maps whose reads take no
// lock and write nothing (github.com/puzpuzpuz/xsync, a cache-line hash
// table), holding immutable holder lists that writers replace; membership
// (AddWorker, RemoveWorker) replaces an immutable map that selections read
// with one atomic load. Lock order: membership, then a candidate's list or
// precise index.
type Index struct {
	// blockSize is the default tokens per block: of a request whose
	// block size is not given (<= 0) and of a Member without one.
	blockSize int
	mu        sync.Mutex // serialises membership changes
	// byID maps the tracked candidates to their state: an immutable map,
	// replaced (copy on write) by AddWorker and RemoveWorker, so a lookup
	// is one atomic load with no lock and no shared write.
	byID atomic.Pointer[map[Candidate]*member]
	// bySlot is the same members by slot (nil: a free slot), replaced
	// with byID.
	bySlot atomic.Pointer[[]*member]
	// freeSlots are slots of candidates that left, reused first (guarded
	// by mu).
	freeSlots []int32
	// holders maps a block hash (at any block size: hashes of different
	// sizes are different chains, their blocks' content ids covering
	// different numbers of tokens) to the slots of the candidates whose
	// approximate lists hold it, each once. The slices are never modified
	// once stored.
	holders *xsync.Map[uint64, []int32]
	// depths pools Fill's per-slot scratch (*depthScratch).
	depths sync.Pool
	// live counts precise candidates whose stream is live, so Fill skips
	// the precise pass when there are none.
	live atomic.Int64
	// precise holds the candidates' precise indexes (guarded by mu). They
	// outlive membership: what an engine holds does not change when the
	// router takes its worker out of the candidate set and back (a failed
	// probe, a new model list), so its subscriber keeps feeding the same
	// index, which a re-added candidate takes back. DropPrecise ends one.
	precise map[Candidate]*Precise
}

// New returns an empty index whose default block size is blockSize
// tokens (> 0): the block size of a request that gives none (a
// blockSize <= 0 to Fill, Overlap, OverlapTokens, Belief, RecordOverlap)
// and the unit of a Member's capacity when it gives none. Each request is
// hashed, and its overlaps counted, at its own block size.
func New(blockSize int) *Index {
	x := &Index{blockSize: max(blockSize, 1), holders: xsync.NewMap[uint64, []int32](), precise: make(map[Candidate]*Precise)}
	x.byID.Store(&map[Candidate]*member{})
	x.bySlot.Store(&[]*member{})
	return x
}

// AddWorker starts tracking a candidate whose KV cache holds capacity
// blocks of the index's default size (0: unknown, bounded by
// DefaultUnknownCapacity). Adding a tracked candidate resets its
// approximate entries. A candidate made precise before (Precise, and not
// dropped since) gets its precise index back, as its events left it, with
// its bound following the new capacity. It is AddWorkers with one member.
func (x *Index) AddWorker(c Candidate, capacity int) error {
	_, err := x.AddWorkers(Member{Candidate: c, Capacity: capacity})
	return err
}

// Member is a candidate joining the index and its KV capacity: Capacity
// blocks (0: unknown) of BlockSize tokens (0: the index's default size).
// The capacity bounds its approximate list, in blocks (its requests are
// hashed at its block size), and its precise index, in tokens
// (2·Capacity·BlockSize).
type Member struct {
	Candidate
	Capacity  int
	BlockSize int
}

// AddWorkers starts tracking every member as AddWorker does, with one copy
// of the membership for all of them: joining n candidates costs O(n +
// tracked), where n AddWorker calls would cost O(n × tracked). It returns
// each member's slot (Slot), in order. A negative capacity is an error and
// adds none of them.
func (x *Index) AddWorkers(ms ...Member) ([]int32, error) {
	for _, m := range ms {
		if m.Capacity < 0 {
			return nil, fmt.Errorf("prefix index: worker %d rank %d: capacity %d blocks, want >= 0", m.ID, m.Rank, m.Capacity)
		}
		if m.BlockSize < 0 {
			return nil, fmt.Errorf("prefix index: worker %d rank %d: block size %d tokens, want >= 0", m.ID, m.Rank, m.BlockSize)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.byID.Load()
	next := make(map[Candidate]*member, len(old)+len(ms))
	for k, v := range old {
		next[k] = v
	}
	slots := slices.Clone(*x.bySlot.Load())
	out := make([]int32, len(ms))
	for i, j := range ms {
		var slot int32
		if m := next[j.Candidate]; m != nil {
			x.purge(m)
			slot = m.slot
		} else if n := len(x.freeSlots); n > 0 {
			slot, x.freeSlots = x.freeSlots[n-1], x.freeSlots[:n-1]
		} else {
			slot = int32(len(slots))
			slots = append(slots, nil)
		}
		bound := j.Capacity
		if bound == 0 {
			bound = DefaultUnknownCapacity
		}
		unit := j.BlockSize
		if unit == 0 {
			unit = x.blockSize
		}
		p := x.precise[j.Candidate]
		m := &member{slot: slot, cand: j.Candidate, lru: newLRU(slot, bound), precise: p, capacity: j.Capacity, capTokens: 2 * j.Capacity * unit}
		next[j.Candidate], slots[slot], out[i] = m, m, slot
		if p != nil {
			p.resize(m.capTokens)
		}
	}
	x.bySlot.Store(&slots)
	x.byID.Store(&next)
	return out, nil
}

// Slot returns the candidate's slot, the dense number Fill's slots column
// holds for it (0 to the number of tracked candidates, reused after one
// leaves), or -1 when it is not tracked.
func (x *Index) Slot(c Candidate) int32 {
	if m := x.member(c); m != nil {
		return m.slot
	}
	return -1
}

// RemoveWorker purges every entry of the candidate. Unknown ones are
// ignored.
func (x *Index) RemoveWorker(c Candidate) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.byID.Load()
	mem := old[c]
	if mem == nil {
		return
	}
	m := make(map[Candidate]*member, len(old))
	for k, v := range old {
		if k != c {
			m[k] = v
		}
	}
	slots := slices.Clone(*x.bySlot.Load())
	slots[mem.slot] = nil
	x.bySlot.Store(&slots)
	x.byID.Store(&m)
	x.purge(mem)
	x.freeSlots = append(x.freeSlots, mem.slot)
}

// setMember replaces tracked candidate c's state by m, a copy with its
// precise index changed, in both membership views. x.mu is held.
func (x *Index) setMember(c Candidate, m *member) {
	next := maps.Clone(*x.byID.Load())
	next[c] = m
	slots := slices.Clone(*x.bySlot.Load())
	slots[m.slot] = m
	x.bySlot.Store(&slots)
	x.byID.Store(&next)
}

// purge drops every entry of m and marks it dead, so a Record or an event
// that looked it up before it left records nothing.
func (x *Index) purge(m *member) {
	l := m.lru
	l.mu.Lock()
	var e holderEdits
	for i := l.order.Front(); i >= 0; i = l.order.Next(i) {
		e.drop(x.holders, l.hash[i], l.owner)
	}
	l.dead = true
	l.mu.Unlock()
}

// holderEdits makes one run of holder-list edits by one candidate (the
// blocks of one Record, or of one purge) share their results: the holder
// lists are immutable, so when a block's list is the very list (the same
// array and length) the previous edit started from, its edited list is
// the previous result too, and the blocks keep sharing one list. The
// blocks of a prompt sent to the same candidates hold one list between
// them, which Fill walks once (and which is one allocation, not one per
// block). Lists are compared by identity, never by content, so sharing
// is an optimisation only: two equal lists that do not share are merely
// walked twice.
type holderEdits struct {
	addFrom, addTo   []int32
	added            bool
	dropFrom, dropTo []int32
	dropped          bool
}

// sameList reports whether a and b are the same list: the same array and
// length (two empty lists are the same).
func sameList(a, b []int32) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// drop removes holder c from block h's list.
func (e *holderEdits) drop(hm *xsync.Map[uint64, []int32], h uint64, c int32) {
	hm.Compute(h, func(hs []int32, loaded bool) ([]int32, xsync.ComputeOp) {
		var out []int32
		if e.dropped && sameList(hs, e.dropFrom) {
			out = e.dropTo
		} else {
			i := slices.Index(hs, c)
			if i < 0 {
				return hs, xsync.CancelOp
			}
			if len(hs) > 1 {
				out = slices.Delete(slices.Clone(hs), i, i+1)
			}
			e.dropFrom, e.dropTo, e.dropped = hs, out, true
		}
		if len(out) == 0 {
			return nil, xsync.DeleteOp
		}
		return out, xsync.UpdateOp
	})
}

// add appends holder c to block h's list; single is c's own one-slot
// list, the list of every block c alone holds.
func (e *holderEdits) add(hm *xsync.Map[uint64, []int32], h uint64, c int32, single []int32) {
	hm.Compute(h, func(hs []int32, loaded bool) ([]int32, xsync.ComputeOp) {
		switch {
		case len(hs) == 0:
			return single, xsync.UpdateOp
		case e.added && sameList(hs, e.addFrom):
			return e.addTo, xsync.UpdateOp
		}
		out := make([]int32, len(hs)+1)
		copy(out, hs)
		out[len(hs)] = c
		e.addFrom, e.addTo, e.added = hs, out, true
		return out, xsync.UpdateOp
	})
}

// warm reads, without a lock, the holder-map entries that recording
// hashes into l may edit: the blocks l lacks and, when l is full, as many
// of its least recent blocks as it lacks (the ones their inserts evict).
// Each edit then locks an entry's bucket already in cache: the lock is an
// atomic read-modify-write, which waits for its cache miss alone, where
// these plain reads' misses overlap.
func (x *Index) warm(l *lru, hashes []uint64) {
	missing := 0
	for _, h := range hashes {
		if _, ok := l.pos.get(h); !ok {
			x.holders.Load(h)
			missing++
		}
	}
	if l.pos.len()+missing <= l.capacity {
		return
	}
	for i, k := l.order.Back(), 0; i != ilist.None && k < missing; i, k = l.order.Prev(i), k+1 {
		x.holders.Load(l.hash[i])
	}
}

// member returns c's state, nil when untracked.
// size returns bs, or the index's default block size when bs <= 0.
func (x *Index) size(bs int) int {
	if bs <= 0 {
		return x.blockSize
	}
	return bs
}

func (x *Index) member(c Candidate) *member {
	return (*x.byID.Load())[c]
}

// Record notes that the candidate was sent a prompt with these chained
// block hashes (at the request's block size): each becomes most recently used, the
// first block most recent of all, so eviction takes suffixes before the
// prefixes they extend (as vLLM frees blocks tail-first). Blocks beyond
// capacity evict the least recently used. Unknown candidates are ignored.
// A precise candidate records too: its approximate list is what it is
// scored by while its stream is cold.
func (x *Index) Record(c Candidate, hashes []uint64) { x.record(x.member(c), hashes, 0, nil, false) }

// RecordAt is Record given also the slot the caller read for c (Slot, a
// partition's Slots column): the slot finds c's list without the lookup by
// id, which a slot reused since by another candidate falls back to.
func (x *Index) RecordAt(slot int32, c Candidate, hashes []uint64) {
	var m *member
	if members := *x.bySlot.Load(); slot >= 0 && int(slot) < len(members) {
		m = members[slot]
	}
	if m == nil || m.cand != c {
		m = x.member(c)
	}
	x.record(m, hashes, 0, nil, false)
}

// RecordOverlap is Record, also returning what Overlap returned just
// before it, under one lock of the candidate's list instead of two. 0 for
// unknown candidates. It counts at the index's default block size
// (RecordOverlapAt gives the request's).
func (x *Index) RecordOverlap(c Candidate, hashes []uint64, prompt shared.PromptKey) int {
	return x.RecordOverlapAt(c, hashes, 0, prompt)
}

// RecordOverlapAt is RecordOverlap for a request of blockSize tokens per
// block (the size its hashes were cut at, the unit of the overlap
// returned; <= 0: the index's default).
func (x *Index) RecordOverlapAt(c Candidate, hashes []uint64, blockSize int, prompt shared.PromptKey) int {
	return x.record(x.member(c), hashes, blockSize, prompt, true)
}

// record is RecordOverlapAt for member m (nil: untracked); without count
// it returns 0 and skips the count (a lookup per leading block).
func (x *Index) record(m *member, hashes []uint64, blockSize int, prompt shared.PromptKey, count bool) int {
	if m == nil {
		return 0
	}
	blocks, ok := -1, false
	if !count {
		blocks, ok = 0, true
	} else if m.precise != nil {
		var tokens int
		if tokens, ok = m.precise.overlapTokens(prompt); ok {
			blocks = tokens / x.size(blockSize)
		}
	}
	if len(hashes) == 0 {
		return max(blocks, 0)
	}
	l := m.lru
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return 0
	}
	// A prompt recorded before and held since as it was recorded (a
	// repeated request, a conversation's earlier turn, the same prompt sent
	// to every worker in turn) moves to the front as one run: one lookup
	// and a walk, where a lookup and a move per block would write the
	// list in as many places (and, across cores, take as many cache lines
	// from the core that last recorded on this worker).
	if first, last, ok2 := l.run(hashes); ok2 {
		l.order.MoveRunToFront(first, last)
		if !ok {
			blocks = len(hashes)
		}
		return blocks
	}
	// Counted before recording: recording a long prompt can evict its own
	// leading blocks before it reaches them.
	if !ok {
		blocks = l.leading(hashes)
	}
	x.warm(l, hashes)
	var e holderEdits
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if l.touch(h) {
			continue
		}
		if evicted, ok := l.insert(h); ok {
			e.drop(x.holders, evicted, l.owner)
		}
		e.add(x.holders, h, l.owner, l.single)
	}
	return blocks
}

// Overlap returns how many leading blocks of the request, at the index's
// default block size, the candidate holds (OverlapAt with blockSize 0).
func (x *Index) Overlap(c Candidate, hashes []uint64, prompt shared.PromptKey) int {
	return x.OverlapAt(c, hashes, 0, prompt)
}

// OverlapAt returns how many leading blocks of the request, of blockSize
// tokens (the request's, the size its hashes were cut at; <= 0: the
// index's default), the candidate holds: by its precise index when live
// and the prompt has token ids (floor(n·E/blockSize) for n leading
// engine blocks of E tokens: 13 blocks of 16 tokens for 208 cached tokens
// at E = 16), else by its approximate list over hashes.
func (x *Index) OverlapAt(c Candidate, hashes []uint64, blockSize int, prompt shared.PromptKey) int {
	tokens, _ := x.OverlapTokensAt(c, hashes, blockSize, prompt)
	return tokens / x.size(blockSize)
}

// OverlapTokens is OverlapTokensAt at the index's default block size.
func (x *Index) OverlapTokens(c Candidate, hashes []uint64, prompt shared.PromptKey) (int, bool) {
	return x.OverlapTokensAt(c, hashes, 0, prompt)
}

// OverlapTokensAt returns the leading prompt tokens the candidate holds
// and whether the figure is precise: n·E for n leading engine blocks of
// its live precise index, else (false) the approximate overlap in blocks
// times blockSize (the request's; <= 0: the index's default).
func (x *Index) OverlapTokensAt(c Candidate, hashes []uint64, blockSize int, prompt shared.PromptKey) (int, bool) {
	m := x.member(c)
	if m == nil {
		return 0, false
	}
	if m.precise != nil {
		if t, ok := m.precise.overlapTokens(prompt); ok {
			return t, true
		}
	}
	if len(hashes) == 0 {
		return 0, false
	}
	l := m.lru
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading(hashes) * x.size(blockSize), false
}

// Belief is what the index believes a candidate holds of one prompt, both
// ways, in tokens: for comparing with what its engine then served from
// cache (the engine's cached-token count).
type Belief struct {
	// Taken is true once the belief was taken (Index.Belief of a tracked
	// candidate); the zero Belief has it false.
	Taken bool
	// PreciseTokens is n·E for the n leading engine blocks of E tokens
	// that the candidate's live precise index holds or counts as held for
	// requests in flight there (AddInflight); Precise is false
	// (and PreciseTokens 0) when it has no live precise index or the
	// prompt has no token ids.
	PreciseTokens   int
	Precise         bool
	EngineBlockSize int
	// CPUTokens is m·E for the m blocks after those PreciseTokens counts
	// that its engine's CPU tier holds (TierOverlap); 0 when not Precise.
	CPUTokens int
	// ApproxTokens is the leading blocks its approximate list holds times
	// the request's block size.
	ApproxTokens int
}

// Belief is BeliefAt at the index's default block size.
func (x *Index) Belief(c Candidate, hashes []uint64, prompt shared.PromptKey) Belief {
	return x.BeliefAt(c, hashes, 0, prompt)
}

// BeliefAt returns what the index believes candidate c holds of the
// prompt (hashes at blockSize tokens, the request's, <= 0 the index's
// default; prompt its token ids or nil), before the prompt is recorded.
// The zero Belief for unknown candidates.
func (x *Index) BeliefAt(c Candidate, hashes []uint64, blockSize int, prompt shared.PromptKey) Belief {
	m := x.member(c)
	if m == nil {
		return Belief{}
	}
	b := Belief{Taken: true}
	if m.precise != nil {
		if o := m.precise.tierOverlap(prompt, true); o.Precise {
			b.PreciseTokens, b.Precise, b.EngineBlockSize, b.CPUTokens = o.GPUTokens, true, o.BlockSize, o.CPUTokens
		}
	}
	if len(hashes) > 0 {
		l := m.lru
		l.mu.Lock()
		b.ApproxTokens = l.leading(hashes) * x.size(blockSize)
		l.mu.Unlock()
	}
	return b
}

// Fill is FillAt at the index's default block size.
func (x *Index) Fill(slots []int32, hashes []uint64, prompt shared.PromptKey, overlap []int32) {
	x.FillAt(slots, hashes, 0, prompt, overlap)
}

// FillAt writes into overlap[i] the leading blocks of the request held by
// the candidate whose slot (Slot) is slots[i]; -1 (untracked) gives 0.
// len(overlap) == len(slots). hashes are the request's at blockSize
// tokens (its own block size, the unit of the overlaps; <= 0: the index's
// default); prompt (may be nil) gives its hashes at engine block sizes
// for live precise candidates, which are scored by their precise index as
// Overlap says.
//
// Cost: one holder-map lookup per leading block, plus the holders of each
// run of consecutive blocks that share one holder list (holderEdits) once
// per run, stopping at the first block no candidate extends, plus
// len(slots); no allocation once its pooled per-slot scratch has grown
// to the number of slots. A prefix that n candidates were all sent costs
// O(blocks + n), not O(blocks × n). When some precise candidate is live,
// plus per live precise candidate a lookup per leading engine block. It
// takes no lock: an update running meanwhile may be seen in part (the
// index is a belief either way), and a slot reused during the call by a
// candidate that just joined may be credited with what its previous
// owner held.
func (x *Index) FillAt(slots []int32, hashes []uint64, blockSize int, prompt shared.PromptKey, overlap []int32) {
	x.FillTiersAt(slots, hashes, blockSize, prompt, overlap, nil)
}

// FillTiersAt is FillAt that also writes, when cpu is not nil (then
// len(cpu) == len(slots)), into cpu[i] the blocks of the request right
// after overlap[i] that the candidate's engine holds on its CPU tier, in
// the request's blocks: floor((g+c)/blockSize) - floor(g/blockSize) for
// the g GPU and c CPU-tier tokens its live precise index holds
// (TierOverlap), so a request block that GPU and CPU blocks cover
// together counts as a CPU-tier block, and one they cover only in part
// not at all; 0 for every other candidate (no live precise index, no
// token ids, untracked). With cpu set, each live precise candidate costs
// one more lookup per engine block of its CPU-tier run. Like FillAt it
// takes no lock and allocates nothing.
func (x *Index) FillTiersAt(slots []int32, hashes []uint64, blockSize int, prompt shared.PromptKey, overlap, cpu []int32) {
	members := *x.bySlot.Load()
	ds, _ := x.depths.Get().(*depthScratch)
	if ds == nil {
		ds = new(depthScratch)
	}
	depth, stamp := ds.begin(len(members))
	// depth[s] is stamp|d for the d leading blocks slot s holds (any
	// other stamp: 0): d advances from k to k+1 only while s held every
	// block before block k. A run of blocks [start, k) sharing one list
	// advances the slots of that list at depth start to k in one pass,
	// as block-by-block passes would. The stamp, new for every call,
	// stands for clearing the slots the last call set.
	var run []int32
	start := 0
	for k := 0; k <= len(hashes); k++ {
		var hs []int32
		if k < len(hashes) {
			hs, _ = x.holders.Load(hashes[k])
			if k > 0 && sameList(hs, run) {
				continue
			}
		}
		if k > 0 {
			advanced := false
			if start == 0 {
				// The first run: every slot in it is at depth 0, that is
				// of an older stamp (a slot listed twice: the second
				// finds it advanced).
				for _, s := range run {
					if int(s) < len(depth) && depth[s]&stampMask != stamp {
						depth[s] = stamp | uint64(k)
						advanced = true
					}
				}
			} else {
				from := stamp | uint64(start)
				for _, s := range run {
					if int(s) < len(depth) && depth[s] == from {
						depth[s] = stamp | uint64(k)
						advanced = true
					}
				}
			}
			if !advanced {
				break
			}
		}
		if len(hs) == 0 {
			break
		}
		run, start = hs, k
	}
	for i, s := range slots {
		var d int32
		if s >= 0 && int(s) < len(depth) {
			if v := depth[s]; v&stampMask == stamp {
				d = int32(uint32(v))
			}
		}
		overlap[i] = d
	}
	x.depths.Put(ds)
	if cpu != nil {
		clear(cpu[:len(slots)])
	}
	if prompt != nil && x.live.Load() > 0 {
		bs := x.size(blockSize)
		for i, s := range slots {
			if s < 0 || int(s) >= len(members) {
				continue
			}
			if m := members[s]; m != nil && m.precise != nil {
				if o := m.precise.tierOverlap(prompt, cpu != nil); o.Precise {
					g := o.GPUTokens / bs
					overlap[i] = int32(g)
					if cpu != nil {
						cpu[i] = int32((o.GPUTokens+o.CPUTokens)/bs - g)
					}
				}
			}
		}
	}
}

// stampMask selects a depthScratch entry's stamp (its upper 32 bits).
const stampMask uint64 = 0xffff_ffff_0000_0000

// depthScratch is FillTiersAt's per-slot scratch: entry s is the call's
// stamp (upper 32 bits) and slot s's depth in blocks (lower 32), an
// entry of any other stamp standing for depth 0. A new stamp per call
// clears every entry at once, so a call writes only the slots its
// prefix's holders name, never resets them, and reads the others as 0.
type depthScratch struct {
	depth []uint64
	stamp uint64 // the last call's, in the upper 32 bits; 0 before the first
}

// begin returns the scratch for n slots and this call's stamp. When the
// 32-bit stamp wraps it clears the entries, so no entry of 2^32 calls
// before reads as this call's.
func (d *depthScratch) begin(n int) ([]uint64, uint64) {
	if len(d.depth) < n {
		d.depth = make([]uint64, n) // zero entries: stamp 0, never a call's
	}
	d.stamp += 1 << 32
	if d.stamp == 0 {
		clear(d.depth)
		d.stamp = 1 << 32
	}
	return d.depth, d.stamp
}

// Len returns the number of blocks (of any size) in the candidate's
// approximate list.
func (x *Index) Len(c Candidate) int {
	m := x.member(c)
	if m == nil {
		return 0
	}
	l := m.lru
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return 0
	}
	return l.pos.len()
}
