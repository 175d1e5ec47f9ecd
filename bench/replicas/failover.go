package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
)

// The failover scenario (--failover), issue #17 §4: --replicas replicas
// with the cluster block share over NATS; a workload of multi-turn
// conversations runs without pause, each request sent to the next replica
// in turn that is up (a round-robin load balancer whose health check has
// seen the dead one go). After --warmup and one --window, replica r0 is
// SIGKILLed; one --window later it is started again under its name and
// port, and, once ready, takes requests again for a last window.
//
// It reports the KV hit ratio (from the answers' usage) over the window
// before the kill, the window after it and the window after the restart;
// the requests that failed at a surviving replica (target: none); those
// in flight on the killed one (lost with it: allowed); how long the
// survivors took to drop the dead replica and expire its bookings; and
// the restarted replica's warm start: the snapshot it loaded, when it
// caught up (its log) and when /readyz answered 200.

// turnsPerConversation is the turns of one conversation before the next.
const turnsPerConversation = 10

// sample is one answered request.
type sample struct {
	at             time.Time
	prompt, cached int
}

// rotation is the round-robin over the replicas that are up.
type rotation struct {
	mu   sync.Mutex
	up   []bool
	next int
}

func (r *rotation) pick() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for range r.up {
		i := r.next % len(r.up)
		r.next++
		if r.up[i] {
			return i
		}
	}
	return -1
}

func (r *rotation) set(i int, up bool) {
	r.mu.Lock()
	r.up[i] = up
	r.mu.Unlock()
}

// failoverLoad is the running workload.
type failoverLoad struct {
	o      options
	c      *http.Client
	bases  []string
	rot    *rotation
	killed atomic.Int32 // the replica killed, -1 before

	mu               sync.Mutex
	samples          []sample
	failedSurvivor   int
	lostOnKilled     int
	redispatched     int
	firstSurvivorErr error
}

// run drives conversations until ctx ends.
func (l *failoverLoad) run(ctx context.Context) {
	systems := make([]string, 4)
	for i := range systems {
		systems[i] = fmt.Sprintf("System prompt %d. ", i) + strings.Repeat("You are a careful assistant who answers in full, plain sentences. ", 12)
	}
	var conv atomic.Int64
	var wg sync.WaitGroup
	for range l.o.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				id := conv.Add(1)
				rng := rand.New(rand.NewPCG(l.o.seed, uint64(id)))
				msgs := []map[string]string{{"role": "system", "content": systems[rng.IntN(len(systems))]}}
				for turn := 0; turn < turnsPerConversation && ctx.Err() == nil; turn++ {
					msgs = append(msgs, map[string]string{"role": "user",
						"content": fmt.Sprintf("Conversation %d, question %d: %s", id, turn, strings.Repeat("please go on with the story. ", 3+rng.IntN(12)))})
					body, _ := json.Marshal(map[string]any{"model": "mock", "max_tokens": 8, "messages": msgs})
					l.send(ctx, body)
					msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.Repeat("Here is more of it. ", 2+rng.IntN(6))})
				}
			}
		})
	}
	wg.Wait()
}

// send posts one request to the next replica up; a refused connection
// (the replica is gone and the request never reached it) goes to the
// next, as a load balancer redispatches it.
func (l *failoverLoad) send(ctx context.Context, body []byte) {
	for tries := 0; tries < len(l.bases); tries++ {
		i := l.rot.pick()
		if i < 0 {
			return
		}
		prompt, cached, err := postUsage(ctx, l.c, l.bases[i], body)
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		switch {
		case err == nil:
			l.samples = append(l.samples, sample{at: time.Now(), prompt: prompt, cached: cached})
		case errors.Is(err, syscall.ECONNREFUSED):
			l.redispatched++
			l.mu.Unlock()
			continue
		case int32(i) == l.killed.Load():
			l.lostOnKilled++
		default:
			l.failedSurvivor++
			if l.firstSurvivorErr == nil {
				l.firstSurvivorErr = err
			}
		}
		l.mu.Unlock()
		return
	}
}

// hit is the KV hit ratio of the answers in [from, to).
func (l *failoverLoad) hit(from, to time.Time) (ratio float64, requests int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var p, c int
	for _, s := range l.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			p += s.prompt
			c += s.cached
			requests++
		}
	}
	if p == 0 {
		return 0, requests
	}
	return float64(c) / float64(p), requests
}

// postUsage posts a chat request and returns its usage's prompt and
// cached tokens.
func postUsage(ctx context.Context, c *http.Client, base string, body []byte) (int, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: %s: %s", base, resp.Status, b)
	}
	var a struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return 0, 0, fmt.Errorf("%s: the answer does not decode: %w", base, err)
	}
	return a.Usage.PromptTokens, a.Usage.PromptTokensDetails.CachedTokens, nil
}

