//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-router/switchyard/internal/envoysim"
	"github.com/switchyard-router/switchyard/router/epp"
)

// End-to-end tests of `router epp` behind envoysim, the stand-in for
// Envoy's ext_proc filter (internal/envoysim): the EPP binary, three
// `router mock-worker` engines publishing KV events, and the harness in
// the test process forwarding to the engines. docs/epp.md ("The test
// harness") maps each test to the bullet of issue #16 it covers.

// kvFleet is three mock engines that tokenize and publish their KV events,
// as worker blocks of a policy file.
type kvFleet struct {
	names     []string
	endpoints map[string]string // name -> "ip:port"
	urls      []string          // the engines' base URLs, in names order
	blocks    string            // worker blocks with kv_events
	tokenizer string            // the tokenizer block of model "mock"
}

// startKVFleet starts the three engines (speedup 50).
func startKVFleet(t *testing.T, routerBin string) *kvFleet {
	t.Helper()
	tokDir, err := filepath.Abs("../../router/tokenizer/testdata")
	if err != nil {
		t.Fatal(err)
	}
	tok, tokCfg := filepath.Join(tokDir, "bytebpe.json"), filepath.Join(tokDir, "chatml_config.json")
	f := &kvFleet{names: []string{"a", "b", "c"}, endpoints: map[string]string{},
		tokenizer: fmt.Sprintf("tokenizer \"mock\" {\n  source = \"file\"\n  path   = %q\n  config = %q\n}\n", tok, tokCfg)}
	var b strings.Builder
	for _, n := range f.names {
		m := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50",
			"--engine-block-size", "16", "--tokenizer", tok, "--tokenizer-config", tokCfg,
			"--kv-events-endpoint", "tcp://127.0.0.1:0")
		fmt.Fprintf(&b, "worker %q {\n  url = %q\n  kv_events {\n    endpoint = %q\n  }\n}\n", n, m.url, m.waitStdout(t, mockKVEvents)[1])
		ep, err := epp.Endpoint(m.url)
		if err != nil {
			t.Fatal(err)
		}
		f.endpoints[n] = ep
		f.urls = append(f.urls, m.url)
	}
	f.blocks = b.String()
	return f
}

// kvAwarePolicy is a KV-aware policy: kv-cost scored, the cheapest
// picked. It scores the router's own bookings, not the engines' periodic
// reports (engine_load = false): a report taken while another request ran
// may be seconds old, and would make the choice depend on timing.
const kvAwarePolicy = `policy "kv" {
  scorer "cost" {
    type           = "kv-cost"
    overlap_credit = 1.0
    engine_load    = false
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

worker_selection {
  aggregated = "kv"
}
`

// startKVEPP starts the KV fleet and `router epp` over it with the
// KV-aware policy, and waits until every worker is ready.
func startKVEPP(t *testing.T) (*kvFleet, *eppProc, *http.Client) {
	t.Helper()
	routerBin, _ := e2eBinaries(t)
	f := startKVFleet(t, routerBin)
	e := startEPPProc(t, routerBin, eppPolicyFile(t, f.tokenizer, kvAwarePolicy, f.blocks), "127.0.0.1:0")
	c := e2eClient(t)
	waitMetrics(t, c, e.api, time.Minute, "every worker ready", allReady(f.names...))
	return f, e, c
}

