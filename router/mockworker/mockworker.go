// Package mockworker is a mock inference engine: an OpenAI-compatible HTTP
// server that simulates vLLM-like engines in real time with the replay
// worker model (router/sim: step-time model, vLLM V1 scheduler, prefix
// cache), streams tokens as the simulated steps end, and exports vLLM-named
// Prometheus metrics. It speaks vLLM's side protocols too: KV-cache events
// over ZeroMQ, /tokenize, data-parallel ranks. `router mock-worker` serves
// it; the router's end-to-end tests, demos and benchmarks run fleets of
// them.
//
// # Endpoints
//
//	POST /v1/completions        prompt: string, [string], token ids or [[ids]]
//	POST /v1/chat/completions   messages: [{role, content}], content a string or text parts
//	POST /tokenize              vLLM's shape; 404 without Config.Tokenizer
//	POST /reset_prefix_cache    drops every rank's prefix cache (vLLM's dev-mode endpoint); 409 while requests run
//	GET  /v1/models             the one served model, with max_model_len (the KV cache in tokens)
//	GET  /health                200
//	GET  /metrics               Prometheus text, vLLM metric names; 404 with Config.NoMetrics
//
// /metrics has, per rank, labelled model_name and engine="R" as vLLM does:
// vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, the token, preemption, prefix-cache and success
// counters, and the info gauge vllm:cache_config_info (value 1) whose
// labels are the cache configuration, among them num_gpu_blocks (Sim's
// TotalKVBlocks) and block_size (Sim's BlockSize, 16: the engine's KV
// block, not BlockTokens).
//
// Requests may set "stream" (SSE chunks in the OpenAI chunk format, one per
// generated token, then "data: [DONE]"; "stream_options": {"include_usage":
// true} adds a usage chunk before it), "max_tokens" (chat also
// "max_completion_tokens"; default Config.DefaultMaxTokens, 16) and
// "prompt_token_ids". The engine always generates exactly max_tokens tokens
// (finish_reason "length"); the text is filler words.
//
// # Prompt length and prefix hashing
//
// With Config.Tokenizer, text prompts are tokenized (a completions prompt
// with special tokens, chat messages through the tokenizer's chat template
// with the generation prompt, as vLLM does), and then count and hash like
// token ids: prefix.TokenBlocks at BlockTokens, the keys a token-accurate
// router computes. /tokenize answers the same ids.
//
// Without a tokenizer, a prompt given as text counts
// ceil(len(text)/CharsPerToken) tokens (CharsPerToken 4 bytes per token, an
// approximation; prefix.EstimateTokens) and is hashed into chained blocks of
// BlockTokens·CharsPerToken bytes (prefix.TextBlocks), the same hashing as
// the router's routing key, so the router's prefix index and this engine's
// cache agree on what a shared prefix is. A chat prompt is rendered first as
// one "role: content\n" line per message (prefix.RenderChat). Token ids, in
// "prompt_token_ids" or as the completions "prompt", count one token each
// and are hashed with prefix.TokenBlocks. Only full blocks are cacheable.
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
// Sim configuration, behind one address, as vLLM's data parallelism does.
// A request with the header X-data-parallel-rank: R (vLLM's, read by
// OpenAIServing._get_data_parallel_rank) goes to rank R (400 when out of
// range; a value that is not an integer is ignored, as vLLM ignores it);
// the others go to the least loaded rank by the score of vLLM's internal
// balancer (DPLBAsyncMPClient), 4·waiting + running, ties to the lowest
// rank. The answer's x-mock-dp-rank header names the rank that served it.
//
// # KV events
//
// With Config.KVEventsEndpoint each rank publishes its prefix cache's
// changes as vLLM's ZmqEventPublisher does (format in router/kvevents):
// messages [topic, sequence, payload] on a PUB socket, rank R on the
// endpoint's port + R, one batch per change of the simulated engine (the
// evictions of a step's allocation, the blocks a step computed, a reset),
// data_parallel_rank R. BlockStored carries the new blocks' hashes (the
// chained prefix hashes the cache is keyed by, as unsigned ints), the
// parent's hash (none for a prompt's first block), block_size and medium
// "GPU"; BlockRemoved the evicted hashes; AllBlocksCleared follows
// /reset_prefix_cache. Consecutive blocks of one chain share one event.
//
// One event block is one prefix group of BlockTokens tokens, not one
// 16-token engine block (router/sim README, "KV events", lists what that
// approximates; with BlockTokens 16 it is exact). BlockStored carries the
// blocks' token ids when the prompt's ids are known (token-id prompts, or
// a Tokenizer). A text prompt without a tokenizer is hashed by bytes, so
// its events carry hashes only: a router that keys blocks by token ids
// cannot key them, and can only match the hashes against its own byte
// hashing (prefix.TextBlocks at the same block and CharsPerToken).
//
// With Config.KVEventsReplayEndpoint a ROUTER socket (port + R too)
// answers replay requests from the last KVEventsReplayBatches batches.
// The PUB socket never blocks the engine: it queues the batches for slow
// subscribers.
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
//
// # Errors and cancellation
//
// Errors use the OpenAI shape {"error": {"message", "type", "param",
// "code"}} with the HTTP status as code: malformed JSON or invalid fields
// 400, a model other than Config.Model 404, a prompt plus max_tokens that
// can never fit the KV cache 400, a closed server 503. A client that
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
	// DefaultBlockTokens is the prefix hashing block in tokens, the
	// router's default router.block_size (router/config.DefaultBlockSize).
	DefaultBlockTokens = 512
	// DefaultMaxTokens is the output length of a request without
	// max_tokens, as in vLLM's completions API.
	DefaultMaxTokens = 16
	// maxBodyBytes bounds a request body.
	maxBodyBytes = 64 << 20
)

