package prefix

import (
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/shared"
)

// MaxPreciseBlocks bounds a precise index, in engine blocks, when its
// candidate's KV capacity is unknown (2^19 blocks: 8 Mi tokens at vLLM's
// default 16-token block, ~60 MB of index).
const MaxPreciseBlocks = 1 << 19

// maxGroups is the KV-cache groups a precise index tracks (group_idx 0 to
// 63); events of higher groups are skipped.
const maxGroups = 64

// maxScopes bounds the residency scopes (tier, group, locality,
// ownership) a precise index counts between two Clears; blocks of
// further scopes are skipped (SkippedScope).
const maxScopes = 256

// maxCopies bounds one block's counted copies over all its scopes; stores
// beyond it are not counted (an engine holds at most its KV capacity).
const maxCopies = 1 << 30

// Precise is one candidate's precise index: the blocks its engine reports
// it holds (router/kvevents), keyed at the engine's block size E by the
// router's own chained hash of their token ids and extra keys, so that a
// request cut by Key.TokenBlockHashes(E) finds them. It implements
// kvevents.Sink. Events are applied under its own mutex; selections read
// its lookup table (which blocks each tier holds: an open-addressing
// table of atomic words, posTable) without locking or allocating.
//
// Residency. vLLM does not deduplicate blocks: every physical copy of a
// block has its own BlockStored and its own BlockRemoved. The index counts
// copies per block and scope, the scope being the tier (medium), the
// KV-cache group (group_idx, absent = 0) and, where the engine sends them
// (vLLM's snapshot branch), locality and ownership, as vLLM's own
// KVCacheSnapshot counts residency. A store adds one copy to its scope, a
// removal takes one away (a removal of a scope without copies is
// ignored), and a block is known while any scope has a copy. The rules:
//   - Tiers: medium absent or "GPU" (any case) is the GPU tier; "CPU" or
//     "CPU_…" (any case) the CPU tier; other media (disk, storage) are
//     skipped and counted (SkippedTier). A block is held on a tier when
//     every group reported on that tier has a local copy of it there
//     (locality absent or "LOCAL"; a "REMOTE" copy is counted, never
//     held). CACHE counts GPU blocks only; the CPU tier is a separate
//     figure (TierOverlap).
//   - AllBlocksCleared takes every GPU copy away; CPU copies stay (vLLM's
//     reset_prefix_cache leaves the offloaded tier alone).
//   - Block size: E is the first stored event with token ids' block_size;
//     such an event at another size is skipped and counted, and its group
//     still counts as reported, so none of its blocks ever count as held
//     on its tier (see groups).
//   - Keys: the router hash of block i is ChainHash(prev, content id),
//     the content id that of its E token ids (TokenBlocks') mixed with its
//     extra keys in canonical form when it has any (lora_name, each
//     block's extra_keys: see extrakeys.go), prev the router hash of the
//     parent block (parent_block_hash, through the engine-to-router map)
//     or 0 for a prompt's first block. A request's Key (IDs, LoRA, Salt,
//     MM) builds the same.
//   - Stores without a key of their own: a store with no token ids
//     (offloading connectors send block_size 0 and no tokens) or with more
//     token ids than its blocks (a sliding-window group's sparse store,
//     whose skipped blocks are not named) is keyed block by block through
//     the engine-to-router map: each engine hash takes the router hash of
//     an earlier store of it with token ids. Engine hashes are folded to
//     64 bits as vLLM's maybe_convert_block_hash does (kvevents.FoldHash),
//     so a CPU store's bytes hash finds the GPU store's int hash. An
//     engine hash no store named is skipped and counted
//     (SkippedUnresolved). The map keeps a block's engine hash while any
//     copy of the block is known, so a CPU copy stays keyed after its GPU
//     copies went.
//   - Engine names: each block keeps, per tier, its latest store's engine
//     hash as the engine sent it (an int, a negative int, or bytes: see
//     engineblocks.go), which EngineBlocks lists, for comparing the
//     belief with the engine's own block set.
//   - Unknown parent: a parent hash absent from the engine-to-router map
//     (its store was missed, evicted from the index, or skipped) makes the
//     event's blocks unkeyable: they are skipped and counted
//     (SkippedParent).
//   - Groups (hybrid models): on each tier, a block counts as held only
//     when every group the engine has reported on that tier holds a copy.
//     A new group withdraws every block of the tier until that group
//     stores it too; a group losing its last copy withdraws the block.
//     This can miss hits (a sliding-window group that dropped early
//     blocks) but never invents one.
//   - Bound: at most 2·capacity tokens / E blocks (capacity the
//     candidate's KV capacity; MaxPreciseBlocks when unknown), whatever
//     their tiers, the least recently stored evicted first with all its
//     copies (Evicted). BlockRemoved of an engine hash the index does not
//     know is ignored.
//
// Work is linear in the events: a store or removal costs O(1) per block
// (plus, for a block with copies in more than one scope, O(scopes)), a
// new group on a tier O(blocks of the tier) at most 64 times per Clear,
// and AllBlocksCleared O(blocks with GPU copies): every one of them was
// stored by an event since.
//
// Engine-hash keys (replay only): after KeyByEngineHashes the router hash
// of a stored block is its engine hash, and its token ids, parent, LoRA and
// extra keys are not read. That is for a stream whose engine hashes
// already are the router's chained hashes, at E = the router's block size:
// router/replay's simulated engines, whose blocks are a trace's blocks
// hashed with ChainHashes (traces carry no token ids). Requests then
// present those hashes through a HashKey. Every other rule (tiers,
// residency, block size, groups, bound, warmth) is the same code. A real
// engine seeds its hashes per process and must be keyed by token ids.
//
// Warmth: a precise index starts cold (the candidate is scored by its
// approximate list) until MarkLive (its subscriber saw the stream from
// sequence 0, replayed a gap, or applied a snapshot). After Clear it is
// cold until it has stored as many GPU blocks as its bound allows (the
// engine's cache has turned over) or the engine reports AllBlocksCleared
// (its state is then known); after ClearCold, only until MarkLive.
type Precise struct {
	x *Index
	c Candidate

	live       atomic.Bool
	blockSize  atomic.Int64 // E, 0 until the first stored event
	engineKeys bool         // KeyByEngineHashes; guarded by mu
	// tab maps each block's router hash to its slot and says which tiers
	// hold it, for lock-free lookups: selections read it only while the
	// index is live. w is the writer's table (guarded by mu), made at the
	// bound's size when E is known (a small empty one before): tab too
	// while live; while cold after a Clear, a new table that only the
	// writer sees, published as tab when the index goes live (setLive),
	// so that selections that saw it live before the Clear read the old
	// table, never one being written without atomics.
	tab atomic.Pointer[posTable]
	w   *posTable

	// inflight counts, per router hash at E, the requests in flight on
	// the candidate whose prompt has that block and which the index did
	// not hold when they were placed (AddInflight); inflightN is its
	// number of keys, so lookups skip it when empty.
	inflight  *xsync.Map[uint64, int32]
	inflightN atomic.Int64

	mu   sync.Mutex
	dead bool
	// lingering are released requests' in-flight blocks kept until
	// lingerBatches more batches have been applied (Inflight.Release);
	// batches counts the batches applied.
	lingering []lingering
	batches   uint64

	capTokens int // 2·capacity in tokens; 0: unknown
	capacity  int // the bound in blocks (MaxPreciseBlocks until E is known)
	// st are the blocks' slots; head and tail the most and least
	// recently stored (-1: none), free the slots to reuse; ghead the
	// first slot of the GPU list, the slots with GPU copies (-1: none).
	st                []*[1 << slotChunkShift]slotState // in chunks: no copy as they grow
	nslots            int32
	head, tail, ghead int32
	free              []int32
	more              map[uint64]uint32 // moreKey(slot, scope) -> copies, scopes but 0
	engine            engTable          // engine hash -> router hash
	groups            [numTiers]uint64  // groups reported, per tier
	// scopes are the residency scopes seen since Clear, by id; scope 0 is
	// (GPU, group 0, no locality, no ownership), counted in slotState.
	scopes   []scopeInfo
	scopeIDs map[scopeKey]uint8
	// localScopes counts, per tier and group, the local scopes in scopes.
	localScopes [numTiers][maxGroups]uint8
	copies      int  // copies counted over every block and scope
	warming     bool // cleared since the last MarkLive
	holdCold    bool // ClearCold since the last MarkLive
	sinceClear  int  // GPU blocks stored since Clear
	stats       PreciseStats
	// wide keeps, per tier, the bytes of each slot's hash when the
	// engine sent it as more than 8 bytes (vLLM's raw sha256 hashes),
	// in chunks parallel to st's, made when a slot of the chunk first
	// needs one: an engine of int hashes costs nothing here.
	wide    [numTiers][]*[1 << slotChunkShift][maxWideHash]byte
	digest  extrasDigest
	scratch []uint64 // an event's router hashes
	found   []bool   // and whether each was found
	sink    uint64   // what touches read
}

