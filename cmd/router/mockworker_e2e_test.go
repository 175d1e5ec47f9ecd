package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// zmqRecv receives one message from s within a minute, or fails the test.
func zmqRecv(t *testing.T, s zmq4.Socket, what string) zmq4.Msg {
	t.Helper()
	c := make(chan zmq4.Msg, 1)
	go func() {
		if m, err := s.Recv(); err == nil {
			c <- m
		}
	}()
	select {
	case m := <-c:
		return m
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
	}
	return zmq4.Msg{}
}

// zmqDial opens a socket of kind on endpoint ("tcp://HOST:PORT"),
// closed with the test.
func zmqDial(t *testing.T, s zmq4.Socket, endpoint string) zmq4.Socket {
	t.Helper()
	if err := s.Dial(endpoint); err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wireEvent is a KV event as a generic msgpack decoder reads vLLM's map
// layout (the mock's default, vLLM's since PR 42892).
type wireEvent struct {
	Type        string   `msgpack:"type"`
	BlockHashes []uint64 `msgpack:"block_hashes"`
	TokenIDs    []int64  `msgpack:"token_ids"`
	Medium      string   `msgpack:"medium"`
	LoRAName    *string  `msgpack:"lora_name"`
	LoRAID      *int64   `msgpack:"lora_id"`
	GroupIdx    *int64   `msgpack:"group_idx"`
	ExtraKeys   []any    `msgpack:"extra_keys"`
}

// wireBatch decodes [ts, events, rank].
func wireBatch(t *testing.T, payload []byte) (events []wireEvent, rank int64) {
	t.Helper()
	var b struct {
		_msgpack struct{} `msgpack:",as_array"`
		TS       float64
		Events   []wireEvent
		Rank     int64
	}
	if err := msgpack.Unmarshal(payload, &b); err != nil {
		t.Fatalf("payload %x: %v", payload, err)
	}
	return b.Events, b.Rank
}

// residency folds events into copies per hash (one store adds one, one
// remove takes one), as vLLM's snapshot tests count residency.
func residency(live map[uint64]int, events []wireEvent) {
	for _, ev := range events {
		for _, h := range ev.BlockHashes {
			switch ev.Type {
			case "BlockStored":
				live[h]++
			case "BlockRemoved":
				if live[h]--; live[h] <= 0 {
					delete(live, h)
				}
			}
		}
		if ev.Type == "AllBlocksCleared" {
			clear(live)
		}
	}
}

// mockSource is one entry of the mock's GET /kv_event_sources.
type mockSource struct {
	Rank     int     `json:"data_parallel_rank"`
	Endpoint string  `json:"endpoint"`
	Replay   *string `json:"replay_endpoint"`
	Snapshot string  `json:"snapshot_endpoint"`
	Topic    string  `json:"topic"`
}

// TestMockWorkerProcessKVProtocols starts `router mock-worker` as a process
// with two data-parallel ranks, KV events, replay, the snapshot service
// and a LoRA adapter, and speaks to it over real sockets as a router
// would: GET /kv_event_sources names each rank's endpoints (vLLM PR
// 55844); the live stream has 24-byte sequence frames (sequence and
// publisher id) and heartbeats when idle; after traffic with a LoRA
// request, a block-aligned repeat (a second copy) and evictions, a REQ
// snapshot rebuilds the residency the live stream describes, and the
// replay (DEALER) answers [“”, topic, sequence, payload] with the payloads
// published, then [“”, “”, -1, “”] (vLLM PR 45177). A process restarted on
// the same ports has a new publisher id, sequences from 0, an empty cache
// and a later process_start_time_seconds.
//
// The first process binds port 0 (every rank's endpoints a free port of
// their own, as its stdout and /kv_event_sources say); the restart, whose
// checks are rank 0's, is given rank 0's ports and one rank (two would
// put rank 1 on those + 1, ports nothing reserved, which an outgoing
// connection's ephemeral port can hold): a bind that finds one taken
// fails naming its owner (startProc).
func TestMockWorkerProcessKVProtocols(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	c := e2eClient(t)
	kvArgs := func(ranks int, pub, replay, snapshot string) []string {
		return []string{"mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50", "--kv-blocks", "40",
			"--data-parallel-size", strconv.Itoa(ranks), "--lora", "ad1",
			"--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay, "--kv-events-snapshot-endpoint", snapshot}
	}
	const port0 = "tcp://127.0.0.1:0"
	mock := startProc(t, routerBin, kvArgs(2, port0, port0, port0)...)
	printed := mock.waitStdout(t, regexp.MustCompile(`(?m)^mock-worker rank 0 KV events on (tcp://\S+) replay on (tcp://\S+) snapshot on (tcp://\S+) publisher [0-9a-f]+\n`+
		`mock-worker rank 1 KV events on (tcp://\S+) replay on (tcp://\S+) snapshot on (tcp://\S+) publisher [0-9a-f]+$`))

	getJSON := func(url string, v any) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(v) != nil {
			t.Fatalf("%s: status %d", url, resp.StatusCode)
		}
	}
	var body struct {
		Sources []mockSource `json:"sources"`
	}
	getJSON(mock.url+"/kv_event_sources", &body)
	if len(body.Sources) != 2 {
		t.Fatalf("/kv_event_sources: %+v", body)
	}
	ports := map[string]bool{}
	for r, s := range body.Sources {
		want := printed[1+3*r : 4+3*r]
		if s.Rank != r || s.Endpoint != want[0] || s.Replay == nil || *s.Replay != want[1] || s.Snapshot != want[2] || s.Topic != "" {
			t.Fatalf("source %d: %+v, want the endpoints printed, %q", r, s, want)
		}
		for _, ep := range want {
			if strings.HasSuffix(ep, ":0") || ports[ep] {
				t.Fatalf("endpoint %s of rank %d: port 0 or another's (%q)", ep, r, printed[1:])
			}
			ports[ep] = true
		}
	}
	src := body.Sources[0]

	sub := zmqDial(t, zmq4.NewSub(context.Background()), src.Endpoint)
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	live := func() (seq uint64, id []byte, payload []byte) {
		m := zmqRecv(t, sub, "live message")
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 24 {
			t.Fatalf("live frames %x, want [\"\", sequence (8) + publisher id (16), payload]", m.Frames)
		}
		return binary.BigEndian.Uint64(m.Frames[1]), m.Frames[1][8:], m.Frames[2]
	}
	// An idle engine's heartbeat proves the subscription (vLLM's client
	// waits for one before asking for a snapshot).
	firstSeq, id, pl := live()
	if ev, rank := wireBatch(t, pl); len(ev) != 0 || rank != 0 {
		t.Fatalf("first message: %d events, rank %d; want a heartbeat of rank 0", len(ev), rank)
	}

	send := func(body string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", mock.url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-data-parallel-rank", "0")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return resp.Header.Get("x-mock-cached-tokens")
	}
	ids := func(from, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(from + i))
		}
		return "[" + b.String() + "]"
	}
	send(`{"prompt": ` + ids(1, 64) + `, "max_tokens": 2}`)
	if got := send(`{"prompt": ` + ids(1, 64) + `, "max_tokens": 2}`); got != "48" {
		t.Fatalf("block-aligned repeat: cached %s tokens, want 48 (the last block recomputed)", got)
	}
	send(`{"model": "ad1", "prompt": ` + ids(1, 64) + `, "max_tokens": 2}`)
	for i := range 6 { // 40 blocks: these evict
		send(`{"prompt": ` + ids(1000*(i+1), 100) + `, "max_tokens": 2}`)
	}

	stream := map[uint64]int{}
	payloads := map[uint64][]byte{firstSeq: pl}
	last, quiet, copies, loraStored := firstSeq, 0, 0, false
	for quiet < 2 {
		seq, mid, pl := live()
		if seq != last+1 || !bytes.Equal(mid, id) {
			t.Fatalf("live %d (id %x) after %d (id %x)", seq, mid, last, id)
		}
		last, payloads[seq] = seq, pl
		events, _ := wireBatch(t, pl)
		if len(events) == 0 {
			quiet++
			continue
		}
		quiet = 0
		for _, ev := range events {
			if ev.Type == "BlockStored" && stream[ev.BlockHashes[0]] > 0 {
				copies++
			}
			if ev.Type == "BlockStored" && ev.LoRAName != nil {
				loraStored = *ev.LoRAName == "ad1" && ev.LoRAID != nil && *ev.LoRAID == 1 && len(ev.ExtraKeys) == len(ev.BlockHashes)
			}
		}
		residency(stream, events)
	}
	if copies == 0 || !loraStored {
		t.Fatalf("second copies stored %d, LoRA store seen %v: the traffic tests nothing", copies, loraStored)
	}

	req := zmqDial(t, zmq4.NewReq(context.Background()), src.Snapshot)
	if err := req.Send(zmq4.NewMsgString("snapshot")); err != nil {
		t.Fatal(err)
	}
	f := zmqRecv(t, req, "snapshot reply").Frames
	if len(f) < 3 || len(f[0]) != 8 || !bytes.Equal(f[1], id) || int64(binary.BigEndian.Uint64(f[0])) < int64(last) {
		t.Fatalf("snapshot header %x, want cut >= %d, id %x, chunks", f[:min(2, len(f))], last, id)
	}
	snap := map[uint64]int{}
	for _, chunk := range f[2:] {
		events, rank := wireBatch(t, chunk)
		if rank != 0 || len(events) > 256 {
			t.Fatalf("chunk of %d events, rank %d", len(events), rank)
		}
		residency(snap, events)
	}
	if fmt.Sprint(snap) != fmt.Sprint(stream) {
		t.Fatalf("snapshot residency %v, live stream's %v", snap, stream)
	}
	// The mock's own view of its cache (GET /debug/kv_blocks) is what the
	// stream says it holds.
	var own struct {
		Ranks []struct {
			Rank   int `json:"data_parallel_rank"`
			Blocks []struct {
				Hash   uint64 `json:"hash"`
				Copies int    `json:"copies"`
			} `json:"blocks"`
		} `json:"ranks"`
	}
	getJSON(mock.url+"/debug/kv_blocks", &own)
	if len(own.Ranks) != 2 || own.Ranks[0].Rank != 0 || len(own.Ranks[1].Blocks) != 0 {
		t.Fatalf("/debug/kv_blocks: %+v, want rank 0's blocks and rank 1 empty", own)
	}
	cache := map[uint64]int{}
	for _, b := range own.Ranks[0].Blocks {
		cache[b.Hash] = b.Copies
	}
	if fmt.Sprint(cache) != fmt.Sprint(stream) {
		t.Fatalf("/debug/kv_blocks rank 0 %v, live stream's residency %v", cache, stream)
	}

	dealer := zmqDial(t, zmq4.NewDealer(context.Background()), *src.Replay)
	if err := dealer.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, firstSeq))); err != nil {
		t.Fatal(err)
	}
	for next := firstSeq; ; next++ {
		m := zmqRecv(t, dealer, "replay answer")
		if len(m.Frames) != 4 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 0 || len(m.Frames[2]) != 8 {
			t.Fatalf("replay frames %x, want [\"\", topic, sequence, payload]", m.Frames)
		}
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == ^uint64(0) {
			if next <= last || len(m.Frames[3]) != 0 {
				t.Fatalf("end marker %x after %d, want it after %d", m.Frames, next, last)
			}
			break
		}
		if seq != next {
			t.Fatalf("replayed %d, want %d", seq, next)
		}
		if want, ok := payloads[seq]; ok && !bytes.Equal(m.Frames[3], want) {
			t.Fatalf("replayed batch %d differs from the published one", seq)
		}
	}

	// Rank 1 served nothing: its snapshot has no chunk, under its own id.
	req1 := zmqDial(t, zmq4.NewReq(context.Background()), body.Sources[1].Snapshot)
	if err := req1.Send(zmq4.NewMsgString("snapshot")); err != nil {
		t.Fatal(err)
	}
	if f := zmqRecv(t, req1, "rank 1's snapshot").Frames; len(f) != 2 || len(f[1]) != 16 || bytes.Equal(f[1], id) {
		t.Fatalf("rank 1's snapshot %x, want [cut, its own id] and no chunk", f)
	}

	metrics, err := scrape(c, mock.url)
	if err != nil {
		t.Fatal(err)
	}
	started := metrics["process_start_time_seconds"]
	if started == 0 {
		t.Fatalf("no process_start_time_seconds: %v", metrics)
	}

	// The restart, on rank 0's ports, with one rank.
	mock.stop(t)

	mock = startProc(t, routerBin, kvArgs(1, src.Endpoint, *src.Replay, src.Snapshot)...)
	if metrics, err = scrape(c, mock.url); err != nil || metrics["process_start_time_seconds"] <= started {
		t.Fatalf("after the restart process_start_time_seconds %v, before %v (%v)", metrics["process_start_time_seconds"], started, err)
	}
	sub2 := zmqDial(t, zmq4.NewSub(context.Background()), src.Endpoint)
	if err := sub2.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	m := zmqRecv(t, sub2, "live message after the restart")
	if len(m.Frames) != 3 || len(m.Frames[1]) != 24 || bytes.Equal(m.Frames[1][8:], id) || binary.BigEndian.Uint64(m.Frames[1]) > 3 {
		t.Fatalf("after the restart: frames %x; want a new id and a sequence from 0 (a heartbeat a second)", m.Frames)
	}
	newID := m.Frames[1][8:]
	req2 := zmqDial(t, zmq4.NewReq(context.Background()), src.Snapshot)
	if err := req2.Send(zmq4.NewMsgString("snapshot")); err != nil {
		t.Fatal(err)
	}
	if f := zmqRecv(t, req2, "snapshot after the restart").Frames; len(f) != 2 || !bytes.Equal(f[1], newID) {
		t.Fatalf("snapshot after the restart %x, want [cut, %x] and nothing cached", f, newID)
	}
	if got := send(`{"prompt": ` + ids(1, 64) + `, "max_tokens": 2}`); got != "0" {
		t.Fatalf("after the restart the cache hit %s tokens, want 0", got)
	}
}

