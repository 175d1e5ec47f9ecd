package shared

import "time"

// WorkerID identifies one engine endpoint. Together with an optional
// data-parallel rank it names one candidate: (WorkerID, DPRank).
type WorkerID uint64

// Role is a worker's serving role.
type Role string

// The worker roles. Disaggregated serving splits prefill and decode.
const (
	RoleAggregated Role = "aggregated"
	RolePrefill    Role = "prefill"
	RoleDecode     Role = "decode"
)

// Valid reports whether r is one of the three roles.
func (r Role) Valid() bool {
	return r == RoleAggregated || r == RolePrefill || r == RoleDecode
}

// Request is what a component sees of one LLM request. Components must treat
// it as read-only; it is shared by every component of the policy.
type Request struct {
	// ID is unique among live requests.
	ID string
	// Model is the model the request names.
	Model string
	// Role is the role being selected for.
	Role Role
	// PromptTokens is the prompt length in tokens (>= 0).
	PromptTokens int
	// BlockSize is this request's tokens per KV block (> 0): its model's
	// engines' KV block size (16 for a default vLLM), or the policy
	// file's router.block_size when the file sets it. Requests of
	// different models may differ; BlockHashes, Candidates.OverlapBlocks,
	// the booked LOAD and TotalKVBlocks are in its blocks.
	BlockSize int
	// BlockHashes are the chained hashes of the prompt's full and partial
	// blocks of BlockSize tokens: BlockHashes[k] identifies tokens
	// [0, (k+1)*BlockSize), so equal leading hashes mean a shared prefix.
	BlockHashes []uint64
	// Prompt, when not nil, gives the prompt's hashes at an engine's own
	// block size for candidates whose prefix index follows the engine's KV
	// events (precise mode); nil when only BlockHashes are known.
	Prompt PromptKey
	// CachedPromptTokens is how many leading prompt tokens the router
	// believes the best-placed candidate already holds (its prefix index),
	// set before classification; PromptTokens - CachedPromptTokens is the
	// uncached prompt, the default scheduling cost.
	CachedPromptTokens int
	// Pin, when HasPin, names the worker the caller insists on (an explicit
	// pin, e.g. a debugging header); it wins over a classifier's advisory
	// target. A pin that is not a candidate is ignored like a target.
	Pin    WorkerID
	HasPin bool
	// SessionID groups the turns of one conversation; empty when unknown.
	SessionID string
	// Priority is the classifier-assigned priority, higher first.
	Priority int
	// Metadata carries request attributes (HTTP headers in serve, trace
	// fields in replay) for classifiers and plugins. May be nil.
	Metadata map[string]string
	// MaxTokens is the request's own cap on generated tokens (the body's
	// max_tokens, max_completion_tokens or max_output_tokens); 0 when it
	// sets none. The latency predictor takes it as the expected output
	// length, else its learned per-class estimate.
	MaxTokens int
	// SLO is the request's latency targets (zero: none), from its
	// headers, its queue class in the policy file, or replay's --slo.
	SLO SLO
}

// SLO is one request's latency targets and what the router does when no
// candidate is predicted to meet them. The zero SLO has no target.
type SLO struct {
	// TTFT is the target time to first token, measured from the
	// request's arrival at the router (its time in the router's queue
	// included); 0: none.
	TTFT time.Duration
	// TPOT is the target mean time per output token after the first
	// (inter-token latency, ITL); 0: none.
	TPOT time.Duration
	// OnMiss is what happens when no candidate is predicted to meet the
	// targets; SLOMissDefault is the policy's choice.
	OnMiss SLOMiss
	// Waited is how long the request had already waited in the router
	// when this selection runs (set by admission): the TTFT left for the
	// engine is TTFT - Waited.
	Waited time.Duration
}

// Has reports whether s sets a target.
func (s SLO) Has() bool { return s.TTFT > 0 || s.TPOT > 0 }

// SLOMiss is what the router does with a request that no candidate is
// predicted to serve within its targets.
type SLOMiss uint8

