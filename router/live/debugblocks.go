package live

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/workers"
)

// DebugBlocks is the /debug/workers/NAME/blocks answer (on
// --debug-listen's address): the blocks the router believes worker NAME's
// engine holds, per data-parallel rank and tier, named by the engine's
// own block hashes, for comparing with the engine's own block set
// (docs/kv-events.md, "Comparing the belief with the engine"). The
// fields come in this order; Blocks is streamed, one entry at a time.
type DebugBlocks struct {
	// Worker is NAME.
	Worker string `json:"worker"`
	// Ranks are the worker's data-parallel ranks (one, rank 0, for an
	// engine without ranks), each with its KV-event stream's state.
	Ranks []DebugBlocksRank `json:"ranks"`
	// Blocks are the believed blocks of every rank, one per block and
	// tier with copies on it, in no particular order; empty for a worker
	// without KV events.
	Blocks []DebugBlock `json:"blocks"`
	// Complete is false when a rank's precise index was cleared or
	// dropped while it was listed: its entries may mix its state before
	// and after (ask again).
	Complete bool `json:"complete"`
}

// DebugBlocksRank is one rank of a DebugBlocks answer, as it was when the
// listing began.
type DebugBlocksRank struct {
	Rank uint32 `json:"rank"`
	// State is the rank's KV-event stream: "live" (routed by the
	// engine's events), "cold", "connecting", "bootstrapping" or "stale"
	// (scored approximately: see Reason), or "none" (the rank has no
	// precise index: no KV-event source, or not joined yet).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// EngineBlockSize is the engine's block size the index learned from
	// its events, in tokens; absent while unknown.
	EngineBlockSize int `json:"engine_block_size,omitempty"`
	// Blocks, GPUBlocks, CPUBlocks and Copies are the index's counts
	// (prefix.PreciseStats): distinct blocks, those held on each tier,
	// and copies over every tier.
	Blocks    int `json:"blocks"`
	GPUBlocks int `json:"gpu_blocks"`
	CPUBlocks int `json:"cpu_blocks"`
	Copies    int `json:"copies"`
}

// DebugBlock is one block on one tier of one rank (prefix.EngineBlock).
type DebugBlock struct {
	// Hash is the engine's own hash of the block: a JSON integer for an
	// engine's int hashes (vLLM's default, the low 64 bits of its hash;
	// SGLang's signed ones, possibly negative), a string of lowercase
	// hex for bytes hashes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0:
	// 32 bytes for sha256_cbor). With Folded it is only the hash's 64-bit
	// fold (kvevents.FoldHash), as an unsigned integer.
	Hash json.RawMessage `json:"hash"`
	// Medium is the tier: "GPU" or "CPU".
	Medium string `json:"medium"`
	Rank   uint32 `json:"rank"`
	// Copies is the block's copies on the tier (vLLM does not
	// deduplicate); Held is true when it counts for routing on the tier
	// (every KV-cache group reported there has a local copy).
	Copies uint32 `json:"copies"`
	Held   bool   `json:"held"`
	// Folded: the engine's own value is not known (the block came from a
	// replica's snapshot, or its hash is bytes wider than 32), Hash is
	// its fold. Aliased: the engine stored the block under another hash
	// too (the router keys both as one block: the same tokens and extra
	// keys); Hash is the latest one's.
	Folded  bool `json:"folded,omitempty"`
	Aliased bool `json:"aliased,omitempty"`
}

// blocksChunk is the slots of a precise index copied under its lock at
// a time by /debug/workers/NAME/blocks (prefix.Precise.EngineBlocks):
// 4,096 slots, up to 8,192 entries (512 KiB), a few hundred
// microseconds of the lock.
const blocksChunk = 4096

// blocksWriteTimeout bounds how long /debug/workers/NAME/blocks waits
// for the client to take each chunk's entries: a client that stops
// reading is cut then.
const blocksWriteTimeout = 30 * time.Second

// blocksView answers GET /debug/workers/{name}/blocks from the workers'
// status and their KV-event subscribers.
type blocksView struct {
	status func(name string) (workers.Status, bool)
	kvs    *kvSubs
}

// rankBlocks is one rank's part of a listing: its precise index (nil:
// none) and head.
type rankBlocks struct {
	p    *prefix.Precise
	head DebugBlocksRank
}

