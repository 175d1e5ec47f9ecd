// Package mockworker is a mock inference engine: an OpenAI-compatible HTTP
// server that simulates vLLM-like engines in real time with the replay
// worker model (router/sim: step-time model, vLLM V1 scheduler, prefix
// cache), streams tokens as the simulated steps end, and exports vLLM-named
// (or SGLang-named) Prometheus metrics. It speaks the engines' side
// protocols too, following their own source and tests: KV-cache events
// over ZeroMQ with replay and vLLM's snapshot service, /kv_event_sources,
// /tokenize, LoRA adapters, cache_salt, data-parallel ranks, SGLang's
// /server_info. `router mock-worker` serves it; the router's end-to-end
// tests, demos and benchmarks run fleets of them.
//
// # Endpoints
//
//	POST /v1/completions        prompt: string, [string], token ids or [[ids]]
//	POST /v1/chat/completions   messages: [{role, content}], content a string or text parts
//	POST /v1/responses          OpenAI's Responses API as vLLM serves it (handleResponses): instructions and
//	                            input as chat messages, previous_response_id from a bounded store, stream events
//	GET  /v1/responses/{id}     a stored response; POST /v1/responses/{id}/cancel: vLLM's answers
//	POST /v1/messages           Anthropic's Messages API as vLLM serves it (handleMessages); not SGLang
//	POST /v1/embeddings         input: string, [string], ids or [[ids]] (or messages); EmbeddingDim floats or base64
//	POST /pooling /classify /score /v1/score /rerank /v1/rerank /v2/rerank   vLLM's pooling and scoring (pooling.go);
//	                            SGLang: /v1/embeddings, /v1/classify, /v1/rerank only
//	GET  /version               vLLM: {"version": Config.Version}; GET (vLLM also POST) /ping: 200
//	POST /tokenize              vLLM's shape (SGLang: a prompt only, also /v1/tokenize); 404 without Config.Tokenizer
//	POST /reset_prefix_cache    drops every rank's prefix cache (vLLM's dev-mode endpoint); 409 while requests run
//	GET  /v1/models             the served model with max_model_len (the KV cache in tokens), then each LoRA adapter
//	GET  /kv_event_sources      vLLM: one KV event source per data-parallel rank (vLLM PR 55844)
//	GET  /server_info           SGLang (and /get_server_info): page_size, dp_size, the kv_events descriptor
//	GET  /debug/kv_blocks       the mock's own: every block its prefix cache holds, per rank (handleKVBlocks)
//	GET  /health                200; 503 while draining (Drain)
//	/mock/fault                 the mock's own: POST sets, DELETE clears, GET shows the process-wide Fault
//	POST /mock/drain            the mock's own: Drain, 202
//	GET  /metrics               Prometheus text, the engine's metric names; 404 with Config.NoMetrics
//
// Any other path answers 404 {"detail": "Not Found"}, FastAPI's answer.
//
// /metrics has, per rank, labelled model_name and engine="R" as vLLM does:
// vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, the token, preemption, prefix-cache and success
// counters, and the info gauge vllm:cache_config_info (value 1) whose
// labels are the cache configuration, among them num_gpu_blocks (Sim's
// TotalKVBlocks), block_size (Sim's BlockSize, the engine's KV block) and
// prefix_caching_hash_algo ("sha256_cbor"); SGLang's names and labels
// with EngineSGLang (see newMetrics); "vllm_x" / "sglang_x" with
// MetricNamesUnderscore. process_start_time_seconds is the time the
// Server was made.
//
// Requests may set "stream" (SSE chunks in the OpenAI chunk format, one per
// generated token, then "data: [DONE]"; "stream_options": {"include_usage":
// true} adds a usage chunk before it), "max_tokens" (chat also
// "max_completion_tokens"; default Config.DefaultMaxTokens, 16),
// "prompt_token_ids" and "cache_salt" (vLLM's: a non-empty string, at
// most 4096 bytes, that becomes part of the first block's hash, so the
// request hits only prompts salted alike). "model" may name a LoRA
// adapter of Config.LoRA. The engine always generates exactly max_tokens
// tokens (finish_reason "length"); the text is filler words, one token
// each, that continue the context (see FillerWords): a request continued
// after k of its tokens (vLLM's continue_final_message on chat, the text
// or token ids so far appended to a completions prompt) generates exactly
// the rest of the uninterrupted answer. "return_token_ids" reports the
// prompt's and the answer's token ids where vLLM puts them (see chunk). A
// prompt plus max_tokens over max_model_len is vLLM's 400 (contextError).
//
// # Prompt length and prefix hashing
//
// The prefix cache is vLLM's, at the engine's KV block size
// (Config.Sim.BlockSize, 16 by default, vLLM's): a prompt's full blocks
// are keyed by the engine's own chained block hashes (engineHasher: vLLM's
// sha256_cbor of parent, token ids and extra keys from a NONE_HASH that is
// random per Server unless Config.HashSeed is set; SGLang's page hashes in
// SGLang mode), the LoRA adapter's name in every block's extra keys and
// the cache salt in block 0's, so a LoRA request never hits the base
// model's blocks nor a salted one an unsalted prefix. The hashes are
// opaque to a router. A hit is capped at (prompt tokens − 1)/block size
// blocks, the last block always computed; and like vLLM the cache does not
// deduplicate: every block a request computes is a cached copy of its
// hash (sim.Worker.TrackBlockCopies), so a block-aligned prompt sent again
// adds a second copy of its last block. SGLang's radix tree does
// deduplicate: in SGLang mode a prefix is cached, and stored, once, when
// the step that computed it ends.
//
// With Config.Tokenizer, text prompts are tokenized (a completions prompt
// with special tokens, chat messages through the tokenizer's chat template
// with the generation prompt, as vLLM does), and then count and hash like
// token ids. /tokenize answers the same ids.
//
// Without a tokenizer, a prompt given as text counts
// ceil(len(text)/CharsPerToken) tokens (CharsPerToken 4 bytes per token, an
// approximation; prefix.EstimateTokens) and its blocks are chunks of
// BlockSize·CharsPerToken bytes, hashed like token blocks with the bytes
// in place of the ids. A chat prompt is rendered first as one "role:
// content\n" line per message, after a line of the request's tools and
// followed by a line per field the message has beside its content
// (prefix.RenderChatTools). Token ids, in
// "prompt_token_ids" or as the completions "prompt", count one token each.
//
// # Time
//
// One goroutine owns the sim.Worker. Simulated time is wall time since the
// server started times Config.Speedup; the goroutine sleeps until the end of
// the simulated step in flight, runs it, and hands each request the tokens
// that step produced: its first token at the end of its prefill
// (FirstToken), then one per step while it decodes, the rest at its
// Completed event. That is exact unless the engine preempts a request (the
// sim does not report per-step progress): then the tokens of the steps it
// spent preempted are handed out early, spread over the following steps,
// and its last ones arrive at completion, as they would.
//
// Every response says, in simulated terms, how it was served:
// x-mock-cached-tokens (prompt tokens served from the prefix cache),
// x-mock-ttft-seconds (submission to first token) and, on non-streamed
// responses, x-mock-latency-seconds (submission to the last token). A
// streamed response sends its headers with the first token, so these are
// known; each chunk carries "x_mock_sim_seconds", the simulated time its
// tokens were produced. usage.prompt_tokens_details.cached_tokens repeats
// the cached tokens, as vLLM reports them.
//
// # Data-parallel ranks
//
// Config.DataParallelSize N runs N simulated engines, each with the whole
// Sim configuration, behind one address, as vLLM's data parallelism does
// (and SGLang's --dp-size: each rank its own scheduler, KV cache and KV
// events publisher). A request with the header X-data-parallel-rank: R
// (vLLM's, read by OpenAIServing._get_data_parallel_rank) goes to rank R
// (400 when out of range; a value that is not an integer is ignored, as
// vLLM ignores it); the others go to the least loaded rank by the score
// of vLLM's internal balancer (DPLBAsyncMPClient), 4·waiting + running,
// ties to the lowest rank. SGLang (EngineSGLang) reads the same header (a
// value that is not an integer is a 400), else the body's routed_dp_rank
// or deprecated data_parallel_rank, and sends the others round-robin, its
// DataParallelController's default (see pickSGLang). The answer's
// x-mock-dp-rank header names the rank that served it.
//
// # KV events
//
// With Config.KVEventsEndpoint each rank publishes its prefix cache's
// changes as vLLM's ZmqEventPublisher does (kvevents.Publisher): messages
// [topic, sequence, payload] on a PUB socket, rank R on the endpoint's
// port + R (port 0: a free port per rank; SGLang, which advertises one
// base, a free base with rank R on base + R), one batch per change of the
// simulated engine (a step's evictions and the blocks it caches, a
// reset), data_parallel_rank R. vLLM (vllm/v1/core/block_pool.py): one
// BlockStored per request and step with the blocks' hashes (64-bit
// ints), the parent's (none for a prompt's first block), the token ids
// (none for text hashed by bytes), block_size, lora_id and lora_name of a
// LoRA request, medium "GPU", extra_keys (per block: None, or the LoRA
// name and on block 0 the cache salt), group_idx 0 and
// kv_cache_spec_kind "full_attention"; one BlockRemoved per evicted block
// (each copy its own); AllBlocksCleared after /reset_prefix_cache. The
// payload layout is Config.KVEventsEncoding. SGLang: one positional
// BlockStored per page (hashes signed, lora_id None), one BlockRemoved
// per page.
//
// With Config.KVEventsReplayEndpoint a ROUTER socket (port + R too)
// answers replay requests from the last KVEventsReplayBatches batches, in
// vLLM's current framing ([topic, sequence, payload], PR 45177) or the
// two-frame one (SGLang's, vLLM's before; Config.KVEventsReplayFormat).
// With Config.KVEventsSnapshotEndpoint (vLLM) it serves vLLM's snapshot
// service (PR 57789 as in vMaroon/vllm@08ee3e54): 24-byte sequence frames
// (the sequence then the publisher's 16-byte id, new per Server), an
// empty batch after each second of silence, and compacted snapshots on a
// ROUTER socket, or [-2, id] with KVEventsSnapshotUnavailable. GET
// /kv_event_sources reports the endpoints (Config.KVEventSources,
// Config.KVEventsAdvertiseHost), SGLang's /server_info the base port.
// The PUB socket never blocks the engine: it queues the batches for slow
// subscribers.
//
// A new Server (a restarted process) has a new publisher id, sequences
// from 0, an empty cache, a new NONE_HASH (unless seeded) and a later
// process_start_time_seconds.
//
// # Disaggregated prefill and decode
//
// The mock plays both ends of vLLM's disaggregated-serving proxy protocol
// (the NixlConnector toy proxy), chosen per request by its
// "kv_transfer_params" (absent or null: an ordinary request):
//
//   - "do_remote_decode": true makes a prefill request: it is simulated
//     with max_tokens 1, whatever it asked, and answered not streamed with
//     the usual completion body plus "kv_transfer_params":
//     {"do_remote_prefill": true, "do_remote_decode": false,
//     "remote_engine_id": Config.EngineID, "remote_block_ids": [the ids of
//     up to 16 engine blocks of the prompt, unique across the server's
//     answers], "remote_host" and "remote_port": the address the request
//     came in on, "tp_size": 1}.
//   - "do_remote_prefill": true makes a decode request: it is simulated
//     with sim.Request.KVTransferred (no prefill computed, nothing
//     published to the prefix cache, the first token already sampled by
//     the prefill worker) and answered as usual, streamed or not, with all
//     max_tokens tokens: the first two arrive at the end of its first
//     decode step. A decode request of max_tokens 1 has nothing left to
//     compute and is answered at once. x-mock-cached-tokens is 0.
//
// Both set is a 400. Nothing is transferred: the remote_* fields of a
// decode request are not read, so any prefill answer's parameters work.
// Chat, completions, /v1/responses and /v1/messages all take them, as
// vLLM's do: the prefill's answer is the API's own (a ResponsesResponse,
// or, streamed, Responses events whose response.completed carries
// "kv_transfer_params"; an Anthropic message, streamed or not), with
// "kv_transfer_params" a top-level member; max_output_tokens (Responses)
// and max_tokens (Messages) are the bound a prefill overrides.
//
// # Faults and drain
//
// The mock's own interface, no engine's: the header FaultHeader
// ("X-Mock-Fault: KIND@N") on a chat or completions request, or POST
// /mock/fault {"kind", "after_tokens"} for every generation in flight and
// to come (Server.SetFault; DELETE clears), makes answers fail after N
// tokens (see Fault): reset (TCP RST), close (a clean close of an answer
// framed by the connection's close from its first byte, so the cut reads
// as a normal end of body), stall (nothing more is sent), error (vLLM's
// in-stream error, StreamErrorEvent, then [DONE]; a whole answer vLLM's
// 500), exit (the process exits, Config.Exit). Drain (POST /mock/drain;
// `router mock-worker` on SIGTERM) models a vLLM shutting down with
// --shutdown-timeout: /health and new requests answer 503, requests in
// flight run to their end, Drained closes when none is left.
//
// # Errors and cancellation
//
// Errors use the OpenAI shape {"error": {"message", "type", "param",
// "code"}} with the HTTP status as code: malformed JSON or invalid fields
// 400, a model other than Config.Model 404, a prompt plus max_tokens over
// max_model_len 400 (vLLM's BadRequestError), a closed or draining server
// 503. A client that
// disconnects, before or during its response, aborts its request in the
// simulated engine (sim.Worker.Abort), which frees its KV blocks.
package mockworker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// Defaults of Config.
const (
	// DefaultModel is the model name served when Config.Model is empty.
	DefaultModel = "mock"
	// DefaultMaxTokens is the output length of a request without
	// max_tokens, as in vLLM's completions API.
	DefaultMaxTokens = 16
	// maxBodyBytes bounds a request body.
	maxBodyBytes = 64 << 20
	// MaxLoRA bounds Config.LoRA; MaxLoRANameBytes bounds a name.
	MaxLoRA          = 64
	MaxLoRANameBytes = 256
	// maxCacheSaltBytes bounds a request's cache_salt.
	maxCacheSaltBytes = 4096
)

