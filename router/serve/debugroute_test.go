package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/shared"
)

// routeGet GETs /debug/route with query q.
func routeGet(t *testing.T, debug string, q url.Values) (int, DebugRoute, string) {
	t.Helper()
	resp, err := http.Get(debug + "/debug/route?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	return routeAnswer(t, resp)
}

// routePost POSTs body to /debug/route.
func routePost(t *testing.T, debug, body string) (int, DebugRoute, string) {
	t.Helper()
	resp, err := http.Post(debug+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return routeAnswer(t, resp)
}

func routeAnswer(t *testing.T, resp *http.Response) (int, DebugRoute, string) {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out DebugRoute
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	return resp.StatusCode, out, string(raw)
}

// engineCompletions counts the completion requests an engine got.
func engineCompletions(e *mockEngine) int {
	n := 0
	for _, c := range e.callsSoFar() {
		if c.path == "/v1/completions" || c.path == "/v1/chat/completions" {
			n++
		}
	}
	return n
}

// idsPrompt is a completions body of the token ids from..to-1.
func idsPrompt(model string, from, to int) string {
	ids := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":1,"prompt":[%s]}`, model, strings.Join(ids, ","))
}

// TestDaemonDebugRoute: a daemon with the default policy (kv-cost,
// min-cost) over two vLLM mock engines given by URL only, whose KV events
// and snapshots the router follows. A first turn (100 token ids: 6 full
// blocks of 16) goes through the live path to one engine; /debug/route
// for its follow-up (the 100 ids and 20 more) then names that engine,
// with 96 tokens precisely held on its GPU and none on the other, the
// key at the engines' block size 16, 120 tokens, 7 blocks, keyed by the
// request's token ids. Asked twice, GET and POST, it changes nothing: no
// engine got a request, /debug/workers shows the same requests in flight
// and index sizes, and the index (approximate lists and precise
// indexes) holds what it held. The follow-up sent for real then goes
// where the dry run said, and the engine served the 96 tokens from
// cache. A text prompt (no tokenizer) is keyed by characters; a model
// nobody serves gets the live path's 404; a body the live path refuses
// is a 400.
func TestDaemonDebugRoute(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.BlockSize = 16
	engines := map[string]*mockEngine{}
	var blocks strings.Builder
	for _, name := range []string{"a", "b"} {
		m, err := mockworker.New(mockworker.Config{Model: "m", Speedup: 50, Sim: cfg,
			KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		engines[name] = newRecorded(t, m)
		fmt.Fprintf(&blocks, "worker %q {\n  url = %q\n}\n", name, engines[name].URL)
	}
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, blocks.String())
	dln, debug := debugListener(t)
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy, DebugListener: dln})
	rd.waitWorkers(t, "a", "b")
	for _, name := range []string{"a", "b"} {
		waitBlocks(t, rd, debug, name, name+" live", func(b live.DebugBlocks) bool {
			return len(b.Ranks) == 1 && b.Ranks[0].State == "live"
		})
	}

	// The first turn, through the live path.
	resp, err := http.Post(rd.base+"/v1/completions", "application/json", strings.NewReader(idsPrompt("m", 1, 101)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	served := resp.Header.Get("X-Switchyard-Worker")
	other := map[string]string{"a": "b", "b": "a"}[served]
	if resp.StatusCode != http.StatusOK || other == "" {
		t.Fatalf("first turn: %d from %q", resp.StatusCode, served)
	}
	waitBlocks(t, rd, debug, served, "the first turn's 6 blocks", func(b live.DebugBlocks) bool { return len(b.Blocks) == 6 })

	type fleetView struct {
		active, index  map[string]int64
		approx         map[string]int
		precise        map[string]int
		engineRequests map[string]int
	}
	look := func() fleetView {
		v := fleetView{active: map[string]int64{}, index: map[string]int64{}, approx: map[string]int{}, precise: map[string]int{}, engineRequests: map[string]int{}}
		var dw live.DebugWorkers
		getJSON(t, debug+"/debug/workers", &dw)
		for _, w := range dw.Workers {
			r := w.Ranks[0]
			v.active[w.Name] = r.ActiveRequests
			if r.PrefixIndexBlocks != nil {
				v.index[w.Name] = *r.PrefixIndexBlocks
			}
			id := shared.WorkerIDOf(w.Name)
			v.approx[w.Name] = rd.d.Runtime().Router().Prefix().Len(prefix.Candidate{ID: id})
			var precise live.DebugBlocks
			getJSON(t, debug+"/debug/workers/"+w.Name+"/blocks", &precise)
			v.precise[w.Name] = len(precise.Blocks)
			v.engineRequests[w.Name] = engineCompletions(engines[w.Name])
		}
		return v
	}
	// The client has the whole answer a moment before the handler ends
	// the request (its read of the engine's end follows its last write):
	// wait for the booking's release.
	var before fleetView
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if before = look(); before.active[served] == 0 || time.Now().After(deadline) {
			break
		}
	}
	if before.approx[served] == 0 || before.precise[served] != 6 || before.active[served] != 0 {
		t.Fatalf("after the first turn: %+v, want %s to hold it (6 precise blocks) with nothing in flight", before, served)
	}

	follow := idsPrompt("m", 1, 121)
	var route DebugRoute
	var first string
	for i := range 2 {
		code, got, raw := routePost(t, debug, follow)
		if code != http.StatusOK || len(got.Hops) != 1 {
			t.Fatalf("POST /debug/route: %d %s", code, raw)
		}
		// The engines' own load reports may change between the two (a
		// scrape), not the rest.
		if sum := routeSummary(got); i == 1 && sum != first {
			t.Errorf("asked twice, answered otherwise:\n%s\n%s", first, sum)
		} else {
			first = sum
		}
		route = got
	}
	if after := look(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("/debug/route changed the fleet: before %+v, after %+v", before, after)
	}
	k := route.Key
	if k.Model != "m" || k.BlockSize != 16 || k.PromptTokens != 120 || k.Blocks != 7 || k.KeyedBy != "token_ids" || !k.Precise || k.LoRA != "" {
		t.Errorf("key %+v, want m at 16-token blocks, 120 tokens, 7 blocks, keyed by token ids", k)
	}
	hop := route.Hops[0]
	if hop.Role != "aggregated" || hop.Error != nil || hop.Chosen == nil || hop.Chosen.Worker != served ||
		hop.Chosen.OverlapBlocks != 6 || hop.Chosen.CachedTokens != 96 {
		t.Fatalf("hop %+v (chosen %+v), want %s with 6 blocks (96 tokens)", hop, hop.Chosen, served)
	}
	if len(hop.Candidates) != 2 {
		t.Fatalf("candidates %+v", hop.Candidates)
	}
	for _, c := range hop.Candidates {
		// The holder: 96 tokens on GPU, none on CPU. The other has
		// stored nothing, so its index has not learnt the engine's block
		// size: live, but no precise figure (null), and its overlap 0.
		if c.KVEvents != "live" || c.Chosen != (c.Worker == served) || c.Cost == nil || len(c.Costs) != 1 || c.Costs[0].Scorer != "cost" ||
			*c.Cost != c.Costs[0].Cost || c.FilteredBy != "" || c.Excluded != "" || c.CapacityBlocks != 27500 || !c.Load.Available {
			t.Errorf("candidate %+v, want live, scored by cost", c)
		}
		holder := c.Worker == served
		if holder && (c.PreciseGPUTokens == nil || *c.PreciseGPUTokens != 96 || c.PreciseCPUTokens == nil || *c.PreciseCPUTokens != 0 ||
			c.EngineBlockSize != 16 || c.OverlapBlocks != 6 || c.ApproxTokens != 96) {
			t.Errorf("holder %+v, want 96 tokens precisely on GPU, 0 on CPU, 6 blocks of overlap, 96 approximately", c)
		}
		if !holder && (c.PreciseGPUTokens != nil || c.OverlapBlocks != 0 || c.ApproxTokens != 0) {
			t.Errorf("other %+v, want no precise figure and no overlap", c)
		}
	}
	costOf := map[string]float64{}
	for _, c := range hop.Candidates {
		if c.Cost != nil {
			costOf[c.Worker] = *c.Cost
		}
	}
	if costOf[served] >= costOf[other] {
		t.Errorf("costs %v: the holder should cost less", costOf)
	}

	// GET, a text prompt: no tokenizer serves it (the mock has no
	// /tokenize), keyed by characters, scored approximately.
	code, got, raw := routeGet(t, debug, url.Values{"model": {"m"}, "prompt": {strings.Repeat("hello world ", 40)}, "cache_salt": {"s1"}})
	if code != http.StatusOK || got.Key.KeyedBy != "characters" || got.Key.Precise || got.Key.CacheSalt != "s1" || got.Key.TokenizerError == "" ||
		len(got.Hops) != 1 || got.Hops[0].Chosen == nil {
		t.Errorf("GET text prompt: %d %s", code, raw)
	} else {
		for _, c := range got.Hops[0].Candidates {
			if c.PreciseGPUTokens != nil {
				t.Errorf("text prompt: candidate %+v scored precisely", c)
			}
		}
	}
	if after := look(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("GET /debug/route changed the fleet: before %+v, after %+v", before, after)
	}

	// The follow-up for real: where the dry run said, from cache.
	resp, err = http.Post(rd.base+"/v1/completions", "application/json", strings.NewReader(follow))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if w, cached := resp.Header.Get("X-Switchyard-Worker"), resp.Header.Get("X-Mock-Cached-Tokens"); resp.StatusCode != http.StatusOK || w != served || cached != "96" {
		t.Errorf("the follow-up: %d from %s with %s cached tokens, want %s with 96", resp.StatusCode, w, cached, served)
	}

	// The live path's errors.
	code, got, raw = routePost(t, debug, idsPrompt("nobody", 1, 10))
	if code != http.StatusOK || len(got.Hops) != 1 || got.Hops[0].Error == nil || got.Hops[0].Error.Status != http.StatusNotFound ||
		got.Hops[0].Error.Code != "model_not_found" || got.Hops[0].Chosen != nil {
		t.Errorf("a model nobody serves: %d %s", code, raw)
	}
	code, _, raw = routePost(t, debug, `{"model":"m","prompt":[1,2,"x"]}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "invalid_request") {
		t.Errorf("a bad body: %d %s", code, raw)
	}
	// A query without a prompt is refused as the API refuses a body
	// without one.
	if resp, err := http.Get(debug + "/debug/route?model=m"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "you must provide a prompt") {
			t.Errorf("GET without a prompt: %d %s, want 400 as the API answers", resp.StatusCode, b)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, debug+"/debug/route", strings.NewReader("{}"))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// routeSummary is r without the engines' load reports.
func routeSummary(r DebugRoute) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%+v\n", r.Key)
	for _, h := range r.Hops {
		fmt.Fprintf(&sb, "%s %s chosen %+v error %+v\n", h.Role, h.Policy, h.Chosen, h.Error)
		for _, c := range h.Candidates {
			c.Load = RouteLoad{}
			b, _ := json.Marshal(c)
			sb.Write(b)
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}
