// Command chaos runs the fault matrix of `router serve` against real
// processes: for each scenario it starts three mock engines, an
// out-of-process plugin policy (the template plugin's queue-depth scorer,
// falling back to least-loaded) and `router serve` on loopback, drives
// chat requests at it from concurrent clients (half streamed), injects
// one fault, and checks what the clients got and what the router holds
// afterwards:
//
//   - worker-kill: an engine SIGKILLed under load, then started again on
//     its port. Only non-streamed requests in flight on it may fail (a
//     stream migrates); every request sent a second after the kill
//     succeeds.
//   - worker-stop: an engine SIGSTOPped for 5 s, then continued: nothing
//     fails.
//   - plugin-kill: the plugin SIGKILLed twice under load: nothing fails
//     (the fallback answers while it restarts).
//   - plugin-stop: the plugin SIGSTOPped for 5 s: nothing fails.
//   - reload: SIGHUP ten times under load, the policy file rewritten
//     between: nothing fails.
//   - worker-move: an engine moved to a new port four times (a workers-file
//     edit, the old engine stopped after): nothing fails, and no socket to
//     a departed port stays open.
//   - disconnect: clients that leave mid-stream and while queued beside
//     the load: nothing else fails, and nothing stays booked or queued.
//   - body-hold: from another client address, connections that declare
//     a body and send one byte of it, as many as the router takes (of 32
//     MiB, then smaller, to fill its body budget), held open while the load
//     runs: nothing of the load fails.
//   - sigterm: SIGTERM under keep-alive load: every request written gets
//     its whole answer (a refused connection before anything is written is
//     fine: the router stopped accepting); the router exits 0 and leaves
//     no plugin process.
//
// After every scenario but sigterm the router must return to rest: no
// request booked on any worker (/debug/workers), no request queued, its
// open descriptors other than the upstream pool's within a few of their
// count before the fault, the upstream pool's idle connections within
// its designed bound (upstream.DefaultMaxIdlePerHost per engine address
// in use; sockets to departed addresses: none), and its goroutines back
// near their count before.
//
//	make build && go run ./bench/chaos --router-bin bin/router --runs 3
//
// It prints one line per scenario and run and exits 1 if any failed. The
// processes' logs are kept in a temporary directory, named at the end
// (removed with --clean). Every process is on 127.0.0.1 and stopped
// before the command exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
	"github.com/switchyard-router/switchyard/router/upstream"
)

type options struct {
	routerBin string
	pluginBin string
	runs      int
	clients   int
	only      []string
	clean     bool
}

func main() {
	var o options
	var only string
	flag.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary (make build)")
	flag.StringVar(&o.pluginBin, "plugin-bin", "bin/plugin-example", "the template plugin binary (make build)")
	flag.IntVar(&o.runs, "runs", 1, "times to run the whole matrix, each on fresh processes")
	flag.IntVar(&o.clients, "clients", 16, "concurrent clients of the load")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run (default: all)")
	flag.BoolVar(&o.clean, "clean", false, "remove the logs' directory at the end, even after a failure")
	flag.Parse()
	if only != "" {
		o.only = strings.Split(only, ",")
		for _, n := range o.only {
			if !slices.ContainsFunc(scenarios, func(s scenario) bool { return s.name == n }) {
				fmt.Fprintf(os.Stderr, "chaos: unknown scenario %q (have %s)\n", n, names())
				os.Exit(2)
			}
		}
	}
	for _, p := range []*string{&o.routerBin, &o.pluginBin} {
		abs, err := filepath.Abs(*p)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v (run make build first)\n", err)
			os.Exit(2)
		}
		*p = abs
	}
	if o.runs < 1 || o.clients < 1 {
		fmt.Fprintln(os.Stderr, "chaos: --runs and --clients must be at least 1")
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "switchyard-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	ok := run(o, dir)
	if o.clean {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Printf("logs: %s\n", dir)
	}
	if !ok {
		os.Exit(1)
	}
}