// readiness is the part of /readyz the scenario reads.
type readiness struct {
	Ready   bool `json:"ready"`
	Cluster *struct {
		CaughtUp bool `json:"caught_up"`
		Snapshot *struct {
			Writer    string `json:"writer"`
			DeltasSeq uint64 `json:"deltas_seq"`
			Workers   int    `json:"workers"`
		} `json:"snapshot"`
	} `json:"cluster"`
}

func getReadyz(c *http.Client, base string) (readiness, int, error) {
	var r readiness
	resp, err := c.Get(base + "/readyz")
	if err != nil {
		return r, 0, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r)
	return r, resp.StatusCode, err
}

// caughtUpAfter reads how long after it began the replica logged that it
// caught up with the cluster.
var caughtUpAfter = regexp.MustCompile(`caught up with the cluster: after=(\S+)`)

func failover(ctx context.Context, o options, natsURL string) error {
	dir, err := os.MkdirTemp("", "bench-failover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var procs benchproc.Children
	defer procs.StopAll()
	blocks, err := startWorkers(ctx, o, dir, &procs)
	if err != nil {
		return err
	}
	// Each replica on --ports, or on a port the kernel picks; r0 comes back
	// on its port (a port another process took meanwhile fails the start,
	// naming that process).
	listen := func(i int) string {
		if o.ports != nil {
			return "127.0.0.1:" + strconv.Itoa(o.ports[i])
		}
		return "127.0.0.1:0"
	}
	const ttl, heartbeat = 10 * time.Second, time.Second // the cluster block's defaults
	clusterBlock := func(i int) string {
		return fmt.Sprintf("\ncluster {\n  nats    = %q\n  replica = \"r%d\"\n  name    = \"failover\"\n}\n", natsURL, i)
	}
	bases := make([]string, o.replicas)
	for i := range bases {
		if bases[i], err = startRouter(ctx, o, dir, i, blocks+clusterBlock(i), listen(i), &procs); err != nil {
			return err
		}
	}
	r0, err := url.Parse(bases[0])
	if err != nil {
		return fmt.Errorf("r0's address %q: %w", bases[0], err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: 2 * time.Minute}
	if err := waitReady(ctx, client, bases, o.workers, true); err != nil {
		return err
	}
	rot := &rotation{up: make([]bool, len(bases))}
	for i := range rot.up {
		rot.up[i] = true
	}
	load := &failoverLoad{o: o, c: client, bases: bases, rot: rot}
	load.killed.Store(-1)
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan struct{})
	go func() { load.run(lctx); close(loadDone) }()

	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	fmt.Fprintf(os.Stderr, "failover: warming up for %s, then a %s window before the kill\n", o.warmup, o.window)
	if err := sleep(o.warmup + o.window); err != nil {
		return err
	}
	before0, killedAt := time.Now().Add(-o.window), time.Now()
	load.killed.Store(0)
	if err := procs.Kill(bases[0]); err != nil {
		return err
	}
	rot.set(0, false)
	fmt.Fprintf(os.Stderr, "failover: r0 SIGKILLed; %s window on the survivors\n", o.window)

	// The survivors drop r0 (its heartbeats stop) and expire its
	// bookings.
	expiredBefore := 0.0
	for _, b := range bases[1:] {
		m, _ := benchproc.Scrape(client, b)
		expiredBefore += m["switchyard_cluster_expired_bookings_total"]
	}
	var dropped time.Duration
	expired := 0.0
	for dropped == 0 && time.Since(killedAt) < o.window {
		n, exp := 0, 0.0
		for _, b := range bases[1:] {
			m, err := benchproc.Scrape(client, b)
			if err == nil && m["switchyard_cluster_peers"] == float64(len(bases)-2) {
				n++
			}
			exp += m["switchyard_cluster_expired_bookings_total"]
		}
		if n == len(bases)-1 {
			dropped, expired = time.Since(killedAt), exp-expiredBefore
		}
		_ = sleep(100 * time.Millisecond)
	}
	if err := sleep(time.Until(killedAt.Add(o.window))); err != nil {
		return err
	}

	// r0 again, under its name and port.
	restartAt := time.Now()
	if bases[0], err = startRouter(ctx, o, dir, 0, blocks+clusterBlock(0), r0.Host, &procs); err != nil {
		return fmt.Errorf("restarting r0: %w", err)
	}
	var readyAfter time.Duration
	var rz readiness
	last := "no answer"
	for readyAfter == 0 && time.Since(restartAt) < time.Minute {
		r, code, err := getReadyz(client, bases[0])
		if err == nil && code == http.StatusOK {
			readyAfter, rz = time.Since(restartAt), r
			break
		}
		last = fmt.Sprintf("status %d, error %v, ready %v", code, err, r.Ready)
		if r.Cluster != nil {
			last += fmt.Sprintf(", caught up %v, snapshot loaded %v", r.Cluster.CaughtUp, r.Cluster.Snapshot != nil)
		}
		_ = sleep(20 * time.Millisecond)
	}
	if readyAfter == 0 {
		logb, _ := os.ReadFile(filepath.Join(dir, "router0.log"))
		return fmt.Errorf("the restarted r0 was not ready within a minute (last /readyz: %s); its log's end:\n%s", last, logb[max(0, len(logb)-3000):])
	}
	caught := "not logged"
	if logb, err := os.ReadFile(filepath.Join(dir, "router0.log")); err == nil {
		if m := caughtUpAfter.FindAllSubmatch(logb, -1); len(m) > 0 {
			caught = string(m[len(m)-1][1])
		}
	}
	load.killed.Store(-1)
	rot.set(0, true)
	back := time.Now()
	fmt.Fprintf(os.Stderr, "failover: r0 back and ready; a last %s window\n", o.window)
	if err := sleep(o.window); err != nil {
		return err
	}
	end := time.Now()
	stopLoad()
	<-loadDone

	hb, nb := load.hit(before0, killedAt)
	ha, na := load.hit(killedAt, killedAt.Add(o.window))
	hr, nr := load.hit(back, end)
	snap := "none"
	if rz.Cluster != nil && rz.Cluster.Snapshot != nil {
		snap = fmt.Sprintf("by %s at deltas sequence %d, %d workers", rz.Cluster.Snapshot.Writer, rz.Cluster.Snapshot.DeltasSeq, rz.Cluster.Snapshot.Workers)
	}
	out := os.Stdout
	fmt.Fprintf(out, "failover: %d replicas sharing over NATS, %d engines, %d conversations at once (%d turns each), windows of %s\n",
		o.replicas, o.workers, o.concurrency, turnsPerConversation, o.window)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\trequests\tKV hit\tof before\t")
	for _, w := range []struct {
		name string
		hit  float64
		n    int
	}{{"before the kill", hb, nb}, {"after the kill", ha, na}, {"after the restart", hr, nr}} {
		of := 0.0
		if hb > 0 {
			of = 100 * w.hit / hb
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t\n", w.name, w.n, 100*w.hit, of)
	}
	_ = tw.Flush()
	load.mu.Lock()
	failed, lost, redispatched, firstErr := load.failedSurvivor, load.lostOnKilled, load.redispatched, load.firstSurvivorErr
	load.mu.Unlock()
	fmt.Fprintf(out, "requests failed at a surviving replica: %d; in flight on the killed replica (lost with it): %d; refused by it and sent to the next: %d\n",
		failed, lost, redispatched)
	fmt.Fprintf(out, "the survivors dropped r0 %.1f s after the kill and expired its bookings (%.0f, summed over the survivors) (booking_ttl %s, heartbeat %s)\n",
		dropped.Seconds(), expired, ttl, heartbeat)
	fmt.Fprintf(out, "r0 restarted: snapshot loaded %s; caught up %s after it began; /readyz 200 %.0f ms after its process started\n",
		snap, caught, float64(readyAfter.Microseconds())/1000)

	var missed []string
	if failed > 0 {
		missed = append(missed, fmt.Sprintf("%d requests failed at a surviving replica, the first: %v", failed, firstErr))
	}
	if hb == 0 || ha < 0.95*hb {
		missed = append(missed, "the hit ratio after the kill is not within 5% of before")
	}
	if dropped == 0 || dropped > ttl+2*heartbeat {
		missed = append(missed, "the survivors did not drop the dead replica within the booking TTL")
	}
	if rz.Cluster == nil || !rz.Cluster.CaughtUp || rz.Cluster.Snapshot == nil {
		missed = append(missed, "the restarted replica did not start warm (a snapshot loaded, caught up)")
	}
	if readyAfter > 2*time.Second {
		missed = append(missed, "the restarted replica was not ready within 2 s")
	}
	if len(missed) > 0 {
		fmt.Fprintf(out, "targets: MISSED: %s\n", strings.Join(missed, "; "))
		return errors.New("targets missed")
	}
	fmt.Fprintln(out, "targets: no request failed at a survivor; hit ratio within 5% after the kill; dead replica dropped within the TTL; warm restart ready within 2 s: met")
	return nil
}
