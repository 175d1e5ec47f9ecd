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
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/sim"
)

// kvMsg is one received KV event message, decoded with kvevents.Decoder
// and copied out of its reused storage.
type kvMsg struct {
	seq     uint64
	payload []byte
	rank    int64
	events  []kvevents.Event
}

// kvSub is a ZeroMQ SUB socket on a mock engine's KV events.
type kvSub struct {
	t      *testing.T
	sock   zmq4.Socket
	msgs   chan zmq4.Msg
	dec    kvevents.Decoder
	cancel context.CancelFunc
}

func subscribe(t *testing.T, addr string) *kvSub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &kvSub{t: t, sock: zmq4.NewSub(ctx), msgs: make(chan zmq4.Msg, 4096), cancel: cancel}
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
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
			s.t.Fatalf("message frames %q, want topic \"\", 8-byte sequence, payload", m.Frames)
		}
		return s.decode(binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]), true
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

// TestKVEvents runs a mock engine with KV events on, in both encodings,
// and a real ZeroMQ subscriber: a prompt given as token ids is reported
// BlockStored block by block (hash = prefix.TokenBlocks, parent chain,
// token ids, block size, medium GPU), then BlockRemoved when a prompt
// that needs the whole cache evicts it; a text prompt's blocks carry no
// token ids; a prefix-cache reset sends AllBlocksCleared. Sequence
// numbers are consecutive, and the replay endpoint answers the same
// payloads from sequence 0 on, then the end marker.
func TestKVEvents(t *testing.T) {
	for _, enc := range []struct {
		name string
		enc  kvevents.Encoding
	}{{"array", kvevents.EncodingArray}, {"map", kvevents.EncodingMap}} {
		t.Run(enc.name, func(t *testing.T) {
			cfg := sim.DefaultConfig()
			cfg.TotalKVBlocks = 64 // 1024 tokens
			s, url := startServer(t, Config{Model: testModel, Sim: cfg, BlockTokens: 16,
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

			a := ids(0, 65) // 4 full blocks of 16 and one token
			aHashes := prefix.TokenBlocks(a, 16)
			complete(t, url, map[string]any{"prompt": a, "max_tokens": 1})
			var stored []kvevents.Event
			seen = append(seen, sub.until("BlockStored of A", func(m kvMsg) bool {
				for _, ev := range m.events {
					if ev.Kind == kvevents.BlockStored && slices.Contains(aHashes, ev.BlockHashes[0]) {
						stored = append(stored, ev)
					}
				}
				return len(stored) > 0
			})...)
			want := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: aHashes, TokenIDs: a[:64],
				BlockSize: 16, Medium: []byte("GPU")}
			if len(stored) != 1 || !sameEvent(stored[0], want) {
				t.Fatalf("A stored as %+v, want one event %+v", stored, want)
			}

			// B needs all 64 blocks: every cached block is evicted.
			complete(t, url, map[string]any{"prompt": ids(1_000_000, 1023), "max_tokens": 1})
			removed := map[uint64]bool{}
			seen = append(seen, sub.until("BlockRemoved of A", func(m kvMsg) bool {
				for _, ev := range m.events {
					if ev.Kind == kvevents.BlockRemoved {
						if !bytes.Equal(ev.Medium, []byte("GPU")) {
							t.Errorf("BlockRemoved medium %q", ev.Medium)
						}
						for _, h := range ev.BlockHashes {
							removed[h] = true
						}
					}
				}
				return removed[aHashes[0]] && removed[aHashes[1]] && removed[aHashes[2]] && removed[aHashes[3]]
			})...)

			// Text without a tokenizer: hashes only.
			text := longText(9, 16*4*2+5)
			complete(t, url, map[string]any{"prompt": text, "max_tokens": 1})
			tHashes := prefix.TextBlocks(text, 16, 4)
			seen = append(seen, sub.until("BlockStored of the text", func(m kvMsg) bool {
				for _, ev := range m.events {
					if ev.Kind == kvevents.BlockStored && ev.BlockHashes[0] == tHashes[0] {
						if !slices.Equal(ev.BlockHashes, tHashes) || len(ev.TokenIDs) != 0 || ev.BlockSize != 16 {
							t.Errorf("text stored as %+v, want hashes %x and no token ids", ev, tHashes)
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
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.HasParent == b.HasParent &&
		a.ParentBlockHash == b.ParentBlockHash && slices.Equal(a.TokenIDs, b.TokenIDs) &&
		a.BlockSize == b.BlockSize && bytes.Equal(a.Medium, b.Medium)
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
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
			t.Fatalf("replay frames %q", m.Frames)
		}
		seq := binary.BigEndian.Uint64(m.Frames[1])
		if seq == ^uint64(0) {
			if len(m.Frames[2]) != 0 {
				t.Errorf("end marker payload %q", m.Frames[2])
			}
			break
		}
		if seq != next {
			t.Fatalf("replayed sequence %d, want %d", seq, next)
		}
		got[seq] = m.Frames[2]
	}
	for _, m := range seen {
		if !bytes.Equal(got[m.seq], m.payload) {
			t.Errorf("replayed batch %d differs from the published one", m.seq)
		}
	}
}

// freePorts returns a port p such that p and p+1 were free a moment ago.
func freePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		l1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l1.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)))
		l1.Close()
		if err == nil {
			l2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// TestKVEventsDataParallel: rank N publishes on the endpoint's port + N
// with data_parallel_rank N, only the events of its own cache.
func TestKVEventsDataParallel(t *testing.T) {
	port := freePorts(t)
	s, url := startServer(t, Config{Model: testModel, BlockTokens: 16, DataParallelSize: 2,
		KVEventsEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(port)})
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
		if m.rank != int64(r) || ev.Kind != kvevents.BlockStored || len(ev.TokenIDs) != 16 ||
			ev.BlockHashes[0] != prefix.TokenBlocks(ev.TokenIDs, 16)[0] {
			t.Fatalf("rank %d: first message %+v", r, m)
		}
		// The block is one of its own prompts' (ids from 10000·(r+1) on).
		if lo, hi := int64(10_000*(r+1)), int64(10_000*(r+2)); m.events[0].TokenIDs[0] < lo || m.events[0].TokenIDs[0] >= hi {
			t.Fatalf("rank %d reported tokens %v, not of its prompts", r, m.events[0].TokenIDs)
		}
	}
}
