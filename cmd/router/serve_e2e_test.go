//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/portowner"
)

// End-to-end tests of `router serve` with real processes on loopback: the
// router binary, `router mock-worker` engines and the out-of-process
// plugin-example (queue-depth scorer), each started from binaries built
// from this repository. Every process is started in its own process group
// and killed with it at the end of its test; the test then checks /proc
// for survivors of the binaries it built.

// The router and plugin binaries of these tests, built once per test
// binary into the example plugins' build directory (removed by TestMain).
// They have names of their own, so the /proc check finds only processes
// these tests started.
var (
	e2eOnce      sync.Once
	e2eRouterBin string
	e2ePluginBin string
	e2eErr       error
)

func e2eBinaries(t *testing.T) (routerBin, pluginBin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the router, mock workers and a plugin as processes")
	}
	dir := filepath.Dir(examplePlugin(t, "plugin-example"))
	e2eOnce.Do(func() {
		r, p := filepath.Join(dir, "e2e-router"), filepath.Join(dir, "e2e-plugin-example")
		for _, b := range [][2]string{{r, "."}, {p, "../plugin-example"}} {
			if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
				e2eErr = fmt.Errorf("building %s: %v\n%s", b[1], err, out)
				return
			}
		}
		e2eRouterBin, e2ePluginBin = r, p
	})
	if e2eErr != nil {
		t.Fatal(e2eErr)
	}
	// Registered first, so it runs after every process's own cleanup.
	t.Cleanup(func() { checkNoSurvivors(t, e2eRouterBin, e2ePluginBin) })
	return e2eRouterBin, e2ePluginBin
}

