package mockworker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/sim"
)

// kvMsg is one received KV event message, decoded with kvevents.Decoder
// and copied out of its reused storage.
type kvMsg struct {
	seq     uint64
	id      []byte // the publisher id after the sequence, with snapshots
	payload []byte
	rank    int64
	events  []kvevents.Event
}

// kvSub is a ZeroMQ SUB socket on a mock engine's KV events.
type kvSub struct {
	t      *testing.T
	seqLen int // 8, or 24 with snapshots (sequence and publisher id)
	sock   zmq4.Socket
	msgs   chan zmq4.Msg
	dec    kvevents.Decoder
	cancel context.CancelFunc
}

func subscribe(t *testing.T, addr string) *kvSub { return subscribeSeq(t, addr, 8) }

// subscribeSeq subscribes expecting sequence frames of seqLen bytes.
func subscribeSeq(t *testing.T, addr string, seqLen int) *kvSub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &kvSub{t: t, seqLen: seqLen, sock: zmq4.NewSub(ctx), msgs: make(chan zmq4.Msg, 4096), cancel: cancel}
	if err := s.sock.Dial("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	if err := s.sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := s.sock.Recv()
			if err != nil {
				return
			}
			s.msgs <- m
		}
	}()
	t.Cleanup(func() {
		cancel()
		s.sock.Close()
		<-done
	})
	return s
}

// next returns the next message, or false after wait.
func (s *kvSub) next(wait time.Duration) (kvMsg, bool) {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != s.seqLen {
			s.t.Fatalf("message frames %q, want topic \"\", %d-byte sequence, payload", m.Frames, s.seqLen)
		}
		out := s.decode(binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2])
		out.id = slices.Clone(m.Frames[1][8:])
		return out, true
	case <-time.After(wait):
		return kvMsg{}, false
	}
}

func (s *kvSub) decode(seq uint64, payload []byte) kvMsg {
	s.t.Helper()
	var b kvevents.Batch
	if err := s.dec.Decode(payload, &b); err != nil {
		s.t.Fatalf("batch %d does not decode: %v", seq, err)
	}
	out := kvMsg{seq: seq, payload: slices.Clone(payload), rank: -1}
	if b.HasDataParallelRank {
		out.rank = b.DataParallelRank
	}
	for _, ev := range b.Events {
		ev.BlockHashes = slices.Clone(ev.BlockHashes)
		ev.TokenIDs = slices.Clone(ev.TokenIDs)
		ev.Medium = slices.Clone(ev.Medium)
		ev.LoRAName = slices.Clone(ev.LoRAName)
		ev.SpecKind = slices.Clone(ev.SpecKind)
		if ev.ExtraKeys != nil {
			keys := make([][]byte, len(ev.ExtraKeys))
			for i, k := range ev.ExtraKeys {
				keys[i] = slices.Clone(k)
			}
			ev.ExtraKeys = keys
		}
		out.events = append(out.events, ev)
	}
	return out
}

// until reads messages until done says so, failing after a minute.
func (s *kvSub) until(what string, done func(kvMsg) bool) []kvMsg {
	s.t.Helper()
	var got []kvMsg
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if m, ok := s.next(time.Second); ok {
			got = append(got, m)
			if done(m) {
				return got
			}
		}
	}
	s.t.Fatalf("no %s within a minute; got %d messages", what, len(got))
	return nil
}

