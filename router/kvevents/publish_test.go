package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// These tests follow the engines' own tests of the publisher side, not
// this package's decoder: vllm-project/vllm
// tests/distributed/test_events.py@05d3142f (replay), and the snapshot
// service's vMaroon/vllm@08ee3e54 tests/distributed/
// test_kv_events_snapshot.py and test_kv_snapshot_bootstrap.py. Payloads
// are read with a generic msgpack decoder, as those tests read them with
// msgspec.msgpack.decode.

// stored is the snapshot tests' helper: a GPU store of 4-token blocks
// with token ids h*4+j, or a tokenless store of block size 0 on another
// medium.
func stored(hashes []uint64, parent uint64, hasParent bool, medium string) Event {
	ev := Event{Kind: BlockStored, BlockHashes: hashes, ParentBlockHash: parent, HasParent: hasParent, Medium: []byte(medium)}
	if medium == MediumGPU {
		ev.BlockSize = 4
		for _, h := range hashes {
			for j := range uint64(4) {
				ev.TokenIDs = append(ev.TokenIDs, int64(h*4+j))
			}
		}
	}
	return ev
}

func removed(medium string, hashes ...uint64) Event {
	return Event{Kind: BlockRemoved, BlockHashes: hashes, Medium: []byte(medium)}
}

// resKey is the tests' residency key (medium, group, hash), as the
// snapshot tests' counts() keys it.
type resKey struct {
	medium string
	group  int64
	hash   uint64
}

// counts folds events into live residency as the snapshot tests' counts()
// does: stores add, removes take one (at most down to none), a clear
// drops the GPU tier.
func counts(events []Event, live map[resKey]int) map[resKey]int {
	if live == nil {
		live = map[resKey]int{}
	}
	for _, e := range events {
		switch e.Kind {
		case BlockStored:
			for _, h := range e.BlockHashes {
				live[resKey{string(e.Medium), e.GroupIdx, h}]++
			}
		case BlockRemoved:
			for _, h := range e.BlockHashes {
				k := resKey{string(e.Medium), e.GroupIdx, h}
				if live[k] > 1 {
					live[k]--
				} else {
					delete(live, k)
				}
			}
		case AllBlocksCleared:
			for k := range live {
				if k.medium == MediumGPU || k.medium == "" {
					delete(live, k)
				}
			}
		}
	}
	return live
}

func sameCounts(a, b map[resKey]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, n := range a {
		if b[k] != n {
			return false
		}
	}
	return true
}

// randomBatches is the snapshot tests' random_batches: half the time a
// store of 8 consecutive hashes, else a live key's removal or, for a GPU
// key, 30% of the time a tokenless CPU store of it; 2% of batches end
// with AllBlocksCleared.
func randomBatches(seed uint64, n int) [][]Event {
	rng := rand.New(rand.NewPCG(seed, seed))
	live := map[resKey]int{}
	var out [][]Event
	for range n {
		var events []Event
		if rng.Float64() < 0.5 || len(live) == 0 {
			start := 1 + 8*uint64(rng.IntN(30))
			hs := make([]uint64, 8)
			for i := range hs {
				hs[i] = start + uint64(i)
			}
			events = append(events, stored(hs, 0, false, MediumGPU))
		} else {
			keys := make([]resKey, 0, len(live))
			for k := range live {
				keys = append(keys, k)
			}
			slices.SortFunc(keys, func(a, b resKey) int {
				if a.medium != b.medium {
					return bytes.Compare([]byte(a.medium), []byte(b.medium))
				}
				return cmpUint64(a.hash, b.hash)
			})
			k := keys[rng.IntN(len(keys))]
			if k.medium == MediumGPU && rng.Float64() < 0.3 {
				events = append(events, stored([]uint64{k.hash}, 0, false, "CPU"))
			} else {
				events = append(events, removed(k.medium, k.hash))
			}
		}
		if rng.Float64() < 0.02 {
			events = append(events, Event{Kind: AllBlocksCleared})
		}
		counts(events, live)
		out = append(out, events)
	}
	return out
}

