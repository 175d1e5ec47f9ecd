package kvevents

import (
	"context"

	"encoding/binary"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-zeromq/zmq4"
	"github.com/switchyard-router/switchyard/internal/testkit"
)

// These tests speak vLLM's wire by hand on real ZeroMQ sockets, following
// vLLM's own tests and source rather than this package's encoder:
//   - replay: tests/distributed/test_events.py (vllm-project/vllm@05d3142f)
//     test_replay_includes_topic, and ZmqEventPublisher._service_replay:
//     answers [identity, "", topic, seq (8), payload], ended by
//     [identity, "", "", -1 (8, signed), ""] (PR 45177); SGLang and older
//     vLLM answer without the topic;
//   - snapshots: the snapshot branch of vLLM PR 57789 (vMaroon/vllm@08ee3e54)
//     vllm/distributed/kv_events.py (live frames [topic, seq (8) + publisher
//     uuid (16), payload], an empty batch each idle second) and
//     kv_events_snapshot.py (a ROUTER replying to the request's envelope
//     with [cut (8, signed), uuid (16), chunk...], -1 for nothing recorded,
//     -2 unavailable in exactly 2 frames), and its
//     tests/distributed/test_kv_events_snapshot.py (empty snapshot, -2,
//     gap requires a fresh snapshot, restart changes the epoch, an
//     incompatible publisher, a mid-stream bootstrap that converges).
// Payloads are vLLM's KVEventBatch as released engines send it: an array
// envelope [ts, events, data_parallel_rank] of tagged map events.

// vllmStored is a BlockStored event as msgspec writes it (tag "type",
// fields with a default left out).
func vllmStored(h uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": nil,
		"token_ids": []any{int64(h % 1000)}, "block_size": 1, "lora_id": nil, "medium": "GPU", "lora_name": nil}
}

func vllmRemoved(h uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": []any{h}, "medium": "GPU"}
}

// vllmBatch is a KVEventBatch payload.
func vllmBatch(t *testing.T, rank int, events ...map[string]any) []byte {
	t.Helper()
	evs := make([]any, len(events))
	for i, e := range events {
		evs[i] = e
	}
	return rawOf(t, []any{float64(time.Now().UnixNano()) / 1e9, evs, rank})
}

// seqFrame is vLLM's live sequence frame: 8 bytes big-endian, then the
// publisher's 16-byte identity when it serves snapshots.
func seqFrame(seq uint64, id []byte) []byte {
	return append(binary.BigEndian.AppendUint64(nil, seq), id...)
}

// engine is a vLLM engine's KV-event publisher written by hand: a PUB
// socket, optionally a replay ROUTER and a snapshot ROUTER. Its cache is
// a set of block hashes; each data batch stores one block (and every
// third also removes an older one), so the state a subscriber must end
// with is known exactly.
type engine struct {
	t      *testing.T
	topic  string
	rank   int
	pub    zmq4.Socket
	replay zmq4.Socket // nil without
	snap   zmq4.Socket // nil without
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once

	mu         sync.Mutex
	id         []byte // 16 bytes, or nil: 8-byte sequence frames (no snapshots)
	seq        uint64 // the next sequence number
	sent       []liveMsg
	held       map[uint64]bool
	nextBlock  uint64
	oldTopic   bool                                // replay answers without the topic (SGLang, vLLM before PR 45177)
	replayKeep int                                 // the replay buffer's batches (vLLM's buffer_steps); 0: all
	snapAnswer func(n int, real [][]byte) [][]byte // the reply to the n-th request (from 1) given the real one; nil: the real one
	snapReqs   int
	beating    atomic.Bool // send a heartbeat every 10 ms
}

type engineOpts struct {
	id             []byte // the publisher identity; nil: no snapshots
	replay, snap   bool
	oldReplayTopic bool
}

