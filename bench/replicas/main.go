// Command replicas measures what router replicas sharing over NATS keep of
// a single router's cache affinity (issue #17 §4): it runs the same
// multi-turn conversation workload three times on fresh mock engines:
//
//   - single: one `router serve`;
//   - sync: --replicas `router serve` processes with a cluster block, one
//     NATS server with JetStream (in this process, from the nats-server
//     module);
//   - no-sync: the same replicas without the cluster block.
//
// The requests go to the routers in turn, one after the other (a
// round-robin load balancer in front), so every conversation's turns are
// spread over the replicas. Each run reads the routers' answers' usage
// (switchyard_prompt_tokens_total, switchyard_cached_prompt_tokens_total)
// and prints the KV hit ratio: the share of prompt tokens the engines
// served from their prefix cache. The target: with sync, at least 95% of
// the single router's hit ratio.
//
//	go run ./bench/replicas --router-bin bin/router
//
// --nats-restart adds a fourth run, sync with NATS shut down after a third
// of the requests and started again (empty, on the same port) after two
// thirds: it prints the hit ratio of each third and the requests that
// failed (issue #17 §4: routing continues on local state, sync resumes by
// itself).
//
// The policy is the default KV-aware one, routing on what the routers
// sent (no KV events: the case where replicas know only what they share);
// --kv-events adds the engines' KV events. Every process is on 127.0.0.1
// and stopped before the command exits.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
	"github.com/switchyard-router/switchyard/internal/portowner"
)

type options struct {
	routerBin     string
	tokenizer     string
	tokenizerCfg  string
	replicas      int
	workers       int
	requests      int
	conversations int
	concurrency   int
	speedup       string
	seed          uint64
	kvEvents      bool
	natsURL       string
	ports         []int
	lb            string
	failover      bool
	warmup        time.Duration
	window        time.Duration
	natsRestart   bool
}

func main() {
	var o options
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (make build)")
	flag.StringVar(&o.tokenizer, "tokenizer", "router/tokenizer/testdata/bytebpe.json", "tokenizer.json of the mock engines and the routers")
	flag.StringVar(&o.tokenizerCfg, "tokenizer-config", "router/tokenizer/testdata/chatml_config.json", "its tokenizer_config.json (chat template)")
	flag.IntVar(&o.replicas, "replicas", 3, "router replicas in the sync and no-sync runs")
	flag.IntVar(&o.workers, "workers", 3, "mock engines")
	flag.IntVar(&o.requests, "requests", 1500, "chat requests per run")
	flag.IntVar(&o.conversations, "conversations", 150, "multi-turn conversations the requests are spread over")
	flag.IntVar(&o.concurrency, "concurrency", 8, "conversations in flight at once")
	flag.StringVar(&o.speedup, "speedup", "50", "the mock engines' simulated seconds per wall second")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the conversations")
	flag.BoolVar(&o.kvEvents, "kv-events", false, "give the routers the engines' KV events (precise prefix knowledge) too")
	flag.StringVar(&o.natsURL, "nats", "", "an external NATS server with JetStream (default: one in this process)")
	ports := flag.String("ports", "", "the replicas' ports, comma-separated, one per replica (default: any free port)")
	flag.StringVar(&o.lb, "lb", "", "a load balancer in front of the replicas on --ports (e.g. http://127.0.0.1:18080): the sync and no-sync runs send every request there instead of to the routers in turn")
	flag.BoolVar(&o.failover, "failover", false, "run the failover scenario instead (failover.go): SIGKILL replica r0 under load, restart it")
	flag.DurationVar(&o.warmup, "warmup", 20*time.Second, "--failover: load before the first window")
	flag.DurationVar(&o.window, "window", time.Minute, "--failover: each window the hit ratio is measured over")
	flag.BoolVar(&o.natsRestart, "nats-restart", false, "add a sync run in which the NATS server (in this process) is shut down after a third of the requests and started again after two thirds")
	flag.Parse()
	if o.natsRestart && o.natsURL != "" {
		fmt.Fprintln(os.Stderr, "replicas: --nats-restart restarts the NATS server of this process: not with --nats")
		os.Exit(2)
	}
	if *ports != "" {
		for _, f := range strings.Split(*ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 65535 {
				fmt.Fprintf(os.Stderr, "replicas: --ports %q: want port numbers separated by commas\n", *ports)
				os.Exit(2)
			}
			o.ports = append(o.ports, n)
		}
		if len(o.ports) != o.replicas {
			fmt.Fprintf(os.Stderr, "replicas: --ports gives %d ports for %d replicas\n", len(o.ports), o.replicas)
			os.Exit(2)
		}
	}
	if o.lb != "" && o.ports == nil {
		fmt.Fprintln(os.Stderr, "replicas: --lb needs --ports, the addresses the load balancer sends to")
		os.Exit(2)
	}
	if o.replicas < 2 || o.workers < 1 || o.requests < 1 || o.conversations < 1 || o.concurrency < 1 {
		fmt.Fprintln(os.Stderr, "replicas: want --replicas >= 2 and positive --workers, --requests, --conversations, --concurrency")
		os.Exit(2)
	}
	for _, f := range []*string{&o.tokenizer, &o.tokenizerCfg} {
		abs, err := filepath.Abs(*f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "replicas:", err)
			os.Exit(2)
		}
		*f = abs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "replicas:", err)
		os.Exit(1)
	}
}

