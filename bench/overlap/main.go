// Command overlap measures how well `router serve` knows what its engines
// hold (issue #12, "Measured, not assumed"): it starts --workers `router
// mock-worker` processes that tokenize with a tokenizer.json and publish
// their KV-cache events over ZeroMQ, on a KV cache small enough to evict,
// and `router serve` with the same tokenizer and a workers file that gives
// only each worker's URL and its kv_events endpoint. It then drives
// --requests chat requests: --conversations multi-turn conversations over a
// few shared system prompts, --concurrency at once, each conversation
// sending its next turn when the previous answer ended. A --direct-share of
// the requests go straight to a random engine instead of through the
// router, as another client of the engines would: their blocks and
// evictions reach the router only through the engines' events.
//
// At the end it reads the router's switchyard_prefix_belief_total, which
// compares, for each answer, the router's belief of the chosen worker's
// cached prefix with the cached_tokens the engine reported: the precise
// belief (the worker's KV events, when its stream was live) and the
// approximate one (what the router itself sent), taken in the same run for
// the same requests. It prints both and checks the target: the
// precise belief exact for at least 99% of the requests it covers.
//
//	go run ./bench/overlap --router-bin bin/router
//
// Every process it starts is on 127.0.0.1, stopped before it exits, and
// killed by the kernel if it dies (Linux).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
)

type options struct {
	routerBin     string
	tokenizer     string
	tokenizerCfg  string
	workers       int
	requests      int
	conversations int
	concurrency   int
	kvBlocks      int
	directShare   float64
	speedup       string
	seed          uint64
	encoding      string
	source        string
	keepLog       string
}

func main() {
	var o options
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (make build)")
	flag.StringVar(&o.tokenizer, "tokenizer", "router/tokenizer/testdata/bytebpe.json", "tokenizer.json of the mock engines and the router")
	flag.StringVar(&o.tokenizerCfg, "tokenizer-config", "router/tokenizer/testdata/chatml_config.json", "its tokenizer_config.json (chat template)")
	flag.IntVar(&o.workers, "workers", 3, "mock engines")
	flag.IntVar(&o.requests, "requests", 2000, "chat requests in all")
	flag.IntVar(&o.conversations, "conversations", 200, "multi-turn conversations the requests are spread over")
	flag.IntVar(&o.concurrency, "concurrency", 8, "conversations in flight at once")
	flag.IntVar(&o.kvBlocks, "kv-blocks", 2000, "each engine's KV cache in 16-token blocks: the conversations need about ten times that, so the engines evict, but the requests in flight at once fit")
	flag.Float64Var(&o.directShare, "direct-share", 0.1, "share of the requests sent straight to a random engine, bypassing the router")
	flag.StringVar(&o.speedup, "speedup", "50", "the mock engines' simulated seconds per wall second")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the conversations")
	flag.StringVar(&o.encoding, "kv-events-encoding", "array", "the engines' KV event layout: array or map")
	flag.StringVar(&o.source, "tokenizer-source", "file", "the router's tokenizer source: file (in process) or engine (/tokenize)")
	flag.StringVar(&o.keepLog, "router-log", "", "copy the router's log (debug level: each precise belief that differs from the engine) to this file")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "overlap:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "bench-overlap-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tok, err := filepath.Abs(o.tokenizer)
	if err != nil {
		return err
	}
	tokCfg, err := filepath.Abs(o.tokenizerCfg)
	if err != nil {
		return err
	}
	var procs benchproc.Children
	defer procs.StopAll()

	listening := regexp.MustCompile(`listening on (http://\S+)`)
	var workersFile strings.Builder
	engines := make([]string, o.workers)
	for i := range engines {
		got, err := procs.StartAll(ctx, filepath.Join(dir, fmt.Sprintf("mock%d.log", i)), []*regexp.Regexp{listening, benchproc.MockKVEvents}, o.routerBin,
			"mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", o.speedup, "--engine-block-size", "16",
			"--kv-blocks", strconv.Itoa(o.kvBlocks), "--tokenizer", tok, "--tokenizer-config", tokCfg,
			"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-encoding", o.encoding)
		if err != nil {
			return err
		}
		engines[i] = got[0]
		endpoint := got[1]
		fmt.Fprintf(&workersFile, "worker \"w%d\" {\n  url = %q\n  kv_events {\n    endpoint = %q\n  }\n}\n", i, engines[i], endpoint)
	}
	tokBlock := fmt.Sprintf("tokenizer \"mock\" {\n  source = \"file\"\n  path   = %q\n  config = %q\n}\n", tok, tokCfg)
	if o.source == "engine" {
		tokBlock = "tokenizer \"mock\" {\n  source = \"engine\"\n}\n"
	}
	policy := filepath.Join(dir, "policy.hcl")
	if err := os.WriteFile(policy, []byte("router {\n  block_size = 16\n}\n\n"+tokBlock), 0o644); err != nil {
		return err
	}
	workers := filepath.Join(dir, "workers.hcl")
	if err := os.WriteFile(workers, []byte(workersFile.String()), 0o644); err != nil {
		return err
	}
	if o.keepLog != "" {
		defer func() {
			if b, err := os.ReadFile(filepath.Join(dir, "router.log")); err == nil {
				_ = os.WriteFile(o.keepLog, b, 0o644)
			}
		}()
	}
	got, err := procs.StartAll(ctx, filepath.Join(dir, "router.log"), []*regexp.Regexp{listening, benchproc.ServeProfiler}, o.routerBin,
		"serve", "--listen", "127.0.0.1:0", "--policy", policy, "--workers-file", workers, "--log-level", "debug",
		"--debug-listen", "127.0.0.1:0")
	if err != nil {
		return err
	}
	router, debugAddr := got[0], got[1]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: 2 * time.Minute}
	if err := waitReady(ctx, client, router, o); err != nil {
		out, _ := os.ReadFile(filepath.Join(dir, "router.log"))
		return fmt.Errorf("%w\nrouter log:\n%s", err, out)
	}

	start := time.Now()
	direct, failed, err := drive(ctx, client, router, engines, o)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	m, err := benchproc.Scrape(client, router)
	if err != nil {
		return err
	}
	if o.keepLog != "" {
		if resp, err := client.Get("http://" + debugAddr + "/debug/workers"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = os.WriteFile(o.keepLog+".workers.json", b, 0o644)
		}
	}
	return report(os.Stdout, o, m, direct, failed, elapsed)
}