func ids(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

func complete(t *testing.T, url string, body map[string]any) {
	t.Helper()
	if resp, b := post(t, url+"/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}

// vLLM's block hashes of the token ids 1..64 in 16-token blocks with
// PYTHONHASHSEED "0" (sha256_cbor, low 64 bits): computed outside this
// code from the canonical CBOR written by hand per RFC 8949, e.g. block 0
// hashes 83 5820 <NONE_HASH> 90 0102…0f10 f6, NONE_HASH = sha256(61 30)
// (vllm/v1/core/kv_cache_utils.py hash_block_tokens, init_none_hash).
var seed0Hashes = []uint64{3236607068019569386, 2758186210834249151, 5191110061519319221, 17013564117172258520}

// TestKVEvents runs a mock engine with KV events on, in both encodings,
// and a real ZeroMQ subscriber, and checks what vLLM's block pool emits
// (vllm/v1/core/block_pool.py cache_full_blocks,
// _emit_block_removed_events; tests/v1/core/test_prefix_caching.py
// test_kv_cache_events): a prompt's full blocks in one BlockStored with
// the engine's hashes, no parent for the first block, the token ids,
// block_size, medium GPU, extra_keys one None per block, group_idx 0 and
// kv_cache_spec_kind "full_attention"; the same block-aligned prompt
// again stores a second copy of its last block (recomputed: vLLM does not
// deduplicate); evicting everything sends one BlockRemoved per copy; a
// text prompt without a tokenizer has hashes but no token ids; a reset
// sends AllBlocksCleared. Sequence numbers are consecutive from 0, and the
// replay endpoint answers the same payloads in vLLM's current format
// ([topic, sequence, payload], then ["", -1, ""]).
func TestKVEvents(t *testing.T) {
	for _, enc := range []struct {
		name string
		enc  kvevents.Encoding
	}{{"array", kvevents.EncodingArray}, {"map", kvevents.EncodingMap}} {
		t.Run(enc.name, func(t *testing.T) {
			cfg := sim.DefaultConfig()
			cfg.TotalKVBlocks = 64 // 1024 tokens
			s, url := startServer(t, Config{Model: testModel, Sim: cfg, HashSeed: "0",
				KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "tcp://127.0.0.1:0", KVEventsEncoding: enc.enc})
			pubAddr, replayAddr := s.KVEventsAddr(0)
			sub := subscribe(t, pubAddr.String())

			// A subscription takes effect some time after the dial: send
			// one-block probes until one is heard.
			var seen []kvMsg
			for i := 0; len(seen) == 0; i++ {
				if i == 600 {
					t.Fatal("no KV event after 600 probes")
				}
				complete(t, url, map[string]any{"prompt": ids(100_000+17*i, 17), "max_tokens": 1})
				if m, ok := sub.next(100 * time.Millisecond); ok {
					seen = append(seen, m)
				}
			}

			a := ids(1, 65) // 4 full blocks of 16 and one token
			complete(t, url, map[string]any{"prompt": a, "max_tokens": 1})
			stored := func(what string, first uint64) kvevents.Event {
				var got *kvevents.Event
				seen = append(seen, sub.until(what, func(m kvMsg) bool {
					for i, ev := range m.events {
						if ev.Kind == kvevents.BlockStored && ev.BlockHashes[0] == first {
							got = &m.events[i]
						}
					}
					return got != nil
				})...)
				return *got
			}
			want := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: seed0Hashes, TokenIDs: a[:64],
				BlockSize: 16, Medium: []byte("GPU"), ExtraKeys: make([][]byte, 4), HasGroupIdx: true, SpecKind: []byte("full_attention")}
			if got := stored("BlockStored of A", seed0Hashes[0]); !sameEvent(got, want) {
				t.Fatalf("A stored as\n%+v\nwant\n%+v", got, want)
			}

			// A's 64 tokens again: 3 blocks hit, the last recomputed into a
			// second copy of its hash.
			resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": a[:64], "max_tokens": 1})
			if resp.StatusCode != 200 || resp.Header.Get("x-mock-cached-tokens") != "48" {
				t.Fatalf("A's blocks again: %d, cached %s: %s", resp.StatusCode, resp.Header.Get("x-mock-cached-tokens"), body)
			}
			want = kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: seed0Hashes[3:], ParentBlockHash: seed0Hashes[2], HasParent: true,
				TokenIDs: a[48:64], BlockSize: 16, Medium: []byte("GPU"), ExtraKeys: make([][]byte, 1), HasGroupIdx: true, SpecKind: []byte("full_attention")}
			if got := stored("the second copy of A's last block", seed0Hashes[3]); !sameEvent(got, want) {
				t.Fatalf("second copy stored as\n%+v\nwant\n%+v", got, want)
			}

			// B needs all 64 blocks: every cached copy is evicted, each in
			// its own BlockRemoved.
			complete(t, url, map[string]any{"prompt": ids(1_000_000, 1023), "max_tokens": 1})
			removed := map[uint64]int{}
			seen = append(seen, sub.until("BlockRemoved of A", func(m kvMsg) bool {
				for _, ev := range m.events {
					if ev.Kind == kvevents.BlockRemoved {
						if !bytes.Equal(ev.Medium, []byte("GPU")) || len(ev.BlockHashes) != 1 || !ev.HasGroupIdx || ev.GroupIdx != 0 {
							t.Errorf("BlockRemoved %+v, want one hash, medium GPU, group_idx 0", ev)
						}
						removed[ev.BlockHashes[0]]++
					}
				}
				return removed[seed0Hashes[3]] == 2
			})...)
			for _, h := range seed0Hashes[:3] {
				if removed[h] != 1 {
					t.Errorf("block %d removed %d times, want once", h, removed[h])
				}
			}

			// Text without a tokenizer: hashes only, one per 64 bytes.
			text := longText(9, 16*4*2+5)
			complete(t, url, map[string]any{"prompt": text, "max_tokens": 1})
			seen = append(seen, sub.until("BlockStored of the text", func(m kvMsg) bool {
				for _, ev := range m.events {
					if ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) == 0 {
						if len(ev.BlockHashes) != 2 || ev.BlockSize != 16 || ev.HasParent {
							t.Errorf("text stored as %+v, want two hashes without token ids", ev)
						}
						return true
					}
				}
				return false
			})...)

			resp, err := http.Post(url+"/reset_prefix_cache", "", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("reset_prefix_cache: %d", resp.StatusCode)
			}
			seen = append(seen, sub.until("AllBlocksCleared", func(m kvMsg) bool {
				return len(m.events) == 1 && m.events[0].Kind == kvevents.AllBlocksCleared
			})...)

			for i, m := range seen {
				if m.rank != 0 || (i > 0 && m.seq != seen[i-1].seq+1) {
					t.Fatalf("message %d: sequence %d after %d, rank %d", i, m.seq, seen[max(i-1, 0)].seq, m.rank)
				}
			}
			checkLayout(t, seen[0].payload, enc.enc)
			checkReplay(t, replayAddr.String(), seen)
		})
	}
}