// slotChunkShift is log2 of the slots per chunk of Precise.st (4,096
// slots, 256 KiB).
const slotChunkShift = 12

// slot returns slot i. p.mu is held.
func (p *Precise) slot(i int32) *slotState {
	return &p.st[i>>slotChunkShift][i&(1<<slotChunkShift-1)]
}

// tier is a storage tier an index counts.
type tier uint8

const (
	tierGPU tier = iota
	tierCPU
	numTiers
)

// tierFlag is tier t's posTable flag.
func tierFlag(t tier) uint64 { return 1 << t }

// slotState is one block: its hashes, residency and list links (64
// bytes).
type slotState struct {
	rh   uint64           // router hash
	eng  uint64           // the engine hash of its latest store
	mask [numTiers]uint64 // per tier, the groups with a local copy
	// cnt0 is the copies in scope 0; gref, the copies in GPU scopes
	// (cnt0 included); oref, in other tiers' scopes.
	cnt0, gref, oref uint32
	prev, next       int32 // recency list (head: most recently stored)
	gprev, gnext     int32 // GPU list, while gref > 0
	// name says, per tier, how the engine sent the hash of the tier's
	// latest store (see engineName): with eng (and, for a hash wider
	// than 8 bytes, the tier's wide store), the engine's own value.
	name [numTiers]engineName
}

// scopeKey identifies a residency scope: a tier, a group and the digests
// of locality and ownership (0: absent).
type scopeKey struct {
	t        tier
	g        uint8
	loc, own uint64
}

type scopeInfo struct {
	t     tier
	g     uint8
	local bool
}

func moreKey(i int32, s uint8) uint64 { return uint64(i)<<8 | uint64(s) }

// PreciseStats are a precise index's counters since it was made. Block
// counts are in engine blocks.
type PreciseStats struct {
	// Live reports the candidate is scored by its precise index.
	Live bool
	// BlockSize is the engine's block size E (0 until known).
	BlockSize int
	// Blocks is the distinct blocks with a copy on some tier now;
	// GPUBlocks those held on GPU (what CACHE counts), CPUBlocks those
	// held on the CPU tier (a block can be both); Copies the copies
	// counted over every block and scope (vLLM's residency references).
	Blocks, GPUBlocks, CPUBlocks, Copies int
	// Stored, Removed and Cleared count applied block stores (copies
	// added), block removals (copies taken away) and AllBlocksCleared
	// events.
	Stored, Removed, Cleared uint64
	// Evicted counts blocks dropped by the bound.
	Evicted uint64
	// SkippedTier counts blocks of a tier other than GPU and CPU;
	// SkippedBlockSize, blocks at a block size other than E;
	// SkippedParent, blocks whose parent is unknown; SkippedUnresolved,
	// blocks of stores without their own token ids whose engine hash no
	// earlier store named; SkippedGroup, blocks of a group_idx beyond 63;
	// SkippedScope, blocks of a residency scope beyond the 256th;
	// SkippedMalformed, blocks of events whose token ids or extra keys do
	// not match their hashes.
	SkippedTier, SkippedBlockSize, SkippedParent, SkippedUnresolved, SkippedGroup, SkippedScope, SkippedMalformed uint64
	// Resets counts Clear calls.
	Resets uint64
}

