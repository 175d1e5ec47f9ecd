package prefix

import (
	"cmp"
	"slices"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// Content is one candidate's index content, as a replica's snapshot of
// the prefix index carries it (router/cluster): its approximate list and,
// when it is precise, its precise index. Export takes it, Import puts it
// back on another router's candidate of the same worker.
type Content struct {
	// Approx is the approximate list's block hashes (router block size),
	// most recent first.
	Approx []uint64
	// Precise is the precise index's content; nil when the candidate is
	// approximate.
	Precise *PreciseContent
}

// PreciseContent is a precise index's content: its blocks, most recent
// first, as parallel slices, and the state that scores them.
type PreciseContent struct {
	// BlockSize is the engine's block size E in tokens; 0 while unknown
	// (then there are no blocks).
	BlockSize int
	// Groups is the set of KV-cache groups reported on the GPU tier (bit
	// i: group_idx i); CPUGroups on the CPU tier.
	Groups, CPUGroups uint64
	// Live reports the index scores the candidate (its stream was
	// complete); Warming, that it was cleared since and is cold until it
	// has stored SinceClear blocks up to its bound.
	Live, Warming bool
	SinceClear    int
	// Router, Engine and Mask are each block's router hash (at E), engine
	// hash and the groups with a local GPU copy of it.
	Router, Engine, Mask []uint64
	// CPU is each block's groups with a local CPU copy; nil when no block
	// has one. Copies is each block's GPU copies in group 0 (vLLM's
	// duplicate blocks); nil when no block has more than one (Scopes
	// empty) or in the exact form (Scopes set) the copies in scope 0.
	CPU    []uint64
	Copies []uint32
	// Scopes and More carry residency exactly, as the index counts it
	// (the exact form), when the blocks' copies outside scope 0 (the GPU
	// tier's group 0, no locality, no ownership) are not one copy per
	// local (tier, group) of Mask and CPU: duplicates on the CPU tier or
	// in another group, copies with a locality or an ownership, remote
	// copies. Scopes are the residency scopes some block has copies in,
	// scope 0 excepted; More each block's copies in them, in ascending
	// (Block, Scope) order; Copies then has every block's copies in
	// scope 0 (0 for a block without). Mask and CPU are the groups held
	// as always, which the exact form implies (Import reads it instead).
	// Both empty otherwise: each bit of Mask and CPU other than the GPU
	// tier's group 0 is then one local copy in its (tier, group).
	Scopes []ResidencyScope
	More   []ScopeCopies
}

// ResidencyScope is a residency scope as a precise index keys it (see
// Residency on Precise): a tier, a KV-cache group, and the digests of
// the events' locality and ownership (0: absent).
type ResidencyScope struct {
	// CPU is the CPU tier; false the GPU tier.
	CPU bool
	// Group is the KV-cache group, 0 to 63.
	Group uint8
	// Locality and Ownership are the digests of the events' locality and
	// ownership (0 when absent), as the index derives them.
	Locality, Ownership uint64
	// Local reports the scope's copies are the publisher's own (locality
	// absent or "LOCAL"): they count as held; a remote copy never does.
	Local bool
}

// ScopeCopies is a block's copies in a scope: Block indexes the
// content's blocks (Router), Scope its Scopes; Copies is at least 1.
type ScopeCopies struct {
	Block  uint32
	Scope  uint8
	Copies uint32
}

// MaxContentScopes bounds PreciseContent.Scopes: the scopes a precise
// index counts between two Clears, scope 0 excepted.
const MaxContentScopes = maxScopes - 1

// Blocks is the number of blocks c holds (approximate and precise): the
// size of what Export returns, in hashes.
func (c *Content) Blocks() int {
	n := len(c.Approx)
	if c.Precise != nil {
		n += len(c.Precise.Router)
	}
	return n
}

// Export returns the candidate's content, false when it is not tracked.
// It copies under the candidate's locks, one at a time (its list, then its
// precise index): linear in what it holds, and concurrent routing only
// waits for the copy.
func (x *Index) Export(c Candidate) (Content, bool) {
	m := x.member(c)
	if m == nil {
		return Content{}, false
	}
	var out Content
	l := m.lru
	l.mu.Lock()
	if !l.dead {
		out.Approx = make([]uint64, 0, l.pos.len())
		for i := l.order.Front(); i >= 0; i = l.order.Next(i) {
			out.Approx = append(out.Approx, l.hash[i])
		}
	}
	l.mu.Unlock()
	if p := m.precise; p != nil {
		p.mu.Lock()
		if !p.dead {
			out.Precise = p.exportLocked()
		}
		p.mu.Unlock()
	}
	return out, true
}

// Import puts content on the tracked candidate c as if it had recorded
// and stored it, keeping its order: its approximate list takes
// content.Approx (beyond its capacity, the least recent go), and its
// precise index, when c is precise here (Precise was called: something
// feeds it), takes content.Precise if it holds nothing yet (a running
// stream is never overwritten). ok is false when c is not tracked or
// content.Precise is malformed (slices of unequal lengths, blocks without
// a block size), in which case nothing precise is imported; precise
// reports that content.Precise was imported. Linear in the content.
func (x *Index) Import(c Candidate, content Content) (ok, precise bool) {
	m := x.member(c)
	if m == nil {
		return false, false
	}
	if len(content.Approx) > 0 {
		x.Record(c, content.Approx)
	}
	pc := content.Precise
	if pc == nil {
		return true, false
	}
	if !pc.WellFormed() {
		return false, false
	}
	p := m.precise
	if p == nil {
		return true, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || p.blocks() > 0 || p.blockSize.Load() != 0 {
		return true, false
	}
	if pc.BlockSize > 0 {
		p.learnBlockSize(int64(pc.BlockSize))
	}
	p.importLocked(pc)
	p.warming, p.sinceClear = pc.Warming, pc.SinceClear
	if pc.Live {
		p.setLive(true)
	}
	return true, true
}

// WellFormed reports whether pc can be imported (Import refuses it
// otherwise): parallel slices of equal
// lengths, a block size when there are blocks, and in the exact form
// (Scopes set) at most MaxContentScopes distinct scopes other than scope
// 0, of groups below 64 (a scope without locality is local), Copies for
// every block, and More in strictly ascending (Block, Scope) order naming
// blocks and scopes that exist, with 1 to 2^30 copies each. Linear in pc.
func (pc *PreciseContent) WellFormed() bool {
	n := len(pc.Router)
	if len(pc.Engine) != n || len(pc.Mask) != n || pc.CPU != nil && len(pc.CPU) != n || pc.Copies != nil && len(pc.Copies) != n ||
		(pc.BlockSize <= 0 && n > 0) || pc.BlockSize > 1<<20 {
		return false
	}
	if len(pc.Scopes) == 0 {
		return len(pc.More) == 0
	}
	if len(pc.Scopes) > MaxContentScopes || len(pc.Copies) != n {
		return false
	}
	seen := make(map[ResidencyScope]bool, len(pc.Scopes))
	for _, sc := range pc.Scopes {
		key := sc
		key.Local = false
		if sc.Group >= maxGroups || sc.Locality == 0 && !sc.Local || seen[key] ||
			!sc.CPU && sc.Group == 0 && sc.Locality == 0 && sc.Ownership == 0 {
			return false
		}
		seen[key] = true
	}
	for i, e := range pc.More {
		if int(e.Block) >= n || int(e.Scope) >= len(pc.Scopes) || e.Copies == 0 || e.Copies > maxCopies {
			return false
		}
		if i > 0 {
			if prev := pc.More[i-1]; prev.Block > e.Block || prev.Block == e.Block && prev.Scope >= e.Scope {
				return false
			}
		}
	}
	for _, c := range pc.Copies {
		if c > maxCopies {
			return false
		}
	}
	return true
}

// exportLocked returns the index's content: in the exact form (Scopes,
// More) when some copy outside scope 0 is not one local copy in a
// (tier, group) without locality or ownership. p.mu is held.
func (p *Precise) exportLocked() *PreciseContent {
	n := p.blocks()
	pc := &PreciseContent{BlockSize: int(p.blockSize.Load()), Groups: p.groups[tierGPU], CPUGroups: p.groups[tierCPU],
		Live: p.live.Load(), Warming: p.warming, SinceClear: p.sinceClear,
		Router: make([]uint64, 0, n), Engine: make([]uint64, 0, n), Mask: make([]uint64, 0, n)}
	exact := p.needsExact()
	var pos []uint32 // exact: slot -> block index
	var cpu []uint64
	var copies []uint32
	if exact {
		pos, copies = make([]uint32, p.nslots), make([]uint32, 0, n)
	}
	for i := p.head; i >= 0; i = p.slot(i).next {
		st := p.slot(i)
		k := len(pc.Router)
		if exact {
			pos[i] = uint32(k)
		}
		pc.Router = append(pc.Router, st.rh)
		pc.Engine = append(pc.Engine, st.eng)
		pc.Mask = append(pc.Mask, st.mask[tierGPU])
		if st.mask[tierCPU] != 0 && cpu == nil {
			cpu = make([]uint64, k, n)
		}
		if cpu != nil {
			cpu = append(cpu, st.mask[tierCPU])
		}
		if st.cnt0 > 1 && copies == nil {
			copies = make([]uint32, k, n)
			for j := range copies {
				copies[j] = 1
			}
		}
		switch {
		case exact:
			copies = append(copies, st.cnt0)
		case copies != nil:
			copies = append(copies, max(st.cnt0, 1))
		}
	}
	pc.CPU, pc.Copies = cpu, copies
	if exact {
		p.exportScopes(pc, pos)
	}
	return pc
}

// needsExact reports whether some block has copies outside scope 0 other
// than one in a scope without locality or ownership: what Mask and CPU
// cannot say. Linear in the counts kept outside scope 0. p.mu is held.
func (p *Precise) needsExact() bool {
	if len(p.more) == 0 {
		return false
	}
	plain := make([]bool, len(p.scopes))
	for k, id := range p.scopeIDs {
		plain[id] = k.loc == 0 && k.own == 0
	}
	for key, c := range p.more {
		if c != 1 || !plain[uint8(key)] {
			return true
		}
	}
	return false
}

// exportScopes sets pc's Scopes (the scopes some block has copies in, by
// ascending scope id) and More (by ascending block and scope), pos giving
// each slot's block index. Linear in the counts kept outside scope 0,
// plus their sort. p.mu is held.
func (p *Precise) exportScopes(pc *PreciseContent, pos []uint32) {
	keys := make([]scopeKey, len(p.scopes))
	for k, id := range p.scopeIDs {
		keys[id] = k
	}
	remap := make([]int, len(p.scopes))
	for key := range p.more {
		remap[uint8(key)] = 1
	}
	for s := 1; s < len(p.scopes); s++ {
		if remap[s] == 0 {
			continue
		}
		remap[s] = len(pc.Scopes)
		k := keys[s]
		pc.Scopes = append(pc.Scopes, ResidencyScope{CPU: k.t == tierCPU, Group: k.g, Locality: k.loc, Ownership: k.own, Local: p.scopes[s].local})
	}
	pc.More = make([]ScopeCopies, 0, len(p.more))
	for key, c := range p.more {
		pc.More = append(pc.More, ScopeCopies{Block: pos[int32(key>>8)], Scope: uint8(remap[uint8(key)]), Copies: c})
	}
	slices.SortFunc(pc.More, func(a, b ScopeCopies) int {
		if a.Block != b.Block {
			return cmp.Compare(a.Block, b.Block)
		}
		return cmp.Compare(a.Scope, b.Scope)
	})
}

// importLocked stores pc's blocks, least recent first, so the most recent
// ends at the front; beyond the bound the least recent go. Linear in the
// content (a block's copies are added at once). p.mu is held.
func (p *Precise) importLocked(pc *PreciseContent) {
	p.groups = [numTiers]uint64{pc.Groups, pc.CPUGroups}
	if len(pc.Scopes) > 0 {
		p.importExact(pc)
		return
	}
	var none kvevents.Event // no locality, no ownership
	for i := len(pc.Router) - 1; i >= 0; i-- {
		var cpu uint64
		if pc.CPU != nil {
			cpu = pc.CPU[i]
		}
		for t, m := range [numTiers]uint64{pc.Mask[i], cpu} {
			for g := 0; m != 0; g, m = g+1, m>>1 {
				if m&1 == 0 {
					continue
				}
				s, ok := p.scopeOf(&none, tier(t), g, true)
				if !ok {
					continue
				}
				k := uint32(1)
				if tier(t) == tierGPU && g == 0 && pc.Copies != nil {
					k = min(max(pc.Copies[i], 1), maxCopies)
				}
				p.addN(pc.Router[i], pc.Engine[i], nil, s, k)
			}
		}
		p.markFolded(pc.Router[i])
	}
}

// markFolded marks the block keyed rh, if held, as named by its engine
// hash's 64-bit fold only: a snapshot carries folds, not the engine's own
// value. p.mu is held.
func (p *Precise) markFolded(rh uint64) {
	if j := p.w.find(rh); j >= 0 {
		st := p.slot(p.w.vals[j])
		for t := range st.name {
			st.name[t] = st.name[t]&nameAliased | nameFolded
		}
	}
}

// importExact is importLocked of the exact form: each block's copies in
// scope 0 (Copies) and in each scope More names. pc is well formed.
// p.mu is held.
func (p *Precise) importExact(pc *PreciseContent) {
	ids := make([]uint8, len(pc.Scopes))
	ok := make([]bool, len(pc.Scopes))
	for j, sc := range pc.Scopes {
		t := tierGPU
		if sc.CPU {
			t = tierCPU
		}
		ids[j], ok[j] = p.scopeOfKey(scopeKey{t: t, g: sc.Group, loc: sc.Locality, own: sc.Ownership}, true, sc.Local)
	}
	m := len(pc.More)
	for i := len(pc.Router) - 1; i >= 0; i-- {
		rh, eh := pc.Router[i], pc.Engine[i]
		if c := pc.Copies[i]; c > 0 {
			p.addN(rh, eh, nil, 0, c)
		}
		for ; m > 0 && pc.More[m-1].Block == uint32(i); m-- {
			if e := pc.More[m-1]; ok[e.Scope] {
				p.addN(rh, eh, nil, ids[e.Scope], e.Copies)
			}
		}
		p.markFolded(rh)
	}
}
