package prefix

import "github.com/switchyard-router/switchyard/router/kvevents"

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
	// duplicate blocks); nil when no block has more than one. Copies in
	// other groups count one each; locality and ownership scopes and
	// remote copies are not carried.
	CPU    []uint64
	Copies []uint32
}

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
		out.Approx = make([]uint64, 0, len(l.pos))
		for i := l.head; i >= 0; i = l.next[i] {
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
	if len(pc.Router) != len(pc.Engine) || len(pc.Router) != len(pc.Mask) ||
		pc.CPU != nil && len(pc.CPU) != len(pc.Router) || pc.Copies != nil && len(pc.Copies) != len(pc.Router) ||
		(pc.BlockSize <= 0 && len(pc.Router) > 0) || pc.BlockSize > 1<<20 {
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

// exportLocked returns the index's content. p.mu is held.
func (p *Precise) exportLocked() *PreciseContent {
	n := p.blocks()
	pc := &PreciseContent{BlockSize: int(p.blockSize.Load()), Groups: p.groups[tierGPU], CPUGroups: p.groups[tierCPU],
		Live: p.live.Load(), Warming: p.warming, SinceClear: p.sinceClear,
		Router: make([]uint64, 0, n), Engine: make([]uint64, 0, n), Mask: make([]uint64, 0, n)}
	var cpu []uint64
	var copies []uint32
	for i := p.head; i >= 0; i = p.slot(i).next {
		st := p.slot(i)
		k := len(pc.Router)
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
		if copies != nil {
			copies = append(copies, max(st.cnt0, 1))
		}
	}
	pc.CPU, pc.Copies = cpu, copies
	return pc
}

// importLocked stores pc's blocks, least recent first, so the most recent
// ends at the front; beyond the bound the least recent go. Linear in the
// content (a block's copies are added at once). p.mu is held.
func (p *Precise) importLocked(pc *PreciseContent) {
	p.groups = [numTiers]uint64{pc.Groups, pc.CPUGroups}
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
		// Only the engine hashes' folds travel: the engine's own value is
		// unknown here.
		if j := p.w.find(pc.Router[i]); j >= 0 {
			st := p.slot(p.w.vals[j])
			for t := range st.name {
				st.name[t] = st.name[t]&nameAliased | nameFolded
			}
		}
	}
}
