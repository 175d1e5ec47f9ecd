package live

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// snapEngine is a snapshot-enabled vLLM engine's KV-event publisher,
// written by hand after the snapshot branch of vLLM PR 57789
// (vMaroon/vllm@08ee3e54 vllm/distributed/kv_events.py and
// kv_events_snapshot.py): a PUB socket sending [topic, sequence (8 bytes)
// + publisher uuid (16), KVEventBatch] with an empty batch as heartbeat
// (every 10 ms here, every idle second in vLLM), and a ROUTER answering a
// snapshot request's envelope with [cut (8, signed), uuid, chunk...]. Its
// cache is blocks stored blocks of 16 tokens, each BlockStored as
// msgspec writes it; the snapshot stores them all in one chunk.
type snapEngine struct {
	pub, snap zmq4.Socket
	id        []byte
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	mu     sync.Mutex
	seq    uint64
	blocks []uint64
	reqs   int
	// chunk, when set, is the snapshot's one chunk in place of blocks'.
	chunk []byte
}

func newSnapEngine(t *testing.T, id string, blocks ...uint64) *snapEngine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &snapEngine{pub: zmq4.NewPub(ctx), snap: zmq4.NewRouter(ctx), id: []byte(id), cancel: cancel, blocks: blocks}
	if err := e.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := e.snap.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	e.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				e.mu.Lock()
				seq := e.seq
				e.seq++
				e.mu.Unlock()
				frame := append(binary.BigEndian.AppendUint64(nil, seq), e.id...)
				_ = e.pub.Send(zmq4.NewMsgFrom(nil, frame, e.batch(t)))
			}
		}
	})
	e.wg.Go(func() {
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
			e.reqs++
			cut := e.seq - 1
			chunk := e.chunk
			if chunk == nil {
				chunk = e.batch(t, e.blocks...)
			}
			e.mu.Unlock()
			_ = e.snap.Send(zmq4.Msg{Frames: append(env, binary.BigEndian.AppendUint64(nil, cut), e.id, chunk)})
		}
	})
	t.Cleanup(func() {
		cancel()
		_ = e.pub.Close()
		_ = e.snap.Close()
		e.wg.Wait()
	})
	return e
}

// batch is a KVEventBatch storing blocks (none: a heartbeat).
func (e *snapEngine) batch(t *testing.T, blocks ...uint64) []byte {
	var evs []any
	var parent any
	for _, h := range blocks {
		toks := make([]any, 16)
		for i := range toks {
			toks[i] = int64(h)*16 + int64(i)
		}
		evs = append(evs, map[string]any{"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": parent,
			"token_ids": toks, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil})
		parent = h
	}
	b, err := msgpack.Marshal([]any{1.0, evs, 0})
	if err != nil {
		t.Error(err)
	}
	return b
}

func (e *snapEngine) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reqs
}

func (e *snapEngine) source() kvSource {
	return kvSource{Rank: 0, Endpoint: "tcp://" + e.pub.Addr().String(), SnapshotEndpoint: "tcp://" + e.snap.Addr().String()}
}