// Precise makes the candidate precise (idempotent) and returns its index,
// the kvevents.Sink for its engine's stream; nil for an untracked
// candidate. It starts cold. It outlives the candidate's membership: while
// the candidate is removed its events still apply, and re-adding it
// (AddWorker) scores it by the same index. DropPrecise ends it.
func (x *Index) Precise(c Candidate) *Precise {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.byID.Load()
	mem := old[c]
	if mem == nil {
		return nil
	}
	if mem.precise != nil {
		return mem.precise
	}
	p := &Precise{x: x, c: c, capacity: MaxPreciseBlocks, head: -1, tail: -1, ghead: -1,
		engine: newEngTable(minTableSize), more: make(map[uint64]uint32), scopeIDs: make(map[scopeKey]uint8),
		inflight: xsync.NewMap[uint64, int32]()}
	p.w = newPosTable(minTableSize)
	p.tab.Store(p.w)
	p.resetScopes()
	p.capTokens = mem.capTokens
	x.precise[c] = p
	m := *mem
	m.precise = p
	x.setMember(c, &m)
	return p
}

// DropPrecise ends the candidate's precise index (its engine no longer
// publishes, or its worker left the configuration): its blocks are
// dropped, its later events change nothing, and the candidate, if
// tracked, is scored approximately. Unknown candidates are ignored.
func (x *Index) DropPrecise(c Candidate) {
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.precise[c]
	if p == nil {
		return
	}
	delete(x.precise, c)
	if mem := (*x.byID.Load())[c]; mem != nil {
		m := *mem
		m.precise = nil
		x.setMember(c, &m)
	}
	p.mu.Lock()
	p.clearLocked()
	p.dead = true
	p.mu.Unlock()
}

// bound is the index's bound in engine blocks of e tokens:
// capTokens / e, MaxPreciseBlocks when the capacity is unknown. p.mu is
// held.
func (p *Precise) bound(e int) int {
	if p.capTokens > 0 {
		return max(p.capTokens/e, 1)
	}
	return MaxPreciseBlocks
}

// resize bounds the index at capTokens tokens (twice the candidate's
// capacity; 0: unknown) when the candidate was added again with another
// capacity: once the engine's block size is known, the oldest blocks
// beyond the new bound are evicted and the lookup table is made again at
// the new size. Work is linear in the blocks held. x.mu is held.
func (p *Precise) resize(capTokens int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || capTokens == p.capTokens {
		return
	}
	p.capTokens = capTokens
	e := int(p.blockSize.Load())
	if e == 0 {
		return // bounded when the first stored event gives E
	}
	p.capacity = p.bound(e)
	for p.blocks() > p.capacity {
		p.drop(p.tail)
		p.stats.Evicted++
	}
	t := newPosTable(tableSize(p.capacity))
	for i := p.head; i >= 0; i = p.slot(i).next {
		var f uint64
		for tr := range numTiers {
			if p.held(tr, i) {
				f |= tierFlag(tr)
			}
		}
		t.insert(p.slot(i).rh, i, f)
	}
	p.replaceTable(t)
}

// replaceTable makes t the writer's table, published at once when the
// index is live. p.mu is held.
func (p *Precise) replaceTable(t *posTable) {
	if p.w.shared {
		t.shared = true
		p.tab.Store(t)
	}
	p.w = t
}

// blocks is the blocks the index knows. p.mu is held.
func (p *Precise) blocks() int { return p.w.n }

// KeyByEngineHashes makes p key stored blocks by their engine hashes (see
// "Engine-hash keys" on Precise): replay's simulated engines only. Call it
// before the first event; it cannot be undone.
func (p *Precise) KeyByEngineHashes() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.engineKeys = true
}

// Stats returns the index's counters.
func (p *Precise) Stats() PreciseStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	t := p.w
	s.Live, s.BlockSize, s.Blocks, s.Copies = p.live.Load(), int(p.blockSize.Load()), t.n, p.copies
	s.GPUBlocks, s.CPUBlocks = t.held[0], t.held[1]
	return s
}

func (p *Precise) setLive(on bool) {
	if on && !p.w.shared {
		p.w.shared = true
		p.tab.Store(p.w)
	}
	if p.live.Load() != on {
		p.live.Store(on)
		if on {
			p.x.live.Add(1)
		} else {
			p.x.live.Add(-1)
		}
	}
}

// MarkLive makes the candidate scored by its precise index (kvevents.Sink).
func (p *Precise) MarkLive() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dead {
		p.warming, p.holdCold = false, false
		p.setLive(true)
	}
}

// Clear drops every block and makes the candidate cold until warm again
// (kvevents.Sink). It also forgets the engine's block size E, learnt again
// from the next stored event: after a restart the engine may run with
// another one. Linear in the blocks held.
func (p *Precise) Clear() { p.clear(false) }

// ClearCold is Clear before a snapshot is applied (the KV-event
// snapshot service's replay program): the candidate then stays cold until
// MarkLive, however many blocks the snapshot stores, where after Clear it
// would go live once its stores reach its bound (kvevents.ColdClearer,
// which the subscriber calls before a snapshot).
func (p *Precise) ClearCold() { p.clear(true) }

func (p *Precise) clear(hold bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	p.blockSize.Store(0)
	p.stats.Resets++
	p.warming, p.holdCold, p.sinceClear = true, hold, 0
}

// clearLocked goes cold and drops every block, the group sets and the
// scopes. The slots and the engine table keep their storage, so an index
// refilled after a restart does not grow them again. p.mu is held.
func (p *Precise) clearLocked() {
	p.setLive(false)
	// A new table: selections that saw the index live may still read the
	// old one.
	p.w = newPosTable(len(p.w.keys))
	p.nslots, p.free = 0, p.free[:0]
	p.head, p.tail, p.ghead = -1, -1, -1
	clear(p.more)
	p.engine.reset()
	p.groups = [numTiers]uint64{}
	p.copies = 0
	p.resetScopes()
}

