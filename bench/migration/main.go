// Command migration measures what request migration (issue #32) costs:
// the extra latency a client sees when its stream is cut mid-answer and
// continued on another engine, and the router's memory per migratable
// stream in flight. It starts three `router mock-worker` engines and
// `router serve` (round robin, --debug-listen) on loopback, then:
//
//   - reset, close: --trials streamed requests (half chat, half
//     completions, --concurrency at once), each cut after 40 of its 80
//     tokens by the mock's per-request fault (X-Mock-Fault: reset@40, a
//     TCP RST; close@40, a clean close without [DONE], the eof cause);
//     the continuation's 40 tokens are not cut (an answer of no more than
//     N tokens is not). For each: the client's gap from token 40 to
//     token 41, and every other inter-token gap of the same streams, p50
//     and p90; the mock cuts when token 41 is due, so the gap across the
//     cut holds one normal step, and the migration's extra latency is
//     the difference. The time to the first token is printed beside it:
//     a continuation is a new request of the prompt and the 40 tokens.
//
//   - kill: rounds of --kill-streams streams; once all are under way the
//     engine "a" carrying a third of them is SIGKILLed, then restarted on
//     its port. For each stream a carried: the time from the kill to its
//     next token at the client.
//
//   - memory: --mem-streams streams held in flight (slow engines) until
//     each has --mem-tokens tokens; then switchyard_migration_kept_bytes
//     and the router's live heap after a GC (HeapAlloc of
//     /debug/pprof/heap?debug=1&gc=1), against the lower of the heaps
//     before and after; with migration on and with --migration-limit 0.
//
//     make build && go run ./bench/migration --router-bin bin/router
//
// Every stream is checked whole (every token once, one [DONE]); a stream
// that is not is counted and printed. The processes' logs are kept in a
// temporary directory, named at the end. Every process is on 127.0.0.1
// and stopped before the command exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
)

type options struct {
	routerBin                  string
	trials, concurrency        int
	kills, killStreams         int
	memStreams, memTokens      int
	only                       string
	speedup                    string
	faultAfter, faultMaxTokens int
}

func main() {
	var o options
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (make build)")
	flag.IntVar(&o.trials, "trials", 200, "cut streams per fault kind (reset, close)")
	flag.IntVar(&o.concurrency, "concurrency", 6, "streams at once in the reset and close runs")
	flag.IntVar(&o.kills, "kills", 25, "kill -9 rounds")
	flag.IntVar(&o.killStreams, "kill-streams", 24, "streams in flight at each kill (a third on the killed engine)")
	flag.IntVar(&o.memStreams, "mem-streams", 120, "streams in flight for the memory measurement")
	flag.IntVar(&o.memTokens, "mem-tokens", 200, "tokens each stream has when memory is measured")
	flag.StringVar(&o.speedup, "speedup", "1", "the engines' --speedup in the reset and close parts (the continuation's prefill is simulated: at 1 it costs what the mock's model says; far above 1 what is left is the router's and loopback's)")
	flag.StringVar(&o.only, "only", "", "one part: reset, close, kill or memory (default: all)")
	flag.Parse()
	o.faultAfter, o.faultMaxTokens = 40, 80
	abs, err := filepath.Abs(o.routerBin)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "migration: %v (run make build first)\n", err)
		os.Exit(2)
	}
	o.routerBin = abs
	dir, err := os.MkdirTemp("", "switchyard-migration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "migration:", err)
		os.Exit(1)
	}
	ok := run(o, dir)
	fmt.Printf("logs: %s\n", dir)
	if !ok {
		os.Exit(1)
	}
}

func run(o options, dir string) bool {
	ok := true
	part := func(name string, f func() error) {
		if o.only != "" && o.only != name {
			return
		}
		if err := f(); err != nil {
			fmt.Printf("%s: FAILED: %v\n", name, err)
			ok = false
		}
	}
	for _, kind := range []string{"reset", "close"} {
		part(kind, func() error { return faultRun(o, dir, kind) })
	}
	part("kill", func() error { return killRun(o, dir) })
	part("memory", func() error { return memoryRun(o, dir) })
	return ok
}

var (
	workerRe = regexp.MustCompile(`mock-worker listening on http://(\S+)`)
	routerRe = regexp.MustCompile(`router serve listening on http://(\S+)`)
)

// env is one fleet: three engines and the router.
type env struct {
	dir     string
	procs   *benchproc.Children
	workers []string // engine addresses, a b c
	speed   string
	router  string
	debug   string
	client  *http.Client
	o       options
}