func names() string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// run runs the matrix o.runs times and prints a line per scenario and run;
// false when one failed.
func run(o options, dir string) bool {
	const format = "%-3v  %-11v  %-7v  %8v  %6v  %7v  %-9v  %-8v  %-10v  %v\n"
	fmt.Printf(format, "run", "scenario", "verdict", "requests", "failed", "allowed", "fds other", "fds pool", "goroutines", "note")
	allOK := true
	for r := 1; r <= o.runs; r++ {
		for _, sc := range scenarios {
			if o.only != nil && !slices.Contains(o.only, sc.name) {
				continue
			}
			sdir := filepath.Join(dir, fmt.Sprintf("run%d-%s", r, sc.name))
			res := runScenario(o, sdir, sc)
			verdict := "ok"
			if res.problem != "" {
				verdict, allOK = "FAILED", false
			}
			note := res.note
			if res.problem != "" {
				note = res.problem + "; " + note
			}
			fmt.Printf(format, r, sc.name, verdict, res.requests, res.failed, res.allowed,
				res.fdsOther, res.fdsPool, res.goroutines, strings.TrimSuffix(note, "; "))
		}
	}
	return allOK
}

// scenario is one fault and what the clients may see of it.
type scenario struct {
	name string
	// keepAlive: the load's clients reuse connections and send short
	// requests with a short think time between (sigterm), four times as
	// many clients as the other scenarios'.
	keepAlive bool
	// act injects the fault while the load runs, from its start; the load
	// runs until act returns (and at least loadMin).
	act func(ctx context.Context, e *env, l *load) (allowed int, note string, err error)
	// noRest: the router does not outlive the scenario (sigterm).
	noRest bool
}

var scenarios = []scenario{
	{name: "worker-kill", act: workerKill},
	{name: "worker-stop", act: workerStop},
	{name: "plugin-kill", act: pluginKill},
	{name: "plugin-stop", act: pluginStop},
	{name: "reload", act: reload},
	{name: "worker-move", act: workerMove},
	{name: "disconnect", act: disconnect},
	{name: "body-hold", act: bodyHold},
	{name: "sigterm", act: sigterm, keepAlive: true, noRest: true},
}

// result is one scenario's line.
type result struct {
	requests, failed, allowed int
	fdsOther, fdsPool         string
	goroutines                string
	note, problem             string
}

func runScenario(o options, dir string, sc scenario) (res result) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.problem = err.Error()
		return res
	}
	e, err := start(ctx, o, dir)
	if e != nil {
		defer e.procs.StopAll()
	}
	if err != nil {
		msg := err.Error()
		if len(msg) > 400 {
			msg = "..." + msg[len(msg)-400:]
		}
		res.problem = "setup: " + strings.ReplaceAll(msg, "\n", " ")
		return res
	}
	// Warm up, then take the resting state the scenario must return to.
	warm := newLoad(e, o.clients, false)
	warm.run(ctx, 2*time.Second)
	before, err := e.rest(ctx, 30*time.Second)
	if err != nil {
		res.problem = "not at rest after the warm-up: " + err.Error()
		return res
	}
	clients := o.clients
	if sc.keepAlive {
		clients *= 4
	}
	l := newLoad(e, clients, sc.keepAlive)
	lctx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() { l.run(lctx, 0); close(loaded) }()
	allowed, note, err := sc.act(ctx, e, l)
	stopLoad()
	<-loaded
	res.requests, res.failed = l.count()
	res.allowed, res.note = allowed, note
	if err != nil {
		res.problem = err.Error()
		return res
	}
	if res.failed > allowed {
		res.problem = fmt.Sprintf("%d requests failed, %d allowed: %s", res.failed, allowed, l.firstFailures(3))
		return res
	}
	if res.requests == 0 {
		res.problem = "no request was sent"
		return res
	}
	if sc.noRest {
		return res
	}
	after, err := e.rest(ctx, 60*time.Second)
	if err != nil {
		res.problem = "not at rest after the fault: " + err.Error()
		return res
	}
	res.fdsOther = fmt.Sprintf("%d->%d", before.other, after.other)
	res.fdsPool = fmt.Sprintf("%d->%d", before.pool, after.pool)
	res.goroutines = fmt.Sprintf("%d->%d", before.goroutines, after.goroutines)
	if p := e.overBounds(before, after); p != "" {
		res.problem = p
	}
	return res
}

// env is one scenario's processes.
type env struct {
	o       options
	dir     string
	procs   *benchproc.Children
	client  *http.Client
	workers []string // engine addresses (host:port), by worker index
	// departed are engine ports no worker uses any more (worker-move).
	departed   []int
	router     string // host:port
	debug      string // host:port of --debug-listen
	policyPath string
	wfPath     string
}

