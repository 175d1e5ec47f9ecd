package cluster

import (
	"context"
	"encoding/base64"
	"encoding/binary"
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

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

func TestSnapshotRoundTrip(t *testing.T) {
	in := &indexSnapshot{DeltasSeq: 1234, TakenAt: time.Unix(0, 1_700_000_000_000_000_001), Writer: "router-0",
		Workers: []WorkerPrefix{
			{Worker: "vllm-0", Rank: 0, Content: prefix.Content{Approx: []uint64{3, 2, 1 << 63}}},
			{Worker: "vllm-1", Rank: 2, Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				BlockSize: 16, Groups: 3, Live: true, SinceClear: 7,
				Router: []uint64{10, 11}, Engine: []uint64{20, 21}, Mask: []uint64{3, 1}}}},
			{Worker: "vllm-2", Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				Warming: true, Router: []uint64{}, Engine: []uint64{}, Mask: []uint64{}}}},
			// The CPU tier and duplicate copies in group 0.
			{Worker: "vllm-3", Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				BlockSize: 16, Groups: 1, CPUGroups: 1, Live: true,
				Router: []uint64{10, 11, 12}, Engine: []uint64{20, 21, 22}, Mask: []uint64{1, 0, 1},
				CPU: []uint64{0, 1, 1}, Copies: []uint32{3, 1, 1 << 30}}}},
			// The exact form: scopes and every scope's copies.
			{Worker: "vllm-4", Rank: 1, Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
				BlockSize: 16, Groups: 3, CPUGroups: 1, Live: true,
				Router: []uint64{10, 11}, Engine: []uint64{20, 21}, Mask: []uint64{3, 2}, CPU: []uint64{1, 0}, Copies: []uint32{2, 0},
				Scopes: []prefix.ResidencyScope{{Group: 1, Local: true}, {CPU: true, Local: true},
					{CPU: true, Locality: 77, Ownership: 1 << 63}},
				More: []prefix.ScopeCopies{{Block: 0, Scope: 0, Copies: 2}, {Block: 0, Scope: 1, Copies: 3},
					{Block: 1, Scope: 0, Copies: 1}, {Block: 1, Scope: 2, Copies: 1}}}}},
		},
		KVNext: []uint64{0, 99, 0, 5, 6}}
	data := encodeSnapshot(in)
	if data[len(snapshotMagic)] != 2 {
		t.Fatalf("written as version %d, want 2", data[len(snapshotMagic)])
	}
	out, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out); diff != "" {
		t.Fatalf("round trip (-in +out):\n%s", diff)
	}
}

// appendV1 appends worker w (approximate list, precise index without the
// CPU tier or copies) in version 1 of the format, as replicas wrote it
// before version 2.
func appendV1(b []byte, w WorkerPrefix, next uint64) []byte {
	b = appendString(b, w.Worker)
	b = binary.AppendUvarint(b, uint64(w.Rank))
	b = binary.AppendUvarint(b, uint64(len(w.Approx)))
	for _, h := range w.Approx {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	p := w.Precise
	if p == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendUvarint(b, next)
	b = binary.AppendUvarint(b, uint64(p.BlockSize))
	b = binary.LittleEndian.AppendUint64(b, p.Groups)
	b = append(b, 1) // live
	b = binary.AppendUvarint(b, uint64(p.SinceClear))
	b = binary.AppendUvarint(b, uint64(len(p.Router)))
	for j := range p.Router {
		b = binary.LittleEndian.AppendUint64(b, p.Router[j])
		b = binary.LittleEndian.AppendUint64(b, p.Engine[j])
		b = binary.LittleEndian.AppendUint64(b, p.Mask[j])
	}
	return b
}

// TestSnapshotVersion1Read: a snapshot an older replica wrote (version 1)
// is still read, as it was written: a replica can be upgraded while the
// snapshot in the store is an older one's.
func TestSnapshotVersion1Read(t *testing.T) {
	ws := []WorkerPrefix{
		{Worker: "a", Rank: 1, Content: prefix.Content{Approx: []uint64{7, 8}}},
		{Worker: "b", Content: prefix.Content{Approx: []uint64{}, Precise: &prefix.PreciseContent{
			BlockSize: 16, Groups: 1, Live: true, SinceClear: 3, Router: []uint64{1, 2}, Engine: []uint64{11, 12}, Mask: []uint64{1, 1}}}},
	}
	b := append([]byte(snapshotMagic), 1)
	b = binary.AppendUvarint(b, 42)
	b = binary.AppendUvarint(b, 1_700_000_000_000_000_000)
	b = appendString(b, "old")
	b = binary.AppendUvarint(b, 2)
	b = appendV1(b, ws[0], 0)
	b = appendV1(b, ws[1], 9)
	out, err := decodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	want := &indexSnapshot{DeltasSeq: 42, TakenAt: time.Unix(0, 1_700_000_000_000_000_000), Writer: "old", Workers: ws, KVNext: []uint64{0, 9}}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Fatalf("version 1 (-want +got):\n%s", diff)
	}
}