// checkNoSurvivors fails the test if, within a minute, a process of one of the
// binaries is still alive, and kills it.
func checkNoSurvivors(t *testing.T, bins ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var left []int
		for _, b := range bins {
			left = append(left, procsOf(b)...)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left behind: %v", left)
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procsOf lists the live (not zombie) processes whose executable is bin.
func procsOf(bin string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != bin {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// The state follows the parenthesised command name.
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// e2eProc is one started process.
type e2eProc struct {
	cmd    *exec.Cmd
	url    string       // http://ADDR from its "listening on" line
	stdout *serveStderr // its stdout lines so far
	stderr *serveStderr
	done   chan struct{}
}

// startProc starts bin with args in its own process group, waits (a minute at
// most) for its "... listening on http://ADDR" line and registers a
// cleanup that stops the group (SIGTERM, then SIGKILL after a minute).
func startProc(t *testing.T, bin string, args ...string) *e2eProc {
	t.Helper()
	p := &e2eProc{cmd: exec.Command(bin, args...), stdout: &serveStderr{}, stderr: &serveStderr{}, done: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(p.stdout, line)
			if _, rest, ok := strings.Cut(line, "listening on "); ok {
				u, _, _ := strings.Cut(rest, " ")
				select {
				case addr <- u:
				default:
				}
			}
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	select {
	case p.url = <-addr:
	case <-p.done:
		t.Fatalf("%s %v exited before listening: %v\n%s%s", filepath.Base(bin), args, p.cmd.ProcessState, p.stderr.String(),
			portowner.TakenNote([]byte(p.stderr.String())))
	case <-time.After(time.Minute):
		t.Fatalf("%s %v: no listening line in a minute\n%s", filepath.Base(bin), args, p.stderr.String())
	}
	return p
}

// waitStdout waits (a minute at most) for a line of p's stdout that
// matches re and returns re's submatches of the first such line; it
// fails the test if p exits first. The addresses a process bound on port
// 0 besides its API (a mock worker's KV events, mockKVEvents; serve's
// profiler, serveProfiler) are read so: from the process's own output.
func (p *e2eProc) waitStdout(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if m := re.FindStringSubmatch(p.stdout.String()); m != nil {
			return m
		}
		select {
		case <-p.done:
			if m := re.FindStringSubmatch(p.stdout.String()); m != nil {
				return m
			}
			t.Fatalf("%s exited before printing %v: %v\nstdout:\n%s\nstderr:\n%s%s", p.cmd.Path, re, p.cmd.ProcessState,
				p.stdout, p.stderr, portowner.TakenNote([]byte(p.stderr.String())))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no line matching %v in a minute:\n%s", p.cmd.Path, re, p.stdout)
		}
	}
}

// Lines of the router's processes that name an address bound on port 0,
// for waitStdout.
var (
	// mockKVEvents is `router mock-worker`'s line for rank 0's KV events:
	// group 1 the publisher's tcp://ADDR, group 2 the replay endpoint's
	// (empty without one), group 3 the snapshot endpoint's (likewise).
	mockKVEvents = regexp.MustCompile(`(?m)^mock-worker rank 0 KV events on (tcp://\S+)(?: replay on (tcp://\S+))?(?: snapshot on (tcp://\S+))?`)
	// serveProfiler is `router serve`'s --debug-listen line: group 1 is
	// host:port.
	serveProfiler = regexp.MustCompile(`router serve profiler on http://(\S+)/debug/pprof/`)
)

// stop ends the process group: SIGTERM, then SIGKILL if it is not gone
// within a minute. Idempotent.
func (p *e2eProc) stop(t *testing.T) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Errorf("%s did not stop on SIGTERM within a minute", p.cmd.Path)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// The group's other members (a plugin) follow their parent.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// kill SIGKILLs the process (not its group) and waits for it.
func (p *e2eProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// startMocks starts n `router mock-worker` processes serving model
// "mock".
func startMocks(t *testing.T, routerBin string, n int, speedup string) []*e2eProc {
	t.Helper()
	ms := make([]*e2eProc, n)
	for i := range ms {
		ms[i] = startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock",
			"--speedup", speedup, "--engine-block-size", "16")
	}
	return ms
}

// workerBlocks is worker "NAME" blocks for name -> url, in names order.
func workerBlocks(names []string, urls map[string]string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "worker %q {\n  url             = %q\n  models          = [\"mock\"]\n  total_kv_blocks = 27500\n}\n", n, urls[n])
	}
	return b.String()
}

// writeAtomic replaces path's content by a rename, as editors and config
// management do.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// closedPort is a loopback URL nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	_ = ln.Close()
	return u
}

// e2eClient talks to the router; its idle connections are closed at the
// end of the test.
func e2eClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// scrape returns the router's /metrics samples by series
// (name{labels} as exposed, labels sorted by name).
func scrape(c *http.Client, base string) (map[string]float64, error) {
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// waitMetrics polls /metrics until ok holds (deadline d) and returns the
// last scrape; on timeout it fails with why and the last scrape's
// switchyard_ series.
func waitMetrics(t *testing.T, c *http.Client, router *e2eProc, d time.Duration, why string, ok func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(d)
	var m map[string]float64
	for {
		var err error
		if m, err = scrape(c, router.url); err == nil && ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			var lines []string
			for k, v := range m {
				if strings.HasPrefix(k, "switchyard_") && !strings.Contains(k, "_bucket{") {
					lines = append(lines, fmt.Sprintf("%s %v", k, v))
				}
			}
			t.Fatalf("after %v: %s; scrape error %v; metrics:\n%s\nrouter stderr:\n%s", d, why, err, strings.Join(lines, "\n"), router.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func activeOf(w string) string { return `switchyard_worker_active_requests{worker="` + w + `"}` }
func readyOf(w string) string  { return `switchyard_worker_ready{worker="` + w + `"}` }

// allReady: every worker in names is ready.
func allReady(names ...string) func(map[string]float64) bool {
	return func(m map[string]float64) bool {
		for _, n := range names {
			if v, ok := m[readyOf(n)]; !ok || v != 1 {
				return false
			}
		}
		return true
	}
}

// requestsCounted is the router's switchyard_requests_total summed over
// its series (every code and model).
func requestsCounted(m map[string]float64) float64 {
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, "switchyard_requests_total{") {
			n += v
		}
	}
	return n
}

// idle: every worker's active requests and every queue class's depth are
// 0 (and at least one worker series is there).
func idle(m map[string]float64) bool {
	seen := false
	for k, v := range m {
		if strings.HasPrefix(k, "switchyard_worker_active_requests{") {
			seen = true
			if v != 0 {
				return false
			}
		}
		if strings.HasPrefix(k, "switchyard_queue_depth{") && v != 0 {
			return false
		}
	}
	return seen
}

func chatJSON(stream bool, maxTokens int, text string) string {
	return fmt.Sprintf(`{"model":"mock","stream":%v,"max_tokens":%d,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":%q}]}`,
		stream, maxTokens, text)
}

// streamResult is one streamed answer as the client saw it.
type streamResult struct {
	status      int
	worker      string
	prefill     string        // x-switchyard-prefill-worker (disaggregated requests)
	events      int           // "data: " lines before [DONE]
	done        bool          // "data: [DONE]" arrived
	first, last time.Duration // since the request was sent: first data line, [DONE]
	body        string        // non-streamed answers and errors
}

// doChat posts one chat request and reads the answer to its end.
func doChat(ctx context.Context, c *http.Client, base, body string) (streamResult, error) {
	var r streamResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return r, err
	}
	defer func() { _ = resp.Body.Close() }()
	r.status, r.worker = resp.StatusCode, resp.Header.Get("X-Switchyard-Worker")
	r.prefill = resp.Header.Get("X-Switchyard-Prefill-Worker")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		r.body = string(b)
		return r, err
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			now := time.Since(start)
			if r.events == 0 && !r.done {
				r.first = now
			}
			if strings.TrimSpace(line) == "data: [DONE]" {
				r.done, r.last = true, now
			} else {
				r.events++
			}
		}
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return r, err
		}
	}
}