var (
	workerRe = regexp.MustCompile(`mock-worker listening on http://(\S+)`)
	routerRe = regexp.MustCompile(`router serve listening on http://(\S+)`)
)

// policy is the scenarios' policy file: the template plugin's scorer,
// least-loaded as its fallback, a queue at 8 requests per engine.
const policy = `router {
  block_size = 16
}

queue {
  max_active_requests = 8
  class "interactive" {
    weight = 1
  }
}

plugin "example" {
  command = %q
}

policy "queue" {
  scorer "depth" {
    type           = "queue-depth"
    waiting_weight = 1.0
  }
  picker "pick" {
    type = "min-cost"
  }
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "queue"
}
`

func start(ctx context.Context, o options, dir string) (*env, error) {
	e := &env{o: o, dir: dir, procs: &benchproc.Children{},
		client:     &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}},
		policyPath: filepath.Join(dir, "policy.hcl"), wfPath: filepath.Join(dir, "workers.hcl")}
	for i := range 3 {
		addr, err := e.startWorker(ctx, i, "127.0.0.1:0")
		if err != nil {
			return e, err
		}
		e.workers = append(e.workers, addr)
	}
	if err := os.WriteFile(e.policyPath, fmt.Appendf(nil, policy, o.pluginBin), 0o644); err != nil {
		return e, err
	}
	if err := e.writeWorkers(); err != nil {
		return e, err
	}
	got, err := e.procs.StartAll(ctx, filepath.Join(dir, "router.log"), []*regexp.Regexp{routerRe, benchproc.ServeProfiler}, o.routerBin, "serve",
		"--policy", e.policyPath, "--workers-file", e.wfPath, "--watch", "--listen", "127.0.0.1:0",
		"--debug-listen", "127.0.0.1:0", "--drain-timeout", "20s", "--log-level", "debug")
	if err != nil {
		return e, err
	}
	e.router, e.debug = got[0], got[1]
	return e, e.waitReady(ctx, 60*time.Second)
}

func (e *env) startWorker(ctx context.Context, i int, listen string) (string, error) {
	return e.procs.Start(ctx, filepath.Join(e.dir, fmt.Sprintf("worker%d-%d.log", i, time.Now().UnixNano())), workerRe, e.o.routerBin,
		"mock-worker", "--listen", listen, "--model", "llama", "--kv-blocks", "4000")
}

// writeWorkers writes the workers file of e.workers, atomically (the
// router watches it).
func (e *env) writeWorkers() error {
	var b strings.Builder
	for i, w := range e.workers {
		fmt.Fprintf(&b, "worker \"w%d\" {\n  url    = \"http://%s\"\n  models = [\"llama\"]\n}\n\n", i, w)
	}
	tmp := e.wfPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, e.wfPath)
}

// waitReady waits until /readyz is 200 with every worker of e.workers
// ready (by URL) and the plugin up.
func (e *env) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		var rz struct {
			Ready   bool
			Workers []struct {
				URL   string
				Ready bool
			}
			Plugins []struct{ State string }
		}
		if err := getJSON(ctx, e.client, "http://"+e.router+"/readyz", &rz); err != nil {
			last = err.Error()
		} else {
			ready := 0
			for _, w := range rz.Workers {
				if w.Ready && slices.Contains(e.workers, strings.TrimPrefix(w.URL, "http://")) {
					ready++
				}
			}
			up := len(rz.Plugins) > 0 && !slices.ContainsFunc(rz.Plugins, func(p struct{ State string }) bool { return p.State != "up" })
			if ready == len(e.workers) && up {
				return nil
			}
			last = fmt.Sprintf("%d of %d workers ready, plugins %v", ready, len(e.workers), rz.Plugins)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready within %v: %s", limit, last)
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// routerPid is the router's process id.
func (e *env) routerPid() int {
	pid, _ := e.procs.Pid(e.router)
	return pid
}

// pluginPid finds the plugin process among the router's children.
func (e *env) pluginPid() (int, error) {
	pid := e.routerPid()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return 0, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			cmdline, err := os.ReadFile("/proc/" + f + "/cmdline")
			if err == nil && strings.Contains(string(cmdline), filepath.Base(e.o.pluginBin)) {
				return strconv.Atoi(f)
			}
		}
	}
	return 0, errors.New("no plugin process under the router")
}

// restState is what the router holds at rest.
type restState struct {
	other, pool, departed int
	goroutines            int
}

