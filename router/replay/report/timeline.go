package report

// Timeline is a replay's state over simulated time, in samples of equal
// intervals from the first arrival: sample k covers [k × IntervalS,
// (k+1) × IntervalS) seconds after it, the last one ending at or after
// the last completion. State figures (InFlight, RouterQueue, EngineQueue)
// are taken at the end of the sample's interval; flows (the token
// counts) are summed over it. The interval starts at 100 ms and doubles,
// merging samples pairwise, whenever the samples would exceed
// MaxTimelineSamples, so a timeline takes at most MaxTimelineSamples ×
// (workers + 6) numbers however long the trace. Filled only with
// Options.Timeline.
type Timeline struct {
	// IntervalS is one sample's width, in seconds of simulated time.
	IntervalS float64 `json:"interval_s"`
	// InFlight[k][w] is the requests on fleet worker w (running or
	// waiting in its engine) at the end of sample k; workers by fleet id
	// (Report.RequestsPerWorker's order).
	InFlight [][]int32 `json:"in_flight"`
	// RouterQueue[k] is the hops waiting in the router's queue.
	RouterQueue []int32 `json:"router_queue"`
	// EngineQueue[k] is the requests waiting in the engines' queues, as
	// the router last saw each engine's (its report after each of the
	// engine's events, as a scraped /metrics would give it).
	EngineQueue []int32 `json:"engine_queue"`
	// PromptTokens[k] and CachedTokens[k] are the prompt tokens, and those
	// served from the engines' prefix caches, of the requests whose first
	// token came in sample k: KV hit over time is their ratio.
	PromptTokens []int64 `json:"prompt_tokens"`
	CachedTokens []int64 `json:"cached_tokens"`
	// ReferencePromptTokens[k] and ReferenceHitTokens[k] are the same for
	// the KV reference (Report.KVHitReference) over the requests that
	// arrived in sample k.
	ReferencePromptTokens []int64 `json:"reference_prompt_tokens"`
	ReferenceHitTokens    []int64 `json:"reference_hit_tokens"`
}

// MaxTimelineSamples bounds Timeline's samples: 512, enough for a plot
// several hundred pixels wide.
const MaxTimelineSamples = 512