// result is one run's figures.
type result struct {
	name           string
	routers        int
	prompt, cached float64
	failed         int64
	elapsed        time.Duration
	lagP50, lagP99 float64 // ms, from the routers' histograms; sync only
	// thirds are the hit ratios of each third of the requests (the
	// NATS restart run only).
	thirds []float64
}

func (r result) hit() float64 {
	if r.prompt == 0 {
		return 0
	}
	return r.cached / r.prompt
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "bench-replicas-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	natsURL := o.natsURL
	var nats *natsServer
	if natsURL == "" {
		if nats, err = startNATS(filepath.Join(dir, "nats")); err != nil {
			return err
		}
		defer nats.stop()
		natsURL = nats.url()
	}

	if o.failover {
		return failover(ctx, o, natsURL)
	}
	var results []result
	for i, mode := range []struct {
		name    string
		routers int
		sync    bool
	}{{"single", 1, false}, {"sync", o.replicas, true}, {"no-sync", o.replicas, false}} {
		r, err := once(ctx, o, filepath.Join(dir, mode.name), mode.routers, mode.sync, natsURL, fmt.Sprintf("run%d", i), nil)
		if err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
		r.name = mode.name
		results = append(results, r)
	}
	if o.natsRestart {
		r, err := restartRun(ctx, o, filepath.Join(dir, "restart"), nats)
		if err != nil {
			return fmt.Errorf("NATS restart: %w", err)
		}
		results = append(results, r)
	}
	return report(os.Stdout, o, results)
}

// natsServer is the NATS server of this process, restartable on its port.
type natsServer struct {
	dir  string
	port int // server.RANDOM_PORT until the first start bound one
	s    *server.Server
	runs int
}

// startNATS starts the server on a port the kernel picks (its bind is
// the reservation: no other process can hold it meanwhile).
func startNATS(dir string) (*natsServer, error) {
	n := &natsServer{dir: dir, port: server.RANDOM_PORT}
	return n, n.start()
}

// start starts a new, empty server on the port. A restart needs the same
// port (the routers' cluster blocks name it); when another process took
// it meanwhile, the error names that process.
func (n *natsServer) start() error {
	n.runs++
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: n.port, JetStream: true, JetStreamMaxMemory: 1 << 30,
		StoreDir: filepath.Join(n.dir, strconv.Itoa(n.runs)), NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		if n.port > 0 {
			return fmt.Errorf("the NATS server did not start on port %d (held by %s)", n.port, portowner.Of(n.port))
		}
		return errors.New("the NATS server did not start")
	}
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		s.Shutdown()
		return fmt.Errorf("the NATS server listens on %v, not a TCP address", s.Addr())
	}
	n.s, n.port = s, addr.Port
	return nil
}

