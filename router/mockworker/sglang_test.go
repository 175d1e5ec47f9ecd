package mockworker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-router/switchyard/router/sim"
)

// TestSGLang plays SGLang: /server_info and /get_server_info carry
// page_size and the kv_events descriptor of SGLang PR 25844
// (server_args.py describe_kv_events_publisher: publisher, endpoint_host,
// endpoint_port_base, topic, block_size, dp_size); /kv_event_sources is
// vLLM's and absent; /metrics has sglang:* names (or sglang_* with
// MetricNamesUnderscore) labelled as SGLang's scheduler labels them;
// /tokenize (and /v1/tokenize) take a prompt, not chat messages
// (serving_tokenize.py@0351c1fa); KV events are SGLang's
// (disaggregation/kv_events.py@612d5790, radix_cache.py
// _record_store_event): one positional BlockStored per page with its
// signed 64-bit hash, its parent's and its token ids, lora_id None, and
// the replay answers in two frames.
func TestSGLang(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.BlockSize = 4 // SGLang's page_size
	cfg.TotalKVBlocks = 1000
	tok := testTokenizer(t)
	s, url, p := startOnFreeRange(t, 2, func(p int) Config {
		return Config{Model: testModel, Engine: EngineSGLang, Sim: cfg, Tokenizer: tok,
			KVEventsEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(p), KVEventsReplayEndpoint: "tcp://127.0.0.1:0", KVEventsAdvertiseHost: "*"}
	})

	for _, path := range []string{"/server_info", "/get_server_info"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			PageSize int            `json:"page_size"`
			DPSize   int            `json:"dp_size"`
			KV       map[string]any `json:"kv_events"`
		}
		err = json.NewDecoder(resp.Body).Decode(&info)
		resp.Body.Close()
		want := map[string]any{"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": float64(p), "topic": "",
			"block_size": float64(4), "dp_size": float64(1)}
		if err != nil || info.PageSize != 4 || info.DPSize != 1 || len(info.KV) != len(want) {
			t.Fatalf("%s: %v %+v", path, err, info)
		}
		for k, v := range want {
			if info.KV[k] != v {
				t.Errorf("%s: kv_events.%s = %v, want %v", path, k, info.KV[k], v)
			}
		}
	}
	resp, err := http.Get(url + "/kv_event_sources")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/kv_event_sources on SGLang: %d, want 404", resp.StatusCode)
	}

	fams := scrape(t, url)
	for name, want := range map[string]float64{"sglang:page_size": 4, "sglang:max_total_num_tokens": 4000, "sglang:num_pages": 1000,
		"sglang:num_running_reqs": 0, "sglang:num_queue_reqs": 0, "sglang:token_usage": 0} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != want {
			t.Errorf("%s: %v, want one sample of %v", name, f, want)
			continue
		}
		m := f.GetMetric()[0]
		if label(m, "model_name") != testModel || label(m, "engine_type") != "unified" || label(m, "tp_rank") != "0" {
			t.Errorf("%s labels %v", name, m.GetLabel())
		}
	}
	for name := range fams {
		if strings.HasPrefix(name, "vllm") {
			t.Errorf("SGLang serves %s", name)
		}
	}

	// /tokenize: a prompt, or a list of them; messages are a 400.
	for _, path := range []string{"/tokenize", "/v1/tokenize"} {
		resp, b := post(t, url+path, map[string]any{"prompt": "hello world"})
		var one struct {
			Tokens      []int64 `json:"tokens"`
			Count       int     `json:"count"`
			MaxModelLen int     `json:"max_model_len"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &one) != nil || one.Count == 0 || one.Count != len(one.Tokens) || one.MaxModelLen != 4000 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		resp, b = post(t, url+path, map[string]any{"prompt": []string{"hello world", "hi"}})
		var many struct {
			Tokens [][]int64 `json:"tokens"`
			Count  []int     `json:"count"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &many) != nil || len(many.Count) != 2 || many.Count[0] != one.Count {
			t.Fatalf("%s with two prompts: %d %s", path, resp.StatusCode, b)
		}
		resp, b = post(t, url+path, map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}})
		if resp.StatusCode != 400 || !strings.Contains(string(b), "not chat messages") {
			t.Fatalf("%s with messages: %d %s", path, resp.StatusCode, b)
		}
	}

	// KV events: the raw frames, read with a generic decoder.
	pub, replay := s.KVEventsAddr(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial("tcp://" + pub.String()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 1024)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	var seen []zmq4.Msg
	for i := 0; len(seen) == 0; i++ {
		if i == 600 {
			t.Fatal("no KV event after 600 probes")
		}
		complete(t, url, map[string]any{"prompt": ids(100_000+9*i, 9), "max_tokens": 1})
		select {
		case m := <-msgs:
			seen = append(seen, m)
		case <-time.After(100 * time.Millisecond):
		}
	}
	complete(t, url, map[string]any{"prompt": []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, "max_tokens": 1})
	// SGLang's hashes of pages [1 2 3 4] and [5 6 7 8] (TestSGLangPageHashes).
	wantFirst := []any{"BlockStored", []any{int64(-3488128144981237669)}, nil, []any{int64(1), int64(2), int64(3), int64(4)}, int64(4), nil}
	wantSecond := []any{"BlockStored", []any{int64(5674439469042975057)}, int64(-3488128144981237669), []any{int64(5), int64(6), int64(7), int64(8)}, int64(4), nil}
	deadline := time.After(time.Minute)
	for found := false; !found; {
		var m zmq4.Msg
		select {
		case m = <-msgs:
		case <-deadline:
			t.Fatal("no BlockStored of the pages within a minute")
		}
		seen = append(seen, m)
		if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
			t.Fatalf("frames %x", m.Frames)
		}
		d := msgpack.NewDecoder(bytes.NewReader(m.Frames[2]))
		d.UseLooseInterfaceDecoding(true)
		var b []any
		if err := d.Decode(&b); err != nil || len(b) != 3 {
			t.Fatalf("batch %x: %v", m.Frames[2], err)
		}
		for i, e := range b[1].([]any) {
			ev := e.([]any)
			if ev[0] == "BlockStored" && len(ev) > 3 && equalJSON(ev[3], []any{int64(1), int64(2), int64(3), int64(4)}) {
				evs := b[1].([]any)
				if !equalJSON(ev, wantFirst) || i+1 >= len(evs) || !equalJSON(evs[i+1], wantSecond) {
					t.Fatalf("pages stored as %v, want %v then %v", evs[i:], wantFirst, wantSecond)
				}
				found = true
			}
		}
	}

	// SGLang's radix tree stores a prefix once: the same block-aligned
	// pages again (the second recomputed, as the hit is capped) store
	// nothing before the next prompt's pages.
	if got := cachedTokens(t, url, map[string]any{"prompt": []int64{1, 2, 3, 4, 5, 6, 7, 8}, "max_tokens": 1}); got != "4" {
		t.Fatalf("the pages again: cached %s tokens, want 4", got)
	}
	complete(t, url, map[string]any{"prompt": []int64{500, 501, 502, 503, 504}, "max_tokens": 1})
	for found := false; !found; {
		var m zmq4.Msg
		select {
		case m = <-msgs:
		case <-deadline:
			t.Fatal("no BlockStored of the next prompt within a minute")
		}
		var b []any
		d := msgpack.NewDecoder(bytes.NewReader(m.Frames[2]))
		d.UseLooseInterfaceDecoding(true)
		if err := d.Decode(&b); err != nil {
			t.Fatal(err)
		}
		for _, e := range b[1].([]any) {
			ev := e.([]any)
			if ev[0] != "BlockStored" {
				continue
			}
			if equalJSON(ev[1], wantSecond[1]) {
				t.Fatalf("page [5 6 7 8] stored twice: %v", ev)
			}
			found = found || equalJSON(ev[3], []any{int64(500), int64(501), int64(502), int64(503)})
		}
	}

	// Replay in SGLang's two frames.
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial("tcp://" + replay.String()); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	for {
		c := make(chan zmq4.Msg, 1)
		go func() {
			if m, err := d.Recv(); err == nil {
				c <- m
			}
		}()
		var m zmq4.Msg
		select {
		case m = <-c:
		case <-time.After(time.Minute):
			t.Fatal("no replay answer within a minute")
		}
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
			t.Fatalf("replay frames %q, want [\"\", sequence, payload]", m.Frames)
		}
		if binary.BigEndian.Uint64(m.Frames[1]) == ^uint64(0) {
			if len(m.Frames[2]) != 0 {
				t.Fatalf("end marker %q", m.Frames)
			}
			break
		}
	}

	// The underscore spelling.
	_, url = startServer(t, Config{Engine: EngineSGLang, MetricNames: MetricNamesUnderscore, DataParallelSize: 2})
	fams = scrape(t, url)
	f := fams["sglang_num_running_reqs"]
	if f == nil || len(f.GetMetric()) != 2 || fams["sglang:num_running_reqs"] != nil {
		t.Fatalf("sglang_num_running_reqs: %v", f)
	}
	for i, m := range f.GetMetric() {
		if label(m, "dp_rank") != strconv.Itoa(i) {
			t.Errorf("rank %d sample labels %v", i, m.GetLabel())
		}
	}
	resp, err = http.Get(url + "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(`"kv_events":null`)) || !bytes.Contains(b, []byte(`"dp_size":2`)) {
		t.Fatalf("/server_info without KV events: %s", b)
	}
}

