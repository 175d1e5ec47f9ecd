// Command serve is the loopback load generator of `make bench-serve`
// (issue 6): in one run it measures requests per second and p50/p99
// latency of
//
//	(a) direct to one mock worker,
//	(f) the floor of a process hop: a minimal HTTP/1.1 forwarder (no
//	    net/http server or Transport; one upstream connection per client
//	    connection, round-robin), so that (f) - (a) is the hop itself,
//	(s) net/http's server with the floor's client and (t) the floor's
//	    server with net/http's Transport (split.go): which half of
//	    net/http a hop pays for, (s) - (f) and (t) - (f),
//	(b) a bare httputil.ReverseProxy round-robin over the mock workers,
//	(x) the same bare proxy on fasthttp, its Server and one HostClient
//	    per mock worker (fastproxy.go): how close a library whose server
//	    and client keep the floor's shape gets to it, (x) - (f),
//	(c) `router serve` with a round-robin policy,
//	(d) `router serve` with the default (KV-aware) policy,
//	(i) the KV policy of (g) and (h) below, declared, without a shadow,
//	(g) the same KV policy with the template plugin's queue-depth scorer
//	    as its shadow (asked beside it on every decision it can keep up
//	    with, sampled at a stated rate otherwise, never acted on):
//	    against (i), what shadow mode costs the live path, and how many
//	    of the shadow's decisions were dropped or sampled out,
//	(h) the same with a built-in shadow (least-loaded): the cost of the
//	    mechanism without a plugin process competing for the CPUs,
//
// (i), (g) and (h) run their throughput phase at --shadow-concurrency
// clients (64, issue 29's measure), in that order, one right after the
// other; the shadow's counts are read right after the throughput phase.
// The cases are first measured closed-loop at --concurrency clients (throughput), then with one
// client (the per-request latency the proxy adds, without queueing), and
// checks the targets: (c) >= 0.9x the throughput of (b), and the
// router adds <= 100us at p50; it also splits the router's added latency
// into the hop itself ((f) - (a)) and the router over that floor
// ((c) - (f)).
//
// The requests above are chat completions. For each API of --apis
// (issue 28: POST /v1/responses and POST /v1/embeddings by default) it
// also measures the one-client phase of (a), (f) and (c) with that API's
// request (apiBody), and reports the router's added latency on it the
// same way: (c) - (a), the hop (f) - (a) and the router over the floor
// (c) - (f). An API the mock engines do not serve is reported as failed
// without stopping the rest.
//
// It starts every process it measures (three `router mock-worker`s, the
// floor forwarder and the bare proxy as copies of itself, and each
// `router serve`; all but the mocks only for their own case), all on
// 127.0.0.1 with ports picked by the kernel, and stops them before it
// exits. The child pids are also written to
// --pid-file so that the calling script can kill them if this process is
// killed first; on Linux the children also get SIGKILL when it dies.
//
//	go run ./bench/serve --router-bin bin/router
//	serve proxy --listen 127.0.0.1:0 --targets http://A,http://B   (the bare proxy)
//	serve floor --listen 127.0.0.1:0 --targets http://A,http://B   (the floor forwarder)
//	serve split-server --listen 127.0.0.1:0 --targets http://A,http://B   (case (s))
//	serve split-client --listen 127.0.0.1:0 --targets http://A,http://B   (case (t))
//	serve fastproxy --listen 127.0.0.1:0 --targets http://A,http://B   (case (x))
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

// Targets of issue 6.
const (
	targetThroughputRatio = 0.9
	targetAddedP50        = 100 * time.Microsecond
)