func newEngine(t *testing.T, o engineOpts) *engine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &engine{t: t, topic: "kv", rank: 0, pub: zmq4.NewPub(ctx), cancel: cancel, id: o.id, held: map[uint64]bool{}, nextBlock: 1000, oldTopic: o.oldReplayTopic}
	if err := e.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if o.replay {
		e.replay = zmq4.NewRouter(ctx)
		if err := e.replay.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		e.wg.Go(e.serveReplay)
	}
	if o.snap {
		e.snap = zmq4.NewRouter(ctx)
		if err := e.snap.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		e.wg.Go(e.serveSnapshots)
	}
	e.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if e.beating.Load() {
					e.send(vllmBatch(t, e.rank))
				}
			}
		}
	})
	t.Cleanup(e.close)
	return e
}

func (e *engine) close() {
	e.closed.Do(func() {
		e.cancel()
		_ = e.pub.Close()
		if e.replay != nil {
			_ = e.replay.Close()
		}
		if e.snap != nil {
			_ = e.snap.Close()
		}
		e.wg.Wait()
	})
}

func (e *engine) endpoint(s zmq4.Socket) string { return "tcp://" + s.Addr().(*net.TCPAddr).String() }

// send records payload under the next sequence number (before sending,
// as vLLM's recorder does) and publishes it.
func (e *engine) send(payload []byte) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sendLocked(payload)
}

func (e *engine) sendLocked(payload []byte) uint64 {
	seq := e.seq
	e.seq++
	e.sent = append(e.sent, liveMsg{seq, payload})
	_ = e.pub.Send(zmq4.NewMsgFrom([]byte(e.topic), seqFrame(seq, e.id), payload))
	return seq
}

// lose stores a new block in a batch no subscriber receives (lost on
// the way: recorded, not sent); the snapshot and the replay buffer have
// it. It returns the block.
func (e *engine) lose() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.nextBlock
	e.nextBlock++
	e.held[h] = true
	e.sent = append(e.sent, liveMsg{e.seq, vllmBatch(e.t, e.rank, vllmStored(h))})
	e.seq++
	return h
}

// store publishes a batch storing a new block (and, every third block,
// removing the oldest held).
func (e *engine) store() {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.nextBlock
	e.nextBlock++
	e.held[h] = true
	evs := []map[string]any{vllmStored(h)}
	if h%3 == 0 {
		old := slices.Min(slices.Collect(maps.Keys(e.held)))
		delete(e.held, old)
		evs = append(evs, vllmRemoved(old))
	}
	e.sendLocked(vllmBatch(e.t, e.rank, evs...))
}

// restart gives the publisher a new identity and a new cache, as a
// restarted engine on the same port; its sequence starts again from
// from (a restarted engine's stream seen mid-way), its blocks from
// firstBlock.
func (e *engine) restart(id []byte, from, firstBlock uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.id, e.seq, e.sent, e.held, e.nextBlock = id, from, nil, map[uint64]bool{}, firstBlock
}

func (e *engine) heldBlocks() map[uint64]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.held)
}

func (e *engine) lastSeq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq - 1
}

func (e *engine) snapshotRequests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapReqs
}

// answer sets snapAnswer.
func (e *engine) answer(f func(n int, real [][]byte) [][]byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.snapAnswer = f
}

// serveReplay answers as ZmqEventPublisher._service_replay.
func (e *engine) serveReplay() {
	for {
		msg, err := e.replay.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		e.mu.Lock()
		var out []liveMsg
		kept := e.sent
		if e.replayKeep > 0 && len(kept) > e.replayKeep {
			kept = kept[len(kept)-e.replayKeep:]
		}
		for _, m := range kept {
			if m.seq >= start {
				out = append(out, m)
			}
		}
		old := e.oldTopic
		e.mu.Unlock()
		end := binary.BigEndian.AppendUint64(nil, ^uint64(0)) // -1, signed
		for _, m := range out {
			if old {
				_ = e.replay.Send(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, m.seq), m.payload))
			} else {
				_ = e.replay.Send(zmq4.NewMsgFrom(id, nil, []byte(e.topic), binary.BigEndian.AppendUint64(nil, m.seq), m.payload))
			}
		}
		if old {
			_ = e.replay.Send(zmq4.NewMsgFrom(id, nil, end, nil))
		} else {
			_ = e.replay.Send(zmq4.NewMsgFrom(id, nil, nil, end, nil))
		}
	}
}