// resetScopes forgets every scope but scope 0. p.mu is held.
func (p *Precise) resetScopes() {
	p.scopes = append(p.scopes[:0], scopeInfo{t: tierGPU, g: 0, local: true})
	clear(p.scopeIDs)
	p.localScopes = [numTiers][maxGroups]uint8{}
	p.localScopes[tierGPU][0] = 1
}

// Apply applies one batch (kvevents.Sink). Work is linear in the batch.
func (p *Precise) Apply(b *kvevents.Batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return
	}
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			p.stored(ev)
		case kvevents.BlockRemoved:
			p.removed(ev)
		case kvevents.AllBlocksCleared:
			p.clearGPU()
			p.stats.Cleared++
			if !p.holdCold {
				p.warming = false
				p.setLive(true)
			}
		}
	}
	if p.warming && !p.holdCold && p.sinceClear >= p.capacity {
		p.warming = false
		p.setLive(true)
	}
	p.batches++
	p.expireLocked()
}

// lingerBatches is how many batches a released request's in-flight blocks
// are still counted for: an engine publishes a request's stored blocks
// before it answers the request's end, but the events travel on another
// connection than the answer, so they can reach the router just after the
// request ended, when the conversation's next turn is already being
// placed. The blocks the events then store are held by the index itself;
// the few batches bound how long blocks the engine never stored (a
// request aborted before its prefill) are believed.
const lingerBatches = 4

// lingering is a released Inflight, dropped once batches reaches until.
type lingering struct {
	in    *Inflight
	until uint64
}

// expireLocked drops the lingering in-flight blocks whose time is up.
// p.mu is held.
func (p *Precise) expireLocked() {
	i := 0
	for ; i < len(p.lingering) && p.lingering[i].until <= p.batches; i++ {
		p.lingering[i].in.drop()
		p.lingering[i] = lingering{}
	}
	if i > 0 {
		p.lingering = append(p.lingering[:0], p.lingering[i:]...)
	}
}

// parseTier returns the tier of a medium: absent or "GPU" (any case) the
// GPU, "CPU" or "CPU_…" (any case: vLLM's offloading connectors, LMCache's
// "cpu", SGLang's "CPU_PINNED") the CPU; false for any other.
func parseTier(medium []byte) (tier, bool) {
	switch {
	case medium == nil || equalFold(medium, "GPU"):
		return tierGPU, true
	case equalFold(medium, "CPU") || len(medium) > 4 && equalFold(medium[:4], "CPU_"):
		return tierCPU, true
	}
	return 0, false
}

// equalFold reports whether b is s, ASCII letters in any case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// optDigest is the digest of an optional string: 0 when absent.
func optDigest(b []byte) uint64 {
	if b == nil {
		return 0
	}
	return bytesContentID(b) | 1
}

// scopeOf returns the id of ev's residency scope on tier t, group g;
// with create, a scope not seen since Clear is added (false beyond
// maxScopes); without, false for it. p.mu is held.
func (p *Precise) scopeOf(ev *kvevents.Event, t tier, g int, create bool) (uint8, bool) {
	if t == tierGPU && g == 0 && ev.Locality == nil && ev.Ownership == nil {
		return 0, true
	}
	k := scopeKey{t: t, g: uint8(g), loc: optDigest(ev.Locality), own: optDigest(ev.Ownership)}
	if id, ok := p.scopeIDs[k]; ok {
		return id, true
	}
	if !create || len(p.scopes) >= maxScopes {
		return 0, false
	}
	id := uint8(len(p.scopes))
	local := ev.Locality == nil || equalFold(ev.Locality, "LOCAL")
	p.scopes = append(p.scopes, scopeInfo{t: t, g: uint8(g), local: local})
	p.scopeIDs[k] = id
	if local {
		p.localScopes[t][g]++
	}
	return id, true
}

// groupIdx returns the event's group (absent: 0), false when out of range.
func groupIdx(ev *kvevents.Event) (int, bool) {
	if !ev.HasGroupIdx {
		return 0, true
	}
	if ev.GroupIdx < 0 || ev.GroupIdx >= maxGroups {
		return 0, false
	}
	return int(ev.GroupIdx), true
}

// held reports whether slot i is held on tier t: every group reported on
// it has a local copy.
func (p *Precise) held(t tier, i int32) bool {
	m := p.slot(i).mask[t]
	return m != 0 && m == p.groups[t]
}

// addGroup notes a group reported on tier t; a new one withdraws every
// block held on the tier (walking the GPU list, or every block for the
// CPU tier). p.mu is held.
func (p *Precise) addGroup(t tier, g int) {
	bit := uint64(1) << g
	old := p.groups[t]
	if old&bit != 0 {
		return
	}
	if old != 0 {
		tab := p.w
		withdraw := func(i int32) {
			if p.slot(i).mask[t] == old {
				tab.setFlag(tab.find(p.slot(i).rh), tierFlag(t), false)
			}
		}
		if t == tierGPU {
			for i := p.ghead; i >= 0; i = p.slot(i).gnext {
				withdraw(i)
			}
		} else {
			for i := p.head; i >= 0; i = p.slot(i).next {
				withdraw(i)
			}
		}
	}
	p.groups[t] = old | bit
}

// learnBlockSize sets E to size (0 < size <= 2^20) and bounds the index
// by it, its lookup table made at the bound's size (or kept, when it is
// that size already). Nothing is held: E is learnt after a Clear. p.mu
// is held.
func (p *Precise) learnBlockSize(size int64) {
	p.blockSize.Store(size)
	p.capacity = p.bound(int(size))
	if want := tableSize(p.capacity); len(p.w.keys) != want {
		p.replaceTable(newPosTable(want))
	}
}