// rest waits (up to limit) until nothing is booked or queued and no
// socket to a departed engine port is open, then reads the router's
// descriptors and goroutines.
func (e *env) rest(ctx context.Context, limit time.Duration) (restState, error) {
	deadline := time.Now().Add(limit)
	var why string
	for {
		booked, err := e.booked(ctx)
		queued := 0.0
		if err == nil {
			var m map[string]float64
			if m, err = benchproc.Scrape(e.client, "http://"+e.router); err == nil {
				for k, v := range m {
					if strings.HasPrefix(k, "switchyard_queue_depth") {
						queued += v
					}
				}
			}
		}
		var st restState
		if err == nil {
			st, err = e.descriptors()
		}
		switch {
		case err != nil:
			why = err.Error()
		case booked > 0 || queued > 0:
			why = fmt.Sprintf("%d requests booked, %v queued", booked, queued)
		case st.departed > 0:
			why = fmt.Sprintf("%d sockets to departed engine ports %v still open", st.departed, e.departed)
		default:
			// Let closed connections' goroutines end before counting.
			time.Sleep(500 * time.Millisecond)
			st, err = e.descriptors()
			if err != nil {
				return st, err
			}
			st.goroutines, err = e.goroutines(ctx)
			return st, err
		}
		if time.Now().After(deadline) {
			return restState{}, fmt.Errorf("after %v: %s", limit, why)
		}
		select {
		case <-ctx.Done():
			return restState{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// booked sums the active requests of every worker's ranks.
func (e *env) booked(ctx context.Context) (int64, error) {
	var dw struct {
		Workers []struct {
			Ranks []struct {
				ActiveRequests int64 `json:"active_requests"`
			}
		}
	}
	if err := getJSON(ctx, e.client, "http://"+e.debug+"/debug/workers", &dw); err != nil {
		return 0, err
	}
	var n int64
	for _, w := range dw.Workers {
		for _, r := range w.Ranks {
			n += r.ActiveRequests
		}
	}
	return n, nil
}

var goroutineRe = regexp.MustCompile(`goroutine profile: total (\d+)`)

func (e *env) goroutines(ctx context.Context) (int, error) {
	n, err := benchproc.DebugNumber(ctx, e.client, e.debug, "/debug/pprof/goroutine?debug=1", 64<<20, goroutineRe)
	return int(n), err
}

// descriptors counts the router's open descriptors: pool is its TCP
// sockets to an engine port (current or departed), departed those to a
// departed port, other the rest (listeners, clients' connections, the
// plugin's, files).
func (e *env) descriptors() (restState, error) {
	pid := e.routerPid()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return restState{}, err
	}
	remote := map[string]int{} // socket inode -> remote port
	for _, f := range []string{"tcp", "tcp6"} {
		if err := readTCP(fmt.Sprintf("/proc/%d/net/%s", pid, f), remote); err != nil {
			return restState{}, err
		}
	}
	engine := map[int]bool{}
	for _, w := range e.workers {
		if _, p, err := net.SplitHostPort(w); err == nil {
			n, _ := strconv.Atoi(p)
			engine[n] = true
		}
	}
	var st restState
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		inode, ok := strings.CutPrefix(link, "socket:[")
		port, isTCP := remote[strings.TrimSuffix(inode, "]")]
		switch {
		case !ok || !isTCP:
			st.other++
		case slices.Contains(e.departed, port):
			st.pool++
			st.departed++
		case engine[port]:
			st.pool++
		default:
			st.other++
		}
	}
	return st, nil
}

// readTCP adds each socket's inode -> remote port of a /proc/net/tcp file.
func readTCP(path string, into map[string]int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		_, p, ok := strings.Cut(fields[2], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseInt(p, 16, 32)
		if err != nil {
			continue
		}
		into[fields[9]] = int(port)
	}
	return sc.Err()
}

// overBounds compares the resting states before and after a fault: ""
// when within bounds.
func (e *env) overBounds(before, after restState) string {
	const slack = 8
	var p []string
	if after.other > before.other+slack {
		p = append(p, fmt.Sprintf("descriptors other than the upstream pool's: %d before, %d after (bound: +%d)", before.other, after.other, slack))
	}
	if bound := upstream.DefaultMaxIdlePerHost * len(e.workers); after.pool > bound {
		p = append(p, fmt.Sprintf("upstream pool: %d sockets at rest, over its designed bound of %d (%d per engine)", after.pool, bound, upstream.DefaultMaxIdlePerHost))
	}
	// Each pooled connection has its reader goroutine or none; allow those
	// of the pool's growth and a few more.
	if bound := before.goroutines + 2*max(0, after.pool-before.pool) + 20; after.goroutines > bound {
		p = append(p, fmt.Sprintf("goroutines: %d before, %d after (bound %d)", before.goroutines, after.goroutines, bound))
	}
	return strings.Join(p, "; ")
}

// load is the clients' requests and what became of them.
type load struct {
	e         *env
	clients   int
	keepAlive bool
	client    *http.Client

	mu       sync.Mutex
	outcomes []outcome
}

type outcome struct {
	start, end time.Time
	err        error // nil: a whole, well-formed answer
	wrote      bool  // the request was written before it failed
	stream     bool  // a streamed request
}

func newLoad(e *env, clients int, keepAlive bool) *load {
	t := &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true, DisableKeepAlives: !keepAlive}
	return &load{e: e, clients: clients, keepAlive: keepAlive, client: &http.Client{Transport: t}}
}

// run sends requests from l.clients goroutines until ctx ends (or for d
// when d > 0).
func (l *load) run(ctx context.Context, d time.Duration) {
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	var wg sync.WaitGroup
	for c := range l.clients {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				o := l.one(ctx, c, i)
				if ctx.Err() != nil && o.err != nil {
					return // cut by the end of the load, not a fault
				}
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
				switch {
				case o.err != nil && !o.wrote:
					// Refused before a byte was written (the router stopped
					// accepting): do not spin.
					time.Sleep(50 * time.Millisecond)
				case l.keepAlive:
					// Think time: connections sit idle now and then, as
					// real clients' do, and are written to again.
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	l.client.CloseIdleConnections()
}

// one sends one request: streamed every other time (odd clients starting
// with a streamed one, even clients with a whole answer, so that half of
// the requests in flight stream at any moment); max_tokens 32, or 4
// with keep-alive (short requests back to back, so connections are often
// idle).
func (l *load) one(ctx context.Context, c, i int) outcome {
	stream := (c+i)%2 == 1
	tokens := 32
	if l.keepAlive {
		tokens, stream = 4, false
	}
	body := fmt.Sprintf(`{"model":"llama","max_tokens":%d,"stream":%v,"messages":[{"role":"system","content":"client %d of the chaos matrix, session prompt %s"},{"role":"user","content":"turn %d"}]}`,
		tokens, stream, c, strings.Repeat("x", 200), i)
	o := l.send(ctx, body, stream)
	o.end = time.Now()
	return o
}

// send posts body and reads the whole answer, checking it is well formed.
func (l *load) send(ctx context.Context, body string, stream bool) outcome {
	o := outcome{start: time.Now(), stream: stream}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// wrote: the whole request reached the socket. A request written and
	// then cut is lost: the client cannot tell whether it ran.
	trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) { o.wrote = o.wrote || i.Err == nil }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(rctx, trace), http.MethodPost,
		"http://"+l.e.router+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	// No GetBody: net/http then never sends the request again by itself
	// on another connection, so every cut connection shows.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		o.err = fmt.Errorf("reading the answer (%s): %w", resp.Status, err)
	case resp.StatusCode != http.StatusOK:
		o.err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	case stream && !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]"):
		o.err = fmt.Errorf("stream ended without data: [DONE] after %d bytes", len(b))
	case stream && strings.Contains(string(b), `data: {"error"`):
		// A stream cut and not continued ends with an error event, then
		// [DONE] (docs/serve.md, "Migration: a stream cut mid-answer").
		o.err = fmt.Errorf("stream ended with an error event: %.200s", b[strings.Index(string(b), `data: {"error"`):])
	case !stream && !json.Valid(b):
		o.err = fmt.Errorf("answer is not JSON: %.80q", b)
	}
	return o
}