// TestSnapshotReferencesMatchFullHistory is
// test_snapshot_references_match_full_history: for 20 seeds, the
// residency a snapshot rebuilds equals the full history's, checked every
// 31 batches and at the end.
func TestSnapshotReferencesMatchFullHistory(t *testing.T) {
	for seed := range uint64(20) {
		s := newSnapshotState(0, 0)
		expected := map[resKey]int{}
		for i, events := range randomBatches(seed, 400) {
			counts(events, expected)
			if err := s.apply(events); err != nil {
				t.Fatalf("seed %d batch %d: %v", seed, i, err)
			}
			if i%31 == 0 {
				if got := counts(s.export(snapshotBlocksPerEvent), nil); !sameCounts(got, expected) {
					t.Fatalf("seed %d batch %d: snapshot %v, history %v", seed, i, got, expected)
				}
			}
		}
		if got := counts(s.export(snapshotBlocksPerEvent), nil); !sameCounts(got, expected) {
			t.Fatalf("seed %d: snapshot %v, history %v", seed, got, expected)
		}
	}
}

// consume is test_kv_snapshot_bootstrap.py's consume(): a replay program
// must store a parent (or, tokenless, the block's own metadata) before
// relying on it; it returns the residency.
func consume(t *testing.T, events []Event) map[resKey]int {
	t.Helper()
	known := map[uint64]bool{}
	live := map[resKey]int{}
	for _, e := range events {
		switch e.Kind {
		case BlockStored:
			if len(e.TokenIDs) > 0 {
				if e.HasParent && !known[e.ParentBlockHash] {
					t.Fatalf("store %v before its parent %d", e.BlockHashes, e.ParentBlockHash)
				}
				for _, h := range e.BlockHashes {
					known[h] = true
				}
			} else {
				for _, h := range e.BlockHashes {
					if !known[h] {
						t.Fatalf("tokenless store of %d before its metadata", h)
					}
				}
			}
			for _, h := range e.BlockHashes {
				live[resKey{string(e.Medium), e.GroupIdx, h}]++
			}
		case BlockRemoved:
			for _, h := range e.BlockHashes {
				k := resKey{string(e.Medium), e.GroupIdx, h}
				if live[k]--; live[k] <= 0 {
					delete(live, k)
				}
			}
		}
	}
	return live
}