func (p *Precise) stored(ev *kvevents.Event) {
	n := uint64(len(ev.BlockHashes))
	if n == 0 {
		return
	}
	t, ok := parseTier(ev.Medium)
	if !ok {
		p.stats.SkippedTier += n
		return
	}
	g, ok := groupIdx(ev)
	if !ok {
		p.stats.SkippedGroup += n
		return
	}
	s, ok := p.scopeOf(ev, t, g, true)
	if !ok {
		p.stats.SkippedScope += n
		return
	}
	p.addGroup(t, g)
	e := int(p.blockSize.Load())
	tokenless := len(ev.TokenIDs) == 0 && !p.engineKeys
	if !tokenless {
		if e == 0 && ev.BlockSize > 0 && ev.BlockSize <= 1<<20 {
			p.learnBlockSize(ev.BlockSize)
			e = int(ev.BlockSize)
		}
		if e == 0 || int64(e) != ev.BlockSize {
			p.stats.SkippedBlockSize += n
			return
		}
	}
	switch {
	case p.engineKeys:
		for k, eh := range ev.BlockHashes {
			p.add(eh, eh, rawAt(ev, k), s, t)
		}
	case tokenless || len(ev.TokenIDs) > len(ev.BlockHashes)*e && len(ev.TokenIDs)%e == 0:
		// Keyed through the engine hashes' earlier stores.
		for k, eh := range ev.BlockHashes {
			rh, ok := p.resolve(eh)
			if !ok {
				p.stats.SkippedUnresolved++
				continue
			}
			p.add(rh, eh, rawAt(ev, k), s, t)
		}
	case len(ev.TokenIDs) != len(ev.BlockHashes)*e || ev.ExtraKeys != nil && len(ev.ExtraKeys) != len(ev.BlockHashes):
		p.stats.SkippedMalformed += n
	default:
		var prev uint64
		if ev.HasParent {
			r, ok := p.resolve(ev.ParentBlockHash)
			if !ok {
				p.stats.SkippedParent += n
				return
			}
			prev = r
		}
		extras := ev.LoRAName != nil || ev.HasLoRAID || ev.ExtraKeys != nil
		d := &p.digest
		rhs := p.scratch[:0]
		for i := range ev.BlockHashes {
			id := tokenContentID(ev.TokenIDs[i*e : (i+1)*e])
			if extras {
				d.reset()
				if ev.LoRAName != nil {
					d.bytes('L', ev.LoRAName)
				} else if ev.HasLoRAID {
					d.int('I', ev.LoRAID)
				}
				if ev.ExtraKeys != nil {
					d.event(ev.ExtraKeys[i], ev.LoRAName)
				}
				id = d.content(id)
			}
			prev = ChainHash(prev, id)
			rhs = append(rhs, prev)
		}
		p.scratch = rhs
		// Touch every block's table slots first: their cache misses
		// overlap, where probing block by block would wait for each.
		tab, sink := p.w, p.sink
		for i, rh := range rhs {
			sink ^= tab.touch(rh) ^ p.engine.touch(ev.BlockHashes[i])
		}
		p.sink = sink
		for i, rh := range rhs {
			p.add(rh, ev.BlockHashes[i], rawAt(ev, i), s, t)
		}
	}
}

// resolve returns the router hash of engine hash eh, false when no block
// the index knows was stored under it. p.mu is held.
func (p *Precise) resolve(eh uint64) (uint64, bool) {
	rh, ok := p.engine.get(eh)
	if !ok {
		return 0, false
	}
	if p.w.find(rh) < 0 {
		p.engine.del(eh) // an alias of a block since dropped
		return 0, false
	}
	return rh, true
}

// rawAt is how the engine sent ev's k-th block hash; nil for a
// non-negative int.
func rawAt(ev *kvevents.Event, k int) *kvevents.RawHash {
	if ev.RawHashes == nil {
		return nil
	}
	return &ev.RawHashes[k]
}

// add counts a copy of block rh, engine hash eh (sent as raw; nil: a
// non-negative int), in scope s of tier t: the block becomes the most
// recently stored, and a new block beyond the bound evicts the least
// recently stored. p.mu is held.
func (p *Precise) add(rh, eh uint64, raw *kvevents.RawHash, s uint8, t tier) {
	if p.addN(rh, eh, raw, s, 1) {
		p.stats.Stored++
		if t == tierGPU {
			p.sinceClear++
		}
	}
}

// addN is add of k copies, not counted in the stats; it reports whether
// it added any. The tier's name of the block becomes eh as sent (raw)
// when it did. p.mu is held.
func (p *Precise) addN(rh, eh uint64, raw *kvevents.RawHash, s uint8, k uint32) bool {
	if k == 0 || k > maxCopies {
		return false
	}
	tab := p.w
	var i int32
	if j := tab.find(rh); j >= 0 {
		i = tab.vals[j]
		p.toFront(i)
		if st := p.slot(i); st.eng != eh {
			// Another engine hash of the same block: both name it.
			st.eng = eh
			p.engine.put(eh, rh)
			p.sweepEngine()
			for t := range st.name {
				st.name[t] |= nameAliased
			}
		}
	} else {
		if tab.n >= p.capacity {
			p.drop(p.tail)
			p.stats.Evicted++
		}
		if tab.full() {
			return false // only before E is known, when nothing is stored
		}
		// Counted first, inserted with its tier flags after.
		i = p.newSlot(rh, eh)
		p.engine.put(eh, rh)
		ok := p.inc(i, s, k)
		var f uint64
		for t := range numTiers {
			if p.held(t, i) {
				f |= tierFlag(t)
			}
		}
		tab.insert(rh, i, f)
		if ok {
			p.setName(i, p.scopes[s].t, raw)
		}
		return ok
	}
	if !p.inc(i, s, k) {
		return false
	}
	p.setName(i, p.scopes[s].t, raw)
	return true
}

// newSlot returns a free slot for block rh, engine hash eh, at the front
// of the recency list. p.mu is held.
func (p *Precise) newSlot(rh, eh uint64) int32 {
	var i int32
	if n := len(p.free); n > 0 {
		i, p.free = p.free[n-1], p.free[:n-1]
	} else {
		i = p.nslots
		if int(i)>>slotChunkShift == len(p.st) {
			p.st = append(p.st, new([1 << slotChunkShift]slotState))
		}
		p.nslots++
	}
	*p.slot(i) = slotState{rh: rh, eng: eh, prev: -1, next: p.head, gprev: -1, gnext: -1}
	if p.head >= 0 {
		p.slot(p.head).prev = i
	} else {
		p.tail = i
	}
	p.head = i
	return i
}