// Engine is the engine a Server plays.
type Engine uint8

// The engines.
const (
	// EngineVLLM plays a current vLLM (the zero value).
	EngineVLLM Engine = iota
	// EngineSGLang plays SGLang: sglang:* metrics, /server_info and
	// /get_server_info, SGLang's /tokenize (a prompt, no chat messages),
	// its KV events (one BlockStored per page, positional layout, signed
	// hashes, two-frame replay); no /kv_event_sources.
	EngineSGLang
)

// MetricNames is how metric names are spelled.
type MetricNames uint8

// The spellings.
const (
	// MetricNamesColon is the engines' own spelling, "vllm:x" and
	// "sglang:x" (the zero value).
	MetricNamesColon MetricNames = iota
	// MetricNamesUnderscore is "vllm_x" and "sglang_x", as SGLang's
	// router aggregation and OpenMetrics escaping=underscores serve them.
	MetricNamesUnderscore
)

// ReplayFormat is the framing of replay answers.
type ReplayFormat uint8

// The replay formats.
const (
	// ReplayDefault is the engine's own: vLLM's with the topic frame (PR
	// 45177), SGLang's two frames.
	ReplayDefault ReplayFormat = iota
	// ReplayWithTopic is kvevents.ReplayWithTopic.
	ReplayWithTopic
	// ReplayTwoFrames is kvevents.ReplayTwoFrames (vLLM before PR 45177).
	ReplayTwoFrames
)