// The SLOMiss actions.
const (
	// SLOMissDefault leaves the choice to the policy (its slo component's
	// on_miss parameter).
	SLOMissDefault SLOMiss = iota
	// SLOMissLeastLate sends the request to the candidate predicted to
	// miss its targets by the least.
	SLOMissLeastLate
	// SLOMissWait keeps the request in the router's queue until some
	// candidate has headroom (the selection answers ErrAllBusy), within
	// its queue class's due time.
	SLOMissWait
	// SLOMissReject refuses the request at once: 429 with Retry-After in
	// serve, "rejected" in replay (a *NoHeadroomError).
	SLOMissReject
)

var sloMissNames = [...]string{"", "least-late", "wait", "reject"}

// String returns "least-late", "wait", "reject", or "" for
// SLOMissDefault.
func (m SLOMiss) String() string {
	if int(m) < len(sloMissNames) {
		return sloMissNames[m]
	}
	return "unknown"
}

// ParseSLOMiss returns the action named "least-late", "wait" or "reject"
// and whether the name is one of them.
func ParseSLOMiss(name string) (SLOMiss, bool) {
	for i, n := range sloMissNames {
		if i > 0 && n == name {
			return SLOMiss(i), true
		}
	}
	return SLOMissDefault, false
}

// Load is what the router knows of one worker's load: its own bookings plus
// the engine's last metrics report.
type Load struct {
	// Available is true when the engine has reported metrics recently; a
	// worker without an observation is "unknown", which differs from idle.
	Available bool
	// ActivePrefillTokens is the booked prompt tokens not yet prefilled
	// (uncached tokens of in-flight requests before their first token).
	ActivePrefillTokens int64
	// ActiveDecodeBlocks is the booked KV blocks of in-flight requests.
	ActiveDecodeBlocks int64
	// ActiveRequests is the router's in-flight request count.
	ActiveRequests int64
	// KVUsage is the engine's KV-cache usage in [0, 1]; valid when HasKVUsage.
	KVUsage    float64
	HasKVUsage bool
	// Waiting is the engine's queued request count; valid when HasWaiting.
	Waiting    int64
	HasWaiting bool
}

// Candidates is the set of workers a policy chooses among, as columns: row i
// of every non-nil column describes worker IDs[i]. Rows are in ascending
// (WorkerID, DPRank) order without duplicates. A column is nil unless some
// component of the policy declared its input.
//
// Components must not modify the columns; the pipeline compacts them between
// filters and fills Costs before the picker runs.
type Candidates struct {
	IDs            []WorkerID
	DPRanks        []uint32 // nil when no worker has a data-parallel rank
	ActiveRequests []int64  // InputActiveRequests
	Load           []Load   // InputLoad
	OverlapBlocks  []int32  // InputCache: leading blocks of the request the worker holds
	// CPUOverlapBlocks (InputCache, in-process components only) is, per
	// row, how many blocks of the request right after its OverlapBlocks
	// the worker's engine holds on its CPU tier (vLLM's offloading
	// connector loads them instead of computing them), in the request's
	// blocks: floor((g+c)/BlockSize) - floor(g/BlockSize) for g GPU and c
	// CPU-tier tokens of a live precise index (KV events), 0 for a worker
	// scored approximately. Out-of-process plugins always see it nil:
	// plugin protocol v1 does not carry it (docs/plugin-protocol.md). A
	// component reading it must take nil as all zeros.
	CPUOverlapBlocks []int32
	TotalKVBlocks    []int64   // InputCapacity: KV capacity in router blocks; 0 = unavailable (unknown), never divide by it
	Costs            []float64 // summed weighted scorer costs; nil when the policy has no scorer
	// Names (InputLabels) is each row's worker name: its worker block's
	// or pod's name, "sim-N" (prefill-N, decode-N) in router replay. Every
	// rank of a data-parallel worker has its name. For the workers of
	// router serve, router epp and router replay IDs[i] is
	// WorkerIDOf(Names[i]) (`router plugins check` sends made-up rows).
	Names []string
	// Labels (InputLabels) is each row's worker labels (see Labels),
	// shared with the router and every other decision: read-only.
	Labels []Labels
	// PredictedTTFT and PredictedTPOT (InputLatency, in-process
	// components only) are, per row, the router's predicted time to
	// first token of this request from its dispatch to that worker, and
	// its mean time per output token after the first, in seconds (finite,
	// >= 0). The router's queue wait so far is not included: compare
	// PredictedTTFT with Request.SLO.TTFT - Request.SLO.Waited.
	PredictedTTFT []float64
	PredictedTPOT []float64
}