func sameEvent(a, b kvevents.Event) bool {
	if len(a.ExtraKeys) != len(b.ExtraKeys) {
		return false
	}
	for i := range a.ExtraKeys {
		if !bytes.Equal(a.ExtraKeys[i], b.ExtraKeys[i]) {
			return false
		}
	}
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.HasParent == b.HasParent &&
		a.ParentBlockHash == b.ParentBlockHash && slices.Equal(a.TokenIDs, b.TokenIDs) &&
		a.BlockSize == b.BlockSize && bytes.Equal(a.Medium, b.Medium) && a.LoRAID == b.LoRAID && a.HasLoRAID == b.HasLoRAID &&
		bytes.Equal(a.LoRAName, b.LoRAName) && a.GroupIdx == b.GroupIdx && a.HasGroupIdx == b.HasGroupIdx &&
		bytes.Equal(a.SpecKind, b.SpecKind)
}

// checkLayout: in the array encoding an event is a positional array, in
// the map encoding a map with a "type" key; the batch is an array.
func checkLayout(t *testing.T, payload []byte, enc kvevents.Encoding) {
	t.Helper()
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil || len(batch) != 3 {
		t.Fatalf("batch %v, %v: want [ts, events, rank]", batch, err)
	}
	ev := batch[1].([]any)[0]
	switch enc {
	case kvevents.EncodingArray:
		if a, ok := ev.([]any); !ok || a[0] != "BlockStored" {
			t.Errorf("array encoding: first event %v", ev)
		}
	case kvevents.EncodingMap:
		if m, ok := ev.(map[string]any); !ok || m["type"] != "BlockStored" {
			t.Errorf("map encoding: first event %v", ev)
		}
	}
}

// checkReplay asks the replay endpoint for everything from sequence 0:
// the answer is every batch in order, those the subscriber saw
// byte-identical, then the end marker.
func checkReplay(t *testing.T, addr string, seen []kvMsg) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	got := map[uint64][]byte{}
	for next := uint64(0); ; next++ {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		// vLLM since PR 45177: [empty, topic, sequence, payload]
		// (tests/distributed/test_events.py test_replay_includes_topic).
		if len(m.Frames) != 4 || len(m.Frames[0]) != 0 || len(m.Frames[2]) != 8 {
			t.Fatalf("replay frames %q", m.Frames)
		}
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == ^uint64(0) {
			if len(m.Frames[1]) != 0 || len(m.Frames[3]) != 0 {
				t.Errorf("end marker %q, want [\"\", \"\", -1, \"\"]", m.Frames)
			}
			break
		}
		if len(m.Frames[1]) != 0 {
			t.Errorf("replayed topic %q, want the publisher's \"\"", m.Frames[1])
		}
		if seq != next {
			t.Fatalf("replayed sequence %d, want %d", seq, next)
		}
		got[seq] = m.Frames[3]
	}
	for _, m := range seen {
		if !bytes.Equal(got[m.seq], m.payload) {
			t.Errorf("replayed batch %d differs from the published one", m.seq)
		}
	}
}

// TestKVEventsDataParallel: rank N publishes on the endpoint's port + N
// with data_parallel_rank N, only the events of its own cache.
func TestKVEventsDataParallel(t *testing.T) {
	s, url, port := startOnFreeRange(t, 2, func(p int) Config {
		return Config{Model: testModel, DataParallelSize: 2, KVEventsEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(p)}
	})
	subs := make([]*kvSub, 2)
	for r := range subs {
		pub, replay := s.KVEventsAddr(r)
		if got := pub.(*net.TCPAddr).Port; got != port+r || replay != nil {
			t.Fatalf("rank %d publishes on %v, replay %v; want port %d, no replay", r, pub, replay, port+r)
		}
		subs[r] = subscribe(t, pub.String())
	}
	pinned := func(rank, i int) {
		b, _ := json.Marshal(map[string]any{"prompt": ids(10_000*(rank+1)+17*i, 17), "max_tokens": 1})
		req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("X-data-parallel-rank", strconv.Itoa(rank))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for r, sub := range subs {
		var m kvMsg
		for i, ok := 0, false; !ok; i++ {
			if i == 600 {
				t.Fatalf("rank %d: no KV event after 600 requests", r)
			}
			pinned(r, i)
			m, ok = sub.next(100 * time.Millisecond)
		}
		ev := m.events[0]
		if m.rank != int64(r) || ev.Kind != kvevents.BlockStored || len(ev.TokenIDs) != 16 || len(ev.BlockHashes) != 1 {
			t.Fatalf("rank %d: first message %+v", r, m)
		}
		// The block is one of its own prompts' (ids from 10000·(r+1) on).
		if lo, hi := int64(10_000*(r+1)), int64(10_000*(r+2)); m.events[0].TokenIDs[0] < lo || m.events[0].TokenIDs[0] >= hi {
			t.Fatalf("rank %d reported tokens %v, not of its prompts", r, m.events[0].TokenIDs)
		}
	}
}