// Config configures a Server. The zero value serves DefaultModel, accepting
// any model name, in real time with sim.DefaultConfig().
type Config struct {
	// Model is the served model name. When set, requests naming another
	// model get 404; when empty, DefaultModel is listed and any name is
	// accepted (and echoed).
	Model string
	// Speedup scales simulated time: a step of d simulated time takes
	// d/Speedup of wall time. 0 means 1; otherwise it must be finite and
	// positive.
	Speedup float64
	// Sim configures the simulated engine; the zero value means
	// sim.DefaultConfig() (Llama-3.1-8B on one H100, 27,500 blocks of 16).
	Sim sim.Config
	// BlockTokens is the prefix hashing block in tokens; it must be a
	// multiple of Sim.BlockSize. 0 means DefaultBlockTokens.
	BlockTokens int
	// CharsPerToken is the assumed bytes per token of text prompts. 0 means
	// prefix.DefaultCharsPerToken (4).
	CharsPerToken int
	// DefaultMaxTokens is the output length when a request sets none. 0
	// means DefaultMaxTokens (16).
	DefaultMaxTokens int
	// EngineID is this engine's id in its prefill answers'
	// kv_transfer_params (remote_engine_id). "" means "mock-" and 8
	// random hex digits.
	EngineID string
	// NoMetrics makes GET /metrics answer 404, as SGLang started without
	// --enable-metrics does; /health still answers 200.
	NoMetrics bool
	// DataParallelSize is the number of data-parallel ranks, each its own
	// simulated engine with the whole Sim configuration (its own KV cache
	// and queue), behind this one server. 0 means 1; at most
	// MaxDataParallelSize.
	DataParallelSize int

	// KVEventsEndpoint, when set, publishes every rank's KV-cache events
	// in vLLM's format on a ZeroMQ PUB socket listening there
	// ("tcp://HOST:PORT"; vLLM's default is tcp://*:5557), rank N on PORT+N
	// (port 0, a free port, only with one rank). See the package doc,
	// "KV events".
	KVEventsEndpoint string
	// KVEventsReplayEndpoint, when set with KVEventsEndpoint, also listens
	// there (a ROUTER socket, rank N on PORT+N) for replay requests,
	// answered from the last KVEventsReplayBatches batches.
	KVEventsReplayEndpoint string
	// KVEventsTopic is the first frame of every published message; vLLM's
	// default is "".
	KVEventsTopic string
	// KVEventsEncoding is the payload layout: kvevents.EncodingArray
	// (positional events, vLLM before PR 42892, the zero value),
	// kvevents.EncodingMap (events as maps with a "type" key, as vLLM
	// since then and SGLang send) or kvevents.EncodingMapEnvelope.
	KVEventsEncoding kvevents.Encoding
	// KVEventsReplayBatches bounds the batches kept for replay per rank. 0
	// means DefaultKVEventsReplayBatches (10,000, vLLM's buffer_steps).
	KVEventsReplayBatches int

	// Tokenizer, when set, tokenizes text prompts (chat: rendered by its
	// chat template) into the token ids that count the prompt's length,
	// key its prefix cache (prefix.TokenBlocks at BlockTokens) and ride on
	// its BlockStored events, and serves POST /tokenize. nil: text counts
	// ceil(bytes/CharsPerToken) tokens and is hashed by bytes, and
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
}