// start starts three engines at speedup speed and the router with extra
// flags.
func start(ctx context.Context, o options, dir, name, speed string, extra ...string) (*env, error) {
	e := &env{dir: filepath.Join(dir, name), procs: &benchproc.Children{}, speed: speed, o: o,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return e, err
	}
	for i := range 3 {
		addr, err := e.startWorker(ctx, i, "127.0.0.1:0")
		if err != nil {
			return e, err
		}
		e.workers = append(e.workers, addr)
	}
	var b strings.Builder
	b.WriteString("router {\n  block_size = 16\n}\n\npolicy \"rr\" {\n  picker \"pick\" {\n    type = \"round-robin\"\n  }\n}\n\nworker_selection {\n  aggregated = \"rr\"\n}\n")
	for i, w := range e.workers {
		fmt.Fprintf(&b, "worker %q {\n  url    = \"http://%s\"\n  models = [\"mock\"]\n}\n", string(rune('a'+i)), w)
	}
	policy := filepath.Join(e.dir, "policy.hcl")
	if err := os.WriteFile(policy, []byte(b.String()), 0o644); err != nil {
		return e, err
	}
	args := append([]string{"serve", "--policy", policy, "--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0",
		"--drain-timeout", "10s", "--request-timeout", "2m"}, extra...)
	got, err := e.procs.StartAll(ctx, filepath.Join(e.dir, "router.log"), []*regexp.Regexp{routerRe, benchproc.ServeProfiler}, o.routerBin, args...)
	if err != nil {
		return e, err
	}
	e.router, e.debug = "http://"+got[0], got[1]
	return e, e.waitReady(ctx, []string{"a", "b", "c"})
}

func (e *env) startWorker(ctx context.Context, i int, listen string) (string, error) {
	return e.procs.Start(ctx, filepath.Join(e.dir, fmt.Sprintf("worker%d-%d.log", i, time.Now().UnixNano())), workerRe, e.o.routerBin,
		"mock-worker", "--listen", listen, "--model", "mock", "--speedup", e.speed, "--engine-block-size", "16")
}

// waitReady waits (a minute at most) for switchyard_worker_ready of
// every worker in names to be 1.
func (e *env) waitReady(ctx context.Context, names []string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := benchproc.Scrape(e.client, e.router)
		if err == nil {
			n := 0
			for _, w := range names {
				if m[`switchyard_worker_ready{worker="`+w+`"}`] == 1 {
					n++
				}
			}
			if n == len(names) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workers %v not ready within a minute (%v)", names, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// request is the body of stream i: chat for even i, completions for odd.
func request(i, maxTokens int) (path, body string) {
	if i%2 == 0 {
		return "/v1/chat/completions", fmt.Sprintf(`{"model":"mock","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":"Stream %d, tell me a story."}]}`, maxTokens, i)
	}
	return "/v1/completions", fmt.Sprintf(`{"model":"mock","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"prompt":"Stream %d asks for a story"}`, maxTokens, i)
}

// streamed is one stream as the client read it.
type streamed struct {
	worker string
	sent   time.Time   // the request was sent
	times  []time.Time // arrival of each text chunk
	done   int
	usage  int // the usage chunk's completion_tokens
	errs   []string
}

// whole reports what is wrong with s as an answer of n tokens.
func (s streamed) whole(n int) error {
	if len(s.times) != n || s.done != 1 || s.usage != n || len(s.errs) > 0 {
		return fmt.Errorf("%d tokens (usage %d), %d [DONE], errors %q: want %d tokens, one [DONE]", len(s.times), s.usage, s.done, s.errs, n)
	}
	return nil
}

// stream sends one streamed request and reads it to its end; tick, when
// set, is called after each text chunk with the count so far.
func (e *env) stream(ctx context.Context, path, body, fault string, tick func(int)) (streamed, error) {
	var s streamed
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.router+path, strings.NewReader(body))
	if err != nil {
		return s, err
	}
	req.Header.Set("Content-Type", "application/json")
	if fault != "" {
		req.Header.Set("X-Mock-Fault", fault)
	}
	s.sent = time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	s.worker = resp.Header.Get("X-Switchyard-Worker")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return s, fmt.Errorf("%s: %s", resp.Status, b)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			now := time.Now()
			if d == "[DONE]" {
				s.done++
			} else {
				var c struct {
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
					Usage *struct {
						Completion int `json:"completion_tokens"`
					} `json:"usage"`
					Error json.RawMessage `json:"error"`
				}
				switch json.Unmarshal([]byte(d), &c) {
				case nil:
					if len(c.Error) > 0 {
						s.errs = append(s.errs, d)
					}
					if c.Usage != nil {
						s.usage = c.Usage.Completion
					}
					if len(c.Choices) > 0 && c.Choices[0].Text+c.Choices[0].Delta.Content != "" {
						s.times = append(s.times, now)
						if tick != nil {
							tick(len(s.times))
						}
					}
				default:
					s.errs = append(s.errs, d)
				}
			}
		}
		if err == io.EOF {
			return s, nil
		}
		if err != nil {
			return s, err
		}
	}
}