// waitReady waits until every worker is ready with the capacity its
// engine reports.
func waitReady(ctx context.Context, c *http.Client, router string, o options) error {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := benchproc.Scrape(c, router)
		ok := err == nil
		for i := 0; i < o.workers && ok; i++ {
			w := fmt.Sprintf("w%d", i)
			ok = m[`switchyard_worker_ready{worker="`+w+`"}`] == 1 &&
				m[`switchyard_worker_capacity_blocks{rank="0",worker="`+w+`"}`] == float64(o.kvBlocks)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the workers were not ready with their engines' capacity within a minute (last error %v)", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// drive sends the requests and returns how many went straight to an
// engine and how many failed.
func drive(ctx context.Context, c *http.Client, router string, engines []string, o options) (direct, failed int64, err error) {
	systems := make([]string, 4)
	for i := range systems {
		systems[i] = fmt.Sprintf("System prompt %d. ", i) + strings.Repeat("You are a careful assistant who answers in full, plain sentences. ", 12)
	}
	perConv := max(1, (o.requests+o.conversations-1)/o.conversations)
	convs := make(chan int, o.conversations)
	for i := range o.conversations {
		convs <- i
	}
	close(convs)
	var sent atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for range o.concurrency {
		wg.Go(func() {
			for conv := range convs {
				rng := rand.New(rand.NewPCG(o.seed, uint64(conv)))
				msgs := []map[string]string{{"role": "system", "content": systems[rng.IntN(len(systems))]}}
				for turn := 0; turn < perConv && sent.Add(1) <= int64(o.requests); turn++ {
					msgs = append(msgs, map[string]string{"role": "user",
						"content": fmt.Sprintf("Conversation %d, question %d: %s", conv, turn, strings.Repeat("please go on with the story. ", 3+rng.IntN(12)))})
					body, _ := json.Marshal(map[string]any{"model": "mock", "max_tokens": 8, "messages": msgs})
					base := router
					if rng.Float64() < o.directShare {
						base = engines[rng.IntN(len(engines))]
						atomic.AddInt64(&direct, 1)
					}
					if err := benchproc.PostChat(ctx, c, base, body); err != nil {
						atomic.AddInt64(&failed, 1)
						errOnce.Do(func() { firstErr = err })
					}
					msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.Repeat("Here is more of it. ", 2+rng.IntN(6))})
				}
			}
		})
	}
	wg.Wait()
	if failed > int64(o.requests)/100 {
		return direct, failed, fmt.Errorf("%d of %d requests failed, the first: %w", failed, o.requests, firstErr)
	}
	return direct, failed, nil
}

// report prints the two beliefs against the engines' cached tokens.
func report(out io.Writer, o options, m map[string]float64, direct, failed int64, elapsed time.Duration) error {
	fmt.Fprintf(out, "%d requests (%d straight to an engine, %d failed) over %d conversations, %d at once, %d engines of %d 16-token KV blocks, %s events, in %.1f s\n",
		o.requests, direct, failed, o.conversations, o.concurrency, o.workers, o.kvBlocks, o.encoding, elapsed.Seconds())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "belief\trequests\texact\tover\tunder\texact share\t")
	shares := map[string]float64{}
	for _, mode := range []string{"precise", "approximate"} {
		get := func(r string) float64 {
			return m[`switchyard_prefix_belief_total{mode="`+mode+`",result="`+r+`"}`]
		}
		n := get("exact") + get("over") + get("under")
		if n > 0 {
			shares[mode] = get("exact") / n
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f%%\t\n", mode, n, get("exact"), get("over"), get("under"), 100*shares[mode])
	}
	_ = tw.Flush()
	prompt, cached := m[`switchyard_prompt_tokens_total{model="mock"}`], m[`switchyard_cached_prompt_tokens_total{model="mock"}`]
	var events, gaps float64
	for k, v := range m {
		switch {
		case strings.HasPrefix(k, "switchyard_worker_kv_events_total{"):
			events += v
		case strings.HasPrefix(k, "switchyard_worker_kv_event_gaps_total{"):
			gaps += v
		}
	}
	if prompt > 0 {
		fmt.Fprintf(out, "through the router: KV hit %.1f%% (%.0f of %.0f prompt tokens served from cache); KV events received %.0f, sequence gaps %.0f\n",
			100*cached/prompt, cached, prompt, events, gaps)
	}
	if shares["precise"] < 0.99 {
		fmt.Fprintf(out, "target: precise belief exact for >= 99%% of the requests it covers: MISSED (%.2f%%)\n", 100*shares["precise"])
		return errors.New("target missed")
	}
	fmt.Fprintf(out, "target: precise belief exact for >= 99%% of the requests it covers: met (%.2f%%)\n", 100*shares["precise"])
	return nil
}