// queueDepthPolicy is examples/policies/plugin-example.hcl with the plugin
// at its absolute path, block_size 16 (the mocks') and the extra blocks.
func queueDepthPolicy(t *testing.T, pluginBin, extra string) string {
	t.Helper()
	src, err := os.ReadFile("../../examples/policies/plugin-example.hcl")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(src), `command = "bin/plugin-example"`, fmt.Sprintf("command = %q", pluginBin), 1)
	s = strings.Replace(s, "block_size = 512", "block_size = 16", 1)
	if !strings.Contains(s, pluginBin) || !strings.Contains(s, "block_size = 16") {
		t.Fatal("examples/policies/plugin-example.hcl changed; update queueDepthPolicy")
	}
	p := filepath.Join(t.TempDir(), "queue-depth.hcl")
	if err := os.WriteFile(p, []byte(s+"\n"+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func startRouter(t *testing.T, routerBin string, args ...string) *e2eProc {
	t.Helper()
	return startProc(t, routerBin, append([]string{"serve", "--listen", "127.0.0.1:0", "--drain-timeout", "5s", "--request-timeout", "20s"}, args...)...)
}

// TestServeE2EStreamingWithPlugin: three mock workers, the router with
// the queue-depth plugin policy and a workers file that is empty at
// first. /readyz is 503 until the workers join, then 200; a streamed
// answer arrives chunk by chunk; a non-streamed one works; /metrics shows
// the plugin up and counts every request.
func TestServeE2EStreamingWithPlugin(t *testing.T) {
	routerBin, pluginBin := e2eBinaries(t)
	t0 := time.Now()
	mocks := startMocks(t, routerBin, 3, "50")
	names := []string{"a", "b", "c"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url, "c": mocks[2].url}
	workersFile := filepath.Join(t.TempDir(), "workers.hcl")
	writeAtomic(t, workersFile, "# no workers yet\n")
	router := startRouter(t, routerBin, "--policy", queueDepthPolicy(t, pluginBin, ""), "--workers-file", workersFile)
	c := e2eClient(t)

	// Listening, plugin up, no worker: not ready.
	resp, err := c.Get(router.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "no worker ready") {
		t.Fatalf("/readyz without workers: %d %s, want 503 naming the workers", resp.StatusCode, body)
	}
	m := waitMetrics(t, c, router, time.Minute, "plugin up", func(m map[string]float64) bool {
		return m[`switchyard_plugin_up{plugin="example"}`] == 1
	})
	if _, ok := m[readyOf("a")]; ok {
		t.Fatal("worker a reported before the workers file named it")
	}
	if pids := procsOf(pluginBin); len(pids) != 1 {
		t.Fatalf("plugin processes %v, want the router's one", pids)
	}

	tJoin := time.Now()
	writeAtomic(t, workersFile, workerBlocks(names, urls))
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := c.Get(router.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			// Ready means a worker is: the metrics agree.
			m, err := scrape(c, router.url)
			if err != nil {
				t.Fatal(err)
			}
			if m[readyOf("a")]+m[readyOf("b")]+m[readyOf("c")] < 1 || m[`switchyard_plugin_up{plugin="example"}`] != 1 {
				t.Fatalf("/readyz 200 with no worker ready or the plugin down: %v", m)
			}
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz: %d %s", resp.StatusCode, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 a minute after the workers file named them: %s\n%s", body, router.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	readyAfter := time.Since(tJoin)
	waitMetrics(t, c, router, time.Minute, "all three workers ready", allReady(names...))

	// A long streamed answer: about 2,000 tokens over ~0.3s of the mock's
	// decode. Chunk by chunk means the first event arrives while most of
	// the answer is still to be generated.
	ctx := context.Background()
	s, err := doChat(ctx, c, router.url, chatJSON(true, 2000, "stream a long answer"))
	if err != nil {
		t.Fatal(err)
	}
	if s.status != http.StatusOK || !s.done || s.events < 2000 || urls[s.worker] == "" {
		t.Fatalf("stream: status %d, worker %q, %d events, done %v: %s", s.status, s.worker, s.events, s.done, s.body)
	}
	// A buffered stream arrives in one read, its events microseconds apart;
	// a streamed one spreads over the mock's decode (~0.3s), however slow
	// the machine.
	if spread := s.last - s.first; spread < 100*time.Millisecond {
		t.Errorf("stream buffered: first event at %v, [DONE] at %v; want the first well before the last", s.first, s.last)
	}
	t.Logf("stream of %d events from %s: first event %v, [DONE] %v", s.events, s.worker, s.first, s.last)

	// Non-streamed.
	n, err := doChat(ctx, c, router.url, chatJSON(false, 8, "a short answer"))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if n.status != http.StatusOK || urls[n.worker] == "" || json.Unmarshal([]byte(n.body), &answer) != nil ||
		len(answer.Choices) != 1 || answer.Choices[0].Message.Content == "" {
		t.Fatalf("non-streamed: status %d worker %q body %s", n.status, n.worker, n.body)
	}

	// A few more of each, concurrently; the plugin's scorer spreads them.
	const more = 24
	var wg sync.WaitGroup
	var bad atomic.Int64
	split := make([]string, more)
	for i := range more {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := doChat(ctx, c, router.url, chatJSON(i%2 == 0, 64, fmt.Sprintf("request %d", i)))
			if err != nil || r.status != http.StatusOK || (i%2 == 0 && !r.done) {
				bad.Add(1)
				t.Errorf("request %d: %v status %d done %v %s", i, err, r.status, r.done, r.body)
			}
			split[i] = r.worker
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.FailNow()
	}
	total := float64(2 + more)
	m = waitMetrics(t, c, router, time.Minute, "requests_total counts every request", func(m map[string]float64) bool {
		return m[`switchyard_requests_total{code="200",model="mock"}`] == total
	})
	if m[`switchyard_plugin_up{plugin="example"}`] != 1 {
		t.Errorf("switchyard_plugin_up{plugin=\"example\"} = %v, want 1", m[`switchyard_plugin_up{plugin="example"}`])
	}
	if got := m[`switchyard_time_to_first_token_seconds_count{model="mock"}`]; got != 1+more/2 {
		t.Errorf("time_to_first_token count %v, want %d streamed", got, 1+more/2)
	}
	waitMetrics(t, c, router, time.Minute, "every worker idle", idle)
	t.Logf("ready %v after the workers file named the workers; split %v; test %v", readyAfter, split, time.Since(t0))
}

// TestServeE2ECancellationAccounting: 300 streamed requests, 16 at a time,
// through the plugin policy with a capacity of 4 per worker (so requests
// queue), a fifth of them cancelled by the client at a random point
// (queued, before the headers, mid-stream). Afterwards every worker's
// active requests and every queue class's depth are 0.
func TestServeE2ECancellationAccounting(t *testing.T) {
	routerBin, pluginBin := e2eBinaries(t)
	t0 := time.Now()
	mocks := startMocks(t, routerBin, 3, "50")
	names := []string{"a", "b", "c"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url, "c": mocks[2].url}
	policy := queueDepthPolicy(t, pluginBin, "queue {\n  max_active_requests = 4\n  class \"interactive\" {\n    weight = 1\n  }\n}\n"+workerBlocks(names, urls))
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "all three workers ready", allReady(names...))

	const total, conc = 300, 16
	rng := rand.New(rand.NewPCG(6, 300))
	type plan struct {
		maxTokens int
		cancelAt  time.Duration // 0: not cancelled
	}
	plans := make([]plan, total)
	cancelled := 0
	for i := range plans {
		plans[i].maxTokens = 16 + rng.IntN(240) // ~2-35ms of decode at 50x
		if rng.IntN(5) == 0 {
			plans[i].cancelAt = time.Duration(1+rng.IntN(40_000)) * time.Microsecond
			cancelled++
		}
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	var ok200, failed, interrupted atomic.Int64
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				p := plans[i]
				ctx, cancel := context.WithCancel(context.Background())
				var timer *time.Timer
				if p.cancelAt > 0 {
					timer = time.AfterFunc(p.cancelAt, cancel)
				}
				r, err := doChat(ctx, c, router.url, chatJSON(true, p.maxTokens, fmt.Sprintf("conversation %d turn %d", i%10, i)))
				if timer != nil {
					timer.Stop()
				}
				cancel()
				switch {
				case p.cancelAt > 0 && (err != nil || !r.done):
					interrupted.Add(1)
				case err == nil && r.status == http.StatusOK && r.done:
					ok200.Add(1)
				default:
					failed.Add(1)
					t.Errorf("request %d (not cancelled): %v status %d done %v %s", i, err, r.status, r.done, r.body)
				}
			}
		}()
	}
	tLoad := time.Now()
	for i := range total {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	load := time.Since(tLoad)
	tIdle := time.Now()
	m := waitMetrics(t, c, router, time.Minute, "every worker's active requests and the queue depth back to 0", idle)
	settled := time.Since(tIdle)
	for _, n := range names {
		if _, ok := m[activeOf(n)]; !ok {
			t.Errorf("no %s series", activeOf(n))
		}
	}
	if _, ok := m[`switchyard_queue_depth{class="interactive"}`]; !ok {
		t.Errorf(`no switchyard_queue_depth{class="interactive"} series`)
	}
	if failed.Load() > 0 {
		t.Fatalf("%d requests that were not cancelled failed", failed.Load())
	}
	if interrupted.Load() == 0 {
		t.Errorf("none of the %d cancellations interrupted a request", cancelled)
	}
	counted := requestsCounted(m)
	t.Logf("%d requests (%d cancelled, %d interrupted, %d completed) in %v; idle %v later; %v counted by the router: 200 %v, 499 %v; test %v",
		total, cancelled, interrupted.Load(), ok200.Load(), load, settled, counted,
		m[`switchyard_requests_total{code="200",model="mock"}`], m[`switchyard_requests_total{code="499",model="mock"}`], time.Since(t0))
}

// TestServeE2EWorkerRemovedAndReaddedMidStream: with a workers file of
// three mocks (at real time, so a stream lasts seconds), a slow stream
// runs on worker X; X is removed from the file (the stream finishes
// normally, new requests avoid X), then added back under the same name
// while the stream still runs (X serves again). X's active requests are
// sampled throughout: never negative, and 0 at the end.
func TestServeE2EWorkerRemovedAndReaddedMidStream(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	t0 := time.Now()
	mocks := startMocks(t, routerBin, 3, "1")
	names := []string{"a", "b", "c"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url, "c": mocks[2].url}
	dir := t.TempDir()
	policy := filepath.Join(dir, "rr.hcl")
	if err := os.WriteFile(policy, []byte(`router {
  block_size = 16
}

policy "rr" {
  picker "pick" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	workersFile := filepath.Join(dir, "workers.hcl")
	writeAtomic(t, workersFile, workerBlocks(names, urls))
	router := startRouter(t, routerBin, "--policy", policy, "--workers-file", workersFile)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "all three workers ready", allReady(names...))

	// The slow stream: ~450 tokens at the mock's real-time decode, about
	// 3s. Its worker is X.
	type result struct {
		r   streamResult
		err error
	}
	slow := make(chan result, 1)
	hdr := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, router.url+"/v1/chat/completions", strings.NewReader(chatJSON(true, 450, "a slow stream")))
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			hdr <- ""
			slow <- result{err: err}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		hdr <- resp.Header.Get("X-Switchyard-Worker")
		var r streamResult
		r.status = resp.StatusCode
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.TrimSpace(line) == "data: [DONE]" {
				r.done, r.last = true, time.Since(start)
			} else if strings.HasPrefix(line, "data: ") {
				r.events++
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				slow <- result{r: r, err: err}
				return
			}
		}
	}()
	x := <-hdr
	if urls[x] == "" {
		res := <-slow
		t.Fatalf("slow stream: worker %q, %v %+v", x, res.err, res.r)
	}
	tStream := time.Now()

	// Sample X's active requests until the end.
	var minActive atomic.Int64
	minActive.Store(1 << 40)
	var samples, maxActive, activeWhileOut atomic.Int64
	var out atomic.Bool // X is out of the workers file
	activeWhileOut.Store(-1)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if m, err := scrape(c, router.url); err == nil {
				if v, ok := m[activeOf(x)]; ok {
					samples.Add(1)
					if int64(v) > maxActive.Load() {
						maxActive.Store(int64(v))
					}
					if out.Load() {
						activeWhileOut.Store(int64(v))
					}
					for cur := minActive.Load(); int64(v) < cur && !minActive.CompareAndSwap(cur, int64(v)); cur = minActive.Load() {
					}
				}
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() {
		select {
		case <-stopSampling:
		default:
			close(stopSampling)
		}
		<-sampled
	}()

	// Remove X: the file without it.
	var rest []string
	for _, n := range names {
		if n != x {
			rest = append(rest, n)
		}
	}
	out.Store(true)
	writeAtomic(t, workersFile, workerBlocks(rest, urls))
	waitMetrics(t, c, router, time.Minute, "worker "+x+" removed", func(m map[string]float64) bool {
		v, ok := m[readyOf(x)]
		return !ok || v == 0
	})
	removedAfter := time.Since(tStream)
	for i := range 9 {
		r, err := doChat(context.Background(), c, router.url, chatJSON(i%2 == 0, 4, fmt.Sprintf("while %s is out %d", x, i)))
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("request while %s is out: %v %d %s", x, err, r.status, r.body)
		}
		if r.worker == x {
			t.Errorf("request %d went to the removed worker %s", i, x)
		}
	}

	// Add X back under the same name while its old stream still runs.
	out.Store(false)
	writeAtomic(t, workersFile, workerBlocks(names, urls))
	waitMetrics(t, c, router, time.Minute, "worker "+x+" ready again", allReady(x))
	readdedAfter := time.Since(tStream)
	select {
	case res := <-slow:
		t.Logf("the slow stream ended before %s rejoined (%v); the rejoin ran without a request in flight", x, res.r.last)
		slow <- res
	default:
	}
	servedAgain := false
	for i := 0; i < 12 && !servedAgain; i++ {
		r, err := doChat(context.Background(), c, router.url, chatJSON(false, 4, fmt.Sprintf("after %s rejoined %d", x, i)))
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("request after %s rejoined: %v %d %s", x, err, r.status, r.body)
		}
		servedAgain = r.worker == x
	}
	if !servedAgain {
		t.Errorf("%s never served again after rejoining", x)
	}

	res := <-slow
	if res.err != nil || res.r.status != http.StatusOK || !res.r.done || res.r.events < 450 {
		t.Fatalf("the slow stream on %s did not finish normally: %v status %d done %v events %d", x, res.err, res.r.status, res.r.done, res.r.events)
	}
	waitMetrics(t, c, router, time.Minute, x+"'s active requests back to 0", func(m map[string]float64) bool {
		v, ok := m[activeOf(x)]
		return ok && v == 0 && idle(m)
	})
	close(stopSampling)
	<-sampled
	if samples.Load() == 0 {
		t.Fatalf("no sample of %s", activeOf(x))
	}
	if v := minActive.Load(); v < 0 {
		t.Errorf("%s went negative: %d", activeOf(x), v)
	}
	if maxActive.Load() < 1 {
		t.Errorf("%s never showed the slow stream in flight", activeOf(x))
	}
	t.Logf("stream on %s: removed %v and ready again %v after it started, [DONE] at %v (%d events); %d samples, active min %d max %d, last while out %d; test %v",
		x, removedAfter, readdedAfter, res.r.last, res.r.events, samples.Load(), minActive.Load(), maxActive.Load(), activeWhileOut.Load(), time.Since(t0))
}

// TestServeE2EWorkerRefusingConnections: a worker block at a closed port
// (never ready) and three live mocks under the KV-aware policy; once they
// are ready one of them is killed, so it refuses connections while the
// router still counts it ready. Requests whose prompts its prefix cache
// holds (the KV policy prefers it) fail there before a byte and are
// retried on other workers: every request succeeds, and both dead workers
// end not ready.
func TestServeE2EWorkerRefusingConnections(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	t0 := time.Now()
	mocks := startMocks(t, routerBin, 3, "50")
	names := []string{"a", "b", "c"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url, "c": mocks[2].url, "never": closedPort(t)}
	policy := filepath.Join(t.TempDir(), "kv.hcl")
	if err := os.WriteFile(policy, []byte(`router {
  block_size = 16
}

policy "kv" {
  scorer "cost" {
    type           = "kv-cost"
    overlap_credit = 1.0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

worker_selection {
  aggregated = "kv"
}
`+workerBlocks(append([]string{"never"}, names...), urls)), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", policy)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "the three live workers ready, never not", func(m map[string]float64) bool {
		v, ok := m[readyOf("never")]
		return allReady(names...)(m) && ok && v == 0
	})

	// Conversations with long shared prefixes; note where each went.
	prefix := strings.Repeat("You are a helpful assistant who answers briefly. ", 40)
	convs := map[string]string{} // worker -> a conversation it holds
	for i := 0; i < 30 && len(convs) < 3; i++ {
		text := fmt.Sprintf("conversation %d: %s", i, prefix)
		r, err := doChat(context.Background(), c, router.url, chatJSON(false, 4, text))
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("warm-up: %v %d %s", err, r.status, r.body)
		}
		if _, ok := convs[r.worker]; !ok {
			convs[r.worker] = text
		}
	}
	// The victim is a worker holding a conversation.
	victim := ""
	for _, n := range names {
		if _, ok := convs[n]; ok {
			victim = n
			break
		}
	}
	if victim == "" {
		t.Fatalf("no conversation landed on a live worker: %v", convs)
	}
	mocks[map[string]int{"a": 0, "b": 1, "c": 2}[victim]].kill()
	tKill := time.Now()

	// Follow-up turns of the victim's conversation and of the others,
	// concurrently: the KV policy wants the victim for its conversation.
	const total, conc = 60, 4
	jobs := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Int64
	split := map[string]int{}
	var splitMu sync.Mutex
	var maxLatency atomic.Int64
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				text := convs[victim]
				if i%3 == 2 {
					text = fmt.Sprintf("another conversation %d: %s", i, prefix)
				}
				text += fmt.Sprintf(" follow-up %d", i)
				start := time.Now()
				r, err := doChat(context.Background(), c, router.url, chatJSON(i%2 == 0, 8, text))
				for d, cur := int64(time.Since(start)), maxLatency.Load(); d > cur && !maxLatency.CompareAndSwap(cur, d); cur = maxLatency.Load() {
				}
				if err != nil || r.status != http.StatusOK || (i%2 == 0 && !r.done) {
					failed.Add(1)
					t.Errorf("request %d: %v status %d done %v %s", i, err, r.status, r.done, r.body)
					continue
				}
				splitMu.Lock()
				split[r.worker]++
				splitMu.Unlock()
			}
		}()
	}
	for i := range total {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	sent := time.Since(tKill)
	if failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed with %s refusing connections:\n%s", failed.Load(), total, victim, router.stderr.String())
	}
	if split[victim] > 0 || split["never"] > 0 {
		t.Errorf("answers from a dead worker: %v", split)
	}
	retried := strings.Count(router.stderr.String(), "worker failed before answering")
	if retried == 0 {
		t.Errorf("no request was sent to the refusing %s: the test did not exercise the retry", victim)
	}
	m := waitMetrics(t, c, router, time.Minute, victim+" and never not ready", func(m map[string]float64) bool {
		v, ok := m[readyOf(victim)]
		w, ok2 := m[readyOf("never")]
		return ok && ok2 && v == 0 && w == 0 && idle(m)
	})
	notReady := time.Since(tKill)
	for k := range m {
		if strings.HasPrefix(k, "switchyard_requests_total{") && !strings.Contains(k, `code="200"`) {
			t.Errorf("a request counted under another code: %s %v", k, m[k])
		}
	}
	t.Logf("%s killed: %d requests in %v (max latency %v), %d attempts failed before a byte and were retried; split %v; %s not ready %v after the kill; test %v",
		victim, total, sent, time.Duration(maxLatency.Load()), retried, split, victim, notReady, time.Since(t0))
}

// TestServeE2EDisaggregated: examples/policies/serve-disagg.hcl with one
// prefill and one decode mock-worker process. A streamed request is served
// in two hops: the answer names both workers and ends with [DONE], the
// prefill engine computed the prompt and generated one token, the decode
// engine computed no prompt (the KV came from the prefill) and generated
// the rest, and every booking ends.
func TestServeE2EDisaggregated(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mocks := startMocks(t, routerBin, 2, "50")
	src, err := os.ReadFile("../../examples/policies/serve-disagg.hcl")
	if err != nil {
		t.Fatal(err)
	}
	// The example's policies and queue (the block size the engines'
	// own, as the example leaves it) with these two workers.
	policy, _, ok := strings.Cut(string(src), "\nworker \"")
	if !ok || !strings.Contains(policy, "worker_selection") || strings.Contains(policy, "block_size") {
		t.Fatal("examples/policies/serve-disagg.hcl changed; update this test")
	}
	for _, w := range []struct{ name, role, url string }{{"prefill-a", "prefill", mocks[0].url}, {"decode-a", "decode", mocks[1].url}} {
		policy += fmt.Sprintf("\nworker %q {\n  url             = %q\n  role            = %q\n  models          = [\"mock\"]\n  total_kv_blocks = 27500\n}\n", w.name, w.url, w.role)
	}
	path := filepath.Join(t.TempDir(), "serve-disagg.hcl")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	router := startRouter(t, routerBin, "--policy", path)
	c := e2eClient(t)
	waitMetrics(t, c, router, time.Minute, "both workers ready", allReady("prefill-a", "decode-a"))

	const tokens = 32
	r, err := doChat(context.Background(), c, router.url, chatJSON(true, tokens, "a disaggregated answer"))
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK || r.prefill != "prefill-a" || r.worker != "decode-a" || !r.done || r.events != tokens {
		t.Fatalf("status %d, prefill worker %q, decode worker %q, %d events, [DONE] %v; want 200 from prefill-a then decode-a, %d events and [DONE]: %s\n%s",
			r.status, r.prefill, r.worker, r.events, r.done, tokens, r.body, router.stderr.String())
	}
	m := waitMetrics(t, c, router, time.Minute, "the request counted and every worker idle", func(m map[string]float64) bool {
		return m[`switchyard_requests_total{code="200",model="mock"}`] == 1 && idle(m)
	})
	if got := m[`switchyard_selection_duration_seconds_count{policy="prefill",role="prefill"}`]; got != 1 {
		t.Errorf("prefill selections %v, want 1", got)
	}
	if got := m[`switchyard_selection_duration_seconds_count{policy="decode",role="decode"}`]; got != 1 {
		t.Errorf("decode selections %v, want 1", got)
	}
	// The engines count a step's tokens just after handing them out: poll.
	const prompt, generated = `vllm:prompt_tokens_total{engine="0",model_name="mock"}`, `vllm:generation_tokens_total{engine="0",model_name="mock"}`
	var pm, dm map[string]float64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if pm, err = scrape(c, mocks[0].url); err != nil {
			t.Fatal(err)
		}
		if dm, err = scrape(c, mocks[1].url); err != nil {
			t.Fatal(err)
		}
		if (pm[generated] == 1 && dm[generated] == tokens-1) || time.Now().After(deadline) {
			break
		}
	}
	if pm[prompt] == 0 || pm[generated] != 1 {
		t.Errorf("prefill engine: %v prompt tokens, %v generated; want the prompt and 1 token", pm[prompt], pm[generated])
	}
	if dm[prompt] != 0 || dm[generated] != tokens-1 {
		t.Errorf("decode engine: %v prompt tokens, %v generated; want none (transferred) and %d", dm[prompt], dm[generated], tokens-1)
	}
}

// TestServeE2EDebugListen: --debug-listen serves Go's profiler on its own
// address and not on the API address.
func TestServeE2EDebugListen(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mocks := startMocks(t, routerBin, 1, "50")
	policy := filepath.Join(t.TempDir(), "rr.hcl")
	if err := os.WriteFile(policy, []byte(workerBlocks([]string{"a"}, map[string]string{"a": mocks[0].url})), 0o644); err != nil {
		t.Fatal(err)
	}
	debug := closedPort(t)
	router := startRouter(t, routerBin, "--policy", policy, "--debug-listen", strings.TrimPrefix(debug, "http://"))
	c := e2eClient(t)
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(debug + "/debug/pprof/cmdline"); code != http.StatusOK || !strings.Contains(body, "--debug-listen") {
		t.Fatalf("profiler cmdline: %d %q, want 200 naming the router's flags", code, body)
	}
	if code, body := get(debug + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("profiler index: %d %.200q", code, body)
	}
	if code, _ := get(router.url + "/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("the API address answers /debug/pprof/ with %d, want 404", code)
	}
}