// TestDaemonKVSnapshotsAndSources: a worker whose kv_events block names a
// snapshot endpoint is bootstrapped from the engine's snapshot and live;
// a URL-only worker follows the sources its engine reports (SetSources),
// again when they change, and no more when they go; a kv_events block
// overrides reported sources; a restart seen from the engine's metrics
// (EngineRestarted) clears the index and bootstraps again; /metrics
// shows the state, the snapshots and the restarts per worker and rank.
func TestDaemonKVSnapshotsAndSources(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
	})
	ea := newSnapEngine(t, "engine-a-uuid-16", 1, 2, 3)
	eb := newSnapEngine(t, "engine-b-uuid-16", 11, 12)
	ec := newSnapEngine(t, "engine-c-uuid-16", 21, 22, 23, 24)
	wa, wb := newFakeVLLM(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 0\n"), newFakeVLLM(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 0\n")
	dir := t.TempDir()
	policy, workersFile := filepath.Join(dir, "policy.hcl"), filepath.Join(dir, "workers.hcl")
	replaceFile(t, policy, daemonPolicy("rr"))
	// A small capacity keeps each clear of the precise index cheap (its
	// lookup set is sized by it) under the race detector.
	replaceFile(t, workersFile, fmt.Sprintf("worker \"a\" {\n  url = %q\n  total_kv_blocks = 8\n  kv_events {\n    endpoint = %q\n    snapshot_endpoint = %q\n  }\n}\nworker \"b\" {\n  url = %q\n  total_kv_blocks = 8\n}\n",
		wa.srv.URL, ea.source().Endpoint, ea.source().SnapshotEndpoint, wb.srv.URL))
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, WorkersFile: workersFile})
	t.Cleanup(func() { _ = rd.stop() })
	rd.waitWorkers(t, "a", "b")
	kvs := rd.d.kvs
	ida, idb := shared.WorkerIDOf("a"), shared.WorkerIDOf("b")
	precise := func(id shared.WorkerID) prefix.PreciseStats {
		kvs.mu.Lock()
		s := kvs.subs[prefix.Candidate{ID: id}]
		kvs.mu.Unlock()
		if s == nil {
			return prefix.PreciseStats{}
		}
		return s.precise.Stats()
	}
	waitLive := func(what string, id shared.WorkerID, blocks int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			st, ok := kvs.stream(id, 0)
			ps := precise(id)
			if ok && st.State == "live" && ps.Live && ps.Blocks == blocks {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: stream %+v (%v), precise %+v a minute on; want live holding %d blocks; logs:\n%s", what, st, ok, ps, blocks, rd.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	waitLive("a from its snapshot", ida, 3)
	if _, ok := kvs.stream(idb, 0); ok || ea.requests() != 1 {
		t.Fatalf("b has a stream before any source; a's engine had %d snapshot requests, want 1", ea.requests())
	}
	metrics := getText(t, rd.base+"/metrics")
	for _, want := range []string{
		`switchyard_worker_kv_state{rank="0",state="live",worker="a"} 1`,
		`switchyard_worker_kv_state{rank="0",state="bootstrapping",worker="a"} 0`,
		`switchyard_worker_kv_snapshots_total{rank="0",worker="a"} 1`,
		`switchyard_worker_kv_snapshot_failures_total{rank="0",reason="unavailable",worker="a"} 0`,
		`switchyard_worker_kv_restarts_total{rank="0",signal="engine",worker="a"} 0`,
		`switchyard_worker_kv_blocks_skipped_total{rank="0",reason="parent",worker="a"} 0`,
		`switchyard_worker_kv_state_start_time_seconds{rank="0",worker="a"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// b follows the source its engine reports; a's block overrides one.
	kvs.SetSources("b", []kvSource{eb.source()})
	kvs.SetSources("a", []kvSource{eb.source()})
	waitLive("b from its reported source", idb, 2)
	kvs.mu.Lock()
	aEndpoint := kvs.subs[prefix.Candidate{ID: ida}].src.Endpoint
	kvs.mu.Unlock()
	if aEndpoint != ea.source().Endpoint || ea.requests() != 1 {
		t.Fatalf("a follows %s (want its block's %s), a's engine had %d snapshot requests", aEndpoint, ea.source().Endpoint, ea.requests())
	}

	// A restart seen from a's metrics: cleared, bootstrapped again.
	kvs.EngineRestarted("a")
	deadline := time.Now().Add(time.Minute)
	for ea.requests() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second snapshot request after EngineRestarted; logs:\n%s", rd.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitLive("a bootstrapped again", ida, 3)
	if m := getText(t, rd.base+"/metrics"); !strings.Contains(m, `switchyard_worker_kv_restarts_total{rank="0",signal="engine",worker="a"} 1`) ||
		!strings.Contains(m, `switchyard_worker_kv_snapshots_total{rank="0",worker="a"} 2`) {
		t.Errorf("/metrics after the restart:\n%s", grepLines(m, "switchyard_worker_kv_"))
	}

	// b's engine reports another source: followed there.
	kvs.SetSources("b", []kvSource{ec.source()})
	waitLive("b on its new source", idb, 4)
	// Sources that are not usable are ignored: b has none.
	kvs.SetSources("b", []kvSource{{Rank: 0, Endpoint: "tcp://*:5557"}, {Rank: -1, Endpoint: ec.source().Endpoint},
		{Rank: 0, Endpoint: "tcp://10.0.0.1\x1b[2J:5557"}, {Rank: 0, Endpoint: ec.source().Endpoint, SnapshotEndpoint: "http://h:1"}})
	if _, ok := kvs.stream(idb, 0); ok {
		t.Fatal("b still follows a source after reporting only unusable ones")
	}
	if !strings.Contains(rd.logs.String(), "KV-event sources the engine reported are ignored") {
		t.Errorf("no warning for the unusable sources; logs:\n%s", rd.logs)
	}
	kvs.SetSources("b", []kvSource{eb.source()})
	waitLive("b back on a usable source", idb, 2)
	kvs.SetSources("b", nil)
	if _, ok := kvs.stream(idb, 0); ok {
		t.Fatal("b still follows a source after its engine reported none")
	}
}

// grepLines returns the lines of s containing sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// skipped counts every reason the metric has a series for: /debug/workers'
// blocks_skipped is their sum.
func TestSkippedCountsEveryReason(t *testing.T) {
	var p kvStatus
	p.ps.SkippedTier, p.ps.SkippedBlockSize, p.ps.SkippedParent, p.ps.SkippedUnresolved = 1, 2, 4, 8
	p.ps.SkippedGroup, p.ps.SkippedScope, p.ps.SkippedMalformed = 16, 32, 64
	if got := p.skipped(); got != 127 {
		t.Fatalf("skipped() = %d, want 127 (every reason once)", got)
	}
}
