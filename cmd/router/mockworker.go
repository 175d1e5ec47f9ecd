package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// mockWorkerCut bounds how long a mock worker whose --drain-timeout passed
// waits for the requests it cut (vLLM's error event) before closing their
// connections.
const mockWorkerCut = 2 * time.Second

func newMockWorkerCmd() *cobra.Command {
	var (
		listen           string
		model            string
		engine           string
		speedup          float64
		engineBlockSize  int
		blockSize        int
		kvBlocks         int
		noMetrics        bool
		metricNames      string
		dpSize           int
		lora             []string
		hashSeed         string
		kvEndpoint       string
		kvReplay         string
		kvReplayFormat   string
		kvBufferSteps    int
		kvSnapshot       string
		kvSnapshotRefuse bool
		kvTopic          string
		kvEncoding       string
		kvSources        string
		kvAdvertise      string
		tokenizerFile    string
		tokenizerConfig  string
		chatTemplate     string
		drainTimeout     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "mock-worker",
		Short: "Serve a simulated OpenAI-compatible inference engine",
		Long: `mock-worker serves an OpenAI-compatible API (POST /v1/completions,
POST /v1/chat/completions, streamed or not; GET /v1/models, /health and
/metrics with vLLM metric names, or 404 with --no-metrics; POST /tokenize with
--tokenizer; POST /reset_prefix_cache; GET /kv_event_sources) backed by
simulated engines running in real time: the replay worker model
(Llama-3.1-8B-Instruct on one H100, vLLM V1 scheduler, prefix cache).
--speedup X runs simulated time X times faster than the wall clock. By default
it plays a current vLLM; --engine sglang plays SGLang (sglang:* metrics,
labelled dp_rank with --data-parallel-size above 1, /server_info and
/get_server_info, SGLang's /tokenize and KV events, and SGLang's choice of a
data-parallel rank: X-Data-Parallel-Rank, else routed_dp_rank, else
round-robin).

The prefix cache is vLLM's, in blocks of --engine-block-size tokens (16, vLLM's
default), keyed by the engine's own block hashes (vLLM's sha256_cbor of the
parent hash, the token ids and the extra keys, from a NONE_HASH that is random
per process unless --hash-seed is given, as PYTHONHASHSEED): a LoRA adapter's
name (--lora) is in every block's key and a request's cache_salt in the first
block's, a hit is capped at all but the last block of the prompt, and, like
vLLM, identical blocks are not deduplicated. Without --tokenizer, text prompts
count ceil(bytes/4) tokens (an approximation) and their blocks are chunks of 4
bytes per token; chat prompts are rendered as "role: content" lines first.
With --tokenizer FILE (a Hugging Face tokenizer.json) prompts are tokenized
(chat through the template of --tokenizer-config or --chat-template) and keyed
by their token ids. Requests generate max_tokens tokens (default 16).
Responses carry the simulated cached prompt tokens and time to first token in
x-mock-cached-tokens and x-mock-ttft-seconds, the serving rank in
x-mock-dp-rank, and usage.prompt_tokens_details.cached_tokens.

--data-parallel-size N runs N engines (ranks) behind the one address, as vLLM's
data parallelism does: metrics labelled engine="R", the header
X-data-parallel-rank: R pins a request to rank R, others go to the least loaded
rank (vLLM's score 4*waiting + running).

--kv-events-endpoint tcp://HOST:PORT publishes the prefix cache's KV events in
the engine's ZeroMQ format (rank R on PORT+R; port 0 a free port per rank,
with --engine sglang a free base for rank 0 and base + R for rank R; HOST *
every interface): one BlockStored per request and step with the engine's
hashes, token ids, LoRA fields and extra keys, one BlockRemoved per
evicted copy. --kv-events-replay-endpoint adds replay from the last
--kv-events-buffer-steps batches (vLLM's current framing, or
--kv-events-replay-format two-frame); --kv-events-snapshot-endpoint adds
vLLM's snapshot service (24-byte sequence frames with the publisher id, a
heartbeat each idle second, compacted snapshots; refused with
--kv-events-snapshot-unavailable). GET /kv_event_sources reports the
endpoints per rank. GET /debug/kv_blocks (the mock's own, no engine has it)
lists every block its prefix cache holds, per rank, from the cache itself.

It prints "mock-worker listening on http://ADDR (model NAME)" once it accepts connections
(useful with --listen 127.0.0.1:0), then, with KV events, one line per rank
"mock-worker rank R KV events on tcp://ADDR" (and " replay on tcp://ADDR",
" snapshot on tcp://ADDR publisher ID"), and stops on SIGINT or SIGTERM,
draining as a vLLM with --shutdown-timeout does: /health and new requests
get 503, requests in flight run to their end for up to --drain-timeout (30s),
then those left get vLLM's in-stream error and the process exits (also after
POST /mock/drain). A restarted process has a new publisher id, sequences from
0 and an empty cache.

Faults on command (see the mockworker package): a request header
X-Mock-Fault: KIND@N, or POST /mock/fault {"kind": KIND, "after_tokens": N}
for every generation in flight and to come (DELETE clears it), makes chat and
completions answers fail after N tokens: reset (TCP RST), close (a clean close
of an answer framed by the connection's close), stall, error (vLLM's error
event), exit (the process exits with status 1).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// New reads 0 as "default"; the flags' defaults are not 0.
			if !(speedup > 0) || math.IsInf(speedup, 1) {
				return fmt.Errorf("--speedup %v: want %s", speedup, speedupWant)
			}
			if cmd.Flags().Changed("block-size") {
				if cmd.Flags().Changed("engine-block-size") && blockSize != engineBlockSize {
					return fmt.Errorf("--block-size %d and --engine-block-size %d: --block-size is the old name of --engine-block-size; give one", blockSize, engineBlockSize)
				}
				if blockSize < 1 || blockSize > maxEngineBlockSize {
					return fmt.Errorf("--block-size %d: want %s", blockSize, engineBlockSizeWant)
				}
				engineBlockSize = blockSize
			}
			if engineBlockSize < 1 || engineBlockSize > maxEngineBlockSize {
				return fmt.Errorf("--engine-block-size %d: want %s", engineBlockSize, engineBlockSizeWant)
			}
			if kvBlocks < 1 || kvBlocks > math.MaxInt32 {
				return fmt.Errorf("--kv-blocks %d: want %s", kvBlocks, kvBlocksWant)
			}
			if dpSize < 1 || dpSize > mockworker.MaxDataParallelSize {
				return fmt.Errorf("--data-parallel-size %d: want %s", dpSize, dpSizeWant)
			}
			eng, ok := mockEngines[engine]
			if !ok {
				return fmt.Errorf("--engine %q: want vllm or sglang", engine)
			}
			names, ok := mockMetricNames[metricNames]
			if !ok {
				return fmt.Errorf("--metric-names %q: want colon or underscore", metricNames)
			}
			enc, ok := kvEncodings[kvEncoding]
			if !ok {
				return fmt.Errorf("--kv-events-encoding %q: want %s", kvEncoding, kvEncodingWant)
			}
			replayFormat, ok := mockReplayFormats[kvReplayFormat]
			if !ok {
				return fmt.Errorf("--kv-events-replay-format %q: want topic or two-frame (default: the engine's)", kvReplayFormat)
			}
			sources, ok := mockSourcesShapes[kvSources]
			if !ok {
				return fmt.Errorf("--kv-event-sources %q: want envelope or array", kvSources)
			}
			if kvEndpoint == "" && (kvReplay != "" || kvSnapshot != "") {
				return fmt.Errorf("--kv-events-replay-endpoint and --kv-events-snapshot-endpoint need --kv-events-endpoint")
			}
			if kvBufferSteps < 1 || kvBufferSteps > maxKVBufferSteps {
				return fmt.Errorf("--kv-events-buffer-steps %d: want %s", kvBufferSteps, kvBufferStepsWant)
			}
			if kvSnapshotRefuse && kvSnapshot == "" {
				return fmt.Errorf("--kv-events-snapshot-unavailable needs --kv-events-snapshot-endpoint")
			}
			if drainTimeout < 0 {
				return fmt.Errorf("--drain-timeout %v: want a duration >= 0 with a unit, such as 500ms, 30s or 5m", drainTimeout)
			}
			if tokenizerFile == "" && (tokenizerConfig != "" || chatTemplate != "") {
				return fmt.Errorf("--tokenizer-config and --chat-template need --tokenizer")
			}
			cfg := sim.DefaultConfig()
			cfg.BlockSize = engineBlockSize
			cfg.TotalKVBlocks = kvBlocks
			mcfg := mockworker.Config{
				Model: model, Engine: eng, Speedup: speedup, Sim: cfg, NoMetrics: noMetrics, MetricNames: names,
				DataParallelSize: dpSize, LoRA: lora, HashSeed: hashSeed,
				KVEventsEndpoint: kvEndpoint, KVEventsReplayEndpoint: kvReplay, KVEventsReplayFormat: replayFormat,
				KVEventsReplayBatches:    kvBufferSteps,
				KVEventsSnapshotEndpoint: kvSnapshot, KVEventsSnapshotUnavailable: kvSnapshotRefuse,
				KVEventsTopic: kvTopic, KVEventsEncoding: enc, KVEventSources: sources, KVEventsAdvertiseHost: kvAdvertise,
			}
			if tokenizerFile != "" {
				tok, err := loadMockTokenizer(tokenizerFile, tokenizerConfig, chatTemplate)
				if err != nil {
					return err
				}
				mcfg.Tokenizer = tok
			}
			srv, err := mockworker.New(mcfg)
			if errors.Is(err, mockworker.ErrListen) {
				return &exitError{code: 1, err: err}
			}
			if err != nil {
				return err // usage error: exit 2
			}
			defer srv.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return &exitError{code: 1, err: fmt.Errorf("--listen %s: %w", listen, err)}
			}
			return serveMockWorker(cmd.Context(), cmd, ln, srv, drainTimeout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8000", "address to listen on (host:port; port 0 picks a free one)")
	f.StringVar(&model, "model", "", "served model name; requests naming another get 404 (default: list \""+mockworker.DefaultModel+"\", accept any)")
	f.StringVar(&engine, "engine", "vllm", "the engine played: vllm, or sglang (sglang:* metrics, /server_info, SGLang's /tokenize and KV events)")
	f.Float64Var(&speedup, "speedup", 1, "simulated seconds per wall-clock second")
	f.IntVar(&engineBlockSize, "engine-block-size", sim.DefaultConfig().BlockSize, "the engine's KV block size in tokens (vLLM's --block-size, SGLang's --page-size): its prefix cache, KV events and vllm:cache_config_info{block_size}")
	f.IntVar(&blockSize, "block-size", 0, "old name of --engine-block-size")
	_ = f.MarkDeprecated("block-size", "use --engine-block-size (the engine keys its cache per KV block)")
	f.IntVar(&kvBlocks, "kv-blocks", sim.DefaultConfig().TotalKVBlocks, "KV cache capacity in blocks of --engine-block-size tokens")
	f.BoolVar(&noMetrics, "no-metrics", false, "answer 404 on /metrics, as SGLang started without --enable-metrics does")
	f.StringVar(&metricNames, "metric-names", "colon", "metric name spelling: colon (vllm:x, sglang:x, the engines' own) or underscore (vllm_x, sglang_x, as OpenMetrics escaping and SGLang's router serve them)")
	f.IntVar(&dpSize, "data-parallel-size", 1, "data-parallel ranks, each its own simulated engine with --kv-blocks blocks (vLLM's --data-parallel-size)")
	f.StringSliceVar(&lora, "lora", nil, "serve LoRA adapters NAME[,NAME...] (vLLM's --lora-modules): listed in /v1/models with the base model as parent, named as a request's model, keyed in the cache and KV events by name")
	f.StringVar(&hashSeed, "hash-seed", "", "seed of the engine's block hashes, as vLLM's PYTHONHASHSEED (default: random per process)")
	f.StringVar(&kvEndpoint, "kv-events-endpoint", "", "publish KV-cache events in the engine's ZeroMQ format on a PUB socket at tcp://HOST:PORT (vLLM's default tcp://*:5557); rank R on PORT+R")
	f.StringVar(&kvReplay, "kv-events-replay-endpoint", "", "answer replay requests on a ROUTER socket at tcp://HOST:PORT from the last --kv-events-buffer-steps batches; rank R on PORT+R")
	f.IntVar(&kvBufferSteps, "kv-events-buffer-steps", mockworker.DefaultKVEventsReplayBatches, "batches the replay endpoint keeps per rank (vLLM's buffer_steps): a subscriber that falls further behind, or starts later, cannot replay from the engine's start")
	f.StringVar(&kvReplayFormat, "kv-events-replay-format", "", "replay framing: topic ([topic, seq, payload], vLLM since PR 45177) or two-frame ([seq, payload], SGLang, older vLLM) (default: the engine's)")
	f.StringVar(&kvSnapshot, "kv-events-snapshot-endpoint", "", "serve vLLM's KV-event snapshots on a ROUTER socket at tcp://HOST:PORT (PR 57789); rank R on PORT+R; makes live sequence frames 24 bytes and adds heartbeats")
	f.BoolVar(&kvSnapshotRefuse, "kv-events-snapshot-unavailable", false, "answer every snapshot request unavailable (-2), as a vLLM whose recorder failed")
	f.StringVar(&kvTopic, "kv-events-topic", "", "topic frame of every KV events message (vLLM's default is empty)")
	f.StringVar(&kvEncoding, "kv-events-encoding", "map", "vLLM's KV events payload layout: map (events as maps with a \"type\" key, vLLM since PR 42892) or array (positional events, vLLM before it); SGLang uses its own")
	f.StringVar(&kvSources, "kv-event-sources", "envelope", "GET /kv_event_sources body: envelope ({\"sources\": [...]}) or array (a bare array); both are in vLLM's history")
	f.StringVar(&kvAdvertise, "kv-events-advertise-host", "", "host reported in /kv_event_sources and /server_info instead of the configured one, e.g. * or 0.0.0.0 as an engine configured with a wildcard reports")
	f.StringVar(&tokenizerFile, "tokenizer", "", "a Hugging Face tokenizer.json: tokenize prompts, key the prefix cache by token ids, serve POST /tokenize")
	f.StringVar(&tokenizerConfig, "tokenizer-config", "", "the model's tokenizer_config.json, for its chat template and BOS/EOS tokens (with --tokenizer)")
	f.StringVar(&chatTemplate, "chat-template", "", "a Jinja chat template file, instead of the one in --tokenizer-config (with --tokenizer)")
	f.DurationVar(&drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM or POST /mock/drain, how long requests in flight may run (/health and new requests get 503 meanwhile) before they are cut with vLLM's error event and the process exits")
	setWant(f, "drain-timeout", "a duration >= 0 with a unit, such as 500ms, 30s or 5m")
	setWant(f, "data-parallel-size", dpSizeWant)
	setWant(f, "speedup", speedupWant)
	setWant(f, "engine-block-size", engineBlockSizeWant)
	setWant(f, "block-size", engineBlockSizeWant)
	setWant(f, "kv-blocks", kvBlocksWant)
	setWant(f, "kv-events-buffer-steps", kvBufferStepsWant)
	return cmd
}

// What the mock-worker's numeric flags accept, in words: the simulated
// engine's limits (sim.Config.Validate, mockworker.New).
const speedupWant = "a finite number greater than 0"

// maxEngineBlockSize bounds --engine-block-size (vLLM's sizes go to 256;
// hybrid models' blocks are larger multiples).
const maxEngineBlockSize = 1 << 16

// maxKVBufferSteps bounds --kv-events-buffer-steps: the replay ring is
// sized by it up front (a hundred times vLLM's default).
const maxKVBufferSteps = 1_000_000

var (
	engineBlockSizeWant = fmt.Sprintf("a whole number from 1 to %d", maxEngineBlockSize)
	kvBlocksWant        = fmt.Sprintf("a whole number from 1 to %d", math.MaxInt32)
	dpSizeWant          = fmt.Sprintf("a whole number from 1 to %d", mockworker.MaxDataParallelSize)
	kvBufferStepsWant   = fmt.Sprintf("a whole number from 1 to %d", maxKVBufferSteps)
)

// kvEncodings are the --kv-events-encoding values.
var kvEncodings = map[string]kvevents.Encoding{"array": kvevents.EncodingArray, "map": kvevents.EncodingMap}

const kvEncodingWant = "array or map"

// The values of --engine, --metric-names, --kv-events-replay-format and
// --kv-event-sources.
var (
	mockEngines       = map[string]mockworker.Engine{"vllm": mockworker.EngineVLLM, "sglang": mockworker.EngineSGLang}
	mockMetricNames   = map[string]mockworker.MetricNames{"colon": mockworker.MetricNamesColon, "underscore": mockworker.MetricNamesUnderscore}
	mockReplayFormats = map[string]mockworker.ReplayFormat{"": mockworker.ReplayDefault, "topic": mockworker.ReplayWithTopic,
		"two-frame": mockworker.ReplayTwoFrames}
	mockSourcesShapes = map[string]mockworker.SourcesShape{"envelope": mockworker.SourcesEnvelope, "array": mockworker.SourcesArray}
)

// loadMockTokenizer builds the mock's tokenizer from a tokenizer.json and,
// optionally, a tokenizer_config.json (chat template, BOS and EOS) and a
// Jinja chat template file that replaces the config's template.
func loadMockTokenizer(path, configPath, templatePath string) (*tokenizer.File, error) {
	var tc tokenizer.TokenizerConfig
	if configPath != "" {
		b, err := inputfile.ReadFile(configPath, tokenizer.MaxFileSize)
		if err != nil {
			return nil, fmt.Errorf("--tokenizer-config: %w", err)
		}
		if tc, err = tokenizer.ParseTokenizerConfig(configPath, b); err != nil {
			return nil, fmt.Errorf("--tokenizer-config: %w", err)
		}
	}
	name := configPath
	if templatePath != "" {
		b, err := inputfile.ReadFile(templatePath, tokenizer.MaxFileSize)
		if err != nil {
			return nil, fmt.Errorf("--chat-template: %w", err)
		}
		tc.ChatTemplate, name = string(b), templatePath
	}
	var tmpl *tokenizer.ChatTemplate
	if tc.ChatTemplate != "" {
		var err error
		if tmpl, err = tokenizer.ParseChatTemplate(name, tc.ChatTemplate, tc.BOS, tc.EOS); err != nil {
			return nil, err
		}
	}
	tok, err := tokenizer.LoadFile(path, tmpl)
	if err != nil {
		return nil, fmt.Errorf("--tokenizer: %w", err)
	}
	return tok, nil
}

// serveMockWorker serves srv on ln until ctx is cancelled or a drain is
// asked for (POST /mock/drain), then drains (mockworker.Server.Drain) for
// at most drainTimeout, cuts what is left and stops.
func serveMockWorker(ctx context.Context, cmd *cobra.Command, ln net.Listener, srv *mockworker.Server, drainTimeout time.Duration) error {
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(cmd.OutOrStdout(), "mock-worker listening on http://%s (model %s)\n", ln.Addr(), srv.Model())
	for r := range srv.DataParallelSize() {
		if pub, replay := srv.KVEventsAddr(r); pub != nil {
			line := fmt.Sprintf("mock-worker rank %d KV events on tcp://%s", r, pub)
			if replay != nil {
				line += fmt.Sprintf(" replay on tcp://%s", replay)
			}
			if snap := srv.KVEventsSnapshotAddr(r); snap != nil {
				line += fmt.Sprintf(" snapshot on tcp://%s publisher %x", snap, srv.KVEventsPublisherID(r))
			}
			fmt.Fprintln(cmd.OutOrStdout(), line)
		}
	}
	select {
	case err := <-errc:
		return &exitError{code: 1, err: err}
	case <-ctx.Done():
	case <-srv.DrainStarted():
	}
	// Drain while still listening: /health and new requests get 503.
	srv.Drain()
	dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if srv.WaitDrained(dctx) != nil {
		// vLLM aborts what is left with finish_reason "error".
		srv.SetFault(&mockworker.Fault{Kind: mockworker.FaultError})
		cctx, ccancel := context.WithTimeout(context.Background(), mockWorkerCut)
		_ = srv.WaitDrained(cctx)
		ccancel()
	}
	sctx, scancel := context.WithTimeout(context.Background(), mockWorkerCut)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return &exitError{code: 1, err: err}
	}
	return nil
}
