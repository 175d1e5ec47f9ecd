package cluster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

func TestSnapshotRoundTrip(t *testing.T) {
	in := &indexSnapshot{DeltasSeq: 1234, TakenAt: time.Unix(0, 1_700_000_000_000_000_001), Writer: "router-0",
		Workers: []router.WorkerPrefix{
			{Worker: "vllm-0", Rank: 0, Content: prefix.Content{Approx: []uint64{3, 2, 1 << 63}}},
			{Worker: "vllm-1", Rank: 2, Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				BlockSize: 16, Groups: 3, Live: true, SinceClear: 7,
				Router: []uint64{10, 11}, Engine: []uint64{20, 21}, Mask: []uint64{3, 1}}}},
			{Worker: "vllm-2", Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				Warming: true, Router: []uint64{}, Engine: []uint64{}, Mask: []uint64{}}}},
		},
		KVNext: []uint64{0, 99, 0}}
	out, err := decodeSnapshot(encodeSnapshot(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out); diff != "" {
		t.Fatalf("round trip (-in +out):\n%s", diff)
	}
}

// TestSnapshotCut: a snapshot over the bound keeps each worker's most
// recent blocks, an equal share each, and decodes within the bound.
func TestSnapshotCut(t *testing.T) {
	big := make([]uint64, maxSnapshotBytes/8)
	for i := range big {
		big[i] = uint64(i)
	}
	in := &indexSnapshot{Workers: []router.WorkerPrefix{
		{Worker: "a", Content: prefix.Content{Approx: big}},
		{Worker: "b", Content: prefix.Content{Approx: big[:10]}},
	}}
	data := encodeSnapshot(in)
	if len(data) > maxSnapshotBytes {
		t.Fatalf("encoded %d bytes, over the bound %d", len(data), maxSnapshotBytes)
	}
	out, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	share := (maxSnapshotBytes - (1 << 20)) / 24 / 2
	if got := out.Workers[0].Approx; len(got) != share || got[0] != 0 || got[share-1] != uint64(share-1) {
		t.Fatalf("worker a kept %d blocks (first %d), want its %d most recent", len(got), got[0], share)
	}
	if got := len(out.Workers[1].Approx); got != 10 {
		t.Fatalf("worker b kept %d blocks, want all 10", got)
	}
}

func TestSnapshotMalformed(t *testing.T) {
	good := encodeSnapshot(&indexSnapshot{Writer: "w", Workers: []router.WorkerPrefix{{Worker: "x", Content: prefix.Content{Approx: []uint64{1}}}}})
	for name, data := range map[string][]byte{
		"empty":           nil,
		"magic":           []byte("NOPE\x01"),
		"version":         []byte(snapshotMagic + "\x09"),
		"truncated":       good[:len(good)-3],
		"trailing":        append(append([]byte{}, good...), 0),
		"count past end":  append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0xff, 0xff, 0x03),
		"precise flag":    append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0, 9),
		"too many blocks": append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 1, 2),
	} {
		if _, err := decodeSnapshot(data); !errors.Is(err, errSnapshot) {
			t.Errorf("%s: %v, want errSnapshot", name, err)
		}
	}
}