// serveSnapshots answers as KVEventSnapshotRecorder._serve: the reply goes
// to the request's envelope (the frames up to the empty delimiter); the
// cut is the last recorded batch, the chunks a replay program storing
// every held block, two events per chunk.
func (e *engine) serveSnapshots() {
	for {
		msg, err := e.snap.Recv()
		if err != nil {
			return
		}
		env := msg.Frames[:1]
		for i, f := range msg.Frames {
			if len(f) == 0 {
				env = msg.Frames[:i+1]
				break
			}
		}
		e.mu.Lock()
		e.snapReqs++
		n, answer := e.snapReqs, e.snapAnswer
		cut := int64(e.seq) - 1
		reply := [][]byte{binary.BigEndian.AppendUint64(nil, uint64(cut)), e.id}
		var evs []map[string]any
		for _, h := range slices.Sorted(maps.Keys(e.held)) {
			evs = append(evs, vllmStored(h))
		}
		e.mu.Unlock()
		for len(evs) > 0 {
			k := min(2, len(evs))
			reply = append(reply, vllmBatch(e.t, e.rank, evs[:k]...))
			evs = evs[k:]
		}
		if answer != nil {
			if r := answer(n, reply); r != nil {
				reply = r
			}
		}
		_ = e.snap.Send(zmq4.Msg{Frames: append(slices.Clone(env), reply...)})
	}
}

// setSink is a sink holding the block hashes stored and not removed, as
// an index would.
type setSink struct {
	mu          sync.Mutex
	blocks      map[uint64]int
	live        bool
	clears      int
	coldClears  int
	lives       int
	appliedLive int // batches applied while live
}

func (s *setSink) Apply(b *Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocks == nil {
		s.blocks = map[uint64]int{}
	}
	if s.live {
		s.appliedLive++
	}
	for _, ev := range b.Events {
		switch ev.Kind {
		case BlockStored:
			for _, h := range ev.BlockHashes {
				s.blocks[h]++
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				if s.blocks[h]--; s.blocks[h] <= 0 {
					delete(s.blocks, h)
				}
			}
		case AllBlocksCleared:
			clear(s.blocks)
		}
	}
}

func (s *setSink) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.blocks)
	s.live = false
	s.clears++
}

func (s *setSink) ClearCold() {
	s.Clear()
	s.mu.Lock()
	s.coldClears++
	s.mu.Unlock()
}

func (s *setSink) MarkLive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = true
	s.lives++
}

type sinkState struct {
	blocks              map[uint64]bool
	live                bool
	clears, cold, lives int
}

func (s *setSink) state() sinkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := sinkState{blocks: map[uint64]bool{}, live: s.live, clears: s.clears, cold: s.coldClears, lives: s.lives}
	for h := range s.blocks {
		out.blocks[h] = true
	}
	return out
}

// fastOpts are options with quick retries for e.
func fastOpts(e *engine) Options {
	o := Options{Endpoint: e.endpoint(e.pub), Topic: "kv", Rank: 0, HasRank: true,
		Backoff: backoff.NewConstantBackOff(20 * time.Millisecond), RecoveryBackoff: backoff.NewConstantBackOff(20 * time.Millisecond)}
	if e.replay != nil {
		o.ReplayEndpoint = e.endpoint(e.replay)
	}
	if e.snap != nil {
		o.SnapshotEndpoint = e.endpoint(e.snap)
	}
	return o
}

func startSub(t *testing.T, o Options, sink Sink) *Subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Subscribe(ctx, o, sink)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Wait() })
	return s
}

