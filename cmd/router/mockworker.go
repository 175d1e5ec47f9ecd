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

// mockWorkerDrain bounds how long a stopping mock worker waits for requests
// in flight before cutting them off.
const mockWorkerDrain = 5 * time.Second

func newMockWorkerCmd() *cobra.Command {
	var (
		listen          string
		model           string
		speedup         float64
		blockSize       int
		kvBlocks        int
		noMetrics       bool
		dpSize          int
		kvEndpoint      string
		kvReplay        string
		kvTopic         string
		kvEncoding      string
		tokenizerFile   string
		tokenizerConfig string
		chatTemplate    string
	)
	cmd := &cobra.Command{
		Use:   "mock-worker",
		Short: "Serve a simulated OpenAI-compatible inference engine",
		Long: `mock-worker serves an OpenAI-compatible API (POST /v1/completions,
POST /v1/chat/completions, streamed or not; GET /v1/models, /health and
/metrics with vLLM metric names, or 404 with --no-metrics; POST /tokenize with
--tokenizer; POST /reset_prefix_cache) backed by simulated engines running in
real time: the replay worker model (Llama-3.1-8B-Instruct on one H100, vLLM V1
scheduler, prefix cache). --speedup X runs simulated time X times faster than
the wall clock.

Without --tokenizer, text prompts count ceil(bytes/4) tokens (an approximation)
and are hashed for the prefix cache in blocks of --block-size tokens (4 bytes
each), the router's own routing-key hashing; chat prompts are rendered as
"role: content" lines first. With --tokenizer FILE (a Hugging Face
tokenizer.json) prompts are tokenized (chat through the template of
--tokenizer-config or --chat-template) and keyed by their token ids in blocks
of --block-size tokens (prefix.TokenBlocks). Requests generate max_tokens tokens
(default 16). Responses carry the simulated cached prompt tokens and time to
first token in x-mock-cached-tokens and x-mock-ttft-seconds, the serving rank
in x-mock-dp-rank, and usage.prompt_tokens_details.cached_tokens.

--data-parallel-size N runs N engines (ranks) behind the one address, as vLLM's
data parallelism does: metrics labelled engine="R", the header
X-data-parallel-rank: R pins a request to rank R, others go to the least loaded
rank (vLLM's score 4*waiting + running).

--kv-events-endpoint tcp://HOST:PORT publishes the prefix cache's KV events in
vLLM's ZeroMQ format (rank R on PORT+R); one event block is one --block-size
prefix group, with token ids when prompts are token ids.

It prints "mock-worker listening on http://ADDR (model NAME)" once it accepts connections
(useful with --listen 127.0.0.1:0), then, with KV events, one line per rank
"mock-worker rank R KV events on tcp://ADDR" (and " replay on tcp://ADDR"), and
stops on SIGINT or SIGTERM, letting requests in flight finish for up to 5s.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// New reads 0 as "default"; the flags' defaults are not 0.
			if !(speedup > 0) || math.IsInf(speedup, 1) {
				return fmt.Errorf("--speedup %v: want %s", speedup, speedupWant)
			}
			if blockSize < 1 || blockSize%sim.DefaultConfig().BlockSize != 0 {
				return fmt.Errorf("--block-size %d: want %s", blockSize, blockSizeWant)
			}
			if kvBlocks < 1 || kvBlocks > math.MaxInt32 {
				return fmt.Errorf("--kv-blocks %d: want %s", kvBlocks, kvBlocksWant)
			}
			if dpSize < 1 || dpSize > mockworker.MaxDataParallelSize {
				return fmt.Errorf("--data-parallel-size %d: want %s", dpSize, dpSizeWant)
			}
			enc, ok := kvEncodings[kvEncoding]
			if !ok {
				return fmt.Errorf("--kv-events-encoding %q: want %s", kvEncoding, kvEncodingWant)
			}
			if kvEndpoint == "" && kvReplay != "" {
				return fmt.Errorf("--kv-events-replay-endpoint needs --kv-events-endpoint")
			}
			if tokenizerFile == "" && (tokenizerConfig != "" || chatTemplate != "") {
				return fmt.Errorf("--tokenizer-config and --chat-template need --tokenizer")
			}
			cfg := sim.DefaultConfig()
			cfg.TotalKVBlocks = kvBlocks
			mcfg := mockworker.Config{
				Model: model, Speedup: speedup, Sim: cfg, BlockTokens: blockSize, NoMetrics: noMetrics,
				DataParallelSize: dpSize, KVEventsEndpoint: kvEndpoint, KVEventsReplayEndpoint: kvReplay,
				KVEventsTopic: kvTopic, KVEventsEncoding: enc,
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
			return serveMockWorker(cmd.Context(), cmd, ln, srv)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8000", "address to listen on (host:port; port 0 picks a free one)")
	f.StringVar(&model, "model", "", "served model name; requests naming another get 404 (default: list \""+mockworker.DefaultModel+"\", accept any)")
	f.Float64Var(&speedup, "speedup", 1, "simulated seconds per wall-clock second")
	f.IntVar(&blockSize, "block-size", mockworker.DefaultBlockTokens, "prefix hashing block in tokens, the router's router.block_size (a multiple of 16)")
	f.IntVar(&kvBlocks, "kv-blocks", sim.DefaultConfig().TotalKVBlocks, "KV cache capacity in 16-token blocks")
	f.BoolVar(&noMetrics, "no-metrics", false, "answer 404 on /metrics, as SGLang started without --enable-metrics does")
	f.IntVar(&dpSize, "data-parallel-size", 1, "data-parallel ranks, each its own simulated engine with --kv-blocks blocks (vLLM's --data-parallel-size)")
	f.StringVar(&kvEndpoint, "kv-events-endpoint", "", "publish KV-cache events in vLLM's ZeroMQ format on a PUB socket at tcp://HOST:PORT (vLLM's default tcp://*:5557); rank R on PORT+R")
	f.StringVar(&kvReplay, "kv-events-replay-endpoint", "", "answer replay requests on a ROUTER socket at tcp://HOST:PORT from the last 10,000 batches; rank R on PORT+R")
	f.StringVar(&kvTopic, "kv-events-topic", "", "topic frame of every KV events message (vLLM's default is empty)")
	f.StringVar(&kvEncoding, "kv-events-encoding", "array", "KV events payload layout: array (positional events, vLLM before PR 42892) or map (events as maps with a \"type\" key, vLLM after it and SGLang)")
	f.StringVar(&tokenizerFile, "tokenizer", "", "a Hugging Face tokenizer.json: tokenize prompts, key the prefix cache by token ids, serve POST /tokenize")
	f.StringVar(&tokenizerConfig, "tokenizer-config", "", "the model's tokenizer_config.json, for its chat template and BOS/EOS tokens (with --tokenizer)")
	f.StringVar(&chatTemplate, "chat-template", "", "a Jinja chat template file, instead of the one in --tokenizer-config (with --tokenizer)")
	setWant(f, "data-parallel-size", dpSizeWant)
	setWant(f, "speedup", speedupWant)
	setWant(f, "block-size", blockSizeWant)
	setWant(f, "kv-blocks", kvBlocksWant)
	return cmd
}

// What the mock-worker's numeric flags accept, in words: the simulated
// engine's limits (sim.Config.Validate, mockworker.New).
const speedupWant = "a finite number greater than 0"

var (
	blockSizeWant = fmt.Sprintf("a positive multiple of %d, the engine's KV block", sim.DefaultConfig().BlockSize)
	kvBlocksWant  = fmt.Sprintf("a whole number from 1 to %d", math.MaxInt32)
	dpSizeWant    = fmt.Sprintf("a whole number from 1 to %d", mockworker.MaxDataParallelSize)
)

// kvEncodings are the --kv-events-encoding values.
var kvEncodings = map[string]kvevents.Encoding{"array": kvevents.EncodingArray, "map": kvevents.EncodingMap}

const kvEncodingWant = "array or map"

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

// serveMockWorker serves srv on ln until ctx is cancelled, then drains.
func serveMockWorker(ctx context.Context, cmd *cobra.Command, ln net.Listener, srv *mockworker.Server) error {
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
			fmt.Fprintln(cmd.OutOrStdout(), line)
		}
	}
	select {
	case err := <-errc:
		return &exitError{code: 1, err: err}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), mockWorkerDrain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return &exitError{code: 1, err: err}
	}
	return nil
}
