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
// default 16-token block, ~50 MB of index).
const MaxPreciseBlocks = 1 << 19

// maxGroups is the KV-cache groups a precise index tracks (group_idx 0 to
// 63); events of higher groups are skipped.
const maxGroups = 64

// Precise is one candidate's precise index: the blocks its engine reports
// it holds (router/kvevents), keyed at the engine's block size E by the
// router's own chained hash of their token ids, so that a request cut with
// TokenBlocks(ids, E) finds them. It implements kvevents.Sink. Events are
// applied under its own mutex; selections read its set of held blocks, an
// open-addressing table of atomic words, without locking or allocating.
//
// The rules, for every BlockStored:
//   - Tier: only the GPU tier counts (medium "GPU" or absent). Blocks
//     stored in or removed from other tiers (CPU, disk offload) are
//     skipped and counted: such a block is a cheaper miss, not a hit.
//   - Block size: E is the first event's block_size; an event at another
//     size is skipped and counted, and its group still counts as reported,
//     so none of its blocks ever count as held (see groups).
//   - Keys: the router hash of block i is ChainHash(prev, content id of its
//     E token ids) (TokenBlocks' content id), prev being the router hash
//     of the parent block (parent_block_hash, through the engine-to-router
//     map) or, for a first block, 0 (base model) or the LoRA seed
//     (LoRASeed of lora_name; an engine sending only a lora_id gets a seed
//     of the id, which no request matches). A block with extra keys
//     (multimodal ids, cache salt, …) has its content id mixed with the
//     FNV-1a digest of their msgpack bytes, so it never matches a
//     text-only request, nor do blocks chained after it.
//   - Unknown parent: a parent hash absent from the engine-to-router map
//     (its store was missed, evicted from the index, or skipped) makes the
//     event's blocks unkeyable: they are skipped and counted.
//   - Groups (hybrid models): a block counts as held only when every KV
//     group the engine has reported (group_idx, absent = 0) holds it. A
//     new group appearing withdraws every block until that group stores
//     it too; a group's BlockRemoved withdraws the block. This can miss
//     hits (a sliding-window group that dropped early blocks) but never
//     invents one.
//   - Bound: at most 2·capacity tokens / E blocks (capacity the
//     candidate's KV capacity; MaxPreciseBlocks when unknown), the least
//     recently stored evicted first. BlockRemoved of an engine hash the
//     index does not know is ignored.
//
// Engine-hash keys (replay only): after KeyByEngineHashes the router hash
// of a stored block is its engine hash, and its token ids, parent, LoRA and
// extra keys are not read. That is for a stream whose engine hashes
// already are the router's chained hashes, at E = the router's block size:
// router/replay's simulated engines, whose blocks are a trace's blocks
// hashed with ChainHashes (traces carry no token ids). Requests then
// present those hashes through a HashKey. Every other rule (tier, block
// size, groups, bound, warmth) is the same code. A real engine seeds its
// hashes per process and must be keyed by token ids.
//
// Warmth: a precise index starts cold (the candidate is scored by its
// approximate list) until MarkLive (its subscriber saw the stream from
// sequence 0, or replayed a gap). After Clear it is cold until it has
// stored as many blocks as its bound allows (the engine's cache has turned
// over) or the engine reports AllBlocksCleared (its state is then known).
type Precise struct {
	x *Index
	c Candidate

	live       atomic.Bool
	blockSize  atomic.Int64 // E, 0 until the first stored event
	engineKeys bool         // KeyByEngineHashes; guarded by mu
	// set holds the blocks every reported group holds, for lock-free
	// lookups; made when E is known, sized by the bound.
	set atomic.Pointer[hashSet]

	// inflight counts, per router hash at E, the requests in flight on
	// the candidate whose prompt has that block and which the set did not
	// hold when they were placed (AddInflight); inflightN is its number
	// of keys, so lookups skip it when empty.
	inflight  *xsync.Map[uint64, int32]
	inflightN atomic.Int64

	mu   sync.Mutex
	dead bool
	// lingering are released requests' in-flight blocks kept until
	// lingerBatches more batches have been applied (Inflight.Release);
	// batches counts the batches applied.
	lingering []lingering
	batches   uint64

	capTokens   int // 2·capacity in tokens; 0: unknown
	l           *lru
	eng, mask   []uint64          // per slot of l: engine hash, groups holding it
	engine      map[uint64]uint64 // engine hash -> router hash
	groups      uint64            // groups reported
	warming     bool              // cleared since the last MarkLive
	sinceClear  int               // blocks stored since Clear
	stats       PreciseStats
	seedScratch []byte
}