// TestVLLMUnderscoreNames: vLLM's series under the underscore spelling.
func TestVLLMUnderscoreNames(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel, MetricNames: MetricNamesUnderscore})
	fams := scrape(t, url)
	for _, name := range []string{"vllm_num_requests_running", "vllm_num_requests_waiting", "vllm_kv_cache_usage_perc", "vllm_cache_config_info"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	for name := range fams {
		if strings.HasPrefix(name, "vllm:") {
			t.Errorf("underscore spelling serves %s", name)
		}
	}
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// TestSGLangPortZeroBase: an SGLang engine with three ranks given port 0
// (publisher and replay) takes a free base for rank 0 and puts rank R on
// base + R, as SGLang's one advertised base says, and /server_info
// reports that base. Before, /server_info said null for port 0 and each
// rank had an unrelated free port.
func TestSGLangPortZeroBase(t *testing.T) {
	s, url := startServer(t, Config{Model: testModel, Engine: EngineSGLang, DataParallelSize: 3,
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "tcp://127.0.0.1:0"})
	port := func(a net.Addr) int {
		t.Helper()
		ta, ok := a.(*net.TCPAddr)
		if !ok || ta.Port == 0 {
			t.Fatalf("address %v: not a bound TCP port", a)
		}
		return ta.Port
	}
	pub0, rep0 := s.KVEventsAddr(0)
	base, repBase := port(pub0), port(rep0)
	for r := 1; r < 3; r++ {
		pub, rep := s.KVEventsAddr(r)
		if port(pub) != base+r || port(rep) != repBase+r {
			t.Errorf("rank %d on %v, replay %v; want ports %d and %d", r, pub, rep, base+r, repBase+r)
		}
	}
	resp, err := http.Get(url + "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		KV map[string]any `json:"kv_events"`
	}
	err = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if err != nil || info.KV["endpoint_port_base"] != float64(base) || info.KV["endpoint_host"] != "127.0.0.1" || info.KV["dp_size"] != float64(3) {
		t.Fatalf("/server_info kv_events %v (%v), want base %d, host 127.0.0.1, dp_size 3", info.KV, err, base)
	}
}