// SourcesShape is the body of GET /kv_event_sources.
type SourcesShape uint8

// The shapes, both in vLLM's history (vllm/entrypoints/serve/kv_events/
// api_router.py).
const (
	// SourcesEnvelope is {"sources": [...]} (vllm-project/vllm@f123199a,
	// tests/entrypoints/serve/test_kv_events_router.py@5f920ec3); the zero
	// value.
	SourcesEnvelope SourcesShape = iota
	// SourcesArray is the bare array (vllm-project/vllm@153c3aa2,
	// tests/entrypoints/serve/kv_events/test_api_router.py@c2090fe4).
	SourcesArray
)

// Config configures a Server. The zero value serves DefaultModel, accepting
// any model name, in real time with sim.DefaultConfig(), as a vLLM.
type Config struct {
	// Model is the served model name. When set, requests naming another
	// model (or LoRA adapter) get 404; when empty, DefaultModel is listed
	// and any name is accepted (and echoed).
	Model string
	// Engine is the engine played; the zero value is vLLM.
	Engine Engine
	// Speedup scales simulated time: a step of d simulated time takes
	// d/Speedup of wall time. 0 means 1; otherwise it must be finite and
	// positive.
	Speedup float64
	// Sim configures the simulated engine; the zero value means
	// sim.DefaultConfig() (Llama-3.1-8B on one H100, 27,500 blocks of 16).
	// Sim.BlockSize is the engine's KV block size (vLLM's --block-size,
	// SGLang's page_size): its prefix cache, its KV events and its
	// vllm:cache_config_info{block_size} are at that size.
	Sim sim.Config
	// BlockTokens is deprecated: the prefix cache is keyed per engine
	// block (Sim.BlockSize). When not 0 it must equal Sim.BlockSize.
	BlockTokens int
	// CharsPerToken is the assumed bytes per token of text prompts. 0 means
	// prefix.DefaultCharsPerToken (4).
	CharsPerToken int
	// DefaultMaxTokens is the output length when a request sets none. 0
	// means DefaultMaxTokens (16).
	DefaultMaxTokens int
	// Version is what GET /version reports (vLLM's {"version": V}); ""
	// means DefaultVersion.
	Version string
	// EngineID is this engine's id in its prefill answers'
	// kv_transfer_params (remote_engine_id). "" means "mock-" and 8
	// random hex digits.
	EngineID string
	// NoMetrics makes GET /metrics answer 404, as SGLang started without
	// --enable-metrics does; /health still answers 200.
	NoMetrics bool
	// MetricNames spells the metric names; the zero value is the engine's
	// own ("vllm:x", "sglang:x").
	MetricNames MetricNames
	// DataParallelSize is the number of data-parallel ranks, each its own
	// simulated engine with the whole Sim configuration (its own KV cache
	// and queue), behind this one server. 0 means 1; at most
	// MaxDataParallelSize.
	DataParallelSize int
	// LoRA names the LoRA adapters served (vLLM's --lora-modules): at most
	// MaxLoRA names of 1 to MaxLoRANameBytes bytes, distinct, none the
	// base model's. Adapter i has vLLM's adapter id i+1.
	LoRA []string
	// HashSeed seeds the engine's block hashes as vLLM's PYTHONHASHSEED
	// does (NONE_HASH = sha256 of the seed's CBOR); "" means a random
	// NONE_HASH per Server, vLLM's default. SGLang's hashes have no seed.
	HashSeed string

	// KVEventsEndpoint, when set, publishes every rank's KV-cache events
	// in the engine's format on a ZeroMQ PUB socket listening there
	// ("tcp://HOST:PORT"; vLLM's default is tcp://*:5557; HOST * listens
	// on every interface), rank N on PORT+N (port 0: each rank a free
	// port, as vLLM PR 55844 does not offset port 0; with EngineSGLang,
	// whose /server_info names one base, rank 0 a free port and rank N
	// that base + N). See the package doc, "KV events".
	KVEventsEndpoint string
	// KVEventsReplayEndpoint, when set with KVEventsEndpoint, also listens
	// there (a ROUTER socket, rank N on PORT+N) for replay requests,
	// answered from the last KVEventsReplayBatches batches.
	KVEventsReplayEndpoint string
	// KVEventsReplayFormat frames replay answers; the zero value is the
	// engine's own.
	KVEventsReplayFormat ReplayFormat
	// KVEventsSnapshotEndpoint, when set with KVEventsEndpoint (vLLM
	// only), serves vLLM's KV-event snapshots there (rank N on PORT+N):
	// see kvevents.Publisher. It makes live sequence frames 24 bytes and
	// adds an empty batch after each second of silence.
	KVEventsSnapshotEndpoint string
	// KVEventsSnapshotUnavailable makes the snapshot endpoint answer
	// unavailable (-2), as a vLLM whose recorder failed.
	KVEventsSnapshotUnavailable bool
	// KVEventsTopic is the first frame of every published message; vLLM's
	// default is "".
	KVEventsTopic string
	// KVEventsEncoding is the payload layout for vLLM: kvevents.EncodingMap
	// (events as maps with a "type" key, as vLLM since PR 42892 sends
	// them), kvevents.EncodingArray (positional events, vLLM before it)
	// or kvevents.EncodingMapEnvelope. SGLang always uses its own
	// (kvevents.EncodingSGLang). The zero value is EncodingArray.
	KVEventsEncoding kvevents.Encoding
	// KVEventsReplayBatches bounds the batches kept for replay per rank. 0
	// means DefaultKVEventsReplayBatches (10,000, vLLM's buffer_steps).
	KVEventsReplayBatches int
	// KVEventSources is the body shape of GET /kv_event_sources (vLLM).
	KVEventSources SourcesShape
	// KVEventsAdvertiseHost, when set, is the host the engine reports in
	// its KV event endpoints (/kv_event_sources, SGLang's /server_info)
	// in place of the configured one: "*" or "0.0.0.0" to report a
	// wildcard, as an engine configured with one does, while listening
	// on a concrete address.
	KVEventsAdvertiseHost string

	// Exit ends the process for an exit fault (FaultExit); nil means
	// os.Exit. A hook that returns leaves the connection reset.
	Exit func(code int)

	// Tokenizer, when set, tokenizes text prompts (chat: rendered by its
	// chat template) into the token ids that count the prompt's length,
	// key its prefix cache (the engine's block hashes of the ids) and
	// ride on its BlockStored events, and serves POST /tokenize. nil: text
	// counts ceil(bytes/CharsPerToken) tokens and is hashed by bytes, and
	// /tokenize answers 404.
	Tokenizer tokenizer.Tokenizer
}

