package mockworker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/sim"
)

// waitSubscribed sends one-block probes (token ids from base) until sub
// hears an event, so that what follows is received.
func waitSubscribed(t *testing.T, url string, sub *kvSub, base int, model string) {
	t.Helper()
	for i := 0; ; i++ {
		if i == 600 {
			t.Fatal("no KV event after 600 probes")
		}
		body := map[string]any{"prompt": ids(base+17*i, 17), "max_tokens": 1}
		if model != "" {
			body["model"] = model
		}
		complete(t, url, body)
		if _, ok := sub.next(100 * time.Millisecond); ok {
			return
		}
	}
}

// storedWith reads sub until a BlockStored whose first hash is first.
func storedWith(t *testing.T, sub *kvSub, first uint64) kvevents.Event {
	t.Helper()
	var got *kvevents.Event
	sub.until(fmt.Sprintf("BlockStored of %d", first), func(m kvMsg) bool {
		for i, ev := range m.events {
			if ev.Kind == kvevents.BlockStored && ev.BlockHashes[0] == first {
				got = &m.events[i]
			}
		}
		return got != nil
	})
	return *got
}

// cachedTokens sends body to the completions endpoint and returns the
// prompt tokens the engine served from its cache.
func cachedTokens(t *testing.T, url string, body map[string]any) string {
	t.Helper()
	resp, b := post(t, url+"/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%v: status %d: %s", body, resp.StatusCode, b)
	}
	return resp.Header.Get("x-mock-cached-tokens")
}

// msgpackStrings is msgspec's encoding of a tuple of short strings.
func msgpackStrings(ss ...string) []byte {
	b := []byte{0x90 | byte(len(ss))}
	for _, s := range ss {
		b = append(append(b, 0xa0|byte(len(s))), s...)
	}
	return b
}