// dist is p50 and p90 of a sample, in milliseconds.
func dist(d []time.Duration) string {
	if len(d) == 0 {
		return "n=0"
	}
	slices.Sort(d)
	q := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))]) / 1e6 }
	return fmt.Sprintf("p50 %.1f ms, p90 %.1f ms, max %.1f ms (n=%d)", q(0.5), q(0.9), float64(d[len(d)-1])/1e6, len(d))
}

// faultRun: o.trials streams cut by the per-request fault kind@40.
func faultRun(o options, dir, kind string) error {
	ctx := context.Background()
	e, err := start(ctx, o, dir, kind, o.speedup)
	defer e.procs.StopAll()
	if err != nil {
		return err
	}
	before, _ := benchproc.Scrape(e.client, e.router)
	var (
		mu         sync.Mutex
		cutGaps    []time.Duration
		normalGaps []time.Duration
		ttfts      []time.Duration
		bad        []string
		next       atomic.Int64
		wg         sync.WaitGroup
	)
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= o.trials {
					return
				}
				path, body := request(i, o.faultMaxTokens)
				s, err := e.stream(ctx, path, body, fmt.Sprintf("%s@%d", kind, o.faultAfter), nil)
				if err == nil {
					err = s.whole(o.faultMaxTokens)
				}
				mu.Lock()
				if err != nil {
					bad = append(bad, fmt.Sprintf("stream %d: %v", i, err))
				} else {
					ttfts = append(ttfts, s.times[0].Sub(s.sent))
					for j := 1; j < len(s.times); j++ {
						g := s.times[j].Sub(s.times[j-1])
						if j == o.faultAfter {
							cutGaps = append(cutGaps, g)
						} else {
							normalGaps = append(normalGaps, g)
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after, err := benchproc.Scrape(e.client, e.router)
	if err != nil {
		return err
	}
	cause := map[string]string{"reset": "reset", "close": "eof"}[kind]
	series := `switchyard_migrations_total{cause="` + cause + `",outcome="migrated"}`
	gapN := after["switchyard_migration_gap_seconds_count"] - before["switchyard_migration_gap_seconds_count"]
	gapS := after["switchyard_migration_gap_seconds_sum"] - before["switchyard_migration_gap_seconds_sum"]
	fmt.Printf("%s@%d, %d streams of %d tokens, %d at once, engines at speedup %s:\n", kind, o.faultAfter, o.trials, o.faultMaxTokens, o.concurrency, o.speedup)
	fmt.Printf("  migrated (%s): %.0f; router's gap (cut to the continuation's first event sent): mean %.1f ms over %.0f\n",
		series, after[series]-before[series], 1000*gapS/max(gapN, 1), gapN)
	fmt.Printf("  client, token %d -> %d (across the cut): %s\n", o.faultAfter, o.faultAfter+1, dist(cutGaps))
	fmt.Printf("  client, every other inter-token gap:   %s\n", dist(normalGaps))
	fmt.Printf("  client, time to the first token:       %s\n", dist(ttfts))
	if len(bad) > 0 {
		return fmt.Errorf("%d streams not whole: %s", len(bad), strings.Join(bad[:min(3, len(bad))], "; "))
	}
	return nil
}

// killRun: o.kills rounds of o.killStreams streams, engine a SIGKILLed
// under them and restarted on its port.
func killRun(o options, dir string) error {
	ctx := context.Background()
	e, err := start(ctx, o, dir, "kill", "1")
	defer e.procs.StopAll()
	if err != nil {
		return err
	}
	const maxTokens = 300
	var afterKill, normalGaps []time.Duration
	var bad []string
	migrated := 0
	for round := range o.kills {
		streams := make([]streamed, o.killStreams)
		errs := make([]error, o.killStreams)
		reached := make(chan struct{}, o.killStreams)
		var wg sync.WaitGroup
		for i := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var once sync.Once
				sig := func() { once.Do(func() { reached <- struct{}{} }) }
				defer sig()
				path, body := request(round*o.killStreams+i, maxTokens)
				streams[i], errs[i] = e.stream(ctx, path, body, "", func(n int) {
					if n >= 10 {
						sig()
					}
				})
			}()
		}
		for range streams {
			<-reached
		}
		victim := e.workers[0]
		if err := e.procs.Kill(victim); err != nil {
			return err
		}
		killed := time.Now()
		wg.Wait()
		for i, s := range streams {
			err := errs[i]
			if err == nil {
				err = s.whole(maxTokens)
			}
			if err != nil {
				bad = append(bad, fmt.Sprintf("round %d stream %d: %v", round, i, err))
				continue
			}
			for j := 1; j < len(s.times); j++ {
				if s.worker == "a" && s.times[j-1].Before(killed) && !s.times[j].Before(killed) {
					afterKill = append(afterKill, s.times[j].Sub(killed))
					migrated++
					continue
				}
				normalGaps = append(normalGaps, s.times[j].Sub(s.times[j-1]))
			}
		}
		if _, err := e.startWorker(ctx, 0, victim); err != nil {
			return err
		}
		if err := e.waitReady(ctx, []string{"a", "b", "c"}); err != nil {
			return err
		}
	}
	m, err := benchproc.Scrape(e.client, e.router)
	if err != nil {
		return err
	}
	fmt.Printf("kill -9 of engine a, %d rounds of %d streams of %d tokens, engines at speedup 1:\n", o.kills, o.killStreams, maxTokens)
	fmt.Printf("  migrated: reset %.0f, eof %.0f; router's gap: mean %.1f ms over %.0f\n",
		m[`switchyard_migrations_total{cause="reset",outcome="migrated"}`], m[`switchyard_migrations_total{cause="eof",outcome="migrated"}`],
		1000*m["switchyard_migration_gap_seconds_sum"]/max(m["switchyard_migration_gap_seconds_count"], 1), m["switchyard_migration_gap_seconds_count"])
	fmt.Printf("  client, kill -> next token of a's streams: %s\n", dist(afterKill))
	fmt.Printf("  client, every other inter-token gap:      %s\n", dist(normalGaps))
	if len(bad) > 0 {
		return fmt.Errorf("%d streams not whole: %s", len(bad), strings.Join(bad[:min(3, len(bad))], "; "))
	}
	return nil
}

var heapRe = regexp.MustCompile(`# HeapAlloc = (\d+)`)

// heap returns the router's live heap after a GC.
func (e *env) heap(ctx context.Context) (int64, error) {
	return benchproc.DebugNumber(ctx, e.client, e.debug, "/debug/pprof/heap?debug=1&gc=1", 256<<20, heapRe)
}

// memoryRun measures the router's memory per stream in flight, with
// migration on and off.
func memoryRun(o options, dir string) error {
	for _, limit := range []string{"3", "0"} {
		if err := memoryOnce(o, dir, limit); err != nil {
			return err
		}
	}
	return nil
}

func memoryOnce(o options, dir, limit string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := start(ctx, o, dir, "memory-"+limit, "0.25", "--migration-limit", limit)
	defer e.procs.StopAll()
	if err != nil {
		return err
	}
	// Warm the router (its pools, the connections) with one round.
	if err := e.hold(ctx, o.memStreams, 5, nil); err != nil {
		return err
	}
	idle, err := e.heap(ctx)
	if err != nil {
		return err
	}
	var kept float64
	var held int64
	err = e.hold(ctx, o.memStreams, o.memTokens, func() error {
		m, err := benchproc.Scrape(e.client, e.router)
		if err != nil {
			return err
		}
		kept = m["switchyard_migration_kept_bytes"]
		held, err = e.heap(ctx)
		return err
	})
	if err != nil {
		return err
	}
	after, err := e.heap(ctx)
	if err != nil {
		return err
	}
	n := float64(o.memStreams)
	fmt.Printf("memory, --migration-limit %s, %d streams in flight at %d+ tokens each (chat and completions):\n", limit, o.memStreams, o.memTokens)
	fmt.Printf("  switchyard_migration_kept_bytes %.0f: %.0f bytes a stream\n", kept, kept/n)
	// The lower of the heaps before and after is the baseline: the one
	// before may still hold the warm-up's connections.
	base := min(idle, after)
	fmt.Printf("  router live heap: before %d, in flight %d, after %d: %.0f bytes a stream\n", idle, held, after, float64(held-base)/n)
	return nil
}

// hold starts n streams of long answers, waits until each has tokens
// text chunks, runs at (when set), and ends them (the client leaves).
func (e *env) hold(ctx context.Context, n, tokens int, at func() error) error {
	ctx, cancel := context.WithCancel(ctx)
	reached := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			path, body := request(i, 4000)
			_, _ = e.stream(ctx, path, body, "", func(k int) {
				if k >= tokens {
					once.Do(func() { reached <- struct{}{} })
				}
			})
		}()
	}
	var err error
	for range n {
		select {
		case <-reached:
		case <-time.After(2 * time.Minute):
			err = fmt.Errorf("the streams did not reach %d tokens in 2 minutes", tokens)
		}
		if err != nil {
			break
		}
	}
	if err == nil && at != nil {
		err = at()
	}
	cancel()
	wg.Wait()
	// Let the router see the clients leave.
	time.Sleep(500 * time.Millisecond)
	return err
}