// MaxDataParallelSize bounds Config.DataParallelSize: each rank is a
// goroutine and a simulated engine of its own.
const MaxDataParallelSize = 64

// Server is a mock engine. It implements http.Handler; create it with New
// and stop its engine with Close.
type Server struct {
	cfg   Config
	model string // the listed model name
	// engines are the data-parallel ranks, by rank.
	engines []*engine
	pubs    []*kvPublisher // by rank; nil without KV events
	mux     *http.ServeMux
	created int64 // unix seconds at New, the models' "created"
	seq     atomic.Int64
	// engineID is Config.EngineID or the generated one.
	engineID string
	// blocks counts the remote_block_ids handed out by prefill answers.
	blocks atomic.Int64
	hasher *engineHasher
	// lora maps an adapter's name to its vLLM adapter id (1-based).
	lora map[string]int64
	// roundRobin counts the requests SGLang's round-robin sent to a rank
	// (pickSGLang).
	roundRobin atomic.Uint64
	// responses are the Responses API answers kept for
	// previous_response_id and GET /v1/responses/{id}.
	responses responseStore
	// fault is the process-wide fault (SetFault); nil for none.
	fault atomic.Pointer[Fault]
	// exit is Config.Exit or os.Exit.
	exit func(int)
	// Drain state (see Drain): draining, requests admitted and not done,
	// drainStarted closed by Drain, drained once draining and idle.
	drainMu      sync.Mutex
	draining     bool
	inFlight     int
	drainStarted chan struct{}
	drained      chan struct{}
}