// converged waits until the subscriber applied the engine's last batch
// and is live, and checks the sink holds exactly the engine's blocks.
func converged(t *testing.T, e *engine, s *Subscriber, sink *setSink) {
	t.Helper()
	testkit.Eventually(t, "the subscriber live at the engine's last batch", func() bool {
		st := s.Stats()
		return st.State == StateLive && st.HasSeq && st.LastSeq == e.lastSeq()
	})
	got, want := sink.state(), e.heldBlocks()
	if !got.live || !maps.Equal(got.blocks, want) {
		t.Fatalf("sink live %v holding %v, engine holds %v", got.live, slices.Sorted(maps.Keys(got.blocks)), slices.Sorted(maps.Keys(want)))
	}
}

// warmUp makes the engine send until the subscriber has taken a message
// (a SUB socket misses what is sent before its subscription arrives).
func warmUp(t *testing.T, e *engine, s *Subscriber) {
	t.Helper()
	e.beating.Store(true)
	testkit.Eventually(t, "a first message taken", func() bool {
		st := s.Stats()
		return st.Batches > 0 || st.State == StateBootstrapping || st.HasPublisherID
	})
}

var (
	uuidA = []byte("0123456789abcdef")
	uuidB = []byte("fedcba9876543210")
)

// TestReplayIncludesTopic: replay against current vLLM, whose answers
// carry the topic (test_replay_includes_topic), and against SGLang's
// two-frame answers; also for a snapshot-enabled publisher (24-byte live
// frames, 8-byte replay frames) followed without a snapshot endpoint. A
// subscriber that joins mid-stream replays from 0 and ends live, exact.
func TestReplayIncludesTopic(t *testing.T) {
	for _, c := range []struct {
		name string
		o    engineOpts
	}{
		{"vllm", engineOpts{replay: true}},
		{"sglang two frames", engineOpts{replay: true, oldReplayTopic: true}},
		{"vllm with publisher identity", engineOpts{replay: true, id: uuidA}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, c.o)
			for range 5 {
				e.store() // before the subscriber: replayed
			}
			sink := &setSink{}
			s := startSub(t, fastOpts(e), sink)
			warmUp(t, e, s)
			e.beating.Store(false)
			for range 4 {
				e.store()
			}
			converged(t, e, s, sink)
			st := s.Stats()
			if st.Replays < 1 || st.ReplayFailures != 0 || st.Batches != e.lastSeq()+1 {
				t.Fatalf("replays %d, failures %d, batches %d (want %d)", st.Replays, st.ReplayFailures, st.Batches, e.lastSeq()+1)
			}
		})
	}
}

// TestSnapshotBootstrapMidstream: a subscriber joining a snapshot-enabled
// engine mid-stream, with batches flowing, buffers the live messages,
// asks for a snapshot, clears the sink (ClearCold), applies the chunks
// and the consecutive live suffix, and ends live holding exactly the
// engine's blocks (test_midstream_bootstrap_converges).
func TestSnapshotBootstrapMidstream(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	for range 7 {
		e.store()
	}
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	for range 20 {
		e.store()
		time.Sleep(time.Millisecond)
	}
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	st, got := s.Stats(), sink.state()
	if st.Snapshots != 1 || st.SnapshotFailures != [NumSnapshotFailures]uint64{} || got.cold != 1 || got.lives != 1 {
		t.Fatalf("snapshots %d, failures %v, cold clears %d, lives %d; want 1, none, 1, 1", st.Snapshots, st.SnapshotFailures, got.cold, got.lives)
	}
	if !st.HasPublisherID || string(st.PublisherID[:]) != string(uuidA) || st.BadMessages != 0 {
		t.Fatalf("publisher id %q (%v), bad messages %d", st.PublisherID, st.HasPublisherID, st.BadMessages)
	}
}