// toFront makes slot i the most recently stored. p.mu is held.
func (p *Precise) toFront(i int32) {
	if p.head == i {
		return
	}
	p.unlink(i)
	st := p.slot(i)
	st.prev, st.next = -1, p.head
	p.slot(p.head).prev = i
	p.head = i
}

// unlink takes slot i out of the recency list. p.mu is held.
func (p *Precise) unlink(i int32) {
	st := p.slot(i)
	if st.prev >= 0 {
		p.slot(st.prev).next = st.next
	} else {
		p.head = st.next
	}
	if st.next >= 0 {
		p.slot(st.next).prev = st.prev
	} else {
		p.tail = st.prev
	}
}

// sweepEngine drops, once the engine-to-router map is over twice the
// bound, its entries that are not a known block's latest engine hash.
// Amortised O(1) per entry added. p.mu is held.
func (p *Precise) sweepEngine() {
	if p.engine.len() <= 2*p.capacity+1024 {
		return
	}
	tab := p.w
	p.engine.each(func(eh, rh uint64) {
		if j := tab.find(rh); j < 0 || p.slot(tab.vals[j]).eng != eh {
			p.engine.del(eh)
		}
	})
}

// inc adds k copies to slot i's scope s (none beyond maxCopies) and
// reports whether it added any. p.mu is held.
func (p *Precise) inc(i int32, s uint8, k uint32) bool {
	st := p.slot(i)
	if k == 0 || k > maxCopies || st.gref+st.oref > maxCopies-k {
		return false
	}
	info := p.scopes[s]
	var before uint32
	if s == 0 {
		before = st.cnt0
		st.cnt0 += k
	} else {
		key := moreKey(i, s)
		before = p.more[key]
		p.more[key] = before + k
	}
	if info.t == tierGPU {
		if st.gref == 0 {
			p.glink(i)
		}
		st.gref += k
	} else {
		st.oref += k
	}
	p.copies += int(k)
	if before == 0 && info.local {
		p.setBit(i, info.t, info.g)
	}
	return true
}

// dec takes one copy from slot i's scope s and reports whether it had
// one. p.mu is held.
func (p *Precise) dec(i int32, s uint8) bool {
	st := p.slot(i)
	info := p.scopes[s]
	var left uint32
	if s == 0 {
		if st.cnt0 == 0 {
			return false
		}
		st.cnt0--
		left = st.cnt0
	} else {
		key := moreKey(i, s)
		c := p.more[key]
		if c == 0 {
			return false
		}
		left = c - 1
		if left == 0 {
			delete(p.more, key)
		} else {
			p.more[key] = left
		}
	}
	if info.t == tierGPU {
		st.gref--
		if st.gref == 0 {
			p.gunlink(i)
		}
	} else {
		st.oref--
	}
	p.copies--
	if left == 0 && info.local && !p.otherLocal(i, s) {
		p.clearBit(i, info.t, info.g)
	}
	return true
}

// otherLocal reports whether slot i has a copy in a local scope of scope
// s's tier and group other than s. p.mu is held.
func (p *Precise) otherLocal(i int32, s uint8) bool {
	info := p.scopes[s]
	if p.localScopes[info.t][info.g] <= 1 {
		return false
	}
	for o := range p.scopes {
		oi := p.scopes[o]
		if uint8(o) == s || oi.t != info.t || oi.g != info.g || !oi.local {
			continue
		}
		if o == 0 && p.slot(i).cnt0 > 0 || o != 0 && p.more[moreKey(i, uint8(o))] > 0 {
			return true
		}
	}
	return false
}

// setBit notes that group g of tier t has a local copy of slot i.
func (p *Precise) setBit(i int32, t tier, g uint8) {
	st := p.slot(i)
	m := st.mask[t] | 1<<g
	if m == st.mask[t] {
		return
	}
	st.mask[t] = m
	if m == p.groups[t] {
		// A new block is not in the table yet: addN inserts it with its
		// flags.
		tab := p.w
		if j := tab.find(st.rh); j >= 0 {
			tab.setFlag(j, tierFlag(t), true)
		}
	}
}

// clearBit notes that group g of tier t has no local copy of slot i.
func (p *Precise) clearBit(i int32, t tier, g uint8) {
	st := p.slot(i)
	bit := uint64(1) << g
	if st.mask[t]&bit == 0 {
		return
	}
	if p.held(t, i) {
		tab := p.w
		tab.setFlag(tab.find(st.rh), tierFlag(t), false)
	}
	st.mask[t] &^= bit
}

func (p *Precise) glink(i int32) {
	st := p.slot(i)
	st.gprev, st.gnext = -1, p.ghead
	if p.ghead >= 0 {
		p.slot(p.ghead).gprev = i
	}
	p.ghead = i
}

func (p *Precise) gunlink(i int32) {
	st := p.slot(i)
	if st.gprev >= 0 {
		p.slot(st.gprev).gnext = st.gnext
	} else {
		p.ghead = st.gnext
	}
	if st.gnext >= 0 {
		p.slot(st.gnext).gprev = st.gprev
	}
	st.gprev, st.gnext = -1, -1
}

// dropMore deletes slot i's copy counts in scopes other than 0 (of tier
// t only when gpuOnly). p.mu is held.
func (p *Precise) dropMore(i int32, gpuOnly bool) {
	for s := 1; s < len(p.scopes); s++ {
		if !gpuOnly || p.scopes[s].t == tierGPU {
			delete(p.more, moreKey(i, uint8(s)))
		}
	}
}

// drop removes slot i's block entirely, with all its copies. p.mu is held.
func (p *Precise) drop(i int32) {
	st := p.slot(i)
	if st.gref > 0 {
		p.gunlink(i)
	}
	if st.gref > st.cnt0 || st.oref > 0 {
		p.dropMore(i, false)
	}
	p.copies -= int(st.gref + st.oref)
	p.forget(i)
}

