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

	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/sim"
)

// mockWorkerDrain bounds how long a stopping mock worker waits for requests
// in flight before cutting them off.
const mockWorkerDrain = 5 * time.Second

func newMockWorkerCmd() *cobra.Command {
	var (
		listen    string
		model     string
		speedup   float64
		blockSize int
		kvBlocks  int
		noMetrics bool
	)
	cmd := &cobra.Command{
		Use:   "mock-worker",
		Short: "Serve a simulated OpenAI-compatible inference engine",
		Long: `mock-worker serves an OpenAI-compatible API (POST /v1/completions,
POST /v1/chat/completions, streamed or not; GET /v1/models, /health and
/metrics with vLLM metric names, or 404 with --no-metrics) backed by one simulated engine running in
real time: the replay worker model (Llama-3.1-8B-Instruct on one H100, vLLM V1
scheduler, prefix cache). --speedup X runs simulated time X times faster than
the wall clock.

Text prompts count ceil(bytes/4) tokens (an approximation) and are hashed for
the prefix cache in blocks of --block-size tokens (4 bytes each), the router's
own routing-key hashing; chat prompts are rendered as "role: content" lines
first. Requests generate max_tokens tokens (default 16). Responses carry the
simulated cached prompt tokens and time to first token in x-mock-cached-tokens
and x-mock-ttft-seconds.

It prints "mock-worker listening on http://ADDR (model NAME)" once it accepts connections
(useful with --listen 127.0.0.1:0) and stops on SIGINT or SIGTERM, letting
requests in flight finish for up to 5s.`,
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
			cfg := sim.DefaultConfig()
			cfg.TotalKVBlocks = kvBlocks
			srv, err := mockworker.New(mockworker.Config{
				Model: model, Speedup: speedup, Sim: cfg, BlockTokens: blockSize, NoMetrics: noMetrics,
			})
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
)

// serveMockWorker serves srv on ln until ctx is cancelled, then drains.
func serveMockWorker(ctx context.Context, cmd *cobra.Command, ln net.Listener, srv *mockworker.Server) error {
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(cmd.OutOrStdout(), "mock-worker listening on http://%s (model %s)\n", ln.Addr(), srv.Model())
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
