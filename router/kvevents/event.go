package kvevents

import (
	"bytes"
	"fmt"
)

// Kind is an event's type, named on the wire by its vLLM class name.
type Kind uint8

// The event kinds.
const (
	BlockStored      Kind = iota + 1 // "BlockStored"
	BlockRemoved                     // "BlockRemoved"
	AllBlocksCleared                 // "AllBlocksCleared"
)

var kindNames = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

// String returns the wire name of k.
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// vLLM's medium names (vllm/distributed/kv_events.py MEDIUM_GPU, MEDIUM_CPU,
// MEDIUM_STORAGE). An absent medium means the GPU tier too. The decoder
// reads a medium case-insensitively: "gpu" (as some offloading connectors
// send it) decodes as MediumGPU, and likewise for the others.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// The canonical media the decoder points Event.Medium at. Never written.
var (
	mediumGPU     = []byte(MediumGPU)
	mediumCPU     = []byte(MediumCPU)
	mediumStorage = []byte(MediumStorage)
)

// IsGPU reports whether medium (an Event's Medium) is the GPU tier: absent
// (nil) or "GPU" in any case.
func IsGPU(medium []byte) bool {
	return medium == nil || bytes.EqualFold(medium, mediumGPU)
}

// Event is one KV-cache event. Fields a kind does not have stay zero.
// Optional fields carry a Has flag (an int) or are nil when None (bytes).
// In a decoded Batch every slice points into the decoder's reused storage
// or into the payload, and is valid until the next decode into that Batch.
type Event struct {
	Kind Kind
	// BlockHashes are the engine's hashes of the blocks, folded to 64 bits
	// (see the package doc). BlockStored, BlockRemoved.
	BlockHashes []uint64
	// RawHashes says how the engine sent BlockHashes where their folds do
	// not say it exactly: nil when every one came as a non-negative int
	// (vLLM's default int hashes), else one entry per hash (RawHash). The
	// encoder writes them back as they came.
	RawHashes []RawHash
	// ParentBlockHash is the engine hash of the block preceding the first
	// of BlockHashes, when HasParent (None for a prompt's first block).
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the token ids of every stored block in order,
	// BlockSize per block. BlockStored.
	TokenIDs []int64
	// BlockSize is the engine's tokens per block. BlockStored.
	BlockSize int64
	// LoRAID is the deprecated LoRA adapter id, when HasLoRAID.
	LoRAID    int64
	HasLoRAID bool
	// Medium is the storage tier ("GPU", "CPU", …); nil when None. The
	// decoder gives the known tiers in upper case whatever their case on
	// the wire (MediumGPU, MediumCPU, MediumStorage); see IsGPU.
	Medium []byte
	// LoRAName is the LoRA adapter's name; nil when None (base model).
	LoRAName []byte
	// ExtraKeys, when not nil, has one entry per block: the raw msgpack
	// encoding of that block's extra-keys tuple (multimodal ids, LoRA name,
	// cache salt…), nil for None. nil when the field is None or absent.
	ExtraKeys [][]byte
	// GroupIdx is the KV-cache group (hybrid models), when HasGroupIdx.
	GroupIdx    int64
	HasGroupIdx bool
	// SpecKind is kv_cache_spec_kind (e.g. "full_attention"); nil when None.
	SpecKind []byte
	// SlidingWindow is kv_cache_spec_sliding_window, when HasSlidingWindow.
	SlidingWindow    int64
	HasSlidingWindow bool
	// Locality is "LOCAL" or "REMOTE" relative to the publisher, nil when
	// None; Ownership names the secondary offloading tier that generated
	// the event (vLLM PR 52067), nil when None. BlockStored, BlockRemoved.
	Locality, Ownership []byte
	// SessionID is the session that triggered a store (the snapshot
	// branch of vLLM PR 57789); Origin is "NEW" or "REUSED" (vLLM PR
	// 51699, open). nil when None or absent. BlockStored.
	SessionID, Origin []byte

	extra [][]byte  // ExtraKeys' storage, kept while ExtraKeys is nil
	raw   []RawHash // RawHashes' storage, kept while RawHashes is nil
}

// HashForm is how an engine sent one block hash on the wire: vLLM's
// ExternalBlockHash is bytes or an int, SGLang's a signed 64-bit int.
type HashForm uint8

// The hash forms.
const (
	// HashUint is a non-negative int: its fold (Event.BlockHashes) is
	// its value.
	HashUint HashForm = iota
	// HashNegative is a negative int: int64 of its fold is its value.
	HashNegative
	// HashBytes is bytes (RawHash.Bytes): vLLM's raw hashes with
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, 32 bytes for sha256 and
	// sha256_cbor, 16 for xxhash; its fold is FoldHash of them.
	HashBytes
)

// RawHash is one block hash as the engine sent it (Event.RawHashes).
type RawHash struct {
	Form HashForm
	// Bytes are a HashBytes hash's bytes; nil for an int. A decoded
	// Batch's point into the payload.
	Bytes []byte
}

// Batch is one published EventBatch.
type Batch struct {
	// TS is the engine's timestamp, seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DataParallelRank is the publishing rank, when HasDataParallelRank.
	DataParallelRank    int64
	HasDataParallelRank bool
}

// BlockEvents returns the block events in b: a block stored or removed
// counts one, a clear counts one.
func (b *Batch) BlockEvents() int {
	n := 0
	for i := range b.Events {
		if k := len(b.Events[i].BlockHashes); k > 0 {
			n += k
		} else if b.Events[i].Kind == AllBlocksCleared {
			n++
		}
	}
	return n
}

// Sink receives one candidate's event stream (the prefix index's Precise
// implements it). The subscriber calls it from one goroutine, in sequence
// order. The Batch and everything it points to are valid only during
// Apply.
//
// A snapshot bootstrap (Options.SnapshotEndpoint) is Clear, then Apply of
// each snapshot chunk (a replay program: stores in their original order,
// then removals of excess copies), then Apply of the live batches after
// the snapshot's cut, then MarkLive: until MarkLive the sink holds a
// partial state and must not score the candidate precisely.
type Sink interface {
	// Apply applies one batch, in sequence order.
	Apply(b *Batch)
	// Clear drops everything the sink learned from the stream: the
	// stream had a gap that could not be replayed, or the engine
	// restarted. The sink is cold (not trusted) until it is warm again.
	Clear()
	// MarkLive says the stream is known complete from the engine's start
	// (it began at sequence 0, or a replay filled the gap).
	MarkLive()
}

// ColdClearer is a Sink that can be cleared into a state that stays cold
// whatever is applied until MarkLive, without any rule of its own that
// would make it live sooner (prefix.Precise warms after storing as many
// blocks as its bound). A snapshot bootstrap clears a Sink that implements
// it with ClearCold instead of Clear, so that a snapshot's intermediate
// state (ancestors kept for their metadata, copies removed at its end)
// never scores a candidate.
type ColdClearer interface {
	// ClearCold is Clear, and the sink stays cold until MarkLive.
	ClearCold()
}