// forget takes slot i's block out of the table, the engine map and the
// recency list, and frees the slot. p.mu is held.
func (p *Precise) forget(i int32) {
	st := p.slot(i)
	tab := p.w
	tab.del(tab.find(st.rh))
	if rh, ok := p.engine.get(st.eng); ok && rh == st.rh {
		p.engine.del(st.eng)
	}
	p.unlink(i)
	*st = slotState{prev: -1, next: -1, gprev: -1, gnext: -1}
	p.free = append(p.free, i)
}

// clearGPU takes every GPU copy away (AllBlocksCleared): the blocks with
// no other copy go, and the GPU groups are learnt again. Linear in the
// blocks with GPU copies. p.mu is held.
func (p *Precise) clearGPU() {
	tab := p.w
	for i := p.ghead; i >= 0; {
		st := p.slot(i)
		next := st.gnext
		if p.held(tierGPU, i) {
			tab.setFlag(tab.find(st.rh), flagGPU, false)
		}
		if st.gref > st.cnt0 {
			p.dropMore(i, true)
		}
		p.copies -= int(st.gref)
		st.mask[tierGPU], st.cnt0, st.gref, st.gprev, st.gnext = 0, 0, 0, -1, -1
		if st.oref == 0 {
			p.forget(i)
		}
		i = next
	}
	p.ghead = -1
	p.groups[tierGPU] = 0
}

func (p *Precise) removed(ev *kvevents.Event) {
	n := uint64(len(ev.BlockHashes))
	t, ok := parseTier(ev.Medium)
	if !ok {
		p.stats.SkippedTier += n
		return
	}
	g, ok := groupIdx(ev)
	if !ok {
		p.stats.SkippedGroup += n
		return
	}
	s, ok := p.scopeOf(ev, t, g, false)
	if !ok {
		return // no copy was ever counted in that scope
	}
	// Touch every block's engine-table slot, then, resolved, its table
	// slot, before probing them (see stored).
	tab, sink := p.w, p.sink
	for _, eh := range ev.BlockHashes {
		sink ^= p.engine.touch(eh)
	}
	rhs, found := p.scratch[:0], p.found[:0]
	for _, eh := range ev.BlockHashes {
		rh, ok := p.engine.get(eh)
		rhs, found = append(rhs, rh), append(found, ok)
		sink ^= tab.touch(rh)
	}
	p.scratch, p.found, p.sink = rhs, found, sink
	for k, eh := range ev.BlockHashes {
		rh := rhs[k]
		if !found[k] {
			continue
		}
		j := tab.find(rh)
		if j < 0 {
			p.engine.del(eh) // an alias of a block since dropped
			continue
		}
		i := tab.vals[j]
		if !p.dec(i, s) {
			continue
		}
		p.stats.Removed++
		if st := p.slot(i); st.gref == 0 && st.oref == 0 {
			p.drop(i)
		}
	}
}

// overlapTokens returns n·E for the n leading engine blocks of the prompt
// the candidate holds on GPU or will hold (its set, then the blocks of
// requests in flight on it: AddInflight), and true, when it is live and
// the prompt has token ids; else false. Lock-free.
func (p *Precise) overlapTokens(prompt shared.PromptKey) (int, bool) {
	o := p.tierOverlap(prompt, false)
	return o.GPUTokens, o.Precise
}

// tierOverlap is overlapTokens, with, when cpu is set, the CPU-tier
// blocks that follow. Lock-free.
func (p *Precise) tierOverlap(prompt shared.PromptKey, cpu bool) TierOverlap {
	if prompt == nil || !p.live.Load() {
		return TierOverlap{}
	}
	e := int(p.blockSize.Load())
	if e <= 0 {
		return TierOverlap{}
	}
	tab := p.tab.Load()
	hashes := prompt.TokenBlockHashes(e)
	if hashes == nil {
		return TierOverlap{}
	}
	n := tab.leading(hashes, flagGPU)
	if p.inflightN.Load() > 0 {
		for n < len(hashes) {
			if _, ok := p.inflight.Load(hashes[n]); !ok && !tab.has(hashes[n], flagGPU) {
				break
			}
			n++
		}
	}
	o := TierOverlap{Precise: true, BlockSize: e, GPUTokens: n * e}
	if cpu {
		o.CPUTokens = tab.leading(hashes[n:], flagCPU) * e
	}
	return o
}

// TierOverlap is what a candidate's live precise index holds of a prompt,
// by tier, in tokens.
type TierOverlap struct {
	// Precise is false (and the rest zero) when the candidate has no live
	// precise index or the prompt no token ids.
	Precise bool
	// BlockSize is the engine's block size E.
	BlockSize int
	// GPUTokens is n·E for the n leading engine blocks held on GPU or
	// counted in flight (AddInflight): what CACHE counts.
	GPUTokens int
	// CPUTokens is m·E for the m blocks right after those that the
	// engine's CPU tier holds: an engine with a CPU offloading connector
	// loads them instead of computing them (its connector looks up the
	// blocks after the GPU hit, in order). A CPU-tier block costs about a
	// fifth of computing it: see docs/kv-events.md, "What a CPU-tier hit
	// is worth".
	CPUTokens int
}

// TierOverlap returns what candidate c's live precise index holds of the
// prompt by tier; the zero TierOverlap when c is untracked, has no live
// precise index, or the prompt has no token ids. Lock-free.
func (x *Index) TierOverlap(c Candidate, prompt shared.PromptKey) TierOverlap {
	m := x.member(c)
	if m == nil || m.precise == nil {
		return TierOverlap{}
	}
	return m.precise.tierOverlap(prompt, true)
}

// Inflight is a request's blocks counted as held by its candidate while
// it is in flight there (Index.AddInflight). Release ends it; later calls
// do nothing. It implements fleet.Held, so the request's booking releases
// it.
type Inflight struct {
	p      *Precise
	hashes []uint64
	done   atomic.Bool
}