// TestSnapshotCut: a snapshot over the bound keeps each worker's most
// recent blocks, an equal share each, and decodes within the bound.
func TestSnapshotCut(t *testing.T) {
	big := make([]uint64, maxSnapshotBytes/8)
	for i := range big {
		big[i] = uint64(i)
	}
	in := &indexSnapshot{Workers: []WorkerPrefix{
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
	share := (maxSnapshotBytes - snapshotSlack) / 2
	if got := out.Workers[0].Approx; len(got) < share/8-workerFixedBytes || len(got) > share/8 || got[0] != 0 || got[len(got)-1] != uint64(len(got)-1) {
		t.Fatalf("worker a kept %d blocks (first %d), want its most recent, about %d", len(got), got[0], share/8)
	}
	if got := len(out.Workers[1].Approx); got != 10 {
		t.Fatalf("worker b kept %d blocks, want all 10", got)
	}
}

// TestSnapshotCutPrecise: the cut of workers with a precise index, within
// a bound of 8 MiB (encodeWithin; the 64 MiB one is the same code): an
// approximate list beside a precise index takes at most a quarter of its
// worker's share, the precise blocks (with their CPU tier, copies and
// scopes' copies) the rest, most recent first; a worker with both lists
// full fits alone. Before, the cut counted 24 bytes a hash for either
// list, and a worker with both lists full came out a third over the bound.
func TestSnapshotCutPrecise(t *testing.T) {
	const limit, slack = 8 << 20, 64 << 10
	big := make([]uint64, limit/8)
	for i := range big {
		big[i] = uint64(i)
	}
	const n = limit / 24
	pc := &prefix.PreciseContent{BlockSize: 16, Groups: 1, CPUGroups: 1, Live: true,
		Router: big[:n], Engine: big[:n], Mask: make([]uint64, n), CPU: make([]uint64, n), Copies: make([]uint32, n),
		Scopes: []prefix.ResidencyScope{{CPU: true, Local: true}}}
	for i := range n {
		pc.Mask[i], pc.CPU[i], pc.Copies[i] = 1, 1, 1
		if i%2 == 0 {
			pc.More = append(pc.More, prefix.ScopeCopies{Block: uint32(i), Scope: 0, Copies: 2})
		}
	}
	in := &indexSnapshot{Workers: []WorkerPrefix{
		{Worker: "a", Content: prefix.Content{Approx: big}},
		{Worker: "c", Content: prefix.Content{Approx: big, Precise: pc}},
	}, KVNext: []uint64{0, 7}}
	data := encodeWithin(in, limit, slack)
	if len(data) > limit {
		t.Fatalf("encoded %d bytes, over the bound %d", len(data), limit)
	}
	out, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	share := (limit - slack) / 2
	mostRecent := func(what string, got []uint64, atLeast int) {
		t.Helper()
		if len(got) < atLeast || len(got) == 0 || got[0] != 0 || got[len(got)-1] != uint64(len(got)-1) {
			t.Fatalf("%s: kept %d hashes, want its most recent, at least %d", what, len(got), atLeast)
		}
	}
	mostRecent("a's list", out.Workers[0].Approx, share/8-workerFixedBytes)
	c := out.Workers[1]
	mostRecent("c's list", c.Approx, share/4/8-workerFixedBytes)
	if len(c.Approx) > share/4/8 {
		t.Fatalf("c's list kept %d hashes, over a quarter of its share", len(c.Approx))
	}
	p := c.Precise
	if p == nil || !p.WellFormed() {
		t.Fatalf("c's precise index %v", p)
	}
	// A block is 24 bytes, its CPU mask 8, its copies 1, and every other
	// one has a scope's copies of at most 6.
	mostRecent("c's precise blocks", p.Router, (share-8*len(c.Approx))/36-2*workerFixedBytes)
	k := len(p.Router)
	if len(p.CPU) != k || len(p.Copies) != k || len(p.More) != (k+1)/2 || out.KVNext[1] != 7 {
		t.Fatalf("c's precise index: %d blocks, %d CPU masks, %d copies, %d scope copies, kv_next %d; want the kept blocks' own",
			k, len(p.CPU), len(p.Copies), len(p.More), out.KVNext[1])
	}
	// c alone: both its lists full fit the bound.
	alone := encodeWithin(&indexSnapshot{Workers: in.Workers[1:]}, limit, slack)
	if len(alone) > limit {
		t.Fatalf("a worker with both lists full encoded in %d bytes, over the bound %d", len(alone), limit)
	}
	if _, err := decodeSnapshot(alone); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotMalformed(t *testing.T) {
	good := encodeSnapshot(&indexSnapshot{Writer: "w", Workers: []WorkerPrefix{{Worker: "x", Content: prefix.Content{Approx: []uint64{1}}}}})
	exact := func(mod func(p *prefix.PreciseContent)) []byte {
		p := &prefix.PreciseContent{BlockSize: 16, Groups: 1, CPUGroups: 1, Router: []uint64{1, 2}, Engine: []uint64{1, 2},
			Mask: []uint64{1, 1}, CPU: []uint64{1, 0}, Copies: []uint32{1, 1},
			Scopes: []prefix.ResidencyScope{{CPU: true, Local: true}}, More: []prefix.ScopeCopies{{Block: 0, Scope: 0, Copies: 2}}}
		mod(p)
		return encodeSnapshot(&indexSnapshot{Workers: []WorkerPrefix{{Worker: "x", Content: prefix.Content{Precise: p}}}})
	}
	if _, err := decodeSnapshot(exact(func(*prefix.PreciseContent) {})); err != nil {
		t.Fatalf("the well-formed base of the cases below: %v", err)
	}
	// v2 is the header of an empty version 2 snapshot with one worker
	// "x" and a precise index of block size 16.
	v2 := append([]byte(snapshotMagic+"\x02"), 0, 0, 0, 1, 1, 'x', 0, 0, 1, 0, 16)
	for name, data := range map[string][]byte{
		"empty":           nil,
		"magic":           []byte("NOPE\x01"),
		"version":         []byte(snapshotMagic + "\x09"),
		"truncated":       good[:len(good)-3],
		"trailing":        append(append([]byte{}, good...), 0),
		"count past end":  append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0xff, 0xff, 0x03),
		"precise flag":    append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0, 9),
		"too many blocks": append([]byte(snapshotMagic+"\x01"), 0, 0, 0, 1, 0, 0, 0, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 1, 2),
		// A count within the bytes left before it, past those left after
		// it: it panicked the loading replica before (found by
		// FuzzDecodeSnapshot).
		"v1 count past its own bytes": []byte(snapshotMagic + "\x0100\x0100\x0100\x010000000"),
		"v2 count past its own bytes": []byte(snapshotMagic + "\x0200\x0100\x0100\x010000000"),
		"v1 blocks without a block size": append([]byte(snapshotMagic+"\x01"), append([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0},
			append(make([]byte, 9), append([]byte{0, 1}, make([]byte, 24)...)...)...)...),
		"v2 flags":    append(append(append([]byte{}, v2...), make([]byte, 16)...), 4),
		"v2 CPU flag": append(append(append([]byte{}, v2...), make([]byte, 16)...), 0, 0, 0, 2),
		"v2 CPU masks past the end": append(append(append([]byte{}, v2...), make([]byte, 16)...),
			append([]byte{0, 0, 1}, append(make([]byte, 24), 1, 0, 0, 0)...)...),
		"v2 copies past the end": append(append(append([]byte{}, v2...), make([]byte, 16)...),
			append([]byte{0, 0, 1}, append(make([]byte, 24), 0, 1)...)...),
		"v2 scopes past the end": append(append(append([]byte{}, v2...), make([]byte, 16)...), 0, 0, 0, 0, 0, 5, 1, 0),
		"v2 too many scopes": append(append(append([]byte{}, v2...), make([]byte, 16)...),
			append([]byte{0, 0, 0, 0, 0, 0xff, 0x01}, make([]byte, 255*18)...)...),
		"v2 more past the end": append(append(append([]byte{}, v2...), make([]byte, 16)...), 0, 0, 0, 0, 0, 0, 9, 0, 0, 1),
		"copies 0 in a scope":  exact(func(p *prefix.PreciseContent) { p.More[0].Copies = 0 }),
		"copies past 2^30":     exact(func(p *prefix.PreciseContent) { p.Copies[1] = 1<<30 + 1 }),
		"a block out of range": func() []byte {
			b := exact(func(*prefix.PreciseContent) {})
			b[len(b)-3] = 2 // the last entry's block: (0, 0, 2) as written
			return b
		}(),
		"a scope out of range":  exact(func(p *prefix.PreciseContent) { p.More[0].Scope = 1 }),
		"scope copies disorder": exact(func(p *prefix.PreciseContent) { p.More = append(p.More, p.More[0]) }),
		"scope 0 named":         exact(func(p *prefix.PreciseContent) { p.Scopes[0] = prefix.ResidencyScope{Local: true} }),
		"a group past 63":       exact(func(p *prefix.PreciseContent) { p.Scopes[0].Group = 64 }),
		"scope copies without scopes": exact(func(p *prefix.PreciseContent) {
			p.Scopes = nil
		}),
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
	f.Add(encodeSnapshot(&indexSnapshot{Writer: "w", Workers: []WorkerPrefix{{Worker: "x", Content: prefix.Content{
		Approx: []uint64{1}, Precise: &prefix.PreciseContent{BlockSize: 16, Router: []uint64{1}, Engine: []uint64{2}, Mask: []uint64{1}}}}}}))
	f.Add(encodeSnapshot(&indexSnapshot{Writer: "w", Workers: []WorkerPrefix{{Worker: "x", Content: prefix.Content{
		Approx: []uint64{1}, Precise: &prefix.PreciseContent{BlockSize: 16, Groups: 1, CPUGroups: 1, Router: []uint64{1, 2}, Engine: []uint64{2, 3},
			Mask: []uint64{1, 1}, CPU: []uint64{1, 0}, Copies: []uint32{2, 1}, Scopes: []prefix.ResidencyScope{{CPU: true, Local: true}},
			More: []prefix.ScopeCopies{{Block: 0, Scope: 0, Copies: 2}}}}}}}))
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
	testkit.Eventually(t, "a caught up", a.rep.caughtUp.Load)

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
	testkit.Eventually(t, "a applied its own records", func() bool { s := lastSeq(); return s > 0 && a.rep.deltaSeq.Load() == s })
	obs, err := a.rep.indexStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rep.writeSnapshot(ctx, obs); err != nil {
		t.Fatal(err)
	}
	// The sequence the snapshot recorded, read back from the store: a's
	// counter may move on between the write and this line (a delta
	// published under load), and b resumes from what the snapshot says.
	data, err := readSnapshot(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	written, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	snapSeq := written.DeltasSeq
	h2 := admitPrompt(t, a, "after", 500)
	w2 := h2.Decision().Worker.Name
	h2.End(admission.Completed(1))
	testkit.Eventually(t, "the stream holds the second request", func() bool { return lastSeq() > snapSeq })
	// The messages up to the snapshot leave the stream.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(snapSeq+1)); err != nil {
		t.Fatal(err)
	}

	b := startNode(t, url, "b", 3, 101, manual)
	testkit.Eventually(t, "b caught up", b.rep.caughtUp.Load)
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
	testkit.Eventually(t, "a restarted caught up", a2.rep.caughtUp.Load)
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
	testkit.Eventually(t, "ready after the warm timeout", n.rep.Ready)
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
	testkit.Eventually(t, "NATS not reachable logged", func() bool { return logged("NATS not reachable") })
	testkit.Eventually(t, "the warm timeout logged", func() bool { return logged("warm_timeout passed") })
	if logged("connected to NATS") {
		t.Fatal("connected logged while NATS is not there")
	}
	s, _ := startNATS(t, port)
	testkit.Eventually(t, "connected logged", func() bool { return logged("connected to NATS") })
	s.Shutdown()
	s.WaitForShutdown()
	testkit.Eventually(t, "disconnected logged", func() bool { return logged("disconnected from NATS") })
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
	testkit.Eventually(t, "a caught up", a.rep.caughtUp.Load)

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
	b := startNodeWith(t, url, "b", 1, 101, manual, func(n *node) { pb = n.r.Prefix().Precise(prefix.Candidate{ID: n.ids["w0"]}) })
	testkit.Eventually(t, "b loaded the snapshot", func() bool { st := b.rep.State(); return st.Snapshot != nil })
	if got := pb.Stats(); got.Blocks != before || !got.Live {
		t.Fatalf("b's index after the snapshot: %d blocks, live %v; want the snapshot's %d, live", got.Blocks, got.Live, before)
	}
	b.rep.FollowKV("w0", 0, pb)
	holds(t, "b's index holds every block", e, pb)
	testkit.Eventually(t, "b caught up", b.rep.caughtUp.Load)

	// c: w0 joins after the snapshot was loaded.
	c := startNodeWith(t, url, "c", 0, 201, manual, func(n *node) { n.ids["w0"] = 201 })
	testkit.Eventually(t, "c loaded the snapshot", func() bool { st := c.rep.State(); return st.Snapshot != nil })
	if st := c.rep.State(); st.Snapshot.Workers != 0 {
		t.Fatalf("c imported %d workers before any joined", st.Snapshot.Workers)
	}
	if _, err := c.r.AddWorker(fleet.Spec{ID: 201, Name: "w0", Role: shared.RoleAggregated, TotalKVBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	pc := c.r.Prefix().Precise(prefix.Candidate{ID: 201})
	c.rep.Joined("w0", 0, 201)
	if st := c.rep.State(); st.Snapshot.Workers != 1 {
		t.Fatalf("c imported %d workers once w0 joined, want 1", st.Snapshot.Workers)
	}
	c.rep.FollowKV("w0", 0, pc)
	holds(t, "c's index holds every block", e, pc)
}

// publishEvents publishes one batch of evs.
func (e *engine) publishEvents(t testing.TB, evs ...kvevents.Event) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	payload, err := e.enc.Encode(&kvevents.Batch{TS: 1, Events: evs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pub.Publish(payload); err != nil {
		t.Fatal(err)
	}
}

// residencyEvents are an engine's stores and removals of blocks 1001,
// 1002, 1003 (a chain of 4 tokens each, token ids the block's number, as
// publishBlocks stores them): the chain on GPU, a second GPU copy of
// 1001, the chain offloaded to the CPU tier (tokenless stores, as vLLM's
// offloading connector sends them), a second CPU copy of 1003, and 1003's
// GPU copy removed. After them the engine holds 1001 (2 GPU copies, 1 CPU),
// 1002 (1 GPU, 1 CPU) and 1003 (2 CPU copies): 7 copies, two blocks on
// GPU, three on CPU.
func residencyEvents() []kvevents.Event {
	chain := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, BlockHashes: []uint64{1001, 1002, 1003}}
	for _, h := range chain.BlockHashes {
		x := int64(h)
		chain.TokenIDs = append(chain.TokenIDs, x, x, x, x)
	}
	dup := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, BlockHashes: []uint64{1001}, TokenIDs: []int64{1001, 1001, 1001, 1001}}
	cpu := []byte(kvevents.MediumCPU)
	return []kvevents.Event{chain, dup,
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1001, 1002, 1003}, Medium: cpu},
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1003}, Medium: cpu},
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1003}, Medium: []byte(kvevents.MediumGPU)},
	}
}