func (n *natsServer) stop() {
	if n.s != nil {
		n.s.Shutdown()
		n.s.WaitForShutdown()
		n.s = nil
	}
}

func (n *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// restartRun is the sync run with NATS shut down after a third of the
// requests and started again after two thirds; it records each third's
// hit ratio. Requests that fail are counted, not fatal.
func restartRun(ctx context.Context, o options, dir string, nats *natsServer) (result, error) {
	var mu sync.Mutex
	var marks [][2]float64 // prompt, cached at each third
	var hookErr error
	third := int64(o.requests / 3)
	hook := func(c *http.Client, bases []string, done int64) {
		if done != third && done != 2*third {
			return
		}
		var prompt, cached float64
		for _, b := range bases {
			m, err := benchproc.Scrape(c, b)
			if err != nil {
				mu.Lock()
				hookErr = err
				mu.Unlock()
			}
			prompt += m[`switchyard_prompt_tokens_total{model="mock"}`]
			cached += m[`switchyard_cached_prompt_tokens_total{model="mock"}`]
		}
		mu.Lock()
		defer mu.Unlock()
		marks = append(marks, [2]float64{prompt, cached})
		if done == third {
			nats.stop()
		} else if err := nats.start(); err != nil {
			hookErr = err
		}
	}
	r, err := once(ctx, o, dir, o.replicas, true, nats.url(), "restart", hook)
	if err != nil {
		return r, err
	}
	if hookErr != nil {
		return r, hookErr
	}
	if len(marks) != 2 {
		return r, fmt.Errorf("the run passed %d of its 2 marks", len(marks))
	}
	r.name = "sync, NATS restarted"
	prev := [2]float64{}
	for _, m := range append(marks, [2]float64{r.prompt, r.cached}) {
		r.thirds = append(r.thirds, (m[1]-prev[1])/max(m[0]-prev[0], 1))
		prev = m
	}
	return r, nil
}

// once runs the workload on fresh engines and routers. hook, when set, is
// called after each request with the number done (each number once), and
// then the requests that fail are counted instead of failing the run.
func once(ctx context.Context, o options, dir string, routers int, sync bool, natsURL, cluster string, hook func(c *http.Client, bases []string, done int64)) (result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return result{}, err
	}
	var procs benchproc.Children
	defer procs.StopAll()
	blocks, err := startWorkers(ctx, o, dir, &procs)
	if err != nil {
		return result{}, err
	}
	bases := make([]string, routers)
	for i := range bases {
		clusterBlock := ""
		if sync {
			clusterBlock = fmt.Sprintf("\ncluster {\n  nats    = %q\n  replica = \"r%d\"\n  name    = %q\n}\n", natsURL, i, cluster)
		}
		listen := "127.0.0.1:0"
		if o.ports != nil {
			listen = "127.0.0.1:" + strconv.Itoa(o.ports[i])
		}
		if bases[i], err = startRouter(ctx, o, dir, i, blocks+clusterBlock, listen, &procs); err != nil {
			return result{}, err
		}
	}
	targets := bases
	if o.lb != "" && routers > 1 {
		targets = []string{strings.TrimSuffix(o.lb, "/")}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: 2 * time.Minute}
	if err := waitReady(ctx, client, bases, o.workers, sync); err != nil {
		return result{}, err
	}
	if len(targets) == 1 && routers > 1 {
		// The load balancer's health checks find the replicas up.
		time.Sleep(time.Second)
	}
	start := time.Now()
	var after func(int64)
	if hook != nil {
		after = func(done int64) { hook(client, bases, done) }
	}
	failed, err := drive(ctx, client, targets, o, after)
	if err != nil && hook == nil {
		return result{}, err
	}
	r := result{routers: routers, failed: failed, elapsed: time.Since(start)}
	var lag []float64 // cumulative bucket counts, summed over the routers
	var bounds []float64
	for _, b := range bases {
		m, err := benchproc.Scrape(client, b)
		if err != nil {
			return result{}, err
		}
		r.prompt += m[`switchyard_prompt_tokens_total{model="mock"}`]
		r.cached += m[`switchyard_cached_prompt_tokens_total{model="mock"}`]
		bounds, lag = addBuckets(m, bounds, lag)
	}
	r.lagP50, r.lagP99 = quantile(bounds, lag, 0.5), quantile(bounds, lag, 0.99)
	return r, nil
}