type options struct {
	routerBin   string
	mocks       int
	speedup     float64
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	serialDur   time.Duration
	promptBytes int
	maxTokens   int
	pidFile     string
	routerArgs  string
	jsonOut     string
	pluginBin   string
	pluginConc  int
	shadowConc  int
	apis        []string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "proxy" {
		if err := runProxy(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench-serve proxy:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "floor" {
		if err := runFloor(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench-serve floor:", err)
			os.Exit(1)
		}
		return
	}
	for name, run := range map[string]func([]string) error{"split-server": runSplitServer, "split-client": runSplitClient, "fastproxy": runFastProxy} {
		if len(os.Args) > 1 && os.Args[1] == name {
			if err := run(os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "bench-serve %s: %v\n", name, err)
				os.Exit(1)
			}
			return
		}
	}
	var o options
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (mock-worker and serve)")
	flag.IntVar(&o.mocks, "mocks", 3, "mock workers")
	flag.Float64Var(&o.speedup, "speedup", 100000, "the mock workers' --speedup")
	flag.IntVar(&o.concurrency, "concurrency", 32, "closed-loop clients of the throughput phase")
	flag.DurationVar(&o.duration, "duration", 4*time.Second, "measured time of the throughput phase, per case")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up before each phase")
	flag.DurationVar(&o.serialDur, "serial-duration", 3*time.Second, "measured time of the one-client latency phase, per case (0: skip)")
	flag.IntVar(&o.promptBytes, "prompt-bytes", 2048, "bytes of the chat prompt (identical in every request)")
	flag.IntVar(&o.maxTokens, "max-tokens", 4, "max_tokens of every request (non-streamed)")
	flag.StringVar(&o.pidFile, "pid-file", "", "append each started child's pid here (for the caller's cleanup)")
	flag.StringVar(&o.routerArgs, "router-args", "", "extra arguments for `router serve`, space-separated")
	flag.StringVar(&o.jsonOut, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.pluginBin, "plugin-bin", "bin/plugin-example", "the template plugin for case (e), an out-of-process scorer (empty: skip (e))")
	flag.IntVar(&o.pluginConc, "plugin-concurrency", 64, "closed-loop clients of case (e)'s throughput phase")
	flag.IntVar(&o.shadowConc, "shadow-concurrency", 64, "closed-loop clients of the throughput phase of cases (i), (g) and (h): shadow off and on")
	apis := flag.String("apis", "responses,embeddings", "APIs besides chat measured with one client on (a), (f) and (c), comma-separated: "+strings.Join(slices.Sorted(maps.Keys(apiPaths)), ", ")+" (empty: none)")
	flag.Parse()
	for _, a := range strings.Split(*apis, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, ok := apiPaths[a]; !ok {
			fmt.Fprintf(os.Stderr, "bench-serve: --apis: unknown API %q\n", a)
			os.Exit(2)
		}
		o.apis = append(o.apis, a)
	}
	if o.concurrency < 1 || o.mocks < 1 || o.duration <= 0 || o.promptBytes < 1 || o.maxTokens < 1 {
		fmt.Fprintln(os.Stderr, "bench-serve: bad flags")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	procs := &children{pidFile: o.pidFile}
	err := run(ctx, o, procs)
	procs.stopAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-serve:", err)
		os.Exit(1)
	}
}

// result is one case's two phases.
type result struct {
	key        string  // "a", "b", ...: what report looks the case up by
	Case       string  `json:"case"`
	RPS        float64 `json:"rps"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	Requests   int     `json:"requests"`
	SerialRPS  float64 `json:"serial_rps,omitempty"`
	SerialP50  float64 `json:"serial_p50_us,omitempty"`
	SerialP99  float64 `json:"serial_p99_us,omitempty"`
	SerialReqs int     `json:"serial_requests,omitempty"`
	// TasksPerMessage is case (e)'s mean Decide tasks per message to the
	// plugin over the warm-up and the throughput phase
	// (switchyard_plugin_decide_tasks_per_message).
	TasksPerMessage float64 `json:"tasks_per_message,omitempty"`
	// Shadow is case (g)'s and (h)'s shadow decisions by result over the
	// warm-up and the throughput phase (switchyard_shadow_decisions_total),
	// and SampleRate the shadow's sample rate at its end
	// (switchyard_shadow_sample_rate).
	Shadow     map[string]float64 `json:"shadow,omitempty"`
	SampleRate float64            `json:"sample_rate,omitempty"`
	// APIs are the one-client phases of cases (a), (f) and (c) with the
	// other APIs' requests (--apis), by API name.
	APIs map[string]apiLatency `json:"apis,omitempty"`
}

// apiLatency is one case's one-client phase on one API: requests per
// second, p50 and p99 in microseconds, requests measured; or why it
// failed.
type apiLatency struct {
	RPS      float64 `json:"serial_rps,omitempty"`
	P50us    float64 `json:"serial_p50_us,omitempty"`
	P99us    float64 `json:"serial_p99_us,omitempty"`
	Requests int     `json:"serial_requests,omitempty"`
	Err      string  `json:"error,omitempty"`
}

// apiPaths are the APIs --apis may name besides chat, by name: the path
// each request is posted to.
var apiPaths = map[string]string{
	"responses":  "/v1/responses",
	"embeddings": "/v1/embeddings",
}

// apiBody is the request of API api ("responses" or "embeddings"), the
// same prompt as requestBody's chat request: for the Responses API the
// system prompt as instructions and the user text as input, at most
// maxTokens output tokens, not streamed (OpenAI's Responses reference,
// https://platform.openai.com/docs/api-reference/responses/create); for
// embeddings the two texts as a batch of two inputs, floats
// (https://platform.openai.com/docs/api-reference/embeddings/create).
func apiBody(api string, promptBytes, maxTokens int) []byte {
	sys, user := promptTexts(promptBytes)
	var v map[string]any
	switch api {
	case "responses":
		v = map[string]any{"model": "mock", "instructions": sys, "input": user, "max_output_tokens": maxTokens, "stream": false}
	case "embeddings":
		v = map[string]any{"model": "mock", "input": []string{sys, user}, "encoding_format": "float"}
	default:
		panic("apiBody: unknown API " + api)
	}
	b, _ := json.Marshal(v)
	return b
}

// shadowCounts reads the router's /metrics and returns
// switchyard_shadow_decisions_total summed by its result label, and
// switchyard_shadow_sample_rate.
func shadowCounts(ctx context.Context, base string) (map[string]float64, float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	rate := -1.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "switchyard_shadow_sample_rate "); ok {
			if _, err := fmt.Sscan(v, &rate); err != nil {
				return nil, 0, fmt.Errorf("switchyard_shadow_sample_rate: %w", err)
			}
			continue
		}
		if !strings.HasPrefix(line, "switchyard_shadow_decisions_total{") {
			continue
		}
		m := resultLabel.FindStringSubmatch(line)
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil && m != nil {
			out[m[1]] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	if len(out) == 0 || rate < 0 {
		return nil, 0, errors.New("no switchyard_shadow_decisions_total or switchyard_shadow_sample_rate in /metrics")
	}
	return out, rate, nil
}

var resultLabel = regexp.MustCompile(`result="([a-z_]+)"`)

// tasksPerMessage reads the router's /metrics and returns the mean of
// switchyard_plugin_decide_tasks_per_message (sum / count over plugins).
func tasksPerMessage(ctx context.Context, base string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum, count float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var v float64
		switch {
		case strings.HasPrefix(line, "switchyard_plugin_decide_tasks_per_message_sum"):
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		case strings.HasPrefix(line, "switchyard_plugin_decide_tasks_per_message_count"):
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				count += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if count == 0 {
		return 0, errors.New("no switchyard_plugin_decide_tasks_per_message samples in /metrics")
	}
	return sum / count, nil
}

func run(ctx context.Context, o options, procs *children) error {
	work, err := os.MkdirTemp("", "bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	self, err := os.Executable()
	if err != nil {
		return err
	}

	var mocks []string
	for i := range o.mocks {
		addr, err := procs.start(ctx, filepath.Join(work, fmt.Sprintf("mock%d.log", i+1)), mockRe, o.routerBin,
			"mock-worker", "--listen", "127.0.0.1:0", "--model", "mock",
			"--speedup", fmt.Sprint(o.speedup), "--engine-block-size", "16")
		if err != nil {
			return fmt.Errorf("mock worker %d: %w", i+1, err)
		}
		mocks = append(mocks, "http://"+addr)
	}
	rrPolicy := filepath.Join(work, "rr.hcl")
	kvPolicy := filepath.Join(work, "kv.hcl")
	if err := os.WriteFile(rrPolicy, []byte(policyFile(mocks, true)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(kvPolicy, []byte(policyFile(mocks, false)), 0o644); err != nil {
		return err
	}
	body := requestBody(o.promptBytes, o.maxTokens)

	fmt.Printf("bench-serve: %d mock workers (--speedup %v) at %s\n", o.mocks, o.speedup, strings.Join(mocks, " "))
	fmt.Printf("  chat request: %d bytes body (%d-byte prompt), max_tokens %d, not streamed, identical\n", len(body), o.promptBytes, o.maxTokens)
	for _, a := range o.apis {
		fmt.Printf("  %s request (POST %s): %d bytes body, one client on (a), (f) and (c)\n", a, apiPaths[a], len(apiBody(a, o.promptBytes, o.maxTokens)))
	}
	fmt.Printf("  throughput: %d keep-alive clients, %v warm-up + %v per case; latency: 1 client, %v warm-up + %v per case\n",
		o.concurrency, o.warmup, o.duration, o.warmup/2, o.serialDur)
	fmt.Printf("  GOMAXPROCS %d, NumCPU %d; every process on 127.0.0.1\n\n", runtime.GOMAXPROCS(0), runtime.NumCPU())

	type kase struct {
		key   string
		name  string
		setup func() (url string, stop func(), err error)
	}
	serveArgs := func(policy string) []string {
		a := []string{"serve", "--policy", policy, "--listen", "127.0.0.1:0", "--log-level", "warn"}
		if o.routerArgs != "" {
			a = append(a, strings.Fields(o.routerArgs)...)
		}
		return a
	}
	cases := []kase{
		{"a", "(a) direct, mock 1", func() (string, func(), error) { return mocks[0], func() {}, nil }},
		{"f", "(f) floor: minimal HTTP/1.1 forwarder", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "floor.log"), floorRe, self,
				"floor", "--listen", "127.0.0.1:0", "--targets", strings.Join(mocks, ","))
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, nil
		}},
		{"s", "(s) net/http server, floor's client", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "split-server.log"), splitServerRe, self,
				"split-server", "--listen", "127.0.0.1:0", "--targets", strings.Join(mocks, ","))
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, nil
		}},
		{"t", "(t) floor's server, net/http Transport", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "split-client.log"), splitClientRe, self,
				"split-client", "--listen", "127.0.0.1:0", "--targets", strings.Join(mocks, ","))
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, nil
		}},
		{"b", "(b) bare ReverseProxy, round-robin", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "proxy.log"), proxyRe, self,
				"proxy", "--listen", "127.0.0.1:0", "--targets", strings.Join(mocks, ","))
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, nil
		}},
		{"x", "(x) bare fasthttp proxy, round-robin", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "fastproxy.log"), fastProxyRe, self,
				"fastproxy", "--listen", "127.0.0.1:0", "--targets", strings.Join(mocks, ","))
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, nil
		}},
		{"c", "(c) router serve, round-robin", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "router-rr.log"), routerRe, o.routerBin, serveArgs(rrPolicy)...)
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, waitReady(ctx, "http://"+addr)
		}},
		{"d", "(d) router serve, default KV policy", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "router-kv.log"), routerRe, o.routerBin, serveArgs(kvPolicy)...)
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, waitReady(ctx, "http://"+addr)
		}},
	}
	if o.pluginBin != "" {
		pluginBin, err := filepath.Abs(o.pluginBin)
		if err != nil {
			return err
		}
		plPolicy := filepath.Join(work, "plugin.hcl")
		if err := os.WriteFile(plPolicy, []byte(pluginPolicyFile(mocks, pluginBin)), 0o644); err != nil {
			return err
		}
		// (i), (g) and (h) one right after the other, so they see the
		// same machine.
		offPolicy := filepath.Join(work, "shadow-off.hcl")
		if err := os.WriteFile(offPolicy, []byte(strings.Replace(shadowPolicyFile(mocks, "", `picker "pick" {
    type = "least-loaded"
  }`), "  shadow = \"trial\"\n", "", 1)), 0o644); err != nil {
			return err
		}
		// (i) runs again after (h) as (j): the shadows are compared with
		// the mean of the two, so a drift of the machine (or of the mock
		// engines' state) over the three cases does not read as the
		// shadow's cost.
		shadowOff := func(log string) func() (string, func(), error) {
			return func() (string, func(), error) {
				addr, err := procs.start(ctx, filepath.Join(work, log), routerRe, o.routerBin, serveArgs(offPolicy)...)
				if err != nil {
					return "", nil, err
				}
				return "http://" + addr, func() { procs.stopLast() }, waitReady(ctx, "http://"+addr)
			}
		}
		cases = append(cases, kase{"i", "(i) router serve, KV, shadow off", shadowOff("router-shadow-off.log")})
		for _, sh := range []struct{ key, name, plugin, trial string }{
			{"g", "(g) router serve, KV + plugin shadow", pluginBin, `scorer "depth" {
    type = "queue-depth"
  }
  picker "pick" {
    type = "min-cost"
  }`},
			{"h", "(h) router serve, KV + built-in shadow", "", `picker "pick" {
    type = "least-loaded"
  }`},
		} {
			policy := filepath.Join(work, "shadow-"+sh.key+".hcl")
			if err := os.WriteFile(policy, []byte(shadowPolicyFile(mocks, sh.plugin, sh.trial)), 0o644); err != nil {
				return err
			}
			cases = append(cases, kase{sh.key, sh.name, func() (string, func(), error) {
				addr, err := procs.start(ctx, filepath.Join(work, "router-shadow-"+sh.key+".log"), routerRe, o.routerBin, serveArgs(policy)...)
				if err != nil {
					return "", nil, err
				}
				return "http://" + addr, func() { procs.stopLast() }, waitReady(ctx, "http://"+addr)
			}})
		}
		cases = append(cases, kase{"j", "(j) router serve, KV, shadow off again", shadowOff("router-shadow-off-2.log")})
		cases = append(cases, kase{"e", "(e) router serve, out-of-process scorer", func() (string, func(), error) {
			addr, err := procs.start(ctx, filepath.Join(work, "router-plugin.log"), routerRe, o.routerBin, serveArgs(plPolicy)...)
			if err != nil {
				return "", nil, err
			}
			return "http://" + addr, func() { procs.stopLast() }, waitReady(ctx, "http://"+addr)
		}})
	}

	var results []result
	for _, c := range cases {
		base, stopCase, err := c.setup()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		target := base + "/v1/chat/completions"
		r := result{key: c.key, Case: c.name}
		conc := o.concurrency
		switch c.key {
		case "e":
			conc = o.pluginConc
		case "i", "g", "h", "j":
			conc = o.shadowConc
		}
		lat, n, elapsed, err := load(ctx, target, body, conc, o.warmup, o.duration)
		if err != nil {
			stopCase()
			return fmt.Errorf("%s: %w", c.name, err)
		}
		r.Requests, r.RPS = n, float64(n)/elapsed.Seconds()
		r.P50us, r.P99us = pct(lat, 0.50), pct(lat, 0.99)
		if c.key == "g" || c.key == "h" {
			// The shadow's counts under load: read before the one-client
			// phase adds its decisions.
			if r.Shadow, r.SampleRate, err = shadowCounts(ctx, base); err != nil {
				stopCase()
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		if c.key == "e" {
			// The batching of the throughput phase alone: read before the
			// one-client phase adds its one-task messages.
			r.TasksPerMessage, err = tasksPerMessage(ctx, base)
			if err != nil {
				stopCase()
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		if o.serialDur > 0 {
			lat, n, elapsed, err := load(ctx, target, body, 1, o.warmup/2, o.serialDur)
			if err != nil {
				stopCase()
				return fmt.Errorf("%s, one client: %w", c.name, err)
			}
			r.SerialReqs, r.SerialRPS = n, float64(n)/elapsed.Seconds()
			r.SerialP50, r.SerialP99 = pct(lat, 0.50), pct(lat, 0.99)
		}
		if o.serialDur > 0 && (c.key == "a" || c.key == "f" || c.key == "c") {
			for _, api := range o.apis {
				al := apiLatency{}
				lat, n, elapsed, err := load(ctx, base+apiPaths[api], apiBody(api, o.promptBytes, o.maxTokens), 1, o.warmup/2, o.serialDur)
				if err != nil {
					if ctx.Err() != nil {
						stopCase()
						return ctx.Err()
					}
					al.Err = err.Error()
				} else {
					al.Requests, al.RPS = n, float64(n)/elapsed.Seconds()
					al.P50us, al.P99us = pct(lat, 0.50), pct(lat, 0.99)
				}
				if r.APIs == nil {
					r.APIs = map[string]apiLatency{}
				}
				r.APIs[api] = al
			}
		}
		stopCase()
		results = append(results, r)
		fmt.Printf("  done: %-38s %8.0f req/s  p50 %7.0f us  p99 %7.0f us  | 1 client: p50 %5.0f us  p99 %5.0f us\n",
			c.name, r.RPS, r.P50us, r.P99us, r.SerialP50, r.SerialP99)
		for _, api := range o.apis {
			if al, ok := r.APIs[api]; ok && al.Err == "" {
				fmt.Printf("        %-38s %8s          %7s       %7s      | 1 client: p50 %5.0f us  p99 %5.0f us\n", api, "", "", "", al.P50us, al.P99us)
			} else if ok {
				fmt.Printf("        %-38s failed: %s\n", api, al.Err)
			}
		}
	}
	report(os.Stdout, o, results)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// report prints the tables and the verdicts. It finds the cases it
// compares by their key ("a" direct, "b" bare proxy, "c" router
// round-robin, "f" floor; "s", "t", "x" and "d" for the one-client line
// over the floor), not by their position in rs; a line whose cases are
// missing is left out.
func report(w io.Writer, o options, rs []result) {
	get := func(key string) (result, bool) {
		for _, r := range rs {
			if r.key == key {
				return r, true
			}
		}
		return result{}, false
	}
	a, haveA := get("a")
	b, haveB := get("b")
	c, haveC := get("c")
	f, haveF := get("f")
	fmt.Fprintf(w, "\nthroughput phase: %d concurrent clients, (e) %d, (i) (g) (h) %d (added = case - (a))\n", o.concurrency, o.pluginConc, o.shadowConc)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\treq/s\tvs (b)\tp50 us\tp99 us\tadded p50 us\tadded p99 us\t")
	for _, r := range rs {
		vsB, added := "-", "-\t-"
		if haveB {
			vsB = fmt.Sprintf("%.2fx", r.RPS/b.RPS)
		}
		if haveA {
			added = fmt.Sprintf("%+.0f\t%+.0f", r.P50us-a.P50us, r.P99us-a.P99us)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.0f\t%s\t\n", r.Case, r.RPS, vsB, r.P50us, r.P99us, added)
	}
	tw.Flush()
	if o.serialDur > 0 {
		fmt.Fprintf(w, "\nlatency phase: 1 client, no queueing (added = case - (a))\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "case\treq/s\tp50 us\tp99 us\tadded p50 us\tadded p99 us\t")
		for _, r := range rs {
			added := "-\t-"
			if haveA {
				added = fmt.Sprintf("%+.0f\t%+.0f", r.SerialP50-a.SerialP50, r.SerialP99-a.SerialP99)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t\n", r.Case, r.SerialRPS, r.SerialP50, r.SerialP99, added)
		}
		tw.Flush()
	}
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	fmt.Fprintln(w)
	if haveB && haveC {
		ratio := c.RPS / b.RPS
		fmt.Fprintf(w, "target (c) throughput >= %.1fx (b): %.0f / %.0f = %.2fx  %s\n", targetThroughputRatio, c.RPS, b.RPS, ratio, verdict(ratio >= targetThroughputRatio))
	}
	if o.serialDur > 0 && haveA && haveC {
		added := time.Duration((c.SerialP50 - a.SerialP50) * 1e3)
		fmt.Fprintf(w, "target router adds <= %v at p50 (1 client, (c) - (a)): %.0f us  %s\n", targetAddedP50, c.SerialP50-a.SerialP50, verdict(added <= targetAddedP50))
		if haveB {
			addedBare := c.SerialP50 - b.SerialP50
			fmt.Fprintf(w, "  (router over the bare proxy at p50, 1 client, (c) - (b): %+.0f us)\n", addedBare)
		}
	}
	if e, ok := get("e"); ok {
		fmt.Fprintf(w, "(e) out-of-process scorer: %d clients %.0f decisions/s, 1 client %.0f decisions/s = %.2fx  %s (target >= 3x)\n",
			o.pluginConc, e.RPS, e.SerialRPS, e.RPS/e.SerialRPS, verdict(e.SerialRPS > 0 && e.RPS >= 3*e.SerialRPS))
		fmt.Fprintf(w, "  Decide tasks per message under %d clients: mean %.2f  %s (target > 1.5)\n",
			o.pluginConc, e.TasksPerMessage, verdict(e.TasksPerMessage > 1.5))
	}
	if off, ok := get("i"); ok {
		offName := "(i)"
		if again, ok := get("j"); ok {
			// The mean of the runs before and after the shadows.
			off.RPS, off.P50us, off.P99us = (off.RPS+again.RPS)/2, (off.P50us+again.P50us)/2, (off.P99us+again.P99us)/2
			off.SerialP50, off.SerialP99 = (off.SerialP50+again.SerialP50)/2, (off.SerialP99+again.SerialP99)/2
			offName = "the mean of (i) and (j)"
		}
		for _, key := range []string{"g", "h"} {
			g, ok := get(key)
			if !ok {
				continue
			}
			ratio := g.RPS / off.RPS
			fmt.Fprintf(w, "shadow on vs off ((%s) vs %s): %d clients %.0f vs %.0f req/s (%.2fx), p50 %+.0f us, p99 %+.0f us",
				key, offName, o.shadowConc, g.RPS, off.RPS, ratio, g.P50us-off.P50us, g.P99us-off.P99us)
			if o.serialDur > 0 {
				fmt.Fprintf(w, "; 1 client p50 %+.0f us, p99 %+.0f us", g.SerialP50-off.SerialP50, g.SerialP99-off.SerialP99)
			}
			var sum float64
			for _, v := range g.Shadow {
				sum += v
			}
			pct := func(v float64) float64 {
				if sum == 0 {
					return 0
				}
				return 100 * v / sum
			}
			fmt.Fprintf(w, "  %s (target >= 0.95x)\n", verdict(ratio >= 0.95))
			fmt.Fprintf(w, "  (%s)'s shadow decisions at %d clients (warm-up + throughput phase): %.0f agree, %.0f disagree, %.0f failed, %.0f none, %.0f sampled out (%.1f%%), %.0f dropped (%.2f%%) of %.0f; sample rate at the end %.4g  %s (target: no drop)\n",
				key, o.shadowConc, g.Shadow["agree"], g.Shadow["disagree"], g.Shadow["failed"], g.Shadow["none"],
				g.Shadow["sampled_out"], pct(g.Shadow["sampled_out"]), g.Shadow["dropped"], pct(g.Shadow["dropped"]), sum, g.SampleRate,
				verdict(g.Shadow["dropped"] == 0))
		}
	}
	if haveA && haveC {
		added32 := time.Duration((c.P50us - a.P50us) * 1e3)
		fmt.Fprintf(w, "router adds <= %v at p50 under %d clients ((c) - (a), queueing included): %.0f us  %s\n", targetAddedP50, o.concurrency, c.P50us-a.P50us, verdict(added32 <= targetAddedP50))
	}
	if o.serialDur > 0 && haveA && haveC && haveF {
		fmt.Fprintf(w, "  (the hop itself, 1 client, (f) - (a): %+.0f us; router over the floor, (c) - (f): %+.0f us)\n", f.SerialP50-a.SerialP50, c.SerialP50-f.SerialP50)
	}
	if o.serialDur > 0 && haveF {
		// Which part of a hop each front end pays for: net/http's server
		// (s), its Transport (t), both (b), fasthttp's server and client
		// (x), the router (c), (d).
		var over []string
		for _, key := range []string{"s", "t", "b", "x", "c", "d"} {
			if r, ok := get(key); ok {
				over = append(over, fmt.Sprintf("(%s) %+.0f", key, r.SerialP50-f.SerialP50))
			}
		}
		if len(over) > 0 {
			fmt.Fprintf(w, "over the floor, 1 client p50 (case - (f)), us: %s\n", strings.Join(over, ", "))
		}
	}
	reportAPIs(w, o, a, f, c, haveA && haveF && haveC)
}

// reportAPIs prints, for each API of --apis besides chat, the one-client
// phase of (a), (f) and (c) and the router's added latency on it: (c) -
// (a) against the 100us target of chat, the hop (f) - (a), and the router
// over the floor (c) - (f), at p50 and p99.
func reportAPIs(w io.Writer, o options, a, f, c result, have bool) {
	if o.serialDur <= 0 || len(o.apis) == 0 || !have {
		return
	}
	fmt.Fprintf(w, "\nother APIs, 1 client, no queueing (added = case - (a))\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "API\tcase\treq/s\tp50 us\tp99 us\tadded p50 us\tadded p99 us\t")
	for _, api := range o.apis {
		for _, r := range []result{a, f, c} {
			al := r.APIs[api]
			if al.Err != "" {
				fmt.Fprintf(tw, "%s\t%s\tfailed\t-\t-\t-\t-\t\n", api, r.Case)
				continue
			}
			added := "-\t-"
			if ad := a.APIs[api]; ad.Err == "" {
				added = fmt.Sprintf("%+.0f\t%+.0f", al.P50us-ad.P50us, al.P99us-ad.P99us)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t\n", api, r.Case, al.RPS, al.P50us, al.P99us, added)
		}
	}
	tw.Flush()
	for _, api := range o.apis {
		aa, fa, ca := a.APIs[api], f.APIs[api], c.APIs[api]
		if aa.Err != "" || fa.Err != "" || ca.Err != "" {
			fmt.Fprintf(w, "%s: not measured: (a) %s, (f) %s, (c) %s\n", api, orOK(aa.Err), orOK(fa.Err), orOK(ca.Err))
			continue
		}
		verdict := "PASS"
		if time.Duration((ca.P50us-aa.P50us)*1e3) > targetAddedP50 {
			verdict = "MISS"
		}
		fmt.Fprintf(w, "%s: router adds <= %v at p50 (1 client, (c) - (a)): %.0f us  %s; p99 %+.0f us\n", api, targetAddedP50, ca.P50us-aa.P50us, verdict, ca.P99us-aa.P99us)
		fmt.Fprintf(w, "  (the hop itself, (f) - (a): %+.0f us; router over the floor, (c) - (f): %+.0f us at p50, %+.0f us at p99)\n",
			fa.P50us-aa.P50us, ca.P50us-fa.P50us, ca.P99us-fa.P99us)
	}
}

// load runs conc closed-loop clients against url for warm+dur and returns
// the latencies of the requests started after the warm-up and finished
// within dur, how many, and the measured window.
func load(ctx context.Context, url string, body []byte, conc int, warm, dur time.Duration) ([]time.Duration, int, time.Duration, error) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conc * 2,
		MaxIdleConnsPerHost: conc * 2,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+dur)
	lctx, cancel := context.WithDeadline(ctx, until.Add(5*time.Second))
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		failures atomic.Int64
		firstErr atomic.Value
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<16)
			for lctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(until) {
					break
				}
				req, _ := http.NewRequestWithContext(lctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				t1 := time.Now()
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					if failures.Load() > 100 {
						break
					}
					continue
				}
				if !t0.Before(from) && !t1.After(until) {
					lat = append(lat, t1.Sub(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, 0, 0, ctx.Err()
	}
	if f := failures.Load(); f > 0 {
		return nil, 0, 0, fmt.Errorf("%d failed requests, first: %v", f, firstErr.Load())
	}
	if len(all) == 0 {
		return nil, 0, 0, errors.New("no request completed in the measured window")
	}
	slices.Sort(all)
	return all, len(all), dur, nil
}

// pct is the q-quantile of sorted latencies, in microseconds.
func pct(sorted []time.Duration, q float64) float64 {
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i]) / 1e3
}

// requestBody is the chat request every client sends: a system prompt
// and a user message of promptBytes bytes together.
func requestBody(promptBytes, maxTokens int) []byte {
	sys, user := promptTexts(promptBytes)
	b, _ := json.Marshal(map[string]any{
		"model":      "mock",
		"max_tokens": maxTokens,
		"stream":     false,
		"messages": []map[string]string{
			{"role": "system", "content": sys},
			{"role": "user", "content": user},
		},
	})
	return b
}

// orOK is err, or "ok" when it is empty.
func orOK(err string) string {
	if err == "" {
		return "ok"
	}
	return err
}

// promptTexts are the system prompt and the user text of promptBytes
// bytes together that every request carries.
func promptTexts(promptBytes int) (sys, user string) {
	sys = strings.Repeat("You are a helpful assistant. ", 20)
	if len(sys) > promptBytes/2 {
		sys = sys[:promptBytes/2]
	}
	userLen := promptBytes - len(sys)
	user = strings.Repeat("Summarise the switchyard benchmark notes, please. ", userLen/50+1)[:userLen]
	return sys, user
}

// policyFile is a router policy with one worker block per mock: the
// round-robin policy, or no policy block (the built-in default, kv-cost +
// min-cost).
func policyFile(mocks []string, roundRobin bool) string {
	return policyFileWith(mocks, roundRobin, "")
}

// pluginPolicyFile is case (e)'s policy: the template plugin's
// queue-depth scorer (out of process) and the in-process min-cost picker.
func pluginPolicyFile(mocks []string, pluginBin string) string {
	return policyFileWith(mocks, false, fmt.Sprintf(`plugin "example" {
  command = %q
}

policy "queue" {
  scorer "depth" {
    type = "queue-depth"
  }
  picker "pick" {
    type = "min-cost"
  }
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "queue"
}

`, pluginBin))
}

// shadowPolicyFile is the policy of cases (g) and (h): the default
// policy's components (case (d)) deciding, with a policy of the trial
// components as its shadow; the template plugin is declared when
// pluginBin is not empty.
func shadowPolicyFile(mocks []string, pluginBin, trial string) string {
	plugin := ""
	if pluginBin != "" {
		plugin = fmt.Sprintf("plugin \"example\" {\n  command = %q\n}\n\n", pluginBin)
	}
	return policyFileWith(mocks, false, plugin+fmt.Sprintf(`policy "live" {
  scorer "cost" {
    type = "kv-cost"
  }
  picker "pick" {
    type = "min-cost"
  }
  shadow = "trial"
}

policy "trial" {
  %s
}

worker_selection {
  aggregated = "live"
}

`, trial))
}

func policyFileWith(mocks []string, roundRobin bool, extra string) string {
	var b strings.Builder
	b.WriteString("router {\n  block_size = 16\n}\n\n")
	b.WriteString(extra)
	if roundRobin {
		b.WriteString("policy \"rr\" {\n  picker \"rr\" {\n    type = \"round-robin\"\n  }\n}\n\nworker_selection {\n  aggregated = \"rr\"\n}\n\n")
	}
	for i, m := range mocks {
		fmt.Fprintf(&b, "worker \"w%d\" {\n  url             = %q\n  models          = [\"mock\"]\n  total_kv_blocks = 27500\n}\n", i+1, m)
	}
	return b.String()
}

// waitReady polls /readyz until 200 (the router has seen its workers).
func waitReady(ctx context.Context, base string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("router not ready after 10s")
}

var (
	mockRe   = regexp.MustCompile(`mock-worker listening on http://(\S+)`)
	routerRe = regexp.MustCompile(`router serve listening on http://(\S+)`)
	proxyRe  = regexp.MustCompile(`proxy listening on http://(\S+)`)
	floorRe  = regexp.MustCompile(`floor listening on http://(\S+)`)
	// splitServerRe and splitClientRe read the split cases' addresses.
	splitServerRe = regexp.MustCompile(`split-server listening on http://(\S+)`)
	splitClientRe = regexp.MustCompile(`split-client listening on http://(\S+)`)
	// fastProxyRe reads case (x)'s address.
	fastProxyRe = regexp.MustCompile(`fastproxy listening on http://(\S+)`)
)

// children are the processes the bench started, stopped in reverse order.
type children struct {
	pidFile string
	list    []*child
}

type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// start runs bin args with stdout and stderr to logPath and waits (10s at
// most) for the line matching re, returning its first group (the address).
func (cs *children) start(ctx context.Context, logPath string, re *regexp.Regexp, bin string, args ...string) (string, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer lf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = pw, lf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return "", err
	}
	pw.Close()
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	cs.list = append(cs.list, c)
	if cs.pidFile != "" {
		if f, err := os.OpenFile(cs.pidFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, cmd.Process.Pid)
			f.Close()
		}
	}
	addrC := make(chan string, 1)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			if !sent {
				if m := re.FindStringSubmatch(sc.Text()); m != nil {
					addrC <- m[1]
					sent = true
				}
			}
		}
		if !sent {
			close(addrC)
		}
	}()
	go func() { _ = cmd.Wait(); close(c.done) }()
	select {
	case addr, ok := <-addrC:
		if !ok {
			out, _ := os.ReadFile(logPath)
			return "", fmt.Errorf("%s exited before listening: %s", filepath.Base(bin), out)
		}
		return addr, nil
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("%s did not listen within 10s", filepath.Base(bin))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// stop sends SIGTERM, then SIGKILL after 3s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(3 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (cs *children) stopLast() {
	if n := len(cs.list); n > 0 {
		cs.list[n-1].stop()
		cs.list = cs.list[:n-1]
	}
}