// AddInflight counts the prompt's engine blocks that candidate c's live
// precise index does not hold yet as held until the returned Inflight is
// released (at the request's end). An engine publishes a block only once
// it has computed it, which is after the request was placed: without
// this, a second request sharing the new prefix, placed while the first
// is queued or in prefill, would be believed a miss there, although the
// engine will serve it from the first's blocks (it schedules in arrival
// order, and a running request's blocks cannot be evicted). The blocks
// are those after the leading run the index holds, so a turn of a
// conversation adds only its new part. nil when c has no live precise
// index, the prompt has no token ids, or every block is held.
func (x *Index) AddInflight(c Candidate, prompt shared.PromptKey) *Inflight {
	m := x.member(c)
	if m == nil || m.precise == nil || prompt == nil {
		return nil
	}
	p := m.precise
	e := int(p.blockSize.Load())
	if !p.live.Load() || e <= 0 {
		return nil
	}
	hashes := prompt.TokenBlockHashes(e)
	n := p.tab.Load().leading(hashes, flagGPU)
	if n == len(hashes) {
		return nil
	}
	in := &Inflight{p: p, hashes: hashes[n:]}
	for _, h := range in.hashes {
		p.inflight.Compute(h, func(old int32, loaded bool) (int32, xsync.ComputeOp) {
			if !loaded {
				p.inflightN.Add(1)
			}
			return old + 1, xsync.UpdateOp
		})
	}
	return in
}

// Release ends the request's claim (idempotent): its blocks are counted
// for lingerBatches more batches of the engine's stream (see
// lingerBatches), then no more; a dead or cold index drops them at once.
func (in *Inflight) Release() {
	if in == nil || !in.done.CompareAndSwap(false, true) {
		return
	}
	p := in.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || !p.live.Load() {
		in.drop()
		return
	}
	p.lingering = append(p.lingering, lingering{in: in, until: p.batches + lingerBatches})
}

// drop stops counting the request's blocks.
func (in *Inflight) drop() {
	p := in.p
	for _, h := range in.hashes {
		p.inflight.Compute(h, func(old int32, loaded bool) (int32, xsync.ComputeOp) {
			if !loaded {
				return 0, xsync.CancelOp
			}
			if old <= 1 {
				p.inflightN.Add(-1)
				return 0, xsync.DeleteOp
			}
			return old - 1, xsync.UpdateOp
		})
	}
}

// HashKey is a prompt known only by its chained block hashes at one block
// size (a trace's: ChainHashes of its hash_ids, shared.Request.BlockHashes
// at the router's block size), the shared.PromptKey of requests routed to
// precise indexes keyed by engine hashes (Precise.KeyByEngineHashes,
// replay only).
type HashKey struct {
	// Hashes are the chained hashes of the prompt's blocks of BlockSize
	// tokens, as the engine hashes them.
	Hashes    []uint64
	BlockSize int
}

// TokenBlockHashes returns k.Hashes when blockSize is k.BlockSize, else
// nil (the prompt is unknown at that size: such a candidate is scored
// approximately). The slice must not be modified.
func (k *HashKey) TokenBlockHashes(blockSize int) []uint64 {
	if k == nil || blockSize != k.BlockSize || blockSize <= 0 {
		return nil
	}
	if k.Hashes == nil {
		return []uint64{}
	}
	return k.Hashes
}

// maxEngineSizes bounds the block sizes a Key caches hashes for; further
// sizes are hashed on every call.
const maxEngineSizes = 4

// Key is a request's prompt as token ids, with what else its engine's
// block hash includes (vLLM's generate_block_hash_extra_keys: the LoRA
// adapter on every block, cache_salt on the first, multimodal items where
// they fall), and its chained hashes at each block size computed once
// (shared.PromptKey). A precise index keys the engine's blocks from the
// same parts (see extrakeys.go), so a request finds exactly the blocks
// its engine would serve it from cache: an adapter's blocks only for that
// adapter, salted blocks only for the same salt. Not safe for concurrent
// use.
type Key struct {
	// IDs are the prompt's token ids.
	IDs []int64
	// LoRA is the name of the LoRA adapter the request runs with (vLLM's
	// lora_name: the adapter's model id in /v1/models), "" for the base
	// model.
	LoRA string
	// Salt is the request's cache_salt, "" for none (vLLM ignores an
	// empty salt).
	Salt string
	// MM are the prompt's multimodal items, sorted by Offset and not
	// overlapping (vLLM's mm_features); nil for a text prompt.
	MM []MMItem

	n      int
	sizes  [maxEngineSizes]int
	hashes [maxEngineSizes][]uint64
}

// TokenBlockHashes returns the chained hashes of the full blocks of
// blockSize ids, any size > 0: TokenBlocks' for a base-model, unsalted
// text prompt; with LoRA, Salt or MM, each block's content id mixed with
// its extra-key parts as the engine's events give them. Empty (not nil)
// for a prompt shorter than one block; nil when k has no ids or
// blockSize <= 0. The slice is cached (for up to 4 sizes) and must not be
// modified.
func (k *Key) TokenBlockHashes(blockSize int) []uint64 {
	if k == nil || k.IDs == nil || blockSize <= 0 {
		return nil
	}
	for i := range k.n {
		if k.sizes[i] == blockSize {
			return k.hashes[i]
		}
	}
	h := make([]uint64, 0, len(k.IDs)/blockSize)
	if k.LoRA == "" && k.Salt == "" && len(k.MM) == 0 {
		h = tokenBlocks(h, k.IDs, blockSize)
	} else {
		var d extrasDigest
		var prev uint64
		for start := 0; start+blockSize <= len(k.IDs); start += blockSize {
			keyDigest(&d, start, start+blockSize, k.LoRA, k.Salt, k.MM)
			prev = ChainHash(prev, d.content(tokenContentID(k.IDs[start:start+blockSize])))
			h = append(h, prev)
		}
	}
	if k.n < len(k.sizes) {
		k.sizes[k.n], k.hashes[k.n] = blockSize, h
		k.n++
	}
	return h
}