// TestReadSnapshotBounded: a snapshot object whose metadata claims a
// small size over chunks past maxSnapshotBytes (metadata is the writing
// client's) is refused after maxSnapshotBytes+1 bytes, not read whole.
func TestReadSnapshotBounded(t *testing.T) {
	defer func(d time.Duration) { snapshotReadTimeout = d }(snapshotReadTimeout)
	snapshotReadTimeout = 5 * time.Minute // 65 MiB under -race on a loaded machine
	_, url := startNATS(t, 0)
	_, js := client(t, url)
	ctx := context.Background()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "test-index", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, snapshotObject, make([]byte, maxSnapshotBytes+1<<20)); err != nil {
		t.Fatal(err)
	}
	// Rewrite the metadata with a lying size.
	stream, err := js.Stream(ctx, "OBJ_test-index")
	if err != nil {
		t.Fatal(err)
	}
	metaSubject := "$O.test-index.M." + base64.URLEncoding.EncodeToString([]byte(snapshotObject))
	m, err := stream.GetLastMsgForSubject(ctx, metaSubject)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(m.Data, &meta); err != nil {
		t.Fatal(err)
	}
	meta["size"] = 100
	data, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(metaSubject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if info, err := obs.GetInfo(ctx, snapshotObject); err != nil || info.Size != 100 {
		t.Fatalf("the metadata says %v (%v), want the lie of 100 bytes", info, err)
	}
	got, err := readSnapshot(ctx, obs)
	if !errors.Is(err, errSnapshot) {
		t.Fatalf("read %d bytes (%v), want errSnapshot past %d bytes", len(got), err, maxSnapshotBytes)
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(encodeSnapshot(&indexSnapshot{Writer: "w", Workers: []router.WorkerPrefix{{Worker: "x", Content: prefix.Content{
		Approx: []uint64{1}, Precise: &prefix.PreciseContent{BlockSize: 16, Router: []uint64{1}, Engine: []uint64{2}, Mask: []uint64{1}}}}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		blocks := 0
		for _, w := range s.Workers {
			blocks += w.Blocks()
		}
		if 8*blocks > len(data) {
			t.Fatalf("%d blocks decoded from %d bytes", blocks, len(data))
		}
	})
}

// TestWarmStart: replica a's index is written to the object store, then
// more is routed, and the stream's messages before the snapshot are gone
// (as the stream's retention drops them). A new replica b loads the
// snapshot, replays the stream from its sequence and is caught up: it
// holds what a sent before the snapshot (from the snapshot alone) and
// after it (from the stream alone). a restarted under its own name
// relearns the prefix blocks of its earlier run's bookings from the
// stream, and b's bookings.
func TestWarmStart(t *testing.T) {
	_, url := startNATS(t, 0)
	manual := func(c *config.Cluster) { c.SnapshotInterval, c.WarmTimeout = time.Hour, time.Hour }
	a := startNode(t, url, "a", 3, 1, manual)
	eventually(t, "a caught up", a.rep.caughtUp.Load)

	_, js := client(t, url)
	ctx := context.Background()
	stream, err := js.Stream(ctx, "test-deltas")
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}

	h1 := admitPrompt(t, a, "before", 1)
	w1 := h1.Decision().Worker.Name
	h1.End(admission.Completed(1))
	eventually(t, "a applied its own records", func() bool { s := lastSeq(); return s > 0 && a.rep.deltaSeq.Load() == s })
	obs, err := a.rep.indexStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rep.writeSnapshot(ctx, obs); err != nil {
		t.Fatal(err)
	}
	snapSeq := a.rep.deltaSeq.Load()
	h2 := admitPrompt(t, a, "after", 500)
	w2 := h2.Decision().Worker.Name
	h2.End(admission.Completed(1))
	eventually(t, "the stream holds the second request", func() bool { return lastSeq() > snapSeq })
	// The messages up to the snapshot leave the stream.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(snapSeq+1)); err != nil {
		t.Fatal(err)
	}

	b := startNode(t, url, "b", 3, 101, manual)
	eventually(t, "b caught up", b.rep.caughtUp.Load)
	if !b.rep.Ready() {
		t.Fatal("b caught up but not ready")
	}
	st := b.rep.State()
	if st.Snapshot == nil || st.Snapshot.Writer != "a" || st.Snapshot.DeltasSeq != snapSeq || st.Snapshot.Workers != 3 || !st.CaughtUp {
		t.Fatalf("b's state %+v snapshot %+v, want a's snapshot at %d of 3 workers, caught up", st, st.Snapshot, snapSeq)
	}
	for _, tc := range []struct {
		first uint64
		w     string
	}{{1, w1}, {500, w2}} {
		h := admitPrompt(t, b, "probe", tc.first)
		if d := h.Decision(); d.Worker.Name != tc.w || d.OverlapBlocks != 10 {
			t.Errorf("b placed the prompt at %d on %s with overlap %d, want %s with 10", tc.first, d.Worker.Name, d.OverlapBlocks, tc.w)
		}
		h.End(admission.Completed(1))
	}

	// a dies and comes back under its own name, on a fresh router: the
	// snapshot gives the first prompt, the replay of its own earlier
	// records the second.
	a.stop(t)
	a2 := startNode(t, url, "a", 3, 1, manual)
	eventually(t, "a restarted caught up", a2.rep.caughtUp.Load)
	for _, tc := range []struct {
		first uint64
		w     string
	}{{1, w1}, {500, w2}} {
		h := admitPrompt(t, a2, "again", tc.first)
		if d := h.Decision(); d.Worker.Name != tc.w || d.OverlapBlocks != 10 {
			t.Errorf("a restarted placed the prompt at %d on %s with overlap %d, want %s with 10", tc.first, d.Worker.Name, d.OverlapBlocks, tc.w)
		}
		h.End(admission.Completed(1))
	}
	if got := counterValue(t, a2.reg, "switchyard_cluster_index_snapshot_loads_total"); got != 1 {
		t.Fatalf("snapshot loads counted %v, want 1", got)
	}
}

// TestReadyWithoutNATS: a replica whose NATS never answers is not caught
// up, and is ready once the warm timeout has passed: a partition never
// stops routing.
func TestReadyWithoutNATS(t *testing.T) {
	port := freePort(t)
	n := startNode(t, "nats://127.0.0.1:"+strconv.Itoa(port), "a", 1, 1, func(c *config.Cluster) { c.WarmTimeout = 200 * time.Millisecond })
	eventually(t, "ready after the warm timeout", n.rep.Ready)
	if st := n.rep.State(); st.CaughtUp || st.Connected || st.Snapshot != nil {
		t.Fatalf("state %+v, want neither connected nor caught up", st)
	}
	m := startNode(t, "nats://127.0.0.1:"+strconv.Itoa(port), "b", 1, 1, func(c *config.Cluster) { c.WarmTimeout = time.Hour })
	time.Sleep(50 * time.Millisecond)
	if m.rep.Ready() {
		t.Fatal("ready without NATS before its hour-long warm timeout")
	}
}

// TestConnectionLogged: a replica says in its log that NATS is not
// reachable at start, that its warm timeout passed before it caught up,
// that it connected once NATS is there, and that it lost NATS.
func TestConnectionLogged(t *testing.T) {
	port := freePort(t)
	var buf strings.Builder
	var mu sync.Mutex
	logged := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), what)
	}
	startNodeWith(t, "nats://127.0.0.1:"+strconv.Itoa(port), "a", 1, 1, func(c *config.Cluster) { c.WarmTimeout = 200 * time.Millisecond },
		func(n *node) {
			n.rep.log = hclog.New(&hclog.LoggerOptions{Output: writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return buf.Write(p)
			})})
		})
	eventually(t, "NATS not reachable logged", func() bool { return logged("NATS not reachable") })
	eventually(t, "the warm timeout logged", func() bool { return logged("warm_timeout passed") })
	if logged("connected to NATS") {
		t.Fatal("connected logged while NATS is not there")
	}
	s, _ := startNATS(t, port)
	eventually(t, "connected logged", func() bool { return logged("connected to NATS") })
	s.Shutdown()
	s.WaitForShutdown()
	eventually(t, "disconnected logged", func() bool { return logged("disconnected from NATS") })
}