// New validates cfg, starts the simulated engine and returns the server.
// Errors: an invalid Config (naming the field), or a KV events socket that
// cannot listen (wrapping ErrListen).
func New(cfg Config) (*Server, error) {
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if math.IsNaN(cfg.Speedup) || math.IsInf(cfg.Speedup, 0) || cfg.Speedup <= 0 {
		return nil, fmt.Errorf("mockworker: speedup %v, want a finite value > 0", cfg.Speedup)
	}
	if cfg.Sim == (sim.Config{}) {
		cfg.Sim = sim.DefaultConfig()
	}
	if err := cfg.Sim.Validate(); err != nil {
		return nil, fmt.Errorf("mockworker: %w", err)
	}
	if cfg.BlockTokens != 0 && cfg.BlockTokens != cfg.Sim.BlockSize {
		return nil, fmt.Errorf("mockworker: block tokens %d: the engine keys its prefix cache per KV block of %d tokens (Sim.BlockSize); set that instead",
			cfg.BlockTokens, cfg.Sim.BlockSize)
	}
	if cfg.Engine > EngineSGLang || cfg.MetricNames > MetricNamesUnderscore || cfg.KVEventsReplayFormat > ReplayTwoFrames ||
		cfg.KVEventSources > SourcesArray {
		return nil, errors.New("mockworker: engine, metric names, replay format or sources shape out of range")
	}
	if cfg.CharsPerToken == 0 {
		cfg.CharsPerToken = prefix.DefaultCharsPerToken
	}
	if cfg.CharsPerToken < 0 {
		return nil, fmt.Errorf("mockworker: chars per token %d, want > 0", cfg.CharsPerToken)
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = DefaultMaxTokens
	}
	if cfg.DefaultMaxTokens < 0 {
		return nil, fmt.Errorf("mockworker: default max tokens %d, want > 0", cfg.DefaultMaxTokens)
	}
	if cfg.DataParallelSize == 0 {
		cfg.DataParallelSize = 1
	}
	if cfg.DataParallelSize < 0 || cfg.DataParallelSize > MaxDataParallelSize {
		return nil, fmt.Errorf("mockworker: data-parallel size %d, want 1 to %d", cfg.DataParallelSize, MaxDataParallelSize)
	}
	if cfg.KVEventsReplayBatches == 0 {
		cfg.KVEventsReplayBatches = DefaultKVEventsReplayBatches
	}
	if cfg.KVEventsReplayBatches < 0 {
		return nil, fmt.Errorf("mockworker: KV events replay batches %d, want > 0", cfg.KVEventsReplayBatches)
	}
	if cfg.KVEventsEncoding > kvevents.EncodingMapEnvelope {
		return nil, fmt.Errorf("mockworker: KV events encoding %d is not one of vLLM's encodings", cfg.KVEventsEncoding)
	}
	if (cfg.KVEventsReplayEndpoint != "" || cfg.KVEventsSnapshotEndpoint != "") && cfg.KVEventsEndpoint == "" {
		return nil, errors.New("mockworker: a KV events replay or snapshot endpoint needs a KV events endpoint")
	}
	if cfg.KVEventsSnapshotEndpoint != "" && cfg.Engine == EngineSGLang {
		return nil, errors.New("mockworker: SGLang has no KV events snapshot endpoint")
	}
	if cfg.KVEventsSnapshotUnavailable && cfg.KVEventsSnapshotEndpoint == "" {
		return nil, errors.New("mockworker: an unavailable snapshot service needs a snapshot endpoint")
	}
	if cfg.KVEventsAdvertiseHost != "" && !validHost(cfg.KVEventsAdvertiseHost) {
		return nil, fmt.Errorf("mockworker: advertised KV events host %q is not a host name, an IP address or *", cfg.KVEventsAdvertiseHost)
	}
	model := cfg.Model
	if model == "" {
		model = DefaultModel
	}
	lora, err := loraIDs(cfg.LoRA, model)
	if err != nil {
		return nil, err
	}
	hasher, err := newEngineHasher(cfg.Engine == EngineSGLang, cfg.HashSeed)
	if err != nil {
		return nil, fmt.Errorf("mockworker: %w", err)
	}
	m := newMetrics(model, cfg)
	engineID := cfg.EngineID
	if engineID == "" {
		var rnd [4]byte
		_, _ = rand.Read(rnd[:])
		engineID = "mock-" + hex.EncodeToString(rnd[:])
	}
	s := &Server{cfg: cfg, model: model, mux: http.NewServeMux(), created: time.Now().Unix(), engineID: engineID,
		hasher: hasher, lora: lora, exit: cfg.Exit, drainStarted: make(chan struct{}), drained: make(chan struct{})}
	if s.exit == nil {
		s.exit = os.Exit
	}
	if cfg.KVEventsEndpoint != "" {
		o := kvEventsOptions{endpoint: cfg.KVEventsEndpoint, replay: cfg.KVEventsReplayEndpoint,
			snapshot: cfg.KVEventsSnapshotEndpoint, snapshotUnavailable: cfg.KVEventsSnapshotUnavailable,
			topic: cfg.KVEventsTopic, encoding: cfg.KVEventsEncoding, ringSize: cfg.KVEventsReplayBatches,
			replayFormat: kvevents.ReplayWithTopic, sglang: cfg.Engine == EngineSGLang}
		switch {
		case cfg.KVEventsReplayFormat == ReplayTwoFrames || cfg.KVEventsReplayFormat == ReplayDefault && o.sglang:
			o.replayFormat = kvevents.ReplayTwoFrames
		}
		if o.sglang {
			o.encoding = kvevents.EncodingSGLang
		}
		pubs, err := newKVPublishers(o, m.ranks[:cfg.DataParallelSize])
		if err != nil {
			return nil, fmt.Errorf("mockworker: %w", err)
		}
		s.pubs = pubs
	}
	epoch := time.Now()
	for r := range cfg.DataParallelSize {
		w, err := sim.NewWorker(cfg.Sim) // validated above: cannot fail
		if err == nil && cfg.Engine == EngineVLLM {
			// vLLM does not deduplicate blocks; SGLang's radix tree does
			// (a prefix inserted again is not stored twice).
			err = w.TrackBlockCopies()
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("mockworker: %w", err)
		}
		var p *kvPublisher
		if s.pubs != nil {
			p = s.pubs[r]
		}
		s.engines = append(s.engines, startEngine(r, w, epoch, cfg.Speedup, m.ranks[r], p))
	}
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, false) })
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, true) })
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("/mock/fault", s.handleFault)
	s.mux.HandleFunc("POST /mock/drain", s.handleDrain)
	s.mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	s.mux.HandleFunc("POST /tokenize", s.handleTokenize)
	s.mux.HandleFunc("GET /debug/kv_blocks", s.handleKVBlocks)
	s.routes()
	if cfg.Engine == EngineSGLang {
		s.mux.HandleFunc("POST /v1/tokenize", s.handleTokenize)
		s.mux.HandleFunc("GET /server_info", s.handleServerInfo)
		s.mux.HandleFunc("GET /get_server_info", s.handleServerInfo)
	} else {
		s.mux.HandleFunc("GET /kv_event_sources", s.handleKVEventSources)
	}
	if !cfg.NoMetrics {
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	}
	return s, nil
}