// TestMockWorkerProcessBufferSteps: with --kv-events-buffer-steps 3 the
// replay endpoint keeps the last 3 batches (vLLM's buffer_steps,
// tests/distributed/test_events.py test_buffer_limit): a replay from 0
// after more batches answers the last 3, then the end marker.
func TestMockWorkerProcessBufferSteps(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	c := e2eClient(t)
	mock := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--speedup", "50", "--kv-events-buffer-steps", "3",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0")
	kv := mock.waitStdout(t, mockKVEvents)
	sub := zmqDial(t, zmq4.NewSub(context.Background()), kv[1])
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	heard := make(chan uint64, 1024)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) == 3 && len(m.Frames[1]) == 8 {
				heard <- binary.BigEndian.Uint64(m.Frames[1])
			}
		}
	}()
	send := func(i int) {
		t.Helper()
		body := fmt.Sprintf(`{"prompt": "request %d %s", "max_tokens": 1}`, i, strings.Repeat("word ", 40))
		resp, err := c.Post(mock.url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// Until the subscription hears one, then six more new prompts: each
	// stores its own blocks (at least one batch).
	var last uint64
	for i := 0; ; i++ {
		if i == 600 {
			t.Fatal("no KV event after 600 requests")
		}
		send(i)
		select {
		case last = <-heard:
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	for i := range 6 {
		send(1000 + i)
	}
	for deadline := time.After(time.Minute); ; {
		select {
		case s := <-heard:
			last = max(last, s)
			continue
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatal("the stream did not go quiet")
		}
		break
	}
	if last < 6 {
		t.Fatalf("last sequence %d: too few batches to test a buffer of 3", last)
	}
	dealer := zmqDial(t, zmq4.NewDealer(context.Background()), kv[2])
	if err := dealer.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for {
		m := zmqRecv(t, dealer, "replay answer")
		if len(m.Frames) != 4 || len(m.Frames[2]) != 8 {
			t.Fatalf("replay frames %x", m.Frames)
		}
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == ^uint64(0) {
			break
		}
		got = append(got, seq)
	}
	if want := []uint64{last - 2, last - 1, last}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("replay from 0 answered %v, want %v (the last 3)", got, want)
	}
}