// eppPolicyFile writes a policy file of block_size 16 and the parts.
func eppPolicyFile(t *testing.T, parts ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "epp.hcl")
	if err := os.WriteFile(p, []byte("router {\n  block_size = 16\n}\n\n"+strings.Join(parts, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// eppProc is a started `router epp`.
type eppProc struct {
	*e2eProc
	grpcAddr string   // its --listen address
	api      *e2eProc // the same process, url = its HTTP API, for waitMetrics
}

// startEPPProc starts `router epp` on listen and waits for its gRPC
// readiness (SERVING).
func startEPPProc(t *testing.T, routerBin, policy, listen string) *eppProc {
	t.Helper()
	p := startProc(t, routerBin, "epp", "--policy", policy, "--listen", listen, "--drain-timeout", "5s")
	addr, ok := strings.CutPrefix(p.url, "grpc://")
	if !ok {
		t.Fatalf("listening line gave %q, want grpc://ADDR", p.url)
	}
	var api string
	for _, line := range strings.Split(p.stdout.String(), "\n") {
		if _, rest, ok := strings.Cut(line, "router epp http api on "); ok {
			api = strings.TrimSpace(rest)
		}
	}
	if api == "" {
		t.Fatalf("no http api line in %q", p.stdout.String())
	}
	view := *p
	view.url = api
	e := &eppProc{e2eProc: p, grpcAddr: addr, api: &view}
	e.waitServing(t)
	return e
}

// waitServing waits (a minute at most) for the EPP's readiness over gRPC
// health.
func (e *eppProc) waitServing(t *testing.T) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+e.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		hr, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.ReadinessService})
		cancel()
		if err == nil && hr.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness %v, %v after a minute\n%s", hr, err, e.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// subsetHeader carries a test request's subset hint to the harness
// (comma-separated endpoints; present but empty: an empty hint).
const subsetHeader = "X-Test-Subset"

// subsetFromHeader is the harness's Config.Subset of these tests.
func subsetFromHeader(r *http.Request) []string {
	v, ok := r.Header[subsetHeader]
	if !ok {
		return nil
	}
	out := []string{}
	for e := range strings.SplitSeq(strings.Join(v, ","), ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// startHarness serves an envoysim.Proxy for cfg on loopback and returns
// it with its base URL.
func startHarness(t *testing.T, cfg envoysim.Config) (*envoysim.Proxy, string) {
	t.Helper()
	p, err := envoysim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(p)
	t.Cleanup(func() { s.Close(); _ = p.Close() })
	return p, s.URL
}

// harnessAnswer is one answer as a client of the harness saw it.
type harnessAnswer struct {
	status   int
	upstream string // envoysim.UpstreamHeader: the endpoint that served
	cached   string // x-mock-cached-tokens
	body     string // errors and non-streamed answers
	events   int    // streamed: data lines before [DONE]
	complete bool   // streamed: [DONE] came; non-streamed: a whole completion
}

// harnessChat posts one chat request (with the extra headers hdr) through
// the harness and reads the answer. afterEvent, when set, is called with 0
// once the headers are in and with n after the n-th streamed event; it
// stops the reading (the caller resets the request) by returning false.
func harnessChat(ctx context.Context, c *http.Client, base, body string, hdr http.Header, afterEvent func(n int) bool) (harnessAnswer, error) {
	var a harnessAnswer
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return a, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return a, err
	}
	defer func() { _ = resp.Body.Close() }()
	a.status, a.upstream, a.cached = resp.StatusCode, resp.Header.Get(envoysim.UpstreamHeader), resp.Header.Get("X-Mock-Cached-Tokens")
	if afterEvent != nil && !afterEvent(0) {
		return a, nil
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		a.body = string(b)
		if err == nil && resp.StatusCode == http.StatusOK {
			var v struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			a.complete = json.Unmarshal(b, &v) == nil && len(v.Choices) == 1 && v.Choices[0].FinishReason != ""
		}
		return a, err
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			if strings.TrimSpace(line) == "data: [DONE]" {
				a.complete = true
			} else {
				a.events++
				if afterEvent != nil && !afterEvent(a.events) {
					return a, nil
				}
			}
		}
		if err == io.EOF {
			return a, nil
		}
		if err != nil {
			return a, err
		}
	}
}

// waitKVLive warms each engine with one request sent to it directly, so
// that its KV event stream is live, and waits for an event from each.
func waitKVLive(t *testing.T, c *http.Client, e *eppProc, f *kvFleet) {
	t.Helper()
	waitMetrics(t, c, e.api, time.Minute, "every worker ready", allReady(f.names...))
	warm := fmt.Sprintf(`{"model":"mock","max_tokens":1,"prompt":%q}`, strings.Repeat("A warm-up prompt of a few blocks. ", 8))
	for _, u := range f.urls {
		resp, err := c.Post(u+"/v1/completions", "application/json", strings.NewReader(warm))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	waitMetrics(t, c, e.api, time.Minute, "an event from every engine", func(m map[string]float64) bool {
		for _, n := range f.names {
			if m[`switchyard_worker_kv_events_total{rank="0",worker="`+n+`"}`] < 1 {
				return false
			}
		}
		return true
	})
}

var harnessModes = []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex}

// TestEPPHarnessConversationsStayOnTheirWorker: with a KV-aware policy
// and the engines' KV events, nine multi-turn conversations (each turn's
// prompt the previous one extended) run in rounds, one request at a time,
// through the harness in both body modes. Each conversation's first turn
// is pinned to worker i%3 with a subset hint, so they spread; every later
// turn, sent without a hint, goes to the worker holding its history, and
// that engine serves part of the prompt from its cache. With round-robin
// the later turns would rotate over the workers and the test fail.
func TestEPPHarnessConversationsStayOnTheirWorker(t *testing.T) {
	f, e, c := startKVEPP(t)
	waitKVLive(t, c, e, f)
	var bases []string
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m, Subset: subsetFromHeader})
		bases = append(bases, base)
	}

	const convs, turns = 9, 5
	history := make([][]map[string]string, convs)
	where := make([]string, convs) // conversation -> endpoint of its first turn
	for turn := range turns {
		for conv := range convs {
			if turn == 0 {
				system := fmt.Sprintf("Conversation %d. ", conv) + strings.Repeat("You are a careful assistant who answers in full sentences. ", 6)
				history[conv] = []map[string]string{{"role": "system", "content": system}}
			}
			history[conv] = append(history[conv], map[string]string{"role": "user",
				"content": fmt.Sprintf("Question %d: %s", turn, strings.Repeat("tell me more about it. ", 3+turn))})
			body, err := json.Marshal(map[string]any{"model": "mock", "max_tokens": 4, "stream": conv%3 == 0, "messages": history[conv]})
			if err != nil {
				t.Fatal(err)
			}
			hdr := http.Header{}
			if turn == 0 {
				hdr.Set(subsetHeader, f.endpoints[f.names[conv%3]])
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			a, err := harnessChat(ctx, c, bases[conv%2], string(body), hdr, nil)
			cancel()
			if err != nil || a.status != http.StatusOK || !a.complete {
				t.Fatalf("conversation %d turn %d: %v %d %q", conv, turn, err, a.status, a.body)
			}
			if turn == 0 {
				where[conv] = a.upstream
			} else {
				if a.upstream != where[conv] {
					t.Errorf("conversation %d turn %d went to %s, its history is on %s", conv, turn, a.upstream, where[conv])
				}
				if a.cached == "" || a.cached == "0" {
					t.Errorf("conversation %d turn %d: the engine served no cached tokens (%q)", conv, turn, a.cached)
				}
			}
			history[conv] = append(history[conv], map[string]string{"role": "assistant", "content": "I will answer that at length in a moment."})
		}
	}
	for conv := range convs {
		if want := f.endpoints[f.names[conv%3]]; where[conv] != want {
			t.Errorf("conversation %d started on %s, its hint named %s", conv, where[conv], want)
		}
	}
	waitMetrics(t, c, e.api, time.Minute, "every booking ended", idle)
}