// TestSnapshotEmptyAndIdle: an idle engine with nothing cached: its
// heartbeats establish the subscription, its snapshot is empty (the
// heartbeat's cut, no chunk) and the sink is live and empty
// (test_empty_snapshot_and_idle_subscription). With a cut of -1 (nothing
// recorded) and the stream's first heartbeat (sequence 0) buffered, the
// heartbeat is applied after the empty snapshot.
func TestSnapshotEmptyAndIdle(t *testing.T) {
	for _, minusOne := range []bool{false, true} {
		e := newEngine(t, engineOpts{id: uuidA, snap: true})
		if minusOne {
			e.answer(func(_ int, real [][]byte) [][]byte {
				return [][]byte{binary.BigEndian.AppendUint64(nil, ^uint64(0)), real[1]}
			})
		}
		sink := &setSink{}
		s := startSub(t, fastOpts(e), sink)
		if minusOne {
			// The stream's first message, at sequence 0, each time from
			// a new engine (a new identity) until the subscriber took
			// one: the stream it follows is seen from its first message.
			attempt := byte(0)
			testkit.Eventually(t, "sequence 0 taken", func() bool {
				attempt++
				e.restart(append([]byte("attempt-0000000"), attempt), 0, 1000)
				e.send(vllmBatch(t, 0))
				time.Sleep(5 * time.Millisecond)
				return s.Stats().HasPublisherID
			})
		} else {
			warmUp(t, e, s)
		}
		testkit.Eventually(t, "live", func() bool { return s.Stats().State == StateLive })
		st, got := s.Stats(), sink.state()
		if !got.live || len(got.blocks) != 0 || st.Snapshots < 1 || minusOne && (st.LastSeq != 0 || !st.HasSeq) {
			t.Fatalf("cut -1 %v: sink live %v with %d blocks, snapshots %d, last sequence %d (%v)",
				minusOne, got.live, len(got.blocks), st.Snapshots, st.LastSeq, st.HasSeq)
		}
		e.beating.Store(false)
		e.store()
		converged(t, e, s, sink)
	}
}

// TestSnapshotUnavailable: an engine whose recorder failed answers -2 in
// exactly two frames (test_resource_budget_fails_closed); the subscriber
// counts it, does not ask again while the publisher is the same, and
// follows it by replay (live, exact) or, without a replay endpoint,
// live-only (cold, every later batch applied).
func TestSnapshotUnavailable(t *testing.T) {
	for _, replay := range []bool{true, false} {
		e := newEngine(t, engineOpts{id: uuidA, snap: true, replay: replay})
		e.answer(func(int, [][]byte) [][]byte {
			return [][]byte{binary.BigEndian.AppendUint64(nil, uint64(0xffff_ffff_ffff_fffe)), uuidA} // -2
		})
		for range 3 {
			e.store()
		}
		sink := &setSink{}
		s := startSub(t, fastOpts(e), sink)
		warmUp(t, e, s)
		e.beating.Store(false)
		for range 4 {
			e.store()
		}
		if replay {
			converged(t, e, s, sink)
		} else {
			testkit.Eventually(t, "the last batch applied", func() bool { return s.Stats().LastSeq == e.lastSeq() })
			if st := s.Stats(); st.State != StateCold || sink.state().live {
				t.Fatalf("without replay: state %v, sink live %v; want cold", st.State, sink.state().live)
			}
		}
		st := s.Stats()
		if st.SnapshotFailures[SnapshotUnavailable] != 1 || e.snapshotRequests() != 1 || st.Snapshots != 0 {
			t.Fatalf("replay %v: unavailable %d, requests %d, snapshots %d; want 1, 1, 0", replay, st.SnapshotFailures[SnapshotUnavailable], e.snapshotRequests(), st.Snapshots)
		}
	}
}

// TestSnapshotGapRequiresFreshSnapshot: a batch lost after the bootstrap,
// exposed by the next heartbeat, clears the sink and bootstraps again
// from a new snapshot, which holds the lost batch's block
// (test_gap_requires_fresh_snapshot).
func TestSnapshotGapRequiresFreshSnapshot(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	testkit.Eventually(t, "live", func() bool { return s.Stats().State == StateLive })
	e.beating.Store(false)
	clears := sink.state().clears
	h := e.lose()
	e.beating.Store(true) // the next heartbeat shows the gap
	testkit.Eventually(t, "a second snapshot", func() bool { return s.Stats().Snapshots == 2 })
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	st, got := s.Stats(), sink.state()
	if st.Gaps != 1 || got.clears < clears+1 || !got.blocks[h] || e.snapshotRequests() != 2 {
		t.Fatalf("gaps %d, clears %d (before %d), lost block held %v, requests %d", st.Gaps, got.clears, clears, got.blocks[h], e.snapshotRequests())
	}
}