func (cs *children) stopAll() {
	for len(cs.list) > 0 {
		cs.stopLast()
	}
}

// forwarderFlags parses the flags of the proxy and floor subcommands:
// --listen ADDR and --targets URL,URL,...
func forwarderFlags(name string, args []string) (listen *string, ups []*url.URL, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	listen = fs.String("listen", "127.0.0.1:0", "address")
	targets := fs.String("targets", "", "comma-separated base URLs")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	for _, t := range strings.Split(*targets, ",") {
		u, err := url.Parse(t)
		if err != nil || u.Host == "" {
			return nil, nil, fmt.Errorf("bad target %q", t)
		}
		ups = append(ups, u)
	}
	if len(ups) == 0 {
		return nil, nil, errors.New("no --targets")
	}
	return listen, ups, nil
}

// runProxy is case (b): a bare httputil.ReverseProxy over the targets in
// turn, with the router's engine transport settings (pooled keep-alive,
// 256 idle per host, no compression).
func runProxy(args []string) error {
	listen, ups, err := forwarderFlags("proxy", args)
	if err != nil {
		return err
	}
	var next atomic.Uint64
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(ups[(next.Add(1)-1)%uint64(len(ups))])
		},
		Transport: engineTransport(),
		ErrorLog:  nil,
	}
	return serveHTTP("proxy", *listen, rp)
}

// engineTransport is an http.Transport with the router's engine
// transport settings (pooled keep-alive, 256 idle per host, no
// compression): the client of cases (b) and (t).
func engineTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// serveHTTP serves h with net/http's server on listen, printing "NAME
// listening on http://ADDR" once bound, until SIGINT or SIGTERM: the
// server of cases (b) and (s).
func serveHTTP(name, listen string, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	return serveUntilSignal(name, listen, hs.Serve, hs.Shutdown)
}