// TestEPPHarnessAccountingUnderResets: 1,000 requests through the harness
// (both body modes, streamed and not, 16 at a time), a fifth of them
// reset by the client at a random point (before the answer, after its
// headers, after some events). Every request not reset gets 200 and a
// complete answer; afterwards the EPP's bookings (active requests of
// every worker, queue depth) return to 0.
func TestEPPHarnessAccountingUnderResets(t *testing.T) {
	f, e, c := startKVEPP(t)
	c.Timeout = time.Minute
	var proxies []*envoysim.Proxy
	var bases []string
	for _, m := range harnessModes {
		p, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m})
		proxies, bases = append(proxies, p), append(bases, base)
	}

	const total, conc = 1000, 16
	type plan struct {
		stream    bool
		maxTokens int
		reset     int           // 0 none; 1 a timer from the send; 2 after the headers; 3 after some events
		after     time.Duration // reset 1
		events    int           // reset 3
	}
	rng := rand.New(rand.NewPCG(16, 1000))
	plans := make([]plan, total)
	// Exactly a fifth of the requests, at random positions, are reset.
	reset := map[int]bool{}
	for _, i := range rng.Perm(total)[:total/5] {
		reset[i] = true
	}
	resets := 0
	for i := range plans {
		p := &plans[i]
		p.stream = i%4 < 2
		p.maxTokens = 4 + rng.IntN(40)
		if reset[i] {
			resets++
			p.reset = 1 + rng.IntN(3)
			if p.reset == 3 && !p.stream {
				p.reset = 2
			}
			p.after = time.Duration(rng.IntN(5000)) * time.Microsecond
			p.events = 1 + rng.IntN(3)
		}
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	var ok200, interrupted atomic.Int64
	for range conc {
		wg.Go(func() {
			for i := range jobs {
				p := plans[i]
				ctx, cancel := context.WithCancel(context.Background())
				var timer *time.Timer
				var hook func(int) bool
				switch p.reset {
				case 1:
					timer = time.AfterFunc(p.after, cancel)
				case 2:
					hook = func(int) bool { cancel(); return false }
				case 3:
					hook = func(n int) bool {
						if n >= p.events {
							cancel()
							return false
						}
						return true
					}
				}
				a, err := harnessChat(ctx, c, bases[i%2], chatJSON(p.stream, p.maxTokens, fmt.Sprintf("conversation %d turn %d", i%10, i)), nil, hook)
				if timer != nil {
					timer.Stop()
				}
				cancel()
				switch {
				case p.reset > 0:
					interrupted.Add(1)
				case err == nil && a.status == http.StatusOK && a.complete:
					ok200.Add(1)
				default:
					t.Errorf("request %d (not reset, %s, stream %v): %v status %d complete %v %q", i, harnessModes[i%2], p.stream, err, a.status, a.complete, a.body)
				}
			}
		})
	}
	for i := range total {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	m := waitMetrics(t, c, e.api, time.Minute, "every worker's active requests and the queue depth back to 0", idle)
	for _, n := range f.names {
		if _, ok := m[activeOf(n)]; !ok {
			t.Errorf("no %s series", activeOf(n))
		}
	}
	var picked int64
	for i, p := range proxies {
		s := p.Stats()
		picked += s.Picked
		if s.FailedOpen != 0 || s.Immediate != 0 || s.StreamErrors != 0 || s.LocalReplies != 0 {
			t.Errorf("%s harness: %+v, want nothing but picks", harnessModes[i], s)
		}
	}
	if want := ok200.Load(); picked < want || ok200.Load() != int64(total-resets) {
		t.Errorf("%d picked, %d answered 200 of %d not reset", picked, ok200.Load(), total-resets)
	}
	t.Logf("%d requests, %d reset; %d picked by the EPP", total, resets, picked)
}

// TestEPPHarnessNoWorkerAndQueueFull: an EPP whose workers all refuse
// connections answers 503 no_worker through the harness; an EPP with one
// slow worker and a queue of max_active_requests = 1, max_waiting = 1,
// holding one request with another waiting, answers a third 429
// queue_full. Both in the OpenAI error shape, in both body modes.
func TestEPPHarnessNoWorkerAndQueueFull(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	c := e2eClient(t)
	c.Timeout = 2 * time.Minute
	errorOf := func(body string) (typ, code string) {
		var v struct {
			Error struct {
				Type string `json:"type"`
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(body), &v)
		return v.Error.Type, v.Error.Code
	}

	dead := startEPPProc(t, routerBin, eppPolicyFile(t, workerBlocks([]string{"x", "y"}, map[string]string{"x": closedPort(t), "y": closedPort(t)})), "127.0.0.1:0")
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: dead.grpcAddr, Mode: m, FailOpen: true, Fallbacks: []string{"127.0.0.1:1"}})
		a, err := harnessChat(context.Background(), c, base, chatJSON(false, 4, "hello"), nil, nil)
		if typ, code := errorOf(a.body); err != nil || a.status != http.StatusServiceUnavailable || typ != "server_error" || code != "no_worker" {
			t.Errorf("%s, no worker ready: %v %d %q, want 503 server_error/no_worker", m, err, a.status, a.body)
		}
	}
	dead.stop(t)

	slow := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "0.05", "--engine-block-size", "16")
	queue := "queue {\n  max_active_requests = 1\n  max_waiting         = 1\n  class \"interactive\" {\n    weight = 1\n  }\n}\n"
	e := startEPPProc(t, routerBin, eppPolicyFile(t, queue, workerBlocks([]string{"slow"}, map[string]string{"slow": slow.url})), "127.0.0.1:0")
	waitMetrics(t, c, e.api, time.Minute, "the worker ready", allReady("slow"))
	queued := func(m map[string]float64) float64 {
		var n float64
		for k, v := range m {
			if strings.HasPrefix(k, "switchyard_queue_depth{") {
				n += v
			}
		}
		return n
	}
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m})
		ctx, cancel := context.WithCancel(context.Background())
		var held sync.WaitGroup
		for range 2 { // the first is placed and runs for minutes, the second waits
			held.Go(func() { _, _ = harnessChat(ctx, c, base, chatJSON(true, 4000, "a long answer"), nil, nil) })
		}
		waitMetrics(t, c, e.api, time.Minute, "one request on the worker, one waiting", func(m map[string]float64) bool {
			return m[activeOf("slow")] == 1 && queued(m) == 1
		})
		a, err := harnessChat(context.Background(), c, base, chatJSON(false, 4, "one too many"), nil, nil)
		if typ, code := errorOf(a.body); err != nil || a.status != http.StatusTooManyRequests || typ != "rate_limit_error" || code != "queue_full" {
			t.Errorf("%s, queue full: %v %d %q, want 429 rate_limit_error/queue_full", m, err, a.status, a.body)
		}
		cancel()
		held.Wait()
		waitMetrics(t, c, e.api, time.Minute, "every booking ended after the resets", idle)
	}
}