// count returns the requests sent and those that failed.
func (l *load) count() (requests, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.outcomes {
		if o.err != nil {
			failed++
		}
	}
	return len(l.outcomes), failed
}

// failedAfter counts the failures of requests that started after t.
func (l *load) failedAfter(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.outcomes {
		if o.err != nil && o.start.After(t) {
			n++
		}
	}
	return n
}

// inFlight counts the requests in flight at t (started before, ended
// after); streams: only the non-streamed ones when false.
func (l *load) inFlight(t time.Time, streams bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.outcomes {
		if o.start.Before(t) && o.end.After(t) && (streams || !o.stream) {
			n++
		}
	}
	return n
}

func (l *load) firstFailures(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Requests written and then cut first: they are what a fault loses.
	var s []string
	for _, wrote := range []bool{true, false} {
		for _, o := range l.outcomes {
			if o.err != nil && o.wrote == wrote && len(s) < n {
				s = append(s, o.err.Error())
			}
		}
	}
	return strings.Join(s, " | ")
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func workerKill(ctx context.Context, e *env, l *load) (int, string, error) {
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	addr := e.workers[0]
	killed := time.Now()
	if err := e.procs.Kill(addr); err != nil {
		return 0, "", err
	}
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	if _, err := e.startWorker(ctx, 0, addr); err != nil {
		return 0, "", fmt.Errorf("restarting the engine on %s: %w", addr, err)
	}
	if err := e.waitReady(ctx, time.Minute); err != nil {
		return 0, "", err
	}
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	// A stream in flight on the killed engine migrates: only non-streamed
	// requests may fail.
	allowed := l.inFlight(killed, false)
	note := fmt.Sprintf("%d in flight at the kill, %d of them not streamed", l.inFlight(killed, true), allowed)
	if n := l.failedAfter(killed.Add(time.Second)); n > 0 {
		return allowed, note, fmt.Errorf("%d requests sent a second or more after the kill failed", n)
	}
	return allowed, note, nil
}

func workerStop(ctx context.Context, e *env, _ *load) (int, string, error) {
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	addr := e.workers[1]
	if err := e.procs.Signal(addr, syscall.SIGSTOP); err != nil {
		return 0, "", err
	}
	err := sleep(ctx, 5*time.Second)
	if cerr := e.procs.Signal(addr, syscall.SIGCONT); cerr != nil {
		return 0, "", cerr
	}
	if err != nil {
		return 0, "", err
	}
	return 0, "", sleep(ctx, 5*time.Second)
}

func pluginKill(ctx context.Context, e *env, _ *load) (int, string, error) {
	for range 2 {
		if err := sleep(ctx, 3*time.Second); err != nil {
			return 0, "", err
		}
		pid, err := e.pluginPid()
		if err != nil {
			return 0, "", err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return 0, "", err
		}
	}
	if err := e.waitReady(ctx, time.Minute); err != nil {
		return 0, "", fmt.Errorf("the plugin did not come back: %w", err)
	}
	return 0, "plugin killed twice", sleep(ctx, 2*time.Second)
}

func pluginStop(ctx context.Context, e *env, _ *load) (int, string, error) {
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	pid, err := e.pluginPid()
	if err != nil {
		return 0, "", err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return 0, "", err
	}
	err = sleep(ctx, 5*time.Second)
	_ = syscall.Kill(pid, syscall.SIGCONT) // it may have been killed as stuck meanwhile
	if err != nil {
		return 0, "", err
	}
	if err := e.waitReady(ctx, time.Minute); err != nil {
		return 0, "", fmt.Errorf("the plugin did not come back: %w", err)
	}
	return 0, "", sleep(ctx, 2*time.Second)
}

func reload(ctx context.Context, e *env, _ *load) (int, string, error) {
	pol, err := os.ReadFile(e.policyPath)
	if err != nil {
		return 0, "", err
	}
	for i := range 10 {
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return 0, "", err
		}
		// The same policy, rewritten (the watch sees a change), and a SIGHUP.
		if err := os.WriteFile(e.policyPath, fmt.Appendf(pol, "# reload %d\n", i), 0o644); err != nil {
			return 0, "", err
		}
		if err := e.procs.Signal(e.router, syscall.SIGHUP); err != nil {
			return 0, "", err
		}
	}
	if err := e.waitReady(ctx, time.Minute); err != nil {
		return 0, "", err
	}
	return 0, "10 reloads", sleep(ctx, 2*time.Second)
}