// PreciseStats are a precise index's counters since it was made. Block
// counts are in engine blocks.
type PreciseStats struct {
	// Live reports the candidate is scored by its precise index.
	Live bool
	// BlockSize is the engine's block size E (0 until known).
	BlockSize int
	// Blocks is the blocks held now.
	Blocks int
	// Stored, Removed and Cleared count applied block stores, block
	// removals and AllBlocksCleared events.
	Stored, Removed, Cleared uint64
	// Evicted counts blocks dropped by the bound.
	Evicted uint64
	// SkippedTier counts blocks of a tier other than the GPU's;
	// SkippedBlockSize, blocks at a block size other than E;
	// SkippedParent, blocks whose parent is unknown; SkippedGroup, blocks
	// of a group_idx beyond 63; SkippedMalformed, blocks of events whose
	// token ids or extra keys do not match their hashes.
	SkippedTier, SkippedBlockSize, SkippedParent, SkippedGroup, SkippedMalformed uint64
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
	p := &Precise{x: x, c: c, l: newLRU(mem.slot, MaxPreciseBlocks), engine: make(map[uint64]uint64), inflight: xsync.NewMap[uint64, int32]()}
	p.capTokens = preciseCapTokens(mem.capacityTokens)
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

// preciseCapTokens is a precise index's bound in tokens for a candidate
// whose KV capacity is capacityTokens: twice the capacity, 0 when it is
// unknown (0).
func preciseCapTokens(capacityTokens int) int {
	return 2 * capacityTokens
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

// resize bounds the index for a candidate of capacityTokens tokens (it
// was added again, with another capacity): once the engine's block size
// is known, the oldest blocks beyond the new bound are evicted and the
// lookup set is made again at the new size. Work is linear in the blocks
// held. x.mu is held.
func (p *Precise) resize(capacityTokens int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	capTokens := preciseCapTokens(capacityTokens)
	if p.dead || capTokens == p.capTokens {
		return
	}
	p.capTokens = capTokens
	e := int(p.blockSize.Load())
	if e == 0 {
		return // bounded when the first stored event gives E
	}
	n := p.bound(e)
	for len(p.l.pos) > n {
		p.drop(p.l.tail)
		p.stats.Evicted++
	}
	p.l.capacity = n
	set := newHashSet(n)
	for i := p.l.head; i >= 0; i = p.l.next[i] {
		if p.mask[i] == p.groups {
			set.add(p.l.hash[i])
		}
	}
	p.set.Store(set)
}

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
	s.Live, s.BlockSize, s.Blocks = p.live.Load(), int(p.blockSize.Load()), len(p.l.pos)
	return s
}

func (p *Precise) setLive(on bool) {
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
		p.warming = false
		p.setLive(true)
	}
}

// Clear drops every block and makes the candidate cold until warm again
// (kvevents.Sink). It also forgets the engine's block size E, learnt again
// from the next stored event: after a restart the engine may run with
// another one.
func (p *Precise) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	p.blockSize.Store(0)
	p.stats.Resets++
	p.warming, p.sinceClear = true, 0
}

// clearLocked drops every block and the group set, and goes cold. p.mu is
// held.
func (p *Precise) clearLocked() {
	if set := p.set.Load(); set != nil {
		set.reset()
	}
	p.l.reset()
	p.eng, p.mask = p.eng[:0], p.mask[:0]
	clear(p.engine)
	p.groups = 0
	p.setLive(false)
}