// TestEPPHarnessSubsetHints: the harness sends a subset hint naming one
// worker: every request lands there, for each worker in turn; a hint
// naming none of the workers, or empty, is 503 no_worker.
func TestEPPHarnessSubsetHints(t *testing.T) {
	f, e, c := startKVEPP(t)
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m, Subset: subsetFromHeader})
		for _, n := range f.names {
			for i := range 6 {
				hdr := http.Header{subsetHeader: {f.endpoints[n]}}
				a, err := harnessChat(context.Background(), c, base, chatJSON(i%2 == 0, 4, fmt.Sprintf("request %d for %s", i, n)), hdr, nil)
				if err != nil || a.status != http.StatusOK || !a.complete || a.upstream != f.endpoints[n] {
					t.Errorf("%s: hint %s: %v %d on %q, complete %v %q", m, f.endpoints[n], err, a.status, a.upstream, a.complete, a.body)
				}
			}
		}
		for _, hint := range []string{"127.0.0.1:1,10.0.0.1:8000", ""} {
			a, err := harnessChat(context.Background(), c, base, chatJSON(false, 4, "nowhere"), http.Header{subsetHeader: {hint}}, nil)
			if err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"code":"no_worker"`) {
				t.Errorf("%s: hint %q: %v %d %q, want 503 no_worker", m, hint, err, a.status, a.body)
			}
		}
	}
	waitMetrics(t, c, e.api, time.Minute, "every booking ended", idle)
}

// TestEPPHarnessServedEndpoint: the harness reports another worker than
// the one that served as x-gateway-destination-endpoint-served (as a
// proxy whose load balancer overrode the pick would). The EPP takes it on
// every response phase: every answer is complete and the bookings return
// to 0. (The unit test envoysim.TestFallbackWhenPrimaryRefuses covers the
// served endpoint being a fallback after the primary refused.)
func TestEPPHarnessServedEndpoint(t *testing.T) {
	f, e, c := startKVEPP(t)
	next := map[string]string{}
	for i, n := range f.names {
		next[f.endpoints[n]] = f.endpoints[f.names[(i+1)%len(f.names)]]
	}
	var mu sync.Mutex
	reported := map[string]int{}
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m, ServedAs: func(used string) string {
			mu.Lock()
			defer mu.Unlock()
			reported[next[used]]++
			return next[used]
		}})
		for i := range 15 {
			a, err := harnessChat(context.Background(), c, base, chatJSON(i%2 == 0, 8, fmt.Sprintf("served %d", i)), nil, nil)
			if err != nil || a.status != http.StatusOK || !a.complete {
				t.Fatalf("%s request %d: %v %d complete %v %q", m, i, err, a.status, a.complete, a.body)
			}
		}
	}
	waitMetrics(t, c, e.api, time.Minute, "every booking ended", idle)
	mu.Lock()
	defer mu.Unlock()
	var n int
	for _, v := range reported {
		n += v
	}
	if n != 30 {
		t.Errorf("%d served endpoints reported, want 30", n)
	}
}

// TestEPPHarnessRestartFailsOpen: under a load of requests through the
// harness (buffered, failure_mode_allow with the three workers as
// fallbacks, the EPP's ext_proc health checked), the EPP is SIGKILLed and
// started again on the same --listen address. Requests go on to the
// fallbacks while it is down (counted), picks resume once it is back
// (readiness SERVING over gRPC health), every request succeeds, and the
// new EPP's bookings return to 0.
func TestEPPHarnessRestartFailsOpen(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	f := startKVFleet(t, routerBin)
	policy := eppPolicyFile(t, f.tokenizer, kvAwarePolicy, f.blocks)
	e := startEPPProc(t, routerBin, policy, "127.0.0.1:0")
	c := e2eClient(t)
	c.Timeout = time.Minute
	waitMetrics(t, c, e.api, time.Minute, "every worker ready", allReady(f.names...))
	var fallbacks []string
	for _, n := range f.names {
		fallbacks = append(fallbacks, f.endpoints[n])
	}
	p, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: envoysim.Buffered, FailOpen: true,
		Fallbacks: fallbacks, HealthService: epp.ExtProcService})

	var stop atomic.Bool
	var sent, failed atomic.Int64
	var failures sync.Map
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				sent.Add(1)
				a, err := harnessChat(context.Background(), c, base, chatJSON(i%2 == 0, 8, fmt.Sprintf("load %d.%d", w, i)), nil, nil)
				if err != nil || a.status != http.StatusOK || !a.complete {
					failed.Add(1)
					failures.Store(fmt.Sprintf("%d.%d", w, i), fmt.Sprintf("%v %d complete %v %q", err, a.status, a.complete, a.body))
				}
			}
		})
	}
	waitFor := func(what string, ok func(envoysim.Stats) bool) envoysim.Stats {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			s := p.Stats()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("after a minute: %s; harness %+v", what, s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("50 picks", func(s envoysim.Stats) bool { return s.Picked >= 50 })
	e.kill()
	down := waitFor("30 requests failed open", func(s envoysim.Stats) bool { return s.FailedOpen >= 30 })
	e2 := startEPPProc(t, routerBin, policy, e.grpcAddr)
	back := waitFor("50 more picks by the restarted EPP", func(s envoysim.Stats) bool { return s.Picked >= down.Picked+50 })
	stop.Store(true)
	wg.Wait()
	failures.Range(func(k, v any) bool {
		t.Errorf("request %s: %s", k, v)
		return true
	})
	waitMetrics(t, c, e2.api, time.Minute, "the restarted EPP's bookings back to 0", idle)
	s := p.Stats()
	if s.Immediate != 0 || s.LocalReplies != 0 {
		t.Errorf("harness %+v: want no immediate or local replies", s)
	}
	t.Logf("%d requests, %d failed; picked %d before the kill, %d failed open while down, %d picks after the restart; harness %+v",
		sent.Load(), failed.Load(), down.Picked, down.FailedOpen, back.Picked-down.Picked, s)
}

// TestEPPHarnessWorkerDiesFallbacks: a worker is SIGKILLed while the EPP
// still has it ready. With round-robin and the EPP's default two
// fallbacks, the requests it picks there are refused and the harness goes
// down the destination list, as Envoy retries on connect failure: every
// request still gets a whole answer, some through a fallback (the
// served endpoint moves their bookings), and the dead worker leaves the
// EPP's candidates (consecutive failures: the served-elsewhere reports
// and its probes). The bookings return to 0.
func TestEPPHarnessWorkerDiesFallbacks(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	ms := startMocks(t, routerBin, 3, "50")
	names := []string{"a", "b", "c"}
	urls := map[string]string{}
	for i, n := range names {
		urls[n] = ms[i].url
	}
	rr := "policy \"rr\" {\n  picker \"pick\" {\n    type = \"round-robin\"\n  }\n}\n\nworker_selection {\n  aggregated = \"rr\"\n}\n"
	e := startEPPProc(t, routerBin, eppPolicyFile(t, rr, workerBlocks(names, urls)), "127.0.0.1:0")
	c := e2eClient(t)
	waitMetrics(t, c, e.api, time.Minute, "every worker ready", allReady(names...))
	p, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: envoysim.Buffered})
	dead, err := epp.Endpoint(ms[0].url)
	if err != nil {
		t.Fatal(err)
	}
	ms[0].kill()
	// Round-robin picks the dead worker every third request until it
	// leaves: the first three requests include one.
	for i := range 12 {
		a, err := harnessChat(context.Background(), c, base, chatJSON(i%2 == 0, 4, fmt.Sprintf("after the kill %d", i)), nil, nil)
		if err != nil || a.status != http.StatusOK || !a.complete || a.upstream == dead {
			t.Fatalf("request %d: %v %d complete %v upstream %s (dead %s) %q", i, err, a.status, a.complete, a.upstream, dead, a.body)
		}
	}
	if s := p.Stats(); s.Picked != 12 || s.FellBack == 0 || s.FailedOpen != 0 {
		t.Errorf("harness stats %+v: want 12 picks, some served by a fallback, none failed open", s)
	}
	waitMetrics(t, c, e.api, time.Minute, "the dead worker out, every booking ended", func(m map[string]float64) bool {
		return m[readyOf("a")] == 0 && idle(m)
	})
}