func workerMove(ctx context.Context, e *env, _ *load) (int, string, error) {
	for range 4 {
		if err := sleep(ctx, 2*time.Second); err != nil {
			return 0, "", err
		}
		old := e.workers[2]
		addr, err := e.startWorker(ctx, 2, "127.0.0.1:0")
		if err != nil {
			return 0, "", err
		}
		e.workers[2] = addr
		if err := e.writeWorkers(); err != nil {
			return 0, "", err
		}
		if err := e.waitReady(ctx, time.Minute); err != nil {
			return 0, "", err
		}
		// The router moved to the new address; stop the old engine (it
		// lets its requests in flight finish).
		if err := sleep(ctx, time.Second); err != nil {
			return 0, "", err
		}
		if err := e.procs.Signal(old, syscall.SIGTERM); err != nil {
			return 0, "", err
		}
		if _, err := e.procs.Wait(old, 30*time.Second); err != nil {
			return 0, "", err
		}
		if _, p, err := net.SplitHostPort(old); err == nil {
			n, _ := strconv.Atoi(p)
			e.departed = append(e.departed, n)
		}
	}
	return 0, "4 moves", sleep(ctx, 2*time.Second)
}

// disconnect runs, beside the load, clients that leave mid-stream (after
// the first chunk) and clients that leave while queued (a burst past the
// queue's capacity, abandoned at once).
func disconnect(ctx context.Context, e *env, _ *load) (int, string, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	body := `{"model":"llama","max_tokens":200,"stream":true,"messages":[{"role":"user","content":"leave early"}]}`
	left := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for round := range 5 {
		if err := sleep(ctx, time.Second); err != nil {
			return 0, "", err
		}
		for j := range 40 {
			wg.Go(func() {
				rctx, cancel := context.WithCancel(ctx)
				defer cancel()
				req, _ := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+e.router+"/v1/chat/completions", strings.NewReader(body))
				if (round+j)%2 == 0 {
					// Leave while queued or just admitted.
					time.AfterFunc(50*time.Millisecond, cancel)
				}
				resp, err := c.Do(req)
				if err == nil {
					buf := make([]byte, 64)
					_, _ = resp.Body.Read(buf) // the first chunk, then leave
					cancel()
					resp.Body.Close()
				}
				mu.Lock()
				left++
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return 0, fmt.Sprintf("%d clients left early", left), sleep(ctx, 2*time.Second)
}

// bodyHold fills the router's body budget as an attacker would, from
// another client address (127.0.0.2): connections that declare a body and
// send one byte of it, 32 MiB ones until refused, then 1 MiB, 16 KiB and
// 256 B ones, each size until refused; they are held for 10 s of the load.
func bodyHold(ctx context.Context, e *env, _ *load) (int, string, error) {
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var declared int64
	for _, size := range []int64{32 << 20, 1 << 20, 16 << 10, 256} {
		for range 64 {
			c, err := d.DialContext(ctx, "tcp", e.router)
			if err != nil {
				return 0, "", err
			}
			if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", size); err != nil {
				c.Close()
				return 0, "", err
			}
			// An answer within 200 ms is a refusal (the router reads the
			// body first, and it is not coming).
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if n, _ := c.Read(make([]byte, 1)); n > 0 {
				c.Close()
				break
			}
			_ = c.SetReadDeadline(time.Time{})
			held = append(held, c)
			declared += size
		}
	}
	note := fmt.Sprintf("%d connections held, %d MiB declared, 1 byte each sent", len(held), declared>>20)
	return 0, note, sleep(ctx, 10*time.Second)
}

// sigterm sends SIGTERM under keep-alive load and waits for the router to
// exit; the load goes on (refused) until it has.
func sigterm(ctx context.Context, e *env, l *load) (int, string, error) {
	if err := sleep(ctx, 3*time.Second); err != nil {
		return 0, "", err
	}
	plugin, err := e.pluginPid()
	if err != nil {
		return 0, "", err
	}
	if err := e.procs.Signal(e.router, syscall.SIGTERM); err != nil {
		return 0, "", err
	}
	code, err := e.procs.Wait(e.router, time.Minute)
	if err != nil {
		return 0, "", err
	}
	if err := sleep(ctx, 500*time.Millisecond); err != nil {
		return 0, "", err
	}
	l.mu.Lock()
	refused := 0
	for _, o := range l.outcomes {
		if o.err != nil && !o.wrote {
			refused++
		}
	}
	l.mu.Unlock()
	note := fmt.Sprintf("%d refused before writing", refused)
	if code != 0 {
		return refused, note, fmt.Errorf("router exited %d", code)
	}
	if syscall.Kill(plugin, 0) == nil {
		return refused, note, fmt.Errorf("plugin process %d outlived the router", plugin)
	}
	// Refused connections are allowed (the router stopped accepting);
	// a request written and then cut is not.
	return refused, note, nil
}
