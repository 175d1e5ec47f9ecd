package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard-router/switchyard/bench/internal/benchproc"
)

// fleet is one run's processes: the mock engines and the router in front
// of them.
type fleet struct {
	o       options
	dir     string
	procs   benchproc.Children
	client  *http.Client
	engines []engine
	policy  string
	workers string
	router  string // the router's URL
	debug   string // its --debug-listen URL
	routers int    // routers started, for log names
}

type engine struct{ name, url string }

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// engineArgs says how the engines publish their KV events.
type engineArgs struct {
	bufferSteps int  // 0: the mock's default (vLLM's 10,000)
	noSnapshots bool // the snapshot service answers unavailable
}

// startEngines starts o.engines mock engines, vLLM-like: 16-token
// blocks, o.kvBlocks of them, the test tokenizer (/tokenize), LoRA
// adapters, KV events with replay and the snapshot service on ports they
// pick and report (/kv_event_sources), and writes a workers file that
// gives each only its URL, and an empty policy file.
func (f *fleet) startEngines(ctx context.Context, a engineArgs) error {
	tok, err := filepath.Abs(f.o.tokenizer)
	if err != nil {
		return err
	}
	tokCfg, err := filepath.Abs(f.o.tokenizerCfg)
	if err != nil {
		return err
	}
	var wf strings.Builder
	for i := range f.o.engines {
		args := []string{"mock-worker", "--listen", "127.0.0.1:0", "--model", baseModel, "--speedup", f.o.speedup,
			"--engine-block-size", strconv.Itoa(blockTokens), "--kv-blocks", strconv.Itoa(f.o.kvBlocks),
			"--tokenizer", tok, "--tokenizer-config", tokCfg, "--lora", strings.Join(f.o.adapters, ","),
			"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
			"--kv-events-snapshot-endpoint", "tcp://127.0.0.1:0"}
		if a.bufferSteps > 0 {
			args = append(args, "--kv-events-buffer-steps", strconv.Itoa(a.bufferSteps))
		}
		if a.noSnapshots {
			args = append(args, "--kv-events-snapshot-unavailable")
		}
		name := fmt.Sprintf("e%d", i)
		u, err := f.procs.Start(ctx, filepath.Join(f.dir, name+".log"), listening, f.o.mockBin, args...)
		if err != nil {
			return err
		}
		f.engines = append(f.engines, engine{name: name, url: u})
		fmt.Fprintf(&wf, "worker %q {\n  url = %q\n}\n", name, u)
	}
	f.workers = filepath.Join(f.dir, "workers.hcl")
	if err := os.WriteFile(f.workers, []byte(wf.String()), 0o644); err != nil {
		return err
	}
	// Nothing in the policy: the engines' block size, tokenizer, adapters,
	// capacity and KV event sources are what they report.
	f.policy = filepath.Join(f.dir, "policy.hcl")
	return os.WriteFile(f.policy, nil, 0o644)
}