// ServeHTTP streams DebugBlocks: a 404 JSON error for a worker not
// configured, else the ranks' heads, then each rank's blocks copied a
// chunk (blocksChunk slots) at a time under its index's lock and written
// with the lock released, one json.Encoder value per block through a
// 64 KiB buffer. Work and output are linear in the blocks held (at most
// 2 × the rank's KV capacity, prefix.MaxPreciseBlocks when unknown, per
// tier); memory is one chunk's.
func (v blocksView) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, ok := v.status(name)
	if !ok {
		WriteError(w, http.StatusNotFound, TypeInvalidRequest, "worker_not_found",
			fmt.Sprintf("no worker named %q is configured", untrusted.Text(name, untrusted.MaxClient)))
		return
	}
	ranks := make([]rankBlocks, 0, len(st.Ranks))
	for _, rs := range st.Ranks {
		ranks = append(ranks, v.rank(st, rs.Rank))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	_ = rc.SetWriteDeadline(time.Now().Add(blocksWriteTimeout))
	head := make([]DebugBlocksRank, len(ranks))
	for i, rb := range ranks {
		head[i] = rb.head
	}
	nameJSON, _ := json.Marshal(name)
	headJSON, _ := json.Marshal(head)
	_, _ = fmt.Fprintf(bw, "{\"worker\":%s,\"ranks\":%s,\"blocks\":[\n", nameJSON, headJSON)
	complete, first := true, true
	var buf []prefix.EngineBlock
	var entry DebugBlock
	var hb []byte
	for _, rb := range ranks {
		if rb.p == nil {
			continue
		}
		var at prefix.EngineListing
		resets := uint64(0)
		for start := true; start || !at.Done; start = false {
			buf, at = rb.p.EngineBlocks(at.Next, blocksChunk, buf[:0])
			if start {
				resets = at.Resets
			} else if at.Resets != resets {
				complete = false
			}
			if at.Dropped {
				complete = false
			}
			for i := range buf {
				b := &buf[i]
				hb = engineHashJSON(hb[:0], b)
				entry = DebugBlock{Hash: hb, Medium: kvevents.MediumGPU, Rank: rb.head.Rank, Copies: b.Copies, Held: b.Held,
					Folded: b.Folded, Aliased: b.Aliased}
				if b.CPU {
					entry.Medium = kvevents.MediumCPU
				}
				if !first {
					_ = bw.WriteByte(',')
				}
				first = false
				if err := enc.Encode(&entry); err != nil {
					return // the client left
				}
			}
			_ = rc.SetWriteDeadline(time.Now().Add(blocksWriteTimeout))
		}
	}
	_, _ = fmt.Fprintf(bw, "],\"complete\":%t}\n", complete)
	_ = bw.Flush()
}

// rank returns rank's precise index and head.
func (v blocksView) rank(st workers.Status, rank uint32) rankBlocks {
	rb := rankBlocks{head: DebugBlocksRank{Rank: rank}}
	p, ks, ok := v.kvs.rankStatus(prefix.Candidate{ID: st.ID, Rank: rank})
	if !ok {
		rb.head.State = "none"
		if v.kvs.hasSource(st.Config.Name, rank) {
			rb.head.Reason = "the rank has not joined the fleet yet: its precise index starts when it does"
		} else {
			rb.head.Reason = "no KV-event source: the worker has no kv_events block and its engine reported none (vLLM's GET /kv_event_sources, SGLang's /server_info)"
		}
		return rb
	}
	rb.p = p
	ps := ks.ps
	rb.head.State, rb.head.Reason = ks.state, stateReason(ks.state)
	rb.head.EngineBlockSize = ps.BlockSize
	rb.head.Blocks, rb.head.GPUBlocks, rb.head.CPUBlocks, rb.head.Copies = ps.Blocks, ps.GPUBlocks, ps.CPUBlocks, ps.Copies
	return rb
}

// stateReason says what a stream state means for the rank's blocks.
func stateReason(state string) string {
	switch state {
	case "live":
		return ""
	case "connecting":
		return "not connected to the engine's KV-event publisher (a broken connection clears the blocks: the engine may be restarting): the rank is scored approximately"
	case "bootstrapping":
		return "a snapshot of the engine's blocks is being applied: the rank is scored approximately until it is"
	case "stale":
		return "the publisher has been silent past its heartbeat timeout: the rank is scored approximately until it is followed again"
	}
	return "the index is not known complete (the stream began mid-way and could not be replayed, or it was cleared): the rank is scored approximately until it is"
}

// engineHashJSON appends b's hash as DebugBlock.Hash has it.
func engineHashJSON(dst []byte, b *prefix.EngineBlock) []byte {
	switch {
	case b.Folded:
		return strconv.AppendUint(dst, b.Hash, 10)
	case b.Form == kvevents.HashNegative:
		return strconv.AppendInt(dst, int64(b.Hash), 10)
	case b.Form == kvevents.HashBytes:
		dst = append(dst, '"')
		dst = hex.AppendEncode(dst, b.Bytes())
		return append(dst, '"')
	}
	return strconv.AppendUint(dst, b.Hash, 10)
}