// listening matches the line `router serve` and `router mock-worker`
// print once they accept connections.
var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startWorkers starts o.workers mock engines (with KV events when
// o.kvEvents) and returns their worker blocks for a policy file.
func startWorkers(ctx context.Context, o options, dir string, procs *benchproc.Children) (string, error) {
	var blocks strings.Builder
	for i := range o.workers {
		args := []string{"mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", o.speedup, "--engine-block-size", "16",
			"--tokenizer", o.tokenizer, "--tokenizer-config", o.tokenizerCfg}
		res := []*regexp.Regexp{listening}
		if o.kvEvents {
			args = append(args, "--kv-events-endpoint", "tcp://127.0.0.1:0")
			res = append(res, benchproc.MockKVEvents)
		}
		got, err := procs.StartAll(ctx, filepath.Join(dir, fmt.Sprintf("mock%d.log", i)), res, o.routerBin, args...)
		if err != nil {
			return "", err
		}
		url, endpoint := got[0], ""
		if o.kvEvents {
			endpoint = got[1]
		}
		fmt.Fprintf(&blocks, "worker \"w%d\" {\n  url = %q\n", i, url)
		if endpoint != "" {
			fmt.Fprintf(&blocks, "  kv_events {\n    endpoint = %q\n  }\n", endpoint)
		}
		blocks.WriteString("}\n")
	}
	return blocks.String(), nil
}

// startRouter writes router i's policy file (the tokenizer, then rest:
// worker blocks and a cluster block) and starts `router serve` on listen,
// returning its base URL.
func startRouter(ctx context.Context, o options, dir string, i int, rest, listen string, procs *benchproc.Children) (string, error) {
	policy := fmt.Sprintf("router {\n  block_size = 16\n}\n\ntokenizer \"mock\" {\n  source = \"file\"\n  path   = %q\n  config = %q\n}\n\n%s", o.tokenizer, o.tokenizerCfg, rest)
	path := filepath.Join(dir, fmt.Sprintf("policy%d.hcl", i))
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		return "", err
	}
	return procs.Start(ctx, filepath.Join(dir, fmt.Sprintf("router%d.log", i)), listening, o.routerBin,
		"serve", "--listen", listen, "--policy", path)
}

// waitReady waits until every router has every worker ready and, with
// sync, hears the other replicas.
func waitReady(ctx context.Context, c *http.Client, bases []string, workers int, sync bool) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ok := true
		for _, b := range bases {
			m, err := benchproc.Scrape(c, b)
			ok = ok && err == nil
			for i := 0; i < workers && ok; i++ {
				ok = m[`switchyard_worker_ready{worker="w`+strconv.Itoa(i)+`"}`] == 1
			}
			if sync && ok {
				ok = m["switchyard_cluster_peers"] == float64(len(bases)-1)
			}
		}
		if ok {
			// The replicas' consumers start with their hello: give the
			// last one's a moment.
			time.Sleep(500 * time.Millisecond)
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the routers were not ready (every worker, every peer) within a minute")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// drive sends the requests, each to the next router in turn, and returns
// how many failed (and an error saying so). after, when set, is called
// after each request with the number done so far.
func drive(ctx context.Context, c *http.Client, bases []string, o options, after func(done int64)) (int64, error) {
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
	var sent, next, failed, done atomic.Int64
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
					base := bases[(next.Add(1)-1)%int64(len(bases))]
					if err := benchproc.PostChat(ctx, c, base, body); err != nil {
						failed.Add(1)
						errOnce.Do(func() { firstErr = err })
					}
					if n := done.Add(1); after != nil {
						after(n)
					}
					msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.Repeat("Here is more of it. ", 2+rng.IntN(6))})
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		return failed.Load(), fmt.Errorf("%d of %d requests failed, the first: %w", failed.Load(), o.requests, firstErr)
	}
	return 0, nil
}