// Len is the number of candidate rows.
func (c *Candidates) Len() int { return len(c.IDs) }

// Compact keeps the rows whose keep flag is true, preserving order, in
// place in every non-nil column, and returns the new length. keep must have
// Len() entries.
func (c *Candidates) Compact(keep []bool) int {
	n := 0
	for i, k := range keep {
		if !k {
			continue
		}
		if n != i {
			c.IDs[n] = c.IDs[i]
			if c.DPRanks != nil {
				c.DPRanks[n] = c.DPRanks[i]
			}
			if c.ActiveRequests != nil {
				c.ActiveRequests[n] = c.ActiveRequests[i]
			}
			if c.Load != nil {
				c.Load[n] = c.Load[i]
			}
			if c.OverlapBlocks != nil {
				c.OverlapBlocks[n] = c.OverlapBlocks[i]
			}
			if c.CPUOverlapBlocks != nil {
				c.CPUOverlapBlocks[n] = c.CPUOverlapBlocks[i]
			}
			if c.TotalKVBlocks != nil {
				c.TotalKVBlocks[n] = c.TotalKVBlocks[i]
			}
			if c.Costs != nil {
				c.Costs[n] = c.Costs[i]
			}
			if c.Names != nil {
				c.Names[n] = c.Names[i]
			}
			if c.Labels != nil {
				c.Labels[n] = c.Labels[i]
			}
			if c.PredictedTTFT != nil {
				c.PredictedTTFT[n] = c.PredictedTTFT[i]
			}
			if c.PredictedTPOT != nil {
				c.PredictedTPOT[n] = c.PredictedTPOT[i]
			}
		}
		n++
	}
	c.IDs = c.IDs[:n]
	if c.DPRanks != nil {
		c.DPRanks = c.DPRanks[:n]
	}
	if c.ActiveRequests != nil {
		c.ActiveRequests = c.ActiveRequests[:n]
	}
	if c.Load != nil {
		c.Load = c.Load[:n]
	}
	if c.OverlapBlocks != nil {
		c.OverlapBlocks = c.OverlapBlocks[:n]
	}
	if c.CPUOverlapBlocks != nil {
		c.CPUOverlapBlocks = c.CPUOverlapBlocks[:n]
	}
	if c.TotalKVBlocks != nil {
		c.TotalKVBlocks = c.TotalKVBlocks[:n]
	}
	if c.Costs != nil {
		c.Costs = c.Costs[:n]
	}
	if c.Names != nil {
		c.Names = c.Names[:n]
	}
	if c.Labels != nil {
		c.Labels = c.Labels[:n]
	}
	if c.PredictedTTFT != nil {
		c.PredictedTTFT = c.PredictedTTFT[:n]
	}
	if c.PredictedTPOT != nil {
		c.PredictedTPOT = c.PredictedTPOT[:n]
	}
	return n
}

// Sorted reports whether the rows are in strictly ascending (WorkerID,
// DPRank) order, the order the router guarantees.
func (c *Candidates) Sorted() bool {
	for i := 1; i < len(c.IDs); i++ {
		a, b := c.IDs[i-1], c.IDs[i]
		if a > b {
			return false
		}
		if a == b {
			if c.DPRanks == nil || c.DPRanks[i-1] >= c.DPRanks[i] {
				return false
			}
		}
	}
	return true
}

// PromptKey gives a request's prompt as chained block hashes at any
// engine block size: TokenBlockHashes(n) is the hashes of its full blocks
// of n token ids (router/prefix.TokenBlocks), nil when the prompt is known
// only as text or n <= 0. The router's prefix index implements it
// (prefix.Key) and looks up precise candidates with it. Not safe for
// concurrent use: one request's selection uses it at a time.
type PromptKey interface {
	TokenBlockHashes(blockSize int) []uint64
}
