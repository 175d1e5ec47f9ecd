package replay

// Outcome is one request's result, one JSON line of --per-request. In
// disaggregated mode Worker is the prefill worker, TTFT is measured at the
// prefill worker's first token (the token the client receives first), and
// E2E at the decode worker's last token.
type Outcome struct {
	Index     int     `json:"index"`
	ArrivalMs float64 `json:"arrival_ms"`
	Worker    int     `json:"worker"` // aggregated or prefill worker's index (N of "sim-N", "prefill-N"), -1 when rejected
	// DecodeWorker is the decode worker's index (N of "decode-N") in disaggregated mode, or
	// -1 when the request reached none (rejected, or done at prefill with
	// output_length <= 1). It is absent in aggregated mode: decode ids
	// start after at least one prefill worker, so 0 never names one.
	DecodeWorker int `json:"decode_worker,omitempty"`
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// Priority and PolicyClass are the request's classification: its
	// priority, and its queue class (the queue's default class when the
	// classifier named none). Present only when the replay has a queue
	// block or a classifier (Options.Queue, Options.Classifier), so the
	// default configuration's lines are as they always were.
	Priority      *int   `json:"priority,omitempty"`
	PolicyClass   string `json:"policy_class,omitempty"`
	OverlapBlocks int    `json:"overlap_blocks"` // router's prefix-index belief at selection
	CachedTokens  int    `json:"cached_tokens"`  // prompt tokens the engine served from cache
	// DecisionMs is the simulated decision latency charged to the
	// request's hops (Options.DecisionLatency: their plugin calls), both
	// hops together in disaggregated mode; absent when none was charged
	// (built-in policies and classifiers).
	DecisionMs float64 `json:"decision_ms,omitempty"`
	// QueueMs is arrival to the first scheduled step of the (prefill)
	// worker: time waiting in the router's queue, the decision latency,
	// and time waiting in the engine's queue.
	QueueMs float64 `json:"queue_ms"`
	TTFTMs  float64 `json:"ttft_ms"`
	// KVTransferMs is the prompt's KV transfer from the prefill to the
	// decode worker (KVTransferTime); absent when there was none.
	KVTransferMs float64 `json:"kv_transfer_ms,omitempty"`
	E2EMs        float64 `json:"e2e_ms"`
	Status       string  `json:"status"` // "ok" or "rejected: reason"
	Fallback     bool    `json:"fallback,omitempty"`
	// Shadow is the result of the (prefill) hop's shadow decision
	// (router.ShadowResult: agree, disagree, failed or none) and
	// ShadowWorker the index of the worker it picked (agree or disagree); both absent
	// when the role's policy has no shadow (a decode hop's shadow is
	// counted in Report.Shadow only).
	Shadow       string `json:"shadow,omitempty"`
	ShadowWorker *int   `json:"shadow_worker,omitempty"`
	// Canary is the side that decided the request when a role's policy
	// has a canary (the first hop whose has one): "live" or
	// "candidate"; absent otherwise.
	Canary string `json:"canary,omitempty"`
	// Migrations is how many times an engine failure cut the request and
	// it continued on another worker (Options.Failures); ExtraPrefillTokens
	// the prompt plus generated tokens those continuations' engines had
	// to prefill again. Both absent when it never migrated.
	Migrations         int `json:"migrations,omitempty"`
	ExtraPrefillTokens int `json:"extra_prefill_tokens,omitempty"`
}