// addBuckets adds the cumulative buckets of the sync lag histogram in m
// to counts (bounds ascending, in seconds).
func addBuckets(m map[string]float64, bounds, counts []float64) ([]float64, []float64) {
	const prefix = `switchyard_cluster_sync_lag_seconds_bucket{le="`
	type bk struct{ le, n float64 }
	var bs []bk
	for k, v := range m {
		if s, ok := strings.CutPrefix(k, prefix); ok {
			le, err := strconv.ParseFloat(strings.TrimSuffix(s, `"}`), 64)
			if err == nil {
				bs = append(bs, bk{le, v})
			}
		}
	}
	if len(bs) == 0 {
		return bounds, counts
	}
	for i := range bs {
		for j := i + 1; j < len(bs); j++ {
			if bs[j].le < bs[i].le {
				bs[i], bs[j] = bs[j], bs[i]
			}
		}
	}
	if bounds == nil {
		bounds, counts = make([]float64, len(bs)), make([]float64, len(bs))
		for i, b := range bs {
			bounds[i] = b.le
		}
	}
	for i, b := range bs {
		counts[i] += b.n
	}
	return bounds, counts
}

// quantile returns the upper bound, in ms, of the bucket holding the q
// quantile; 0 without samples.
func quantile(bounds, counts []float64, q float64) float64 {
	if len(counts) == 0 || counts[len(counts)-1] == 0 {
		return 0
	}
	want := q * counts[len(counts)-1]
	for i, n := range counts {
		if n >= want {
			return 1000 * bounds[i]
		}
	}
	return 1000 * bounds[len(bounds)-1]
}

// report prints each run's KV hit ratio against the single router's and
// checks the target.
func report(out io.Writer, o options, rs []result) error {
	mode := "no KV events (each router knows what was sent)"
	if o.kvEvents {
		mode = "with the engines' KV events"
	}
	sent := "requests sent to the routers in turn"
	if o.lb != "" {
		sent = "the replicas' requests sent to the load balancer " + o.lb
	}
	fmt.Fprintf(out, "%d requests per run over %d conversations, %d at once, %d engines, %s; %s\n",
		o.requests, o.conversations, o.concurrency, o.workers, mode, sent)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\trouters\tKV hit\tof single\tsync lag p50 <=\tp99 <=\tfailed\twall\t")
	single := rs[0].hit()
	for _, r := range rs {
		lag := "-\t-"
		if r.lagP50 > 0 {
			lag = fmt.Sprintf("%.1f ms\t%.1f ms", r.lagP50, r.lagP99)
		}
		of := 0.0
		if single > 0 {
			of = 100 * r.hit() / single
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%s\t%d\t%.1f s\t\n", r.name, r.routers, 100*r.hit(), of, lag, r.failed, r.elapsed.Seconds())
	}
	_ = tw.Flush()
	for _, r := range rs {
		if len(r.thirds) == 3 {
			fmt.Fprintf(out, "%s: KV hit %.1f%% before, %.1f%% while NATS was down, %.1f%% after it returned; %d requests failed\n",
				r.name, 100*r.thirds[0], 100*r.thirds[1], 100*r.thirds[2], r.failed)
		}
	}
	for _, r := range rs {
		if r.failed > 0 {
			fmt.Fprintf(out, "target: every request answered: MISSED (%s: %d failed)\n", r.name, r.failed)
			return errors.New("target missed")
		}
	}
	if single == 0 || rs[1].hit() < 0.95*single {
		fmt.Fprintf(out, "target: with sync, KV hit >= 95%% of the single router's: MISSED\n")
		return errors.New("target missed")
	}
	fmt.Fprintf(out, "target: with sync, KV hit >= 95%% of the single router's: met\n")
	return nil
}