// LoRASeed is the chain seed of a LoRA adapter's blocks: the FNV-1a digest
// of "lora:" and its name, so an adapter's blocks never match the base
// model's (seed 0) nor another adapter's.
func LoRASeed(name string) uint64 {
	return bytesContentID([]byte("lora:" + name))
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
			p.clearLocked()
			p.stats.Cleared++
			p.warming = false
			p.setLive(true)
		}
	}
	if p.warming && p.sinceClear >= p.l.capacity {
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

func gpu(medium []byte) bool { return medium == nil || string(medium) == kvevents.MediumGPU }

// group returns the event's group bit, 0 when out of range.
func group(ev *kvevents.Event) uint64 {
	if !ev.HasGroupIdx {
		return 1
	}
	if ev.GroupIdx < 0 || ev.GroupIdx >= maxGroups {
		return 0
	}
	return 1 << ev.GroupIdx
}

// addGroup notes a reported group; a new one withdraws every held block.
func (p *Precise) addGroup(bit uint64) {
	if p.groups&bit != 0 {
		return
	}
	for i := p.l.head; i >= 0; i = p.l.next[i] {
		if p.mask[i] == p.groups {
			p.set.Load().del(p.l.hash[i])
		}
	}
	p.groups |= bit
}

// tierGroup returns the group bit of a store or removal the index takes
// (the GPU tier, a group below maxGroups); 0 after counting its blocks as
// skipped. p.mu is held.
func (p *Precise) tierGroup(ev *kvevents.Event) uint64 {
	n := uint64(len(ev.BlockHashes))
	if !gpu(ev.Medium) {
		p.stats.SkippedTier += n
		return 0
	}
	bit := group(ev)
	if bit == 0 {
		p.stats.SkippedGroup += n
	}
	return bit
}

func (p *Precise) stored(ev *kvevents.Event) {
	n := uint64(len(ev.BlockHashes))
	bit := p.tierGroup(ev)
	if bit == 0 {
		return
	}
	p.addGroup(bit)
	e := int(p.blockSize.Load())
	if e == 0 && ev.BlockSize > 0 && ev.BlockSize <= 1<<20 {
		e = int(ev.BlockSize)
		p.blockSize.Store(int64(e))
		p.l.capacity = p.bound(e)
		p.set.Store(newHashSet(p.l.capacity))
	}
	if int64(e) != ev.BlockSize {
		p.stats.SkippedBlockSize += n
		return
	}
	if p.engineKeys {
		for _, eh := range ev.BlockHashes {
			p.store(eh, eh, bit)
		}
		p.stats.Stored += n
		p.sinceClear += len(ev.BlockHashes)
		return
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*e || ev.ExtraKeys != nil && len(ev.ExtraKeys) != len(ev.BlockHashes) {
		p.stats.SkippedMalformed += n
		return
	}
	var prev uint64
	switch {
	case ev.HasParent:
		r, ok := p.engine[ev.ParentBlockHash]
		if !ok {
			p.stats.SkippedParent += n
			return
		}
		prev = r
	case ev.LoRAName != nil:
		p.seedScratch = append(append(p.seedScratch[:0], "lora:"...), ev.LoRAName...)
		prev = bytesContentID(p.seedScratch)
	case ev.HasLoRAID:
		prev = ChainHash(LoRASeed(""), uint64(ev.LoRAID))
	}
	for i, eh := range ev.BlockHashes {
		id := tokenContentID(ev.TokenIDs[i*e : (i+1)*e])
		if ev.ExtraKeys != nil && ev.ExtraKeys[i] != nil {
			id = ChainHash(id, bytesContentID(ev.ExtraKeys[i]))
		}
		prev = ChainHash(prev, id)
		p.store(prev, eh, bit)
	}
	p.stats.Stored += n
	p.sinceClear += len(ev.BlockHashes)
}

// store notes that group bit holds router hash rh, engine hash eh.
func (p *Precise) store(rh, eh uint64, bit uint64) {
	l := p.l
	if i, ok := l.pos[rh]; ok {
		l.touch(rh)
		if old := p.eng[i]; old != eh {
			if p.engine[old] == rh {
				delete(p.engine, old)
			}
			p.eng[i] = eh
		}
		p.engine[eh] = rh
		if p.mask[i] != p.groups && p.mask[i]|bit == p.groups {
			p.set.Load().add(rh)
		}
		p.mask[i] |= bit
		return
	}
	if len(l.pos) >= l.capacity {
		t := l.tail
		p.drop(t)
		p.stats.Evicted++
	}
	l.insert(rh) // never evicts: drop made room
	i := l.pos[rh]
	if int(i) == len(p.eng) {
		p.eng, p.mask = append(p.eng, 0), append(p.mask, 0)
	}
	p.eng[i], p.mask[i] = eh, bit
	p.engine[eh] = rh
	if bit == p.groups {
		p.set.Load().add(rh)
	}
}

// drop removes slot i's block entirely.
func (p *Precise) drop(i int32) {
	rh := p.l.hash[i]
	if p.mask[i] == p.groups {
		p.set.Load().del(rh)
	}
	if p.engine[p.eng[i]] == rh {
		delete(p.engine, p.eng[i])
	}
	p.l.remove(rh)
}

func (p *Precise) removed(ev *kvevents.Event) {
	bit := p.tierGroup(ev)
	if bit == 0 {
		return
	}
	for _, eh := range ev.BlockHashes {
		rh, ok := p.engine[eh]
		if !ok {
			continue
		}
		i := p.l.pos[rh]
		if p.mask[i] == p.groups {
			p.set.Load().del(rh)
		}
		p.mask[i] &^= bit
		if p.mask[i] == 0 {
			if p.engine[p.eng[i]] == rh {
				delete(p.engine, p.eng[i])
			}
			p.l.remove(rh)
		}
		p.stats.Removed++
	}
}

// overlapTokens returns n·E for the n leading engine blocks of the prompt
// the candidate holds or will hold (its set, then the blocks of requests
// in flight on it: AddInflight), and true, when it is live and the prompt
// has token ids; else false. Lock-free.
func (p *Precise) overlapTokens(prompt shared.PromptKey) (int, bool) {
	if prompt == nil || !p.live.Load() {
		return 0, false
	}
	e := int(p.blockSize.Load())
	if e <= 0 {
		return 0, false
	}
	set := p.set.Load()
	hashes := prompt.TokenBlockHashes(e)
	if hashes == nil || set == nil {
		return 0, false
	}
	n := set.leading(hashes)
	if p.inflightN.Load() > 0 {
		for n < len(hashes) {
			if _, ok := p.inflight.Load(hashes[n]); !ok && !set.has(hashes[n]) {
				break
			}
			n++
		}
	}
	return n * e, true
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
	set := p.set.Load()
	if !p.live.Load() || e <= 0 || set == nil {
		return nil
	}
	hashes := prompt.TokenBlockHashes(e)
	n := set.leading(hashes)
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

// Key is a request's prompt as token ids, with its chained hashes at each
// block size computed once (shared.PromptKey). Not safe for concurrent
// use.
type Key struct {
	// IDs are the prompt's token ids.
	IDs []int64
	// LoRA is the LoRA adapter the request runs with, "" for the base
	// model (its blocks chain from LoRASeed).
	LoRA string
	// Salt is the request's cache_salt, "" for none: vLLM puts it in the
	// extra keys of the prompt's first block, so a salted prompt's blocks
	// are not an unsalted one's (router/serve sets it; how the precise
	// index keys it is this package's).
	Salt string

	n      int
	sizes  [maxEngineSizes]int
	hashes [maxEngineSizes][]uint64
}

// TokenBlockHashes returns the chained hashes of the full blocks of
// blockSize ids (TokenBlocks, chained from the LoRA seed), empty (not nil)
// for a prompt shorter than one block; nil when k has no ids or blockSize
// <= 0. The slice is cached and must not be modified.
func (k *Key) TokenBlockHashes(blockSize int) []uint64 {
	if k == nil || k.IDs == nil || blockSize <= 0 {
		return nil
	}
	for i := range k.n {
		if k.sizes[i] == blockSize {
			return k.hashes[i]
		}
	}
	var seed uint64
	if k.LoRA != "" {
		seed = LoRASeed(k.LoRA)
	}
	h := tokenBlocks(make([]uint64, 0, len(k.IDs)/blockSize), k.IDs, blockSize, seed)
	if k.n < len(k.sizes) {
		k.sizes[k.n], k.hashes[k.n] = blockSize, h
		k.n++
	}
	return h
}