// TestSnapshotRestartChangesEpoch: the publisher's identity changes (the
// engine restarted; its new stream seen from sequence 3): the sink is
// cleared at once, counted as SignalPublisherID, and bootstrapped from
// the new engine's snapshot, holding none of the old engine's blocks
// (test_restart_changes_epoch). A snapshot naming another identity than
// the buffered messages (a restart during the bootstrap) fails as
// SnapshotStream and is retried.
func TestSnapshotRestartChangesEpoch(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	e.store()
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	old := e.heldBlocks()
	e.answer(func(n int, _ [][]byte) [][]byte {
		if n == 2 { // the first request after the restart: an identity the messages do not carry
			return [][]byte{binary.BigEndian.AppendUint64(nil, 1), uuidA}
		}
		return nil
	})
	e.restart(uuidB, 3, 5000)
	e.store()
	e.beating.Store(true)
	testkit.Eventually(t, "bootstrapped on the new engine", func() bool { return s.Stats().Snapshots == 2 })
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	st, got := s.Stats(), sink.state()
	for h := range old {
		if got.blocks[h] {
			t.Fatalf("the old engine's block %d is still held", h)
		}
	}
	if st.Restarts[SignalPublisherID] != 1 || st.SnapshotFailures[SnapshotStream] != 1 || string(st.PublisherID[:]) != string(uuidB) {
		t.Fatalf("publisher-id restarts %d, stream failures %d, publisher %q; want 1, 1, %q", st.Restarts[SignalPublisherID], st.SnapshotFailures[SnapshotStream], st.PublisherID, uuidB)
	}
}

// TestIncompatiblePublisher: after a bootstrap, a message with an 8-byte
// sequence frame (a publisher without identities:
// test_incompatible_publisher_marks_source_unready) clears the sink; the
// stream is then followed as one without snapshots (cold here: no
// replay).
func TestIncompatiblePublisher(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	e.store()
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	e.mu.Lock()
	e.id = nil
	e.mu.Unlock()
	e.store()
	testkit.Eventually(t, "the 8-byte message taken", func() bool { return s.Stats().Restarts[SignalPublisherID] == 1 })
	testkit.Eventually(t, "applied", func() bool { return s.Stats().LastSeq == e.lastSeq() })
	st, got := s.Stats(), sink.state()
	if st.State != StateCold || got.live || len(got.blocks) != 1 || st.BadMessages != 0 {
		t.Fatalf("state %v, sink live %v holding %d blocks, bad messages %d; want cold holding the one block stored since", st.State, got.live, len(got.blocks), st.BadMessages)
	}
}

// TestHeartbeatTimeout: a snapshot-enabled publisher that goes silent
// (its heartbeats stop, its socket stays open) is stale after the
// heartbeat timeout: the sink is cleared, counted as SignalHeartbeat;
// when it sends again the subscriber bootstraps again and is live.
func TestHeartbeatTimeout(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	e.store()
	sink := &setSink{}
	o := fastOpts(e)
	o.HeartbeatTimeout = time.Second
	s := startSub(t, o, sink)
	warmUp(t, e, s)
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	testkit.Eventually(t, "stale", func() bool { return s.Stats().Restarts[SignalHeartbeat] >= 1 })
	if got := sink.state(); got.live || len(got.blocks) != 0 {
		t.Fatalf("stale: sink live %v holding %d blocks; want cleared", got.live, len(got.blocks))
	}
	e.beating.Store(true)
	testkit.Eventually(t, "bootstrapped again", func() bool { return s.Stats().Snapshots >= 2 })
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
}