// TestSnapshotBootstrapCases are test_kv_snapshot_bootstrap.py's cases
// and the unit cases of test_kv_events_snapshot.py.
func TestSnapshotBootstrapCases(t *testing.T) {
	gpu := func(k uint64) resKey { return resKey{MediumGPU, 0, k} }
	cpu := func(k uint64) resKey { return resKey{"CPU", 0, k} }
	cases := []struct {
		name    string
		history []Event
		want    map[resKey]int
	}{
		{"evicted parent metadata is retained",
			[]Event{stored([]uint64{1}, 0, false, MediumGPU), stored([]uint64{2}, 1, true, MediumGPU), removed(MediumGPU, 1)},
			map[resKey]int{gpu(2): 1}},
		{"CPU-only block retains GPU metadata",
			[]Event{stored([]uint64{1}, 0, false, MediumGPU), stored([]uint64{1}, 0, false, "CPU"), removed(MediumGPU, 1)},
			map[resKey]int{cpu(1): 1}},
		{"duplicate references survive one remove",
			[]Event{stored([]uint64{1}, 0, false, MediumGPU), stored([]uint64{1}, 0, false, MediumGPU), removed(MediumGPU, 1)},
			map[resKey]int{gpu(1): 1}},
		{"reset keeps CPU dependencies",
			[]Event{stored([]uint64{1}, 0, false, MediumGPU), stored([]uint64{1}, 0, false, "CPU"), {Kind: AllBlocksCleared}},
			map[resKey]int{cpu(1): 1}},
	}
	for _, c := range cases {
		s := newSnapshotState(0, 0)
		if err := s.apply(c.history); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := consume(t, s.export(snapshotBlocksPerEvent)); !sameCounts(got, c.want) {
			t.Errorf("%s: snapshot residency %v, want %v", c.name, got, c.want)
		}
	}

	// A sparse source event is not split: exported verbatim.
	s := newSnapshotState(0, 0)
	original := Event{Kind: BlockStored, BlockHashes: []uint64{1, 3}, TokenIDs: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
		BlockSize: 4, Medium: []byte(MediumGPU), LoRAName: []byte("adapter"), ExtraKeys: [][]byte{{0x92, 0xa1, 'a', 0xa1, 's'}, nil},
		SpecKind: []byte("sliding_window"), SlidingWindow: 128, HasSlidingWindow: true}
	if err := s.apply([]Event{original, removed(MediumGPU, 1)}); err != nil {
		t.Fatal(err)
	}
	exported := s.export(snapshotBlocksPerEvent)
	if !sameEvent(exported[0], original) {
		t.Fatalf("sparse store exported as %+v, want verbatim %+v", exported[0], original)
	}
	if got := consume(t, exported); !sameCounts(got, map[resKey]int{gpu(3): 1}) {
		t.Fatalf("sparse store: residency %v", got)
	}

	// Missing metadata fails closed.
	if err := newSnapshotState(0, 0).apply([]Event{stored([]uint64{2}, 1, true, MediumGPU)}); err == nil {
		t.Fatal("a store whose parent was never seen was accepted")
	}

	// Metadata is collected when the last dependent disappears.
	s = newSnapshotState(0, 0)
	for h := uint64(1); h <= 1000; h++ {
		if err := s.apply([]Event{stored([]uint64{h}, 0, false, MediumGPU)}); err != nil {
			t.Fatal(err)
		}
		if err := s.apply([]Event{removed(MediumGPU, h)}); err != nil {
			t.Fatal(err)
		}
		if len(s.sources) != 0 || len(s.known) != 0 || s.metaSize != 0 {
			t.Fatalf("after store and remove of %d: %d sources, %d known, %d bytes", h, len(s.sources), len(s.known), s.metaSize)
		}
	}

	// Dependencies are released iteratively: a chain whose every block but
	// the last was evicted keeps all its stores, until the last goes.
	s = newSnapshotState(0, 0)
	for h := uint64(1); h <= 1500; h++ {
		if err := s.apply([]Event{stored([]uint64{h}, h-1, h > 1, MediumGPU)}); err != nil {
			t.Fatal(err)
		}
		if h > 1 {
			if err := s.apply([]Event{removed(MediumGPU, h-1)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(s.live) != 1 || len(s.sources) != 1500 {
		t.Fatalf("chain: %d live, %d sources; want 1 and 1500", len(s.live), len(s.sources))
	}
	if err := s.apply([]Event{removed(MediumGPU, 1500)}); err != nil {
		t.Fatal(err)
	}
	if len(s.sources) != 0 || len(s.known) != 0 {
		t.Fatalf("chain gone: %d sources, %d known", len(s.sources), len(s.known))
	}
}

func sameEvent(a, b Event) bool {
	if len(a.ExtraKeys) != len(b.ExtraKeys) {
		return false
	}
	for i := range a.ExtraKeys {
		if !bytes.Equal(a.ExtraKeys[i], b.ExtraKeys[i]) || (a.ExtraKeys[i] == nil) != (b.ExtraKeys[i] == nil) {
			return false
		}
	}
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.HasParent == b.HasParent &&
		a.ParentBlockHash == b.ParentBlockHash && slices.Equal(a.TokenIDs, b.TokenIDs) && a.BlockSize == b.BlockSize &&
		a.LoRAID == b.LoRAID && a.HasLoRAID == b.HasLoRAID && bytes.Equal(a.Medium, b.Medium) &&
		bytes.Equal(a.LoRAName, b.LoRAName) && a.GroupIdx == b.GroupIdx && a.HasGroupIdx == b.HasGroupIdx &&
		bytes.Equal(a.SpecKind, b.SpecKind) && a.SlidingWindow == b.SlidingWindow && a.HasSlidingWindow == b.HasSlidingWindow
}

// --- wire tests ---

// recvTimeout receives one message from s, failing the test after a
// minute.
func recvTimeout(t *testing.T, s zmq4.Socket) zmq4.Msg {
	t.Helper()
	type res struct {
		m   zmq4.Msg
		err error
	}
	c := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		c <- res{m, err}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("recv: %v", r.err)
		}
		return r.m
	case <-time.After(time.Minute):
		t.Fatal("no message within a minute")
	}
	return zmq4.Msg{}
}

func newPublisher(t *testing.T, o PublisherOptions) *Publisher {
	t.Helper()
	if o.Endpoint == "" {
		o.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisherWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, s zmq4.Socket, addr fmt.Stringer) zmq4.Socket {
	t.Helper()
	if err := s.Dial("tcp://" + addr.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func seqFrame8(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

// testBatch is the publisher tests' batch: one store of hash i.
func testBatch(i int) *Batch {
	ev := stored([]uint64{uint64(i) + 1}, 0, false, MediumGPU)
	return &Batch{TS: float64(i), Events: []Event{ev}}
}

// TestPublisherReplayFormats: test_replay_mechanism and
// test_replay_includes_topic (vLLM's current format, PR 45177): 19
// batches, a replay from 10 answers exactly 10..18, each [topic, seq,
// payload] after the delimiter, then [“”, -1, “”]; and SGLang's two-frame
// form ([seq, payload], end [-1, “”]) with the same content.
func TestPublisherReplayFormats(t *testing.T) {
	for _, f := range []ReplayFormat{ReplayWithTopic, ReplayTwoFrames} {
		p := newPublisher(t, PublisherOptions{ReplayEndpoint: "tcp://127.0.0.1:0", ReplayFormat: f, Topic: "test", BufferSteps: 100})
		var payloads [][]byte
		enc := Encoder{}
		for i := range 19 {
			b := testBatch(i)
			b.DataParallelRank, b.HasDataParallelRank = 0, true
			pl, _ := enc.Encode(b)
			payloads = append(payloads, slices.Clone(pl))
			if seq, err := p.PublishBatch(b); err != nil || seq != uint64(i) {
				t.Fatalf("publish %d: seq %d, %v", i, seq, err)
			}
		}
		d := dial(t, zmq4.NewDealer(context.Background()), p.ReplayAddr())
		if err := d.Send(zmq4.NewMsgFrom(nil, seqFrame8(10))); err != nil {
			t.Fatal(err)
		}
		for want := int64(10); ; want++ {
			m := recvTimeout(t, d)
			var wantFrames [][]byte
			if want == 19 {
				wantFrames = [][]byte{{}, {}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}
				if f == ReplayTwoFrames {
					wantFrames = [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}
				}
			} else {
				wantFrames = [][]byte{{}, []byte("test"), seqFrame8(want), payloads[want]}
				if f == ReplayTwoFrames {
					wantFrames = [][]byte{{}, seqFrame8(want), payloads[want]}
				}
			}
			if len(m.Frames) != len(wantFrames) {
				t.Fatalf("format %d, message %d: frames %q, want %q", f, want, m.Frames, wantFrames)
			}
			for i := range wantFrames {
				if !bytes.Equal(m.Frames[i], wantFrames[i]) {
					t.Fatalf("format %d, message %d: frames %q, want %q", f, want, m.Frames, wantFrames)
				}
			}
			if want == 19 {
				break
			}
		}
	}
}

// TestPublisherBufferLimit is test_buffer_limit: with buffer_steps B, B+10
// batches published, a replay from 0 answers 10..B+9.
func TestPublisherBufferLimit(t *testing.T) {
	const steps = 7
	p := newPublisher(t, PublisherOptions{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: steps})
	for i := range steps + 10 {
		if _, err := p.PublishBatch(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	d := dial(t, zmq4.NewDealer(context.Background()), p.ReplayAddr())
	if err := d.Send(zmq4.NewMsgFrom(nil, seqFrame8(0))); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for {
		m := recvTimeout(t, d)
		s := int64(binary.BigEndian.Uint64(m.Frames[2]))
		if s == -1 {
			break
		}
		seqs = append(seqs, s)
	}
	if want := []int64{10, 11, 12, 13, 14, 15, 16}; !slices.Equal(seqs, want) {
		t.Fatalf("replayed %v, want %v", seqs, want)
	}
}

// subscriber is a SUB socket on a publisher, subscribed to everything,
// that has received at least one message (a subscription takes effect
// some time after the dial).
func subscriber(t *testing.T, p *Publisher) zmq4.Socket {
	t.Helper()
	s := dial(t, zmq4.NewSub(context.Background()), p.Addr())
	if err := s.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	return s
}

// decodeBatch reads a payload with a generic msgpack decoder:
// [ts, events, rank].
func decodeBatch(t *testing.T, payload []byte) (events []any, rank int64) {
	t.Helper()
	var b []any
	if err := msgpack.Unmarshal(payload, &b); err != nil || len(b) != 3 {
		t.Fatalf("batch %x: %v, %v", payload, b, err)
	}
	ev, ok := b[1].([]any)
	if !ok {
		t.Fatalf("batch events %T", b[1])
	}
	return ev, toInt(t, b[2])
}

func toInt(t *testing.T, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	t.Fatalf("not an integer: %T %v", v, v)
	return 0
}

// wireCounts folds events as read by a generic decoder (map events,
// EncodingMap) into residency, as the snapshot tests' counts() folds
// msgspec.msgpack.decode(chunk)[1].
func wireCounts(t *testing.T, events []any, live map[resKey]int) map[resKey]int {
	t.Helper()
	var evs []Event
	for _, e := range events {
		m, ok := e.(map[string]any)
		if !ok {
			t.Fatalf("event %v is not a map", e)
		}
		ev := Event{}
		switch m["type"] {
		case "BlockStored":
			ev.Kind = BlockStored
		case "BlockRemoved":
			ev.Kind = BlockRemoved
		case "AllBlocksCleared":
			ev.Kind = AllBlocksCleared
		default:
			t.Fatalf("event type %v", m["type"])
		}
		if md, ok := m["medium"].(string); ok {
			ev.Medium = []byte(md)
		}
		if g, ok := m["group_idx"]; ok && g != nil {
			ev.GroupIdx = toInt(t, g)
		}
		if hs, ok := m["block_hashes"].([]any); ok {
			for _, h := range hs {
				ev.BlockHashes = append(ev.BlockHashes, uint64(toInt(t, h)))
			}
		}
		evs = append(evs, ev)
	}
	return counts(evs, live)
}

// snapshot sends one REQ "snapshot", as vLLM's tests and client do, and
// returns the reply's frames.
func snapshot(t *testing.T, p *Publisher) [][]byte {
	t.Helper()
	f, err := requestSnapshot(p.SnapshotAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// requestSnapshot is snapshot on its own REQ socket, waiting a minute at
// most.
func requestSnapshot(addr string) ([][]byte, error) {
	r := zmq4.NewReq(context.Background())
	defer r.Close()
	if err := r.Dial("tcp://" + addr); err != nil {
		return nil, err
	}
	if err := r.Send(zmq4.NewMsgString("snapshot")); err != nil {
		return nil, err
	}
	c := make(chan zmq4.Msg, 1)
	go func() {
		m, err := r.Recv()
		if err == nil {
			c <- m
		}
	}()
	select {
	case m := <-c:
		return m.Frames, nil
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("no snapshot reply from %s within a minute", addr)
	}
}

// TestPublisherSnapshotEmptyAndHeartbeat is
// test_empty_snapshot_and_idle_subscription: a snapshot before any batch
// is [-1, publisher id]; an idle publisher's subscriber still receives
// messages (heartbeats): empty batches with the rank, sequence frames of
// 24 bytes, the sequence then the id.
func TestPublisherSnapshotEmptyAndHeartbeat(t *testing.T) {
	p := newPublisher(t, PublisherOptions{SnapshotEndpoint: "tcp://127.0.0.1:0", Encoding: EncodingMap, DataParallelRank: 3})
	id := p.ID()
	if len(id) != 16 || id[6]>>4 != 4 {
		t.Fatalf("publisher id %x, want a 16-byte version 4 UUID", id)
	}
	f := snapshot(t, p)
	if len(f) != 2 || !bytes.Equal(f[0], seqFrame8(-1)) || !bytes.Equal(f[1], id) {
		t.Fatalf("empty snapshot %x, want [-1, %x]", f, id)
	}
	s := subscriber(t, p)
	// No batch is ever published: whatever arrives is a heartbeat.
	m := recvTimeout(t, s)
	if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 24 || !bytes.Equal(m.Frames[1][8:], id) {
		t.Fatalf("heartbeat frames %x, want topic \"\", 8-byte sequence + id, payload", m.Frames)
	}
	events, rank := decodeBatch(t, m.Frames[2])
	if len(events) != 0 || rank != 3 {
		t.Fatalf("heartbeat payload: %d events, rank %d; want none, rank 3", len(events), rank)
	}
	next := recvTimeout(t, s)
	if a, b := binary.BigEndian.Uint64(m.Frames[1]), binary.BigEndian.Uint64(next.Frames[1]); b != a+1 {
		t.Fatalf("heartbeat sequences %d then %d", a, b)
	}
	// The heartbeats are recorded: the snapshot's cut moved, still empty.
	f = snapshot(t, p)
	if cut := int64(binary.BigEndian.Uint64(f[0])); cut < 0 || len(f) != 2 {
		t.Fatalf("snapshot after heartbeats: cut %d, %d frames; want >= 0 and no chunk", cut, len(f))
	}
}

// TestPublisherSnapshotConcurrent is test_concurrent_requests: one store
// of three blocks, 32 snapshot requests from 8 clients at once: every
// reply covers it, each block resident once.
func TestPublisherSnapshotConcurrent(t *testing.T) {
	p := newPublisher(t, PublisherOptions{SnapshotEndpoint: "tcp://127.0.0.1:0", Encoding: EncodingMap})
	if _, err := p.PublishBatch(&Batch{Events: []Event{stored([]uint64{1, 2, 3}, 0, false, MediumGPU)}}); err != nil {
		t.Fatal(err)
	}
	want := map[resKey]int{{MediumGPU, 0, 1}: 1, {MediumGPU, 0, 2}: 1, {MediumGPU, 0, 3}: 1}
	var wg sync.WaitGroup
	replies := make(chan [][]byte, 32)
	errs := make(chan error, 32)
	for range 8 {
		wg.Go(func() {
			for range 4 {
				f, err := requestSnapshot(p.SnapshotAddr().String())
				if err != nil {
					errs <- err
					return
				}
				replies <- f
			}
		})
	}
	wg.Wait()
	close(errs)
	close(replies)
	for err := range errs {
		t.Fatal(err)
	}
	n := 0
	for f := range replies {
		n++
		if len(f) < 2 || int64(binary.BigEndian.Uint64(f[0])) < 0 || !bytes.Equal(f[1], p.ID()) {
			t.Fatalf("reply header %x", f)
		}
		live := map[resKey]int{}
		for _, c := range f[2:] {
			ev, _ := decodeBatch(t, c)
			wireCounts(t, ev, live)
		}
		if !sameCounts(live, want) {
			t.Fatalf("snapshot residency %v, want %v", live, want)
		}
	}
	if n != 32 {
		t.Fatalf("%d replies, want 32", n)
	}
}

// TestPublisherSnapshotUnavailable: test_resource_budget_fails_closed
// (metadata and reply budgets), test_fold_failure_is_unavailable (here: a
// raw payload the recorder cannot read, and a store whose parent was
// never seen) and a publisher started unavailable: the reply is exactly
// [-2, id], and live publishing goes on.
func TestPublisherSnapshotUnavailable(t *testing.T) {
	one := &Batch{Events: []Event{stored([]uint64{1, 2}, 0, false, MediumGPU)}}
	orphan := &Batch{Events: []Event{stored([]uint64{2}, 1, true, MediumGPU)}}
	for _, c := range []struct {
		name string
		o    PublisherOptions
		pub  func(p *Publisher) error
	}{
		{"refused", PublisherOptions{SnapshotUnavailable: true}, func(p *Publisher) error { _, err := p.PublishBatch(one); return err }},
		{"references", PublisherOptions{SnapshotMaxReferences: 1}, func(p *Publisher) error { _, err := p.PublishBatch(one); return err }},
		{"metadata", PublisherOptions{SnapshotMaxMetadataBytes: 1}, func(p *Publisher) error { _, err := p.PublishBatch(one); return err }},
		{"reply", PublisherOptions{SnapshotMaxReplyBytes: 1}, func(p *Publisher) error { _, err := p.PublishBatch(one); return err }},
		{"raw payload", PublisherOptions{}, func(p *Publisher) error { _, err := p.Publish([]byte{0x92, 0, 0x90}); return err }},
		{"missing parent", PublisherOptions{}, func(p *Publisher) error { _, err := p.PublishBatch(orphan); return err }},
	} {
		c.o.SnapshotEndpoint = "tcp://127.0.0.1:0"
		p := newPublisher(t, c.o)
		if err := c.pub(p); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		f := snapshot(t, p)
		if len(f) != 2 || !bytes.Equal(f[0], seqFrame8(-2)) || !bytes.Equal(f[1], p.ID()) {
			t.Fatalf("%s: reply %x, want exactly [-2, id]", c.name, f)
		}
		if seq, err := p.PublishBatch(testBatch(5)); err != nil || seq != 1 {
			t.Fatalf("%s: publishing after the failure: seq %d, %v", c.name, seq, err)
		}
		if f := snapshot(t, p); len(f) != 2 || !bytes.Equal(f[0], seqFrame8(-2)) {
			t.Fatalf("%s: the recorder recovered: %x", c.name, f)
		}
	}
}

// TestPublisherSnapshotRank is test_data_parallel_rank_offsets_and_tags'
// tag half: a rank 2 publisher's chunks carry data_parallel_rank 2.
func TestPublisherSnapshotRank(t *testing.T) {
	p := newPublisher(t, PublisherOptions{SnapshotEndpoint: "tcp://127.0.0.1:0", DataParallelRank: 2, Encoding: EncodingMap})
	if _, err := p.PublishBatch(testBatch(0)); err != nil {
		t.Fatal(err)
	}
	f := snapshot(t, p)
	if len(f) != 3 {
		t.Fatalf("reply %d frames, want one chunk", len(f))
	}
	if _, rank := decodeBatch(t, f[2]); rank != 2 {
		t.Fatalf("chunk rank %d, want 2", rank)
	}
}

// TestPublisherRestartChangesID is test_restart_changes_epoch: a new
// publisher on the same endpoints has a new id and starts at sequence 0.
func TestPublisherRestartChangesID(t *testing.T) {
	o := PublisherOptions{Endpoint: "tcp://127.0.0.1:0", SnapshotEndpoint: "tcp://127.0.0.1:0"}
	p, err := NewPublisherWith(o)
	if err != nil {
		t.Fatal(err)
	}
	old := p.ID()
	if _, err := p.PublishBatch(testBatch(0)); err != nil {
		t.Fatal(err)
	}
	o.Endpoint, o.SnapshotEndpoint = "tcp://"+p.Addr().String(), "tcp://"+p.SnapshotAddr().String()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	q := newPublisher(t, o)
	if bytes.Equal(q.ID(), old) {
		t.Fatal("the restarted publisher kept its id")
	}
	if seq, err := q.PublishBatch(testBatch(0)); err != nil || seq != 0 {
		t.Fatalf("restarted publisher: first sequence %d, %v", seq, err)
	}
}

// TestPublisherMidstreamBootstrap is test_midstream_bootstrap_converges,
// with the handoff of the fork's examples/others/kv_snapshot_poc/client.py:
// while 600 random batches are being published, a client waits for one
// live message, requests a snapshot while buffering live messages,
// applies the snapshot and then the buffered and following batches with
// sequences past the cut, consecutively; its residency ends equal to the
// full history's.
func TestPublisherMidstreamBootstrap(t *testing.T) {
	for seed := range uint64(3) {
		p := newPublisher(t, PublisherOptions{SnapshotEndpoint: "tcp://127.0.0.1:0", Encoding: EncodingMap})
		batches := randomBatches(seed, 600)
		expected := map[resKey]int{}
		for _, b := range batches {
			counts(b, expected)
		}
		sub := subscriber(t, p)
		msgs := make(chan zmq4.Msg, 1024)
		go func() {
			for {
				m, err := sub.Recv()
				if err != nil {
					close(msgs)
					return
				}
				msgs <- m
			}
		}()
		var last uint64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, b := range batches {
				seq, err := p.PublishBatch(&Batch{Events: b})
				if err != nil {
					t.Error(err)
					return
				}
				last = seq
				time.Sleep(time.Millisecond)
			}
		}()
		read := func() (seq uint64, payload []byte) {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatal("subscriber closed")
				}
				if len(m.Frames) != 3 || len(m.Frames[1]) != 24 || !bytes.Equal(m.Frames[1][8:], p.ID()) {
					t.Fatalf("live frames %x", m.Frames)
				}
				return binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]
			case <-time.After(time.Minute):
				t.Fatal("no live message within a minute")
			}
			return 0, nil
		}
		type live struct {
			seq     uint64
			payload []byte
		}
		first, pl := read()
		buffered := []live{{first, pl}}
		f := snapshot(t, p)
		// Whatever arrived while the snapshot was made is buffered too.
	drain:
		for {
			select {
			case m := <-msgs:
				buffered = append(buffered, live{binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]})
			default:
				break drain
			}
		}
		if len(f) < 2 || !bytes.Equal(f[1], p.ID()) {
			t.Fatalf("snapshot header %x", f)
		}
		cut := int64(binary.BigEndian.Uint64(f[0]))
		if cut < int64(first) {
			t.Fatalf("snapshot cut %d before the first live message %d it must cover", cut, first)
		}
		state := map[resKey]int{}
		for _, c := range f[2:] {
			ev, _ := decodeBatch(t, c)
			wireCounts(t, ev, state)
		}
		next := uint64(cut + 1)
		for _, m := range buffered {
			if m.seq <= uint64(cut) {
				continue
			}
			if m.seq != next {
				t.Fatalf("gap during bootstrap: %d after %d", m.seq, next-1)
			}
			ev, _ := decodeBatch(t, m.payload)
			wireCounts(t, ev, state)
			next++
		}
		<-done
		for next <= last {
			seq, pl := read()
			if seq < next {
				continue
			}
			if seq != next {
				t.Fatalf("live gap: %d after %d", seq, next-1)
			}
			ev, _ := decodeBatch(t, pl)
			wireCounts(t, ev, state)
			next++
		}
		if !sameCounts(state, expected) {
			t.Fatalf("seed %d: bootstrapped residency %v, history %v", seed, state, expected)
		}
	}
}

// TestPublisherOptionsValidate: an unknown replay format and negative
// bounds are refused; an endpoint in use names itself.
func TestPublisherOptionsValidate(t *testing.T) {
	for _, o := range []PublisherOptions{
		{Endpoint: "tcp://127.0.0.1:0", ReplayFormat: 9},
		{Endpoint: "tcp://127.0.0.1:0", Heartbeat: -1},
		{Endpoint: "tcp://127.0.0.1:0", SnapshotMaxReferences: -1},
	} {
		if p, err := NewPublisherWith(o); err == nil {
			p.Close()
			t.Errorf("%+v accepted", o)
		}
	}
	p := newPublisher(t, PublisherOptions{})
	ep := "tcp://" + p.Addr().String()
	if _, err := NewPublisherWith(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", SnapshotEndpoint: ep}); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte(ep)) {
		t.Fatalf("snapshot endpoint in use: %v", err)
	}
}