// startRouter starts `router serve` on the engines and returns when
// /readyz is 200 with every engine ready (the time it first was).
func (f *fleet) startRouter(ctx context.Context) (time.Time, error) {
	f.routers++
	log := filepath.Join(f.dir, fmt.Sprintf("router%d.log", f.routers))
	got, err := f.procs.StartAll(ctx, log, []*regexp.Regexp{listening, benchproc.ServeProfiler}, f.o.routerBin, "serve", "--policy", f.policy,
		"--workers-file", f.workers, "--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0",
		"--log-level", f.o.logLevel)
	if err != nil {
		return time.Time{}, err
	}
	f.router, f.debug = got[0], "http://"+got[1]
	deadline := time.Now().Add(time.Minute)
	var last string
	for {
		ok, why := f.ready(ctx)
		if ok {
			return time.Now(), nil
		}
		last = why
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			return time.Time{}, fmt.Errorf("router not ready with every engine within a minute: %s\nlog:\n%s", last, tail(b, 4000))
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ready reports whether /readyz is 200 with every engine ready.
func (f *fleet) ready(ctx context.Context) (bool, string) {
	var rz struct {
		Ready   bool `json:"ready"`
		Workers []struct {
			URL   string `json:"url"`
			Ready bool   `json:"ready"`
		} `json:"workers"`
	}
	status, err := getJSON(ctx, f.client, f.router+"/readyz", &rz)
	if err != nil {
		return false, err.Error()
	}
	n := 0
	for _, w := range rz.Workers {
		if w.Ready {
			n++
		}
	}
	if status != http.StatusOK || n != len(f.engines) {
		return false, fmt.Sprintf("/readyz %d, %d of %d engines ready", status, n, len(f.engines))
	}
	return true, ""
}

// stopRouter stops the router with SIGTERM and waits for it.
func (f *fleet) stopRouter() error {
	addr := f.router
	if err := f.procs.Signal(addr, syscall.SIGTERM); err != nil {
		return err
	}
	_, err := f.procs.Wait(addr, time.Minute)
	return err
}

// kvStates returns each engine's KV-event stream state as the router's
// switchyard_worker_kv_state says it (rank 0), by engine name.
func (f *fleet) kvStates() (map[string]string, error) {
	m, err := benchproc.Scrape(f.client, f.router)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range f.engines {
		for _, s := range []string{"connecting", "cold", "bootstrapping", "live", "stale"} {
			if m[`switchyard_worker_kv_state{rank="0",state="`+s+`",worker="`+e.name+`"}`] == 1 {
				out[e.name] = s
			}
		}
	}
	return out, nil
}

// waitLive waits until every engine's stream is live.
func (f *fleet) waitLive(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := f.kvStates()
		live := err == nil
		for _, e := range f.engines {
			live = live && st[e.name] == "live"
		}
		if live {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("KV events not live within %v: %v (%v)", limit, st, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// blockKey is one block of one data-parallel rank, named by the engine's
// hash (folded to 64 bits as vLLM's int hashes are).
type blockKey struct {
	rank int
	hash uint64
}

// truth returns the blocks e's cache holds (GET /debug/kv_blocks, the
// mock's own view of its cache, not its events), copies per block, and
// the cached blocks it has evicted since it started.
func (f *fleet) truth(ctx context.Context, e engine) (map[blockKey]int, int64, error) {
	var body struct {
		Ranks []struct {
			Rank    int   `json:"data_parallel_rank"`
			Evicted int64 `json:"evicted_blocks"`
			Blocks  []struct {
				Hash   uint64 `json:"hash"`
				Medium string `json:"medium"`
				Copies int    `json:"copies"`
			} `json:"blocks"`
		} `json:"ranks"`
	}
	status, err := getJSON(ctx, f.client, e.url+"/debug/kv_blocks", &body)
	if err != nil || status != http.StatusOK {
		return nil, 0, fmt.Errorf("%s /debug/kv_blocks: status %d: %v", e.name, status, err)
	}
	out := map[blockKey]int{}
	var evicted int64
	for _, r := range body.Ranks {
		evicted += r.Evicted
		for _, b := range r.Blocks {
			out[blockKey{r.Rank, b.Hash}] = b.Copies
		}
	}
	return out, evicted, nil
}

// belief is what the router believes one engine holds.
type belief struct {
	gpu map[blockKey]int // GPU blocks and their copies
	// other counts entries on another tier (the mock has none); notHeld
	// GPU blocks listed as not counting for routing; flagged those listed
	// by a fold or as aliases (not the engine's exact value).
	other, notHeld, flagged int
	// state is the ranks' KV-event stream states as the listing began
	// ("live" when all are), reason why one is not live.
	state, reason string
}

// belief reads the blocks the router believes e holds (GET
// /debug/workers/NAME/blocks on --debug-listen: {"ranks": [...],
// "blocks": [{"hash": an int, or lowercase hex of a bytes hash, "medium",
// "rank", "copies", "held", "folded", "aliased"}], "complete"}), asking
// again (up to 10 times) while it says it is not complete (an index
// cleared while it was listed).
func (f *fleet) belief(ctx context.Context, e engine) (belief, error) {
	type entry struct {
		Hash    json.RawMessage `json:"hash"`
		Medium  string          `json:"medium"`
		Rank    int             `json:"rank"`
		Copies  int             `json:"copies"`
		Held    *bool           `json:"held"`
		Folded  bool            `json:"folded"`
		Aliased bool            `json:"aliased"`
	}
	var body struct {
		Ranks []struct {
			State  string `json:"state"`
			Reason string `json:"reason"`
		} `json:"ranks"`
		Blocks   []entry `json:"blocks"`
		Complete bool    `json:"complete"`
	}
	u := f.debug + "/debug/workers/" + url.PathEscape(e.name) + "/blocks"
	for try := 0; ; try++ {
		body.Ranks, body.Blocks, body.Complete = nil, nil, false
		status, err := getJSON(ctx, f.client, u, &body)
		if err != nil || status != http.StatusOK {
			return belief{}, fmt.Errorf("router /debug/workers/%s/blocks: status %d: %v", e.name, status, err)
		}
		if body.Complete || try == 9 {
			break
		}
	}
	if !body.Complete {
		return belief{}, fmt.Errorf("router /debug/workers/%s/blocks: not complete 10 times in a row", e.name)
	}
	b := belief{gpu: map[blockKey]int{}, state: "live"}
	for _, r := range body.Ranks {
		if r.State != "live" {
			b.state, b.reason = r.State, r.Reason
		}
	}
	for _, x := range body.Blocks {
		if !strings.EqualFold(x.Medium, "GPU") {
			b.other++
			continue
		}
		h, err := engineHash(x.Hash)
		if err != nil {
			return belief{}, fmt.Errorf("router /debug/workers/%s/blocks: %w", e.name, err)
		}
		b.gpu[blockKey{x.Rank, h}] += x.Copies
		if x.Held != nil && !*x.Held {
			b.notHeld++
		}
		if x.Folded || x.Aliased {
			b.flagged++
		}
	}
	return b, nil
}

// engineHash reads a hash as the router lists it: an int (vLLM's default
// int hashes, the low 64 bits; a negative one is SGLang's signed value),
// or a bytes hash in lowercase hex, folded as vLLM's
// maybe_convert_block_hash does (its last 8 bytes, big-endian).
func engineHash(raw json.RawMessage) (uint64, error) {
	s := string(raw)
	if strings.HasPrefix(s, `"`) {
		var h string
		if err := json.Unmarshal(raw, &h); err != nil {
			return 0, fmt.Errorf("hash %.40s: %w", s, err)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			return 0, fmt.Errorf("hash %.40q: not hex: %w", h, err)
		}
		var v uint64
		for _, c := range b[max(0, len(b)-8):] {
			v = v<<8 | uint64(c)
		}
		return v, nil
	}
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("hash %.40s: not a 64-bit int or a hex string", s)
	}
	return uint64(v), nil
}

// diff is one engine's belief against its cache.
type diff struct {
	engine          string
	truth, believed int
	missing, extra  int // blocks held and not believed; believed and not held
	otherMedium     int // believed on another tier (the mock has none)
	copiesWrong     int // believed and held, with other copies
	notHeld         int // believed but listed as not counting for routing
	flagged         int // listed by a fold or as an alias
	evicted         int64
	// state is the router's stream state for the engine as its listing
	// began (the ranks': "live" when all are), reason why it is not live.
	state, reason string
}

func (d diff) exact() bool {
	return d.missing == 0 && d.extra == 0 && d.otherMedium == 0 && d.copiesWrong == 0 && d.notHeld == 0 && d.flagged == 0
}

// compare reads every engine's cache and the router's belief of it.
func (f *fleet) compare(ctx context.Context) ([]diff, error) {
	out := make([]diff, 0, len(f.engines))
	for _, e := range f.engines {
		t, evicted, err := f.truth(ctx, e)
		if err != nil {
			return nil, err
		}
		b, err := f.belief(ctx, e)
		if err != nil {
			return nil, err
		}
		d := diff{engine: e.name, truth: len(t), believed: len(b.gpu), otherMedium: b.other, notHeld: b.notHeld, flagged: b.flagged,
			evicted: evicted, state: b.state, reason: b.reason}
		for k, n := range t {
			bn, ok := b.gpu[k]
			switch {
			case !ok:
				d.missing++
			case bn != n:
				d.copiesWrong++
			}
		}
		for k := range b.gpu {
			if _, ok := t[k]; !ok {
				d.extra++
			}
		}
		out = append(out, d)
	}
	return out, nil
}

func allExact(ds []diff) bool {
	for _, d := range ds {
		if !d.exact() {
			return false
		}
	}
	return len(ds) > 0
}

// getJSON GETs u into v (16 MiB at most) and returns the status; v is
// decoded only on 200.
func getJSON(ctx context.Context, c *http.Client, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.Unmarshal(b, v)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
