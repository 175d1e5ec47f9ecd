package prefix

import (
	"encoding/binary"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// The engine's own names of a precise index's blocks. A block is keyed by
// the router's hash of its tokens; its engine hash (the name the engine
// gives it in its events) is kept folded to 64 bits (slotState.eng),
// which is the engine's value for vLLM's default int hashes but not for a
// bytes hash or a negative int. So that the blocks can be listed as the
// engine names them (the debug listener's /debug/workers/NAME/blocks),
// each block keeps, per tier, how the engine sent its latest store's hash
// (engineName, in two bytes of the slot's padding) and, for a hash of
// more than 8 bytes, its bytes (Precise.wide: maxWideHash bytes per slot
// and tier, in chunks made for the slots that need them). A hash of up
// to 8 bytes, a negative int and a plain int are told by the fold alone.

// maxWideHash is the widest engine hash kept whole, in bytes: vLLM's
// sha256 and sha256_cbor hashes are 32 bytes, its xxhash ones 16. A
// wider hash is listed by its fold and marked so (EngineBlock.Folded).
const maxWideHash = 32

// engineName says how the engine sent one tier's hash of a block: its
// kind (low 3 bits), a bytes hash's length (bits 3-8) and nameAliased.
type engineName uint16

// The kinds of engineName.
const (
	nameUint   engineName = iota // a non-negative int: eng
	nameNeg                      // a negative int: int64(eng)
	nameBytes                    // bytes, at most 8: eng's last n bytes big-endian
	nameWide                     // bytes, 9 to maxWideHash: the tier's wide store
	nameFolded                   // unknown: only eng, the fold, is known
	nameKind   engineName = 7
)

// nameAliased marks a block the engine named by more than one hash (the
// router keys both as one block: equal tokens and extra keys): only the
// latest store's is kept.
const nameAliased engineName = 1 << 15

func (n engineName) kind() engineName { return n & nameKind }
func (n engineName) size() int        { return int(n>>3) & 63 }

// setName makes the engine's hash as sent (raw; nil: a non-negative int)
// slot i's name on tier t. The fold is the slot's eng. p.mu is held.
func (p *Precise) setName(i int32, t tier, raw *kvevents.RawHash) {
	st := p.slot(i)
	n := nameUint
	if raw != nil {
		switch raw.Form {
		case kvevents.HashNegative:
			n = nameNeg
		case kvevents.HashBytes:
			switch b := raw.Bytes; {
			case len(b) <= 8:
				n = nameBytes | engineName(len(b))<<3
			case len(b) <= maxWideHash:
				n = nameWide | engineName(len(b))<<3
				copy(p.wideAt(t, i)[:], b)
			default:
				n = nameFolded
			}
		}
	}
	st.name[t] = st.name[t]&nameAliased | n
}

// wideAt returns slot i's wide bytes on tier t, making their chunk when
// it is not made. p.mu is held.
func (p *Precise) wideAt(t tier, i int32) *[maxWideHash]byte {
	c := int(i >> slotChunkShift)
	w := p.wide[t]
	for len(w) <= c {
		w = append(w, nil)
	}
	if w[c] == nil {
		w[c] = new([1 << slotChunkShift][maxWideHash]byte)
	}
	p.wide[t] = w
	return &w[c][i&(1<<slotChunkShift-1)]
}

// EngineBlock is one block a precise index counts copies of on one tier,
// named by its engine's own hash (Precise.EngineBlocks).
type EngineBlock struct {
	// Hash is the engine hash folded to 64 bits (kvevents.FoldHash):
	// a non-negative int's value, a negative int's two's complement.
	Hash uint64
	// Form is how the engine sent it: kvevents.HashUint,
	// kvevents.HashNegative (the value is int64(Hash)) or
	// kvevents.HashBytes (Bytes). Meaningless when Folded.
	Form kvevents.HashForm
	// Folded is true when only the fold is known: the block came from a
	// replica's snapshot (router/cluster carries folds), or its hash was
	// bytes wider than 32.
	Folded bool
	// Aliased is true when the engine stored the block under more than
	// one hash, which the router keys as one block (the same tokens and
	// extra keys): Hash is the latest store's, the others are not listed.
	Aliased bool
	// CPU is true for the CPU tier, false for the GPU's.
	CPU bool
	// Copies is the block's copies on the tier (vLLM does not
	// deduplicate: each is a stored and not yet removed copy), over its
	// groups and residency scopes.
	Copies uint32
	// Held is true when the tier holds the block for routing: every
	// group reported on it has a local copy (what CACHE counts on GPU).
	Held bool

	n    uint8
	wide [maxWideHash]byte
}

// Bytes returns a bytes hash's bytes (Form kvevents.HashBytes and not
// Folded), nil otherwise. The slice points into b.
func (b *EngineBlock) Bytes() []byte {
	if b.Folded || b.Form != kvevents.HashBytes {
		return nil
	}
	return b.wide[:b.n]
}

// EngineListing is where a precise index's listing stands
// (Precise.EngineBlocks).
type EngineListing struct {
	// Next is the slot the next call starts at; Done is true when every
	// slot was looked at.
	Next int
	Done bool
	// Resets is the index's Clear count when the call ran: a listing
	// whose calls saw different counts spans a Clear. Dropped is true
	// once the index was ended (Index.DropPrecise): it lists nothing more.
	Resets  uint64
	Dropped bool
}

// EngineBlocks appends to dst the blocks of up to n of the index's slots
// from slot from (0 to start), one entry per tier the block has copies
// on, named by their engine hashes, in no particular order, and says
// where the listing stands. It holds the index's lock for the copy only:
// O(n) work, 1 to 2 entries per slot; a listing made of several calls
// sees each block once but not one moment (blocks stored, removed or
// cleared between its calls may or may not be in it; Resets tells a
// Clear). n <= 0 lists every slot in one call.
func (p *Precise) EngineBlocks(from, n int, dst []EngineBlock) ([]EngineBlock, EngineListing) {
	p.mu.Lock()
	defer p.mu.Unlock()
	end := int(p.nslots)
	if n > 0 && from+n < end {
		end = from + n
	}
	out := EngineListing{Next: max(end, from), Done: end >= int(p.nslots), Resets: p.stats.Resets}
	if p.dead {
		out.Done, out.Dropped = true, true
		return dst, out
	}
	tab := p.w
	for i := int32(max(from, 0)); i < int32(end); i++ {
		st := p.slot(i)
		if st.gref+st.oref == 0 {
			continue // free
		}
		if j := tab.find(st.rh); j < 0 || tab.vals[j] != i {
			continue
		}
		for t := range numTiers {
			copies := st.gref
			if t == tierCPU {
				copies = st.oref
			}
			if copies == 0 {
				continue
			}
			nm := st.name[t]
			b := EngineBlock{Hash: st.eng, CPU: t == tierCPU, Copies: copies, Held: p.held(t, i), Aliased: nm&nameAliased != 0}
			switch nm.kind() {
			case nameNeg:
				b.Form = kvevents.HashNegative
			case nameBytes:
				// At most 8 bytes: the fold's last ones.
				b.Form, b.n = kvevents.HashBytes, uint8(nm.size())
				var full [8]byte
				binary.BigEndian.PutUint64(full[:], st.eng)
				copy(b.wide[:], full[8-b.n:])
			case nameWide:
				b.Form, b.n = kvevents.HashBytes, uint8(nm.size())
				copy(b.wide[:], p.wideAt(t, i)[:b.n])
			case nameFolded:
				b.Folded = true
			}
			dst = append(dst, b)
		}
	}
	return dst, out
}