// TestDisconnectClears: an engine that goes away while idle (its
// socket closed, no event after) is forgotten at once: the sink is
// cleared and the stream is connecting, counted as SignalDisconnect.
func TestDisconnectClears(t *testing.T) {
	e := newEngine(t, engineOpts{replay: true})
	e.store()
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	e.close()
	testkit.Eventually(t, "cleared", func() bool { return !sink.state().live })
	st, got := s.Stats(), sink.state()
	if len(got.blocks) != 0 || st.Restarts[SignalDisconnect] < 1 || st.State == StateLive {
		t.Fatalf("after the engine left: %d blocks held, disconnects %d, state %v", len(got.blocks), st.Restarts[SignalDisconnect], st.State)
	}
}

// TestEngineRestartedSignal: a restart seen from outside the stream (the
// engine's metrics) clears the sink at once and bootstraps again.
func TestEngineRestartedSignal(t *testing.T) {
	e := newEngine(t, engineOpts{id: uuidA, snap: true})
	e.store()
	sink := &setSink{}
	s := startSub(t, fastOpts(e), sink)
	warmUp(t, e, s)
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	clears := sink.state().clears
	s.EngineRestarted()
	testkit.Eventually(t, "cleared", func() bool { return s.Stats().Restarts[SignalEngine] == 1 })
	if got := sink.state(); got.clears <= clears || got.live {
		t.Fatalf("after EngineRestarted: clears %d (before %d), live %v", got.clears, clears, got.live)
	}
	e.beating.Store(true)
	testkit.Eventually(t, "bootstrapped again", func() bool { return s.Stats().Snapshots == 2 })
	e.beating.Store(false)
	e.store()
	converged(t, e, s, sink)
	if e.snapshotRequests() != 2 {
		t.Fatalf("%d snapshot requests, want 2", e.snapshotRequests())
	}
}

// TestSnapshotFailures: each bound and malformed reply fails the
// bootstrap with its reason, leaves the sink cold and not live, and the
// next attempt (a good reply) succeeds.
func TestSnapshotFailures(t *testing.T) {
	cut := func(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }
	for _, c := range []struct {
		name   string
		reason SnapshotFailure
		opts   func(*Options)
		answer func(e *engine) [][]byte // the first reply; nil: none (it hangs)
	}{
		{"one frame", SnapshotInvalid, nil, func(*engine) [][]byte { return [][]byte{cut(0)} }},
		{"short identity", SnapshotInvalid, nil, func(*engine) [][]byte { return [][]byte{cut(0), uuidA[:8]} }},
		{"chunk not a batch", SnapshotInvalid, nil, func(*engine) [][]byte { return [][]byte{cut(0), uuidA, []byte("hello")} }},
		{"chunk of rank 3", SnapshotInvalid, nil, func(e *engine) [][]byte {
			return [][]byte{cut(0), uuidA, vllmBatch(e.t, 3, vllmStored(1))}
		}},
		{"too large", SnapshotTooLarge, func(o *Options) { o.MaxSnapshotBytes = 4096 }, func(e *engine) [][]byte {
			return [][]byte{cut(0), uuidA, make([]byte, 8192)}
		}},
		{"timeout", SnapshotTimeout, func(o *Options) { o.SnapshotTimeout = 300 * time.Millisecond }, nil},
		{"buffer", SnapshotBuffer, func(o *Options) { o.MaxBufferMessages = 3; o.SnapshotTimeout = time.Minute }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, engineOpts{id: uuidA, snap: true})
			e.store()
			var hang chan struct{}
			if c.answer == nil {
				hang = make(chan struct{})
			}
			e.answer(func(n int, _ [][]byte) [][]byte {
				if n > 1 {
					return nil
				}
				if hang != nil {
					<-hang // no reply to the first request
					return [][]byte{cut(0), uuidB}
				}
				return c.answer(e)
			})
			o := fastOpts(e)
			if c.opts != nil {
				c.opts(&o)
			}
			sink := &setSink{}
			s := startSub(t, o, sink)
			warmUp(t, e, s)
			testkit.Eventually(t, "the failure", func() bool { return s.Stats().SnapshotFailures[c.reason] >= 1 })
			if hang != nil {
				close(hang)
			}
			testkit.Eventually(t, "bootstrapped at the next attempt", func() bool { return s.Stats().Snapshots == 1 })
			e.beating.Store(false)
			e.store()
			converged(t, e, s, sink)
			st := s.Stats()
			var others uint64
			for r, n := range st.SnapshotFailures {
				if SnapshotFailure(r) != c.reason {
					others += n
				}
			}
			if others != 0 {
				t.Fatalf("failures %v, want only %v", st.SnapshotFailures, c.reason)
			}
		})
	}
}