// New validates cfg, starts the simulated engine and returns the server.
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
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = DefaultBlockTokens
	}
	if cfg.BlockTokens < 0 || cfg.BlockTokens%cfg.Sim.BlockSize != 0 {
		return nil, fmt.Errorf("mockworker: block tokens %d, want a positive multiple of the engine's block size %d",
			cfg.BlockTokens, cfg.Sim.BlockSize)
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
		return nil, fmt.Errorf("mockworker: KV events encoding %d is not one of kvevents' encodings", cfg.KVEventsEncoding)
	}
	if cfg.KVEventsReplayEndpoint != "" && cfg.KVEventsEndpoint == "" {
		return nil, errors.New("mockworker: a KV events replay endpoint needs a KV events endpoint")
	}
	model := cfg.Model
	if model == "" {
		model = DefaultModel
	}
	m := newMetrics(model, cfg.DataParallelSize, cfg.Sim)
	engineID := cfg.EngineID
	if engineID == "" {
		var rnd [4]byte
		_, _ = rand.Read(rnd[:])
		engineID = "mock-" + hex.EncodeToString(rnd[:])
	}
	s := &Server{cfg: cfg, model: model, mux: http.NewServeMux(), created: time.Now().Unix(), engineID: engineID}
	if cfg.KVEventsEndpoint != "" {
		o := kvEventsOptions{endpoint: cfg.KVEventsEndpoint, replay: cfg.KVEventsReplayEndpoint,
			topic: cfg.KVEventsTopic, encoding: cfg.KVEventsEncoding, ringSize: cfg.KVEventsReplayBatches}
		for r := range cfg.DataParallelSize {
			p, err := newKVPublisher(o, r, m.ranks[r])
			if err != nil {
				s.closePubs()
				return nil, fmt.Errorf("mockworker: %w", err)
			}
			s.pubs = append(s.pubs, p)
		}
	}
	epoch := time.Now()
	for r := range cfg.DataParallelSize {
		w, err := sim.NewWorker(cfg.Sim) // validated above: cannot fail
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
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	s.mux.HandleFunc("POST /tokenize", s.handleTokenize)
	if !cfg.NoMetrics {
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	}
	return s, nil
}

// Model returns the served model name.
func (s *Server) Model() string { return s.model }

// EngineID returns the engine id its prefill answers name as
// remote_engine_id (Config.EngineID or the generated one).
func (s *Server) EngineID() string { return s.engineID }

// ServeHTTP serves the endpoints listed in the package documentation.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

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

// errClosed is returned to requests once the engine stopped.
var errClosed = errors.New("mock engine is shut down")