// loraIDs checks Config.LoRA and numbers the adapters from 1.
func loraIDs(names []string, model string) (map[string]int64, error) {
	if len(names) > MaxLoRA {
		return nil, fmt.Errorf("mockworker: %d LoRA adapters, want at most %d", len(names), MaxLoRA)
	}
	ids := make(map[string]int64, len(names))
	for i, n := range names {
		switch {
		case n == "" || len(n) > MaxLoRANameBytes:
			return nil, fmt.Errorf("mockworker: LoRA adapter %d: name of %d bytes, want 1 to %d", i, len(n), MaxLoRANameBytes)
		case n == model:
			return nil, fmt.Errorf("mockworker: LoRA adapter %q has the base model's name", n)
		case ids[n] != 0:
			return nil, fmt.Errorf("mockworker: LoRA adapter %q named twice", n)
		}
		ids[n] = int64(i + 1)
	}
	return ids, nil
}

// validHost reports whether h can be the host of a tcp:// endpoint: a
// name, an IP address, or *.
func validHost(h string) bool {
	if h == "*" || net.ParseIP(h) != nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, c := range h {
		if !(c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// Model returns the served model name.
func (s *Server) Model() string { return s.model }

// EngineID returns the engine id its prefill answers name as
// remote_engine_id (Config.EngineID or the generated one).
func (s *Server) EngineID() string { return s.engineID }

// ServeHTTP serves the endpoints listed in the package documentation;
// while draining, requests other than GET and /mock/ get 503.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if drainExempt(r) {
		s.mux.ServeHTTP(w, r)
		return
	}
	if !s.enter() {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errDraining.Error()})
		return
	}
	defer s.leave()
	s.mux.ServeHTTP(w, r)
}