// TestWarmStartKVEventsResidency: the relay's index saw GPU and CPU
// stores and duplicate copies (residencyEvents); a replica that joins
// after the KV stream's messages before the snapshot are gone holds, from
// the snapshot alone, the same belief: the same Precise.Stats (blocks,
// GPU and CPU blocks, copies) and the same TierOverlap for the prompts,
// and the same content; a removal of one of two copies, applied on both
// after, leaves both the same. Before, the snapshot carried neither the
// CPU tier nor the copies: the replica lost the CPU-only block and
// counted one copy of each.
func TestWarmStartKVEventsResidency(t *testing.T) {
	_, url := startNATS(t, 0)
	e := startEngine(t)
	manual := func(c *config.Cluster) { c.SnapshotInterval, c.WarmTimeout = time.Hour, time.Hour }
	a := startNode(t, url, "a", 1, 1, manual)
	pa := followW0(a)
	a.rep.RelayKV(RelayTarget{Worker: "w0", Rank: 0, KVEvents: e.kvEvents()})
	relaying(t, e, a)
	holds(t, "a's index holds the engine's blocks", e, pa)
	plain := e.published()
	e.publishEvents(t, residencyEvents()...)
	testkit.Eventually(t, "a's index holds the residency", func() bool {
		s := pa.Stats()
		return s.Blocks == plain+3 && s.GPUBlocks == plain+2 && s.CPUBlocks == 3 && s.Copies == plain+7
	})
	testkit.Eventually(t, "a caught up", a.rep.caughtUp.Load)

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
	stream, err := js.Stream(ctx, "test-kv")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(next)); err != nil {
		t.Fatal(err)
	}

	var pb *prefix.Precise
	b := startNodeWith(t, url, "b", 1, 101, manual, func(n *node) { pb = n.r.Prefix().Precise(prefix.Candidate{ID: n.ids["w0"]}) })
	testkit.Eventually(t, "b loaded the snapshot", func() bool { st := b.rep.State(); return st.Snapshot != nil })
	tokens := func(hs ...int64) *prefix.Key {
		k := &prefix.Key{}
		for _, h := range hs {
			k.IDs = append(k.IDs, h, h, h, h)
		}
		return k
	}
	prompts := []*prefix.Key{tokens(1001, 1002, 1003), tokens(1002, 1003), tokens(1003), tokens(1, 2, 3)}
	same := func(what string) {
		t.Helper()
		sa, sb := pa.Stats(), pb.Stats()
		if sa.Blocks != sb.Blocks || sa.GPUBlocks != sb.GPUBlocks || sa.CPUBlocks != sb.CPUBlocks || sa.Copies != sb.Copies ||
			sa.Live != sb.Live || sa.BlockSize != sb.BlockSize {
			t.Fatalf("%s: b's index %+v, a's %+v", what, sb, sa)
		}
		for _, k := range prompts {
			if oa, ob := pa.TierOverlap(k), pb.TierOverlap(k); oa != ob {
				t.Fatalf("%s: TierOverlap of %d tokens: b's %+v, a's %+v", what, len(k.IDs), ob, oa)
			}
		}
	}
	same("b's index from the snapshot")
	if o := pb.TierOverlap(prompts[0]); o != (prefix.TierOverlap{Precise: true, BlockSize: 4, GPUTokens: 8, CPUTokens: 4}) {
		t.Fatalf("b's TierOverlap of blocks 1001-1003 = %+v, want 1001 and 1002 on GPU, 1003 on CPU", o)
	}
	export := func(n *node) *prefix.PreciseContent {
		for _, w := range exportPrefix(n.r) {
			if w.Worker == "w0" {
				return w.Precise
			}
		}
		return nil
	}
	if ca, cb := export(a), export(b); ca == nil || !cmp.Equal(ca, cb) {
		t.Fatalf("b's content differs from a's (-a +b):\n%s", cmp.Diff(ca, cb))
	}

	// Both follow the stream on: one of 1001's two GPU copies and one of
	// 1003's two CPU copies removed leave both holding them.
	b.rep.FollowKV("w0", 0, pb)
	e.publishEvents(t, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1001}},
		kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1003}, Medium: []byte(kvevents.MediumCPU)})
	for _, p := range []*prefix.Precise{pa, pb} {
		testkit.Eventually(t, "the removals applied", func() bool { return p.Stats().Copies == plain+5 })
	}
	same("after the removals")
	if s := pb.Stats(); s.GPUBlocks != plain+2 || s.CPUBlocks != 3 {
		t.Fatalf("b's index after one of two copies went: %+v, want blocks 1001 and 1002 still on GPU, all three on CPU", s)
	}
}