// TestWarmStartKVEvents: the snapshot carries a precise index with its
// KV stream position. The stream's messages before that position are
// purged; a replica whose worker is a member at start (b), and one whose
// worker joins only after the snapshot was loaded (c, Joined), both take
// the snapshot's blocks and liveness and follow the stream from the
// position: each holds every block the engine published, live.
func TestWarmStartKVEvents(t *testing.T) {
	_, url := startNATS(t, 0)
	e := startEngine(t)
	manual := func(c *config.Cluster) { c.SnapshotInterval, c.WarmTimeout = time.Hour, time.Hour }
	a := startNode(t, url, "a", 1, 1, manual)
	pa := followW0(a)
	a.rep.RelayKV(RelayTarget{Worker: "w0", Rank: 0, KVEvents: e.kvEvents()})
	relaying(t, e, a)
	for range 4 {
		e.publish(t)
	}
	holds(t, "a's index holds the engine's blocks", e, pa)
	eventually(t, "a caught up", a.rep.caughtUp.Load)

	ctx := context.Background()
	_, js := client(t, url)
	obs, err := a.rep.indexStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rep.writeSnapshot(ctx, obs); err != nil {
		t.Fatal(err)
	}
	next := a.rep.kvPositions()[kvCandidate{"w0", 0}]
	if next == 0 {
		t.Fatal("a's follow of w0 has no position")
	}
	before := e.published()
	for range 3 {
		e.publish(t)
	}
	holds(t, "a's index holds the later blocks", e, pa)
	stream, err := js.Stream(ctx, "test-kv")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(next)); err != nil {
		t.Fatal(err)
	}

	// b: w0 a member, precise, before b runs.
	var pb *prefix.Precise
	b := startNodeWith(t, url, "b", 1, 101, manual, func(n *node) { pb = n.r.PrefixPrecise(n.ids["w0"], 0) })
	eventually(t, "b loaded the snapshot", func() bool { st := b.rep.State(); return st.Snapshot != nil })
	if got := pb.Stats(); got.Blocks != before || !got.Live {
		t.Fatalf("b's index after the snapshot: %d blocks, live %v; want the snapshot's %d, live", got.Blocks, got.Live, before)
	}
	b.rep.FollowKV("w0", 0, pb)
	holds(t, "b's index holds every block", e, pb)
	eventually(t, "b caught up", b.rep.caughtUp.Load)

	// c: w0 joins after the snapshot was loaded.
	c := startNodeWith(t, url, "c", 0, 201, manual, func(n *node) { n.ids["w0"] = 201 })
	eventually(t, "c loaded the snapshot", func() bool { st := c.rep.State(); return st.Snapshot != nil })
	if st := c.rep.State(); st.Snapshot.Workers != 0 {
		t.Fatalf("c imported %d workers before any joined", st.Snapshot.Workers)
	}
	if _, err := c.r.AddWorker(fleet.Spec{ID: 201, Name: "w0", Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	pc := c.r.PrefixPrecise(201, 0)
	c.rep.Joined("w0", 0)
	if st := c.rep.State(); st.Snapshot.Workers != 1 {
		t.Fatalf("c imported %d workers once w0 joined, want 1", st.Snapshot.Workers)
	}
	c.rep.FollowKV("w0", 0, pc)
	holds(t, "c's index holds every block", e, pc)
}