// TestReplayGivenUpLeaksNothing: an engine that no longer buffers the
// start of its stream (its buffer_steps passed) answers a replay from 0
// with thousands of later batches; the subscriber gives the replay up at
// the first (the stream is cold) and leaves no goroutine behind: zmq4's
// reader of the replay connection, blocked on its full queue of unread
// answers, is drained.
func TestReplayGivenUpLeaksNothing(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	e := newEngine(t, engineOpts{replay: true})
	e.mu.Lock()
	e.replayKeep = 2000
	e.mu.Unlock()
	for range 3000 {
		e.store()
	}
	sink := &setSink{}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Subscribe(ctx, fastOpts(e), sink)
	if err != nil {
		t.Fatal(err)
	}
	warmUp(t, e, s)
	testkit.Eventually(t, "the replay given up", func() bool { return s.Stats().ReplayFailures >= 1 })
	if st := s.Stats(); st.State != StateCold || st.Replays != 0 {
		t.Fatalf("state %v, replays %d; want cold, 0", st.State, st.Replays)
	}
	cancel()
	s.Wait()
	e.close()
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// silentListener accepts TCP connections and never writes a byte (an
// endpoint that is not a ZeroMQ socket, or a hung one).
func silentListener(t *testing.T) (endpoint string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "tcp://" + ln.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}

// TestSilentEndpoints: a PUB endpoint that accepts the connection and
// never completes the ZMTP handshake is given up after the handshake
// timeout and dialled again, and the subscriber stops when told (zmq4
// alone would wait in the handshake for ever); a snapshot endpoint that
// never answers fails the bootstrap as a timeout.
func TestSilentEndpoints(t *testing.T) {
	old := handshakeTimeout
	t.Cleanup(func() { handshakeTimeout = old }) // after the subscribers' cleanups
	handshakeTimeout = 200 * time.Millisecond

	endpoint, accepted := silentListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Subscribe(ctx, Options{Endpoint: endpoint, Backoff: backoff.NewConstantBackOff(20 * time.Millisecond)}, &setSink{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the silent endpoint dialled three times", func() bool { return accepted() >= 3 })
	if st := s.Stats(); st.State != StateConnecting || st.Connects != 0 {
		t.Fatalf("state %v, connections made %d; want connecting, 0", st.State, st.Connects)
	}
	cancel()
	stopped := make(chan struct{})
	go func() { s.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("the subscriber did not stop within a minute of its context's end")
	}

	// The snapshot exchange's own bound (300 ms) ends its handshake too
	// (the handshake's own is 10 s again).
	handshakeTimeout = old
	e := newEngine(t, engineOpts{id: uuidA})
	o := fastOpts(e)
	o.SnapshotEndpoint, _ = silentListener(t)
	o.SnapshotTimeout = 300 * time.Millisecond
	sink := &setSink{}
	sub := startSub(t, o, sink)
	warmUp(t, e, sub)
	testkit.Eventually(t, "a timeout", func() bool { return sub.Stats().SnapshotFailures[SnapshotTimeout] >= 1 })
	if st := sub.Stats(); st.State == StateLive || st.Snapshots != 0 {
		t.Fatalf("state %v, snapshots %d", st.State, st.Snapshots)
	}
}