// TestLoRAAndCacheSalt: the engine serves LoRA adapters and cache_salt as
// vLLM does. /v1/models lists the base model (root, parent null,
// max_model_len) and each adapter (root its path, parent the base, no
// max_model_len; OpenAIServingModels.show_available_models). A request
// naming an adapter is keyed by it and so is a salted one, with vLLM's
// hashes (expected values computed outside this code, see
// TestVLLMBlockHashes), so neither hits the base model's blocks; their
// events carry lora_id (the adapter id, 1 for the first;
// test_kv_cache_events_with_lora), lora_name, and extra_keys per block:
// the adapter's name on every block and the salt on block 0
// (generate_block_hash_extra_keys). An empty cache_salt is a 400, an
// unknown model a 404.
func TestLoRAAndCacheSalt(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 400
	s, url := startServer(t, Config{Model: testModel, Sim: cfg, LoRA: []string{"ad1", "ad2"}, HashSeed: "0",
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsEncoding: kvevents.EncodingMap})

	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []map[string]any `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 3 {
		t.Fatalf("models: %v %+v", err, list)
	}
	base, ad1 := list.Data[0], list.Data[1]
	if base["id"] != testModel || base["root"] != testModel || base["parent"] != nil || base["max_model_len"] != float64(400*16) {
		t.Errorf("base model card %v", base)
	}
	// vLLM's ModelCard dumps an adapter's max_model_len as null.
	if mml, has := ad1["max_model_len"]; ad1["id"] != "ad1" || ad1["root"] != "/mock/lora/ad1" || ad1["parent"] != testModel || !has || mml != nil {
		t.Errorf("adapter card %v", ad1)
	}
	if list.Data[2]["id"] != "ad2" {
		t.Errorf("second adapter card %v", list.Data[2])
	}

	pub, _ := s.KVEventsAddr(0)
	sub := subscribe(t, pub.String())
	waitSubscribed(t, url, sub, 200_000, "")
	prompt := ids(1, 48) // 3 full blocks; the hit is capped at 2 (the last block is computed)

	// The base model caches its blocks.
	if got := cachedTokens(t, url, map[string]any{"prompt": prompt, "max_tokens": 1}); got != "0" {
		t.Fatalf("base, first: cached %s", got)
	}
	plain := storedWith(t, sub, 3236607068019569386)
	if plain.HasLoRAID || plain.LoRAName != nil || len(plain.ExtraKeys) != 3 || plain.ExtraKeys[0] != nil {
		t.Errorf("base model's store %+v: want no LoRA, extra_keys [None None None]", plain)
	}

	// An adapter's request does not hit them, and is stored under vLLM's
	// hashes with its name in every block's extra keys.
	if got := cachedTokens(t, url, map[string]any{"model": "ad1", "prompt": prompt, "max_tokens": 1}); got != "0" {
		t.Fatalf("ad1 after the base model: cached %s, want 0", got)
	}
	want := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{896934114758974002, 4048387985669920188, 2013072458129285803},
		TokenIDs: prompt, BlockSize: 16, LoRAID: 1, HasLoRAID: true, Medium: []byte("GPU"), LoRAName: []byte("ad1"),
		ExtraKeys: [][]byte{msgpackStrings("ad1"), msgpackStrings("ad1"), msgpackStrings("ad1")}, HasGroupIdx: true,
		SpecKind: []byte("full_attention")}
	if got := storedWith(t, sub, want.BlockHashes[0]); !sameEvent(got, want) {
		t.Fatalf("ad1's store\n%+v\nwant\n%+v", got, want)
	}
	if got := cachedTokens(t, url, map[string]any{"model": "ad1", "prompt": prompt, "max_tokens": 1}); got != "32" {
		t.Fatalf("ad1 again: cached %s, want 32", got)
	}
	if got := cachedTokens(t, url, map[string]any{"model": "ad2", "prompt": prompt, "max_tokens": 1}); got != "0" {
		t.Fatalf("ad2 after ad1: cached %s, want 0", got)
	}

	// A salted request: only block 0 carries the salt; it hits only its
	// own salt.
	if got := cachedTokens(t, url, map[string]any{"prompt": prompt, "max_tokens": 1, "cache_salt": "s1"}); got != "0" {
		t.Fatalf("salted after unsalted: cached %s, want 0", got)
	}
	want = kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{2098375440168515790, 13351230569374862786, 4997034330794856585},
		TokenIDs: prompt, BlockSize: 16, Medium: []byte("GPU"), ExtraKeys: [][]byte{msgpackStrings("s1"), nil, nil},
		HasGroupIdx: true, SpecKind: []byte("full_attention")}
	if got := storedWith(t, sub, want.BlockHashes[0]); !sameEvent(got, want) {
		t.Fatalf("salted store\n%+v\nwant\n%+v", got, want)
	}
	if got := cachedTokens(t, url, map[string]any{"prompt": prompt, "max_tokens": 1, "cache_salt": "s1"}); got != "32" {
		t.Fatalf("same salt again: cached %s, want 32", got)
	}
	if got := cachedTokens(t, url, map[string]any{"prompt": prompt, "max_tokens": 1, "cache_salt": "s2"}); got != "0" {
		t.Fatalf("another salt: cached %s, want 0", got)
	}
	// LoRA and salt: block 0's extra keys are (name, salt).
	if got := cachedTokens(t, url, map[string]any{"model": "ad1", "prompt": prompt, "max_tokens": 1, "cache_salt": "s1"}); got != "0" {
		t.Fatalf("ad1 salted: cached %s, want 0", got)
	}
	ev := storedWith(t, sub, 8535775692285830676)
	if !slices.Equal(ev.BlockHashes, []uint64{8535775692285830676, 9529146155116454865, 1609834978130274703}) ||
		string(ev.ExtraKeys[0]) != string(msgpackStrings("ad1", "s1")) || string(ev.ExtraKeys[1]) != string(msgpackStrings("ad1")) {
		t.Fatalf("ad1 salted store %+v", ev)
	}
	// Chat takes cache_salt too.
	chat := map[string]any{"messages": []map[string]string{{"role": "user", "content": longText(3, 400)}}, "max_tokens": 1, "cache_salt": "c"}
	for i, want := range []string{"0", "96"} {
		resp, b := post(t, url+"/v1/chat/completions", chat)
		if resp.StatusCode != 200 || resp.Header.Get("x-mock-cached-tokens") != want {
			t.Fatalf("salted chat %d: %d cached %s, want %s: %s", i, resp.StatusCode, resp.Header.Get("x-mock-cached-tokens"), want, b)
		}
	}
	delete(chat, "cache_salt")
	if resp, _ := post(t, url+"/v1/chat/completions", chat); resp.Header.Get("x-mock-cached-tokens") != "0" {
		t.Fatalf("unsalted chat after the salted one: cached %s, want 0", resp.Header.Get("x-mock-cached-tokens"))
	}

	for _, c := range []struct {
		body   map[string]any
		status int
		msg    string
	}{
		{map[string]any{"prompt": "hi", "cache_salt": ""}, 400, "Parameter 'cache_salt' must be a non-empty string if provided."},
		{map[string]any{"prompt": "hi", "cache_salt": strings.Repeat("s", maxCacheSaltBytes+1)}, 400, "cache_salt of 4097 bytes"},
		{map[string]any{"prompt": "hi", "model": "ad3"}, 404, "The model `ad3` does not exist"},
	} {
		resp, b := post(t, url+"/v1/completions", c.body)
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.msg) {
			t.Errorf("%v: %d %s, want %d with %q", c.body["model"], resp.StatusCode, b, c.status, c.msg)
		}
	}
}

// freeRange returns a port p such that p..p+n-1 were free a moment ago.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := p+n-1 <= 65535
		for i := 1; ok && i < n; i++ {
			li, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, li)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// TestKVEventSources: GET /kv_event_sources as vLLM PR 55844 serves it
// (tests/entrypoints/serve/test_kv_events_router.py@5f920ec3: {"sources":
// [{data_parallel_rank, endpoint, replay_endpoint, topic}]} sorted by
// rank; tests/entrypoints/serve/kv_events/test_api_router.py@c2090fe4:
// the bare array): one source per rank on the configured ports offset by
// the rank (test_data_parallel_rank_tagging), replay_endpoint null without
// replay, snapshot_endpoint with snapshots; an advertised host replaces
// the configured one ("tcp://*:PORT", as vLLM reports a configured
// wildcard: test_event_publisher_factory); port 0 reports the bound port.
func TestKVEventSources(t *testing.T) {
	get := func(url string) []byte {
		resp, err := http.Get(url + "/kv_event_sources")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b json.RawMessage
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&b) != nil {
			t.Fatalf("/kv_event_sources: %d", resp.StatusCode)
		}
		return b
	}
	ep := func(port int) string { return "tcp://127.0.0.1:" + strconv.Itoa(port) }
	_, url, p := startOnFreeRange(t, 6, func(p int) Config {
		return Config{DataParallelSize: 2, KVEventsEndpoint: ep(p), KVEventsReplayEndpoint: ep(p + 2),
			KVEventsSnapshotEndpoint: ep(p + 4), KVEventsTopic: "kv"}
	})
	want := fmt.Sprintf(`{"sources":[`+
		`{"data_parallel_rank":0,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d","snapshot_endpoint":"tcp://127.0.0.1:%d","topic":"kv"},`+
		`{"data_parallel_rank":1,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d","snapshot_endpoint":"tcp://127.0.0.1:%d","topic":"kv"}]}`,
		p, p+2, p+4, p+1, p+3, p+5)
	if got := string(get(url)); got != want {
		t.Fatalf("sources\n%s\nwant\n%s", got, want)
	}

	_, url, p = startOnFreeRange(t, 2, func(p int) Config {
		return Config{DataParallelSize: 2, KVEventsEndpoint: ep(p), KVEventSources: SourcesArray, KVEventsAdvertiseHost: "*"}
	})
	want = fmt.Sprintf(`[{"data_parallel_rank":0,"endpoint":"tcp://*:%d","replay_endpoint":null,"topic":""},`+
		`{"data_parallel_rank":1,"endpoint":"tcp://*:%d","replay_endpoint":null,"topic":""}]`, p, p+1)
	if got := string(get(url)); got != want {
		t.Fatalf("sources\n%s\nwant\n%s", got, want)
	}

	// A wildcard configured is reported as configured, and listens on
	// every interface.
	_, url, p = startOnFreeRange(t, 1, func(p int) Config { return Config{KVEventsEndpoint: "tcp://*:" + strconv.Itoa(p)} })
	if got, want := string(get(url)), fmt.Sprintf(`{"sources":[{"data_parallel_rank":0,"endpoint":"tcp://*:%d","replay_endpoint":null,"topic":""}]}`, p); got != want {
		t.Fatalf("wildcard sources\n%s\nwant\n%s", got, want)
	}
	sub := subscribe(t, "127.0.0.1:"+strconv.Itoa(p))
	waitSubscribed(t, url, sub, 10_000, "")

	s, url := startServer(t, Config{DataParallelSize: 2, KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsAdvertiseHost: "0.0.0.0"})
	var sources struct {
		Sources []kvEventSource `json:"sources"`
	}
	if err := json.Unmarshal(get(url), &sources); err != nil || len(sources.Sources) != 2 {
		t.Fatalf("sources %+v, %v", sources, err)
	}
	for r, src := range sources.Sources {
		pub, _ := s.KVEventsAddr(r)
		if want := "tcp://0.0.0.0:" + strconv.Itoa(pub.(*net.TCPAddr).Port); src.Endpoint != want || src.DataParallelRank != r {
			t.Errorf("rank %d of port 0: %+v, want endpoint %s", r, src, want)
		}
	}

	_, url = startServer(t, Config{})
	if got := string(get(url)); got != `{"sources":[]}` {
		t.Fatalf("without KV events: %s", got)
	}
}

// TestSnapshotService: the engine with a snapshot endpoint plays vLLM's
// snapshot service (PR 57789, vMaroon/vllm@08ee3e54): live sequence
// frames are 24 bytes (sequence, then the publisher id), an idle engine
// sends heartbeats, and after traffic with duplicate copies and
// evictions the snapshot ([cut, id, chunks]) rebuilds exactly the
// residency the full live stream describes; with the service refused the
// reply is exactly [-2, id].
func TestSnapshotService(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 48
	s, url := startServer(t, Config{Sim: cfg, KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0",
		KVEventsEncoding: kvevents.EncodingMap})
	pub, _ := s.KVEventsAddr(0)
	sub := subscribeSeq(t, pub.String(), 24)
	first, ok := sub.next(time.Minute) // a heartbeat: nothing was sent yet
	if !ok || len(first.events) != 0 || first.seq != 0 {
		t.Fatalf("first message %+v, want the heartbeat of sequence 0", first)
	}
	id := first.id
	residency := map[uint64]int{}
	apply := func(events []kvevents.Event) {
		for _, ev := range events {
			for _, h := range ev.BlockHashes {
				switch ev.Kind {
				case kvevents.BlockStored:
					residency[h]++
				case kvevents.BlockRemoved:
					if residency[h]--; residency[h] == 0 {
						delete(residency, h)
					}
				}
			}
			if ev.Kind == kvevents.AllBlocksCleared {
				clear(residency)
			}
		}
	}
	// Block-aligned prompts sent twice (second copies), then enough others
	// to evict.
	for i := range 12 {
		prompt := ids(1000*(i%4), 64)
		complete(t, url, map[string]any{"prompt": prompt, "max_tokens": 2})
	}
	// Apply the stream until it is quiet for 3 heartbeats.
	last := first.seq
	quiet := 0
	dups := 0
	for quiet < 3 {
		m, ok := sub.next(time.Minute)
		if !ok {
			t.Fatal("the stream stopped: no heartbeat within a minute")
		}
		if m.seq != last+1 || string(m.id) != string(id) {
			t.Fatalf("message %d after %d, id %x then %x", m.seq, last, id, m.id)
		}
		last = m.seq
		if len(m.events) == 0 {
			quiet++
			continue
		}
		quiet = 0
		for _, ev := range m.events {
			if ev.Kind == kvevents.BlockStored && residency[ev.BlockHashes[0]] > 0 {
				dups++
			}
		}
		apply(m.events)
	}
	if dups == 0 {
		t.Fatal("no second copy was stored: the test tests nothing")
	}
	snapAddr := s.KVEventsSnapshotAddr(0)
	f := snapshotOf(t, snapAddr.String())
	if len(f) < 3 || string(f[1]) != string(id) || int64(binary.BigEndian.Uint64(f[0])) < int64(last) {
		t.Fatalf("snapshot header %x, want cut >= %d and id %x", f[:min(2, len(f))], last, id)
	}
	snap := map[uint64]int{}
	saved := residency
	residency = snap
	var dec kvevents.Decoder
	for _, c := range f[2:] {
		var b kvevents.Batch
		if err := dec.Decode(c, &b); err != nil {
			t.Fatal(err)
		}
		if !b.HasDataParallelRank || b.DataParallelRank != 0 || len(b.Events) > 256 {
			t.Fatalf("chunk: rank %d, %d events", b.DataParallelRank, len(b.Events))
		}
		apply(b.Events)
	}
	if len(snap) != len(saved) {
		t.Fatalf("snapshot residency %v, stream's %v", snap, saved)
	}
	for h, n := range saved {
		if snap[h] != n {
			t.Fatalf("block %d: %d copies in the snapshot, %d in the stream", h, snap[h], n)
		}
	}

	r, _ := startServer(t, Config{KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsSnapshotEndpoint: "tcp://127.0.0.1:0",
		KVEventsSnapshotUnavailable: true})
	snapAddr = r.KVEventsSnapshotAddr(0)
	if f := snapshotOf(t, snapAddr.String()); len(f) != 2 || int64(binary.BigEndian.Uint64(f[0])) != -2 || len(f[1]) != 16 {
		t.Fatalf("refused snapshot %x, want exactly [-2, id]", f)
	}
}

// snapshotOf sends one REQ "snapshot" (as vLLM's client does) and returns
// the reply's frames.
func snapshotOf(t *testing.T, addr string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := zmq4.NewReq(ctx)
	defer r.Close()
	if err := r.Dial("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	if err := r.Send(zmq4.NewMsgString("snapshot")); err != nil {
		t.Fatal(err)
	}
	c := make(chan zmq4.Msg, 1)
	go func() {
		if m, err := r.Recv(); err == nil {
			c <- m
		}
	}()
	select {
	case m := <-c:
		return m.Frames
	case <-time.After(time.Minute):
		t.Fatal("no snapshot reply within a minute")
	}
	return nil
}

// TestProcessStartTime: /metrics has process_start_time_seconds, the
// time the server was made (prometheus_client's process collector gives
// vLLM's), so a restart shows as a later value.
func TestProcessStartTime(t *testing.T) {
	before := float64(time.Now().Unix())
	_, url := startServer(t, Config{Model: testModel})
	after := float64(time.Now().Unix() + 1)
	fams := scrape(t, url)
	f := fams["process_start_time_seconds"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("process_start_time_seconds: %v", f)
	}
	if v := f.GetMetric()[0].GetGauge().GetValue(); v < before || v > after {
		t.Fatalf("process_start_time_seconds %v, want between %v and %v", v, before, after)
	}
}

// TestVLLMBlockStoredWire reads, with a generic msgpack decoder (as
// msgspec.msgpack.decode would), the BlockStored of a salted request to a
// LoRA adapter, in both layouts: every field of vLLM's BlockStored
// (vllm/distributed/kv_events.py) in its declared order for the positional
// one, fields with a default left out when at it (msgspec omit_defaults):
// block_hashes, parent_block_hash None, token_ids, block_size, lora_id 1,
// medium "GPU", lora_name, extra_keys [["ad1", "s1"], ["ad1"], ["ad1"]],
// group_idx 0, kv_cache_spec_kind "full_attention".
func TestVLLMBlockStoredWire(t *testing.T) {
	tokens := make([]any, 48)
	for i := range tokens {
		tokens[i] = i + 1
	}
	hashes := []any{uint64(8535775692285830676), uint64(9529146155116454865), uint64(1609834978130274703)}
	extra := []any{[]any{"ad1", "s1"}, []any{"ad1"}, []any{"ad1"}}
	for _, c := range []struct {
		enc  kvevents.Encoding
		want any
	}{
		{kvevents.EncodingMap, map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
			"token_ids": tokens, "block_size": 16, "lora_id": 1, "medium": "GPU", "lora_name": "ad1", "extra_keys": extra,
			"group_idx": 0, "kv_cache_spec_kind": "full_attention"}},
		{kvevents.EncodingArray, []any{"BlockStored", hashes, nil, tokens, 16, 1, "GPU", "ad1", extra, 0, "full_attention"}},
	} {
		s, url := startServer(t, Config{Model: testModel, LoRA: []string{"ad1"}, HashSeed: "0", KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsEncoding: c.enc})
		pub, _ := s.KVEventsAddr(0)
		sub := subscribe(t, pub.String())
		waitSubscribed(t, url, sub, 300_000, "")
		complete(t, url, map[string]any{"model": "ad1", "prompt": ids(1, 48), "max_tokens": 1, "cache_salt": "s1"})
		var payload []byte
		sub.until("the salted LoRA store", func(m kvMsg) bool {
			for _, ev := range m.events {
				if ev.Kind == kvevents.BlockStored && ev.BlockHashes[0] == 8535775692285830676 {
					payload = m.payload
				}
			}
			return payload != nil
		})
		var batch []any
		d := msgpack.NewDecoder(bytes.NewReader(payload))
		d.UseLooseInterfaceDecoding(true)
		if err := d.Decode(&batch); err != nil || len(batch) != 3 {
			t.Fatalf("batch: %v %v", batch, err)
		}
		var got any
		for _, e := range batch[1].([]any) {
			if m, ok := e.(map[string]any); ok && m["lora_name"] == "ad1" {
				got = m
			}
			if a, ok := e.([]any); ok && len(a) > 7 && a[7] == "ad1" {
				got = a
			}
		}
		if !equalJSON(got, c.want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(c.want)
			t.Fatalf("encoding %d: BlockStored\n%s\nwant\n%s", c.enc, g, w)
		}
	}
}