// Close stops the simulated engine and waits for its goroutine to exit.
// Requests in flight end (a streamed one stops without [DONE], one that has
// sent nothing gets 503) and new ones get 503. Close is idempotent. Call it
// after http.Server.Shutdown to let in-flight requests finish first.
func (s *Server) Close() {
	for _, e := range s.engines {
		e.close()
	}
	s.closePubs()
}

func (s *Server) closePubs() {
	for _, p := range s.pubs {
		p.close()
	}
}

// maxModelLen is the longest prompt plus output the engine accepts, its
// KV cache in tokens, reported as vLLM's max_model_len.
func (s *Server) maxModelLen() int { return s.cfg.Sim.TotalKVBlocks * s.cfg.Sim.BlockSize }

// DataParallelSize returns the number of ranks.
func (s *Server) DataParallelSize() int { return len(s.engines) }

// KVEventsAddr returns the address rank's KV events PUB socket listens on
// and its replay ROUTER socket's (nil without one), or nil, nil without KV
// events or for a rank out of range. With port 0 in the endpoint it names
// the port picked.
func (s *Server) KVEventsAddr(rank int) (pub, replay net.Addr) {
	if rank < 0 || rank >= len(s.pubs) {
		return nil, nil
	}
	return s.pubs[rank].pub.Addr(), s.pubs[rank].pub.ReplayAddr()
}

// KVEventsSnapshotAddr returns the address rank's KV events snapshot
// ROUTER socket listens on, or nil without one or for a rank out of
// range.
func (s *Server) KVEventsSnapshotAddr(rank int) net.Addr {
	if rank < 0 || rank >= len(s.pubs) {
		return nil
	}
	return s.pubs[rank].pub.SnapshotAddr()
}

// KVEventsPublisherID returns rank's KV events publisher id (16 bytes,
// new for every Server), or nil without snapshots or for a rank out of
// range.
func (s *Server) KVEventsPublisherID(rank int) []byte {
	if rank < 0 || rank >= len(s.pubs) {
		return nil
	}
	return s.pubs[rank].pub.ID()
}

// errClosed is returned to requests once the engine stopped.
var errClosed = errors.New("mock engine is shut down")
