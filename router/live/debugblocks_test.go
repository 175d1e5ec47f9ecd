package live

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/sim"
)

// getBlocks GETs /debug/workers/NAME/blocks on the debug listener at base.
func getBlocks(t *testing.T, base, name string) (int, DebugBlocks, string) {
	t.Helper()
	resp, err := http.Get(base + "/debug/workers/" + name + "/blocks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out DebugBlocks
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	return resp.StatusCode, out, string(raw)
}

// blockKey is a listed block as compared: its hash's JSON, tier, rank,
// copies and flags.
type blockKey struct {
	hash    string
	medium  string
	rank    uint32
	copies  uint32
	held    bool
	folded  bool
	aliased bool
}

func blockKeys(bs []DebugBlock) []blockKey {
	out := make([]blockKey, 0, len(bs))
	for _, b := range bs {
		out = append(out, blockKey{string(b.Hash), b.Medium, b.Rank, b.Copies, b.Held, b.Folded, b.Aliased})
	}
	slices.SortFunc(out, func(a, b blockKey) int {
		return strings.Compare(a.hash+a.medium+strconv.Itoa(int(a.rank)), b.hash+b.medium+strconv.Itoa(int(b.rank)))
	})
	return out
}

// waitBlocks polls NAME's listing until cond holds (a minute at most).
func waitBlocks(t *testing.T, rd *runningDaemon, base, name, what string, cond func(DebugBlocks) bool) DebugBlocks {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, got, raw := getBlocks(t, base, name)
		if code == http.StatusOK && cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute; last answer %d %s\nlogs:\n%s", what, code, raw, rd.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func debugListener(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, "http://" + ln.Addr().String()
}

// vllmBytesChunk is a snapshot chunk of vLLM events as released vLLM
// sends them (an array_like KVEventBatch of map events) with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: raw 32-byte hashes (msgspec
// writes bytes as msgpack bin), parents too. Blocks h0, h1 of 16 tokens
// stored on GPU; h1 again (vLLM does not deduplicate: a second copy);
// h0 offloaded to CPU by a tokenless store (block_size 0, as the
// offloading connector sends it); h2 stored and removed.
func vllmBytesChunk(t *testing.T, h0, h1, h2 []byte) []byte {
	t.Helper()
	toks := func(from int) []any {
		out := make([]any, 16)
		for i := range out {
			out[i] = from + i
		}
		return out
	}
	stored := func(hashes []any, parent any, tokens []any, blockSize int, medium string) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
			"block_size": blockSize, "lora_id": nil, "medium": medium, "lora_name": nil}
	}
	evs := []any{
		stored([]any{h0, h1}, nil, append(toks(0), toks(16)...), 16, "GPU"),
		stored([]any{h1}, h0, toks(16), 16, "GPU"),
		stored([]any{h0}, nil, []any{}, 0, "CPU"),
		stored([]any{h2}, h1, toks(32), 16, "GPU"),
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{h2}, "medium": "GPU"},
	}
	b, err := msgpack.Marshal([]any{1.0, evs, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sglangPage is SGLang's hash of a page (python/sglang/srt/mem_cache
// get_hash_str, hash_str_to_int64, as router/mockworker follows them):
// sha256 of the parent page's 32-byte hash (none for a first page) then
// each token id as 4 bytes little-endian; the event carries its first 8
// bytes as a signed 64-bit int.
func sglangPage(parent []byte, tokens ...int) ([]byte, int64) {
	h := sha256.New()
	h.Write(parent)
	for _, tok := range tokens {
		h.Write(binary.LittleEndian.AppendUint32(nil, uint32(tok)))
	}
	sum := h.Sum(nil)
	return sum, int64(binary.BigEndian.Uint64(sum[:8]))
}

// TestDaemonDebugBlocks: /debug/workers/NAME/blocks lists, per rank and
// tier, the blocks the router believes each engine holds, by the
// engine's own hashes, and they are the engine's:
//   - a vLLM mock engine given by URL only (its KV-event and snapshot
//     endpoints read from /kv_event_sources), PYTHONHASHSEED "0": after
//     the prompt 1..64 through the router, exactly its four sha256_cbor
//     block hashes as vLLM's default ints (the low 64 bits; the values
//     computed outside this code, router/mockworker TestVLLMBlockHashes),
//     and after the same prompt again a second copy of the last block
//     (its hit is capped, the block recomputed: vLLM does not
//     deduplicate);
//   - a vLLM engine with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: its
//     32-byte hashes in lowercase hex, its duplicate copy, its CPU tier;
//   - an SGLang mock engine: its signed page hashes, negative ones
//     included, as SGLang computes them;
//   - a worker without KV events: no blocks, state "none" saying why;
//   - an unknown worker: 404 with a JSON error.
func TestDaemonDebugBlocks(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.BlockSize = 16
	vllm, err := mockworker.New(mockworker.Config{Model: "m", Speedup: 50, Sim: cfg, HashSeed: "0",
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	vs := httptest.NewServer(vllm)
	t.Cleanup(func() { vs.Close(); vllm.Close() })

	sgCfg := sim.DefaultConfig()
	sgCfg.BlockSize = 4 // SGLang's page_size
	sglang, err := mockworker.New(mockworker.Config{Model: "s", Engine: mockworker.EngineSGLang, Speedup: 50, Sim: sgCfg,
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ss := httptest.NewServer(sglang)
	t.Cleanup(func() { ss.Close(); sglang.Close() })
	sgPub, sgReplay := sglang.KVEventsAddr(0)

	h0, h1, h2 := sha256.Sum256([]byte("h0")), sha256.Sum256([]byte("h1")), sha256.Sum256([]byte("h2"))
	raw := newSnapEngine(t, "engine-raw-uuid1")
	raw.mu.Lock()
	raw.chunk = vllmBytesChunk(t, h0[:], h1[:], h2[:])
	raw.mu.Unlock()
	// More blocks than one chunk of the listing (blocksChunk slots).
	var many []uint64
	for i := range blocksChunk + 904 {
		many = append(many, uint64(1_000_000+i))
	}
	manyEngine := newSnapEngine(t, "engine-many-uuid", many...)
	manyHTTP := newFakeVLLM(t, "")
	rawHTTP := newFakeVLLM(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"raw\"} 0\n")
	plain := newFakeVLLM(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"plain\"} 0\n")

	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, daemonPolicy("rr")+fmt.Sprintf(`
worker "vllm" {
  url = %q
}
worker "sglang" {
  url = %q
  kv_events {
    endpoint        = "tcp://%s"
    replay_endpoint = "tcp://%s"
  }
}
worker "raw" {
  url    = %q
  models = ["raw"]
  kv_events {
    endpoint          = %q
    snapshot_endpoint = %q
  }
}
worker "plain" {
  url    = %q
  models = ["plain"]
}
worker "many" {
  url    = %q
  models = ["many"]
  kv_events {
    endpoint          = %q
    snapshot_endpoint = %q
  }
}
`, vs.URL, ss.URL, sgPub, sgReplay, rawHTTP.srv.URL, raw.source().Endpoint, raw.source().SnapshotEndpoint, plain.srv.URL,
		manyHTTP.srv.URL, manyEngine.source().Endpoint, manyEngine.source().SnapshotEndpoint))
	dln, debug := debugListener(t)
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, DebugListener: dln})
	rd.waitWorkers(t, "many", "plain", "raw", "sglang", "vllm")

	// An unknown worker: 404, a JSON error naming it (escaped).
	code, _, body := getBlocks(t, debug, "nobody%1b")
	var apiErr apiError
	if code != http.StatusNotFound || json.Unmarshal([]byte(body), &apiErr) != nil || apiErr.Error.Code != "worker_not_found" ||
		!strings.Contains(apiErr.Error.Message, `nobody\\x1b`) {
		t.Errorf("unknown worker: %d %s, want 404 worker_not_found naming it escaped", code, body)
	}
	// A worker without KV events: no blocks, and why.
	code, got, body := getBlocks(t, debug, "plain")
	if code != http.StatusOK || got.Worker != "plain" || len(got.Blocks) != 0 || !got.Complete || len(got.Ranks) != 1 ||
		got.Ranks[0].State != "none" || !strings.Contains(got.Ranks[0].Reason, "no KV-event source") || !strings.Contains(body, `"blocks":[`) {
		t.Errorf("worker without KV events: %d %s", code, body)
	}

	// vLLM's raw bytes hashes, from its snapshot: the engine's own set.
	got = waitBlocks(t, rd, debug, "raw", "raw live with its blocks", func(b DebugBlocks) bool {
		return len(b.Ranks) == 1 && b.Ranks[0].State == "live" && len(b.Blocks) == 3
	})
	hexOf := func(b [32]byte) string { return `"` + hex.EncodeToString(b[:]) + `"` }
	want := blockKeys([]DebugBlock{
		{Hash: json.RawMessage(hexOf(h0)), Medium: "GPU", Copies: 1, Held: true},
		{Hash: json.RawMessage(hexOf(h1)), Medium: "GPU", Copies: 2, Held: true},
		{Hash: json.RawMessage(hexOf(h0)), Medium: "CPU", Copies: 1, Held: true},
	})
	if g := blockKeys(got.Blocks); !slices.Equal(g, want) || !got.Complete || got.Ranks[0].EngineBlockSize != 16 ||
		got.Ranks[0].Blocks != 2 || got.Ranks[0].Copies != 4 {
		t.Errorf("raw: listed %+v (%+v), want %+v", g, got, want)
	}

	// Listed over several chunks, each block once: the engine's set.
	got = waitBlocks(t, rd, debug, "many", "many live with its blocks", func(b DebugBlocks) bool {
		return len(b.Ranks) == 1 && b.Ranks[0].State == "live" && b.Ranks[0].Blocks == len(many)
	})
	var manyWant []DebugBlock
	for _, h := range many {
		manyWant = append(manyWant, DebugBlock{Hash: json.RawMessage(strconv.FormatUint(h, 10)), Medium: "GPU", Copies: 1, Held: true})
	}
	if g, w := blockKeys(got.Blocks), blockKeys(manyWant); !slices.Equal(g, w) || !got.Complete {
		t.Errorf("many: %d blocks listed (complete %v), want the engine's %d", len(g), got.Complete, len(w))
	}

	// The vLLM mock: live from its (empty) snapshot, then the prompt's
	// blocks.
	waitBlocks(t, rd, debug, "vllm", "vllm live", func(b DebugBlocks) bool {
		return len(b.Ranks) == 1 && b.Ranks[0].State == "live"
	})
	prompt := make([]string, 64)
	for i := range prompt {
		prompt[i] = strconv.Itoa(i + 1)
	}
	// The mocks serve their own models (m, s): sendTo checks.
	ids := `{"model":"m","max_tokens":1,"prompt":[` + strings.Join(prompt, ",") + `]}`
	sendTo := func(worker, body string) {
		t.Helper()
		resp, err := http.Post(rd.base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != worker {
			t.Fatalf("%s: %d from %q, want 200 from %s", body, resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), worker)
		}
	}
	sendTo("vllm", ids)
	seed0 := []uint64{3236607068019569386, 2758186210834249151, 5191110061519319221, 17013564117172258520}
	vllmWant := func(lastCopies uint32) []blockKey {
		var bs []DebugBlock
		for i, h := range seed0 {
			c := uint32(1)
			if i == len(seed0)-1 {
				c = lastCopies
			}
			bs = append(bs, DebugBlock{Hash: json.RawMessage(strconv.FormatUint(h, 10)), Medium: "GPU", Copies: c, Held: true})
		}
		return blockKeys(bs)
	}
	got = waitBlocks(t, rd, debug, "vllm", "vllm's four blocks", func(b DebugBlocks) bool { return len(b.Blocks) == 4 })
	if g := blockKeys(got.Blocks); !slices.Equal(g, vllmWant(1)) || got.Ranks[0].EngineBlockSize != 16 {
		t.Errorf("vllm: listed %+v, want %+v", g, vllmWant(1))
	}
	sendTo("vllm", ids)
	got = waitBlocks(t, rd, debug, "vllm", "the last block's second copy", func(b DebugBlocks) bool { return b.Ranks[0].Copies == 5 })
	if g := blockKeys(got.Blocks); !slices.Equal(g, vllmWant(2)) {
		t.Errorf("vllm after the prompt again: listed %+v, want %+v", g, vllmWant(2))
	}

	// SGLang: probes of one page each until its stream is live (a
	// stream joined mid-way is replayed from 0), then pages [1 2 3 4]
	// and [5 6 7 8]; every page listed by SGLang's own signed hash.
	var sgWant []DebugBlock
	for i := 0; ; i++ {
		if i == 300 {
			t.Fatalf("sglang not live after 300 probes; logs:\n%s", rd.logs)
		}
		from := 10_000 + 5*i
		body := fmt.Sprintf(`{"model":"s","max_tokens":1,"prompt":[%d,%d,%d,%d,%d]}`, from, from+1, from+2, from+3, from+4)
		sendTo("sglang", body)
		_, v := sglangPage(nil, from, from+1, from+2, from+3)
		sgWant = append(sgWant, DebugBlock{Hash: json.RawMessage(strconv.FormatInt(v, 10)), Medium: "GPU", Copies: 1, Held: true})
		if _, b, _ := getBlocks(t, debug, "sglang"); len(b.Ranks) == 1 && b.Ranks[0].State == "live" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	sendTo("sglang", `{"model":"s","max_tokens":1,"prompt":[1,2,3,4,5,6,7,8,9]}`)
	p1, v1 := sglangPage(nil, 1, 2, 3, 4)
	_, v2 := sglangPage(p1, 5, 6, 7, 8)
	if v1 >= 0 || v1 != -3488128144981237669 || v2 != 5674439469042975057 {
		t.Fatalf("SGLang's page hashes %d, %d: want router/mockworker's -3488128144981237669, 5674439469042975057", v1, v2)
	}
	sgWant = append(sgWant, DebugBlock{Hash: json.RawMessage(strconv.FormatInt(v1, 10)), Medium: "GPU", Copies: 1, Held: true},
		DebugBlock{Hash: json.RawMessage(strconv.FormatInt(v2, 10)), Medium: "GPU", Copies: 1, Held: true})
	got = waitBlocks(t, rd, debug, "sglang", "sglang's pages", func(b DebugBlocks) bool { return len(b.Blocks) == len(sgWant) })
	if g, w := blockKeys(got.Blocks), blockKeys(sgWant); !slices.Equal(g, w) || !strings.Contains(fmt.Sprint(g), "-3488128144981237669") {
		t.Errorf("sglang: listed %+v, want %+v", g, w)
	}
}
