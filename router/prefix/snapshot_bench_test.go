package prefix

import (
	"encoding/binary"
	"runtime"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/internal/cputime"
	"github.com/switchyard-router/switchyard/router/kvevents"
)

// snapshotBlocks is the resident blocks of BenchmarkSnapshot's snapshot:
// vLLM's snapshot recorder refuses more than 1,000,000 references
// (KVCacheSnapshot.MAX_REFERENCES, vMaroon/vllm@08ee3e54).
const snapshotBlocks = 1_000_000

// snapshotPayloads encodes a snapshot as vLLM's KV-event snapshot service
// sends it (vMaroon/vllm@08ee3e54 kv_events_snapshot.py: source
// BlockStored events verbatim and in order, re-emitted until each block
// reaches its copies, then BlockRemoved events of up to 1024 hashes for
// the excess; chunks of up to 256 events, each an ordinary KVEventBatch):
// snapshotBlocks distinct 16-token blocks in stores of 64 (three stores in
// four continue the previous one's chain, as a conversation's turns do),
// then every 100th store again (the duplicate copies of 1% of the
// blocks), then removals of 9 × 1024 of those copies. Map events in an
// array envelope, int hashes (random-looking, as sha256's); with wide,
// every block hash is 32 bytes instead (vLLM's sha256_cbor with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), folding to the same ints. It
// returns the payloads, the block events they carry and the copies they
// leave.
func snapshotPayloads(b *testing.B, wide bool) (payloads [][]byte, events, copies int) {
	const (
		blockSize = 16
		perStore  = 64
		perChunk  = 256
	)
	stores := snapshotBlocks / perStore
	var evs []kvevents.Event
	// Engine hashes look random, as vLLM's (sha256 or xxhash, folded).
	hash := func(s, i int) uint64 { return ChainHash(uint64(s), uint64(i)) }
	tokens := make([]int64, stores*perStore*blockSize)
	for i := range tokens {
		tokens[i] = int64(i*7919) % 151_000
	}
	raws := map[uint64][]byte{} // with wide: each block's bytes, by fold
	for s := range stores {
		ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: blockSize, Medium: []byte("GPU"), GroupIdx: 0, HasGroupIdx: true,
			TokenIDs: tokens[s*perStore*blockSize : (s+1)*perStore*blockSize]}
		for i := range perStore {
			ev.BlockHashes = append(ev.BlockHashes, hash(s, i))
			if wide {
				raw := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 32), hash(-1-s, i)), hash(-1-i, s))
				raw = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(raw, hash(s, -1-i)), hash(s, i))
				ev.RawHashes = append(ev.RawHashes, kvevents.RawHash{Form: kvevents.HashBytes, Bytes: raw})
				raws[hash(s, i)] = raw
			}
		}
		if s%4 != 0 {
			ev.ParentBlockHash, ev.HasParent = hash(s-1, perStore-1), true
		}
		evs = append(evs, ev)
		events += perStore
	}
	for s := 0; s < stores; s += 100 {
		evs = append(evs, evs[s])
		events += perStore
	}
	var excess []uint64
	for s := 0; s < stores && len(excess) < 9*1024; s += 100 {
		excess = append(excess, evs[s].BlockHashes...)
	}
	copies = events - 9*1024
	for range 9 {
		rm := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: excess[:1024], Medium: []byte("GPU"), HasGroupIdx: true}
		if wide {
			for _, h := range rm.BlockHashes {
				rm.RawHashes = append(rm.RawHashes, kvevents.RawHash{Form: kvevents.HashBytes, Bytes: raws[h]})
			}
		}
		evs = append(evs, rm)
		excess = excess[1024:]
		events += 1024
	}
	enc := kvevents.Encoder{Encoding: kvevents.EncodingMap}
	for len(evs) > 0 {
		n := min(perChunk, len(evs))
		pl, err := enc.Encode(&kvevents.Batch{TS: 1.7e9, Events: evs[:n], DataParallelRank: 0, HasDataParallelRank: true})
		if err != nil {
			b.Fatal(err)
		}
		payloads = append(payloads, slices.Clone(pl))
		evs = evs[n:]
	}
	return payloads, events, copies
}

// BenchmarkSnapshot applies a 1-million-block snapshot (snapshotPayloads)
// to a candidate's precise index, as a subscriber bootstrapping from
// vLLM's snapshot service does. One op is one whole snapshot; the timed
// loop is Precise.ClearCold, then Decoder.Decode + Precise.Apply
// of every chunk (in order), then Precise.MarkLive. "fresh" applies it to
// a new index each time (made outside the timer), its tables growing from
// empty: a router starting in front of a busy engine; "refill" to the
// same index each time, whose Clear keeps its tables' storage: an engine
// restarting. The index's bound is 2^20 blocks (capacity 2^19 blocks of
// 16 tokens). ns/op is the time per snapshot; blocks/s its resident
// blocks per wall second, block_events/cpu-s the stored and removed
// blocks per second of process CPU time (run with -cpu 1 for one core).
func BenchmarkSnapshot(b *testing.B) {
	payloads, events, copies := snapshotPayloads(b, false)
	for _, fresh := range []bool{true, false} {
		name := map[bool]string{true: "fresh", false: "refill"}[fresh]
		b.Run(name, func(b *testing.B) {
			newIndex := func() *Precise {
				x := New(16)
				if err := x.AddWorker(Candidate{ID: 1}, 1<<19); err != nil {
					b.Fatal(err)
				}
				return x.Precise(Candidate{ID: 1})
			}
			p := newIndex()
			var d kvevents.Decoder
			var batch kvevents.Batch
			apply := func() {
				p.ClearCold()
				for _, pl := range payloads {
					if err := d.Decode(pl, &batch); err != nil {
						b.Fatal(err)
					}
					p.Apply(&batch)
				}
				p.MarkLive()
			}
			apply() // warm the decoder's batch; check the result
			if s := p.Stats(); s.GPUBlocks != snapshotBlocks || s.Copies != copies ||
				s.SkippedParent+s.SkippedMalformed+s.Evicted != 0 || !s.Live {
				b.Fatalf("the snapshot did not apply as meant: %+v", s)
			}
			b.ReportAllocs()
			var cpu0, cpu int64
			n := 0
			for b.Loop() {
				if fresh {
					b.StopTimer()
					p = newIndex()
					b.StartTimer()
				}
				cpu0 = int64(cputime.Process())
				apply()
				cpu += int64(cputime.Process()) - cpu0
				n++
			}
			b.ReportMetric(float64(n*snapshotBlocks)/b.Elapsed().Seconds(), "blocks/s")
			if cpu > 0 {
				b.ReportMetric(float64(n*events)/(float64(cpu)/1e9), "block_events/cpu-s")
				b.ReportMetric(float64(cpu)/1e9/float64(n), "cpu-s/op")
			}
		})
	}
}

// BenchmarkPreciseMemory measures what a precise index of 1,000,000
// blocks (snapshotPayloads' snapshot) keeps in memory when its engine
// sends int hashes ("int") and 32-byte ones ("bytes32": vLLM's
// sha256_cbor with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, whose bytes
// the index keeps for /debug/workers/NAME/blocks). One op builds a fresh
// index from the snapshot; B/op (-benchmem) is what that allocates, and
// heap-B/block the live heap the index holds after a GC, per resident
// block.
func BenchmarkPreciseMemory(b *testing.B) {
	for _, wide := range []bool{false, true} {
		name := map[bool]string{false: "int", true: "bytes32"}[wide]
		b.Run(name, func(b *testing.B) {
			payloads, _, _ := snapshotPayloads(b, wide)
			var d kvevents.Decoder
			var batch kvevents.Batch
			build := func() *Precise {
				x := New(16)
				if err := x.AddWorker(Candidate{ID: 1}, 1<<19); err != nil {
					b.Fatal(err)
				}
				p := x.Precise(Candidate{ID: 1})
				for _, pl := range payloads {
					if err := d.Decode(pl, &batch); err != nil {
						b.Fatal(err)
					}
					p.Apply(&batch)
				}
				return p
			}
			_ = build() // warm the decoder's batch
			b.ReportAllocs()
			var heap uint64
			n := 0
			for b.Loop() {
				b.StopTimer()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				b.StartTimer()
				p := build()
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&after)
				if s := p.Stats(); s.Blocks != snapshotBlocks {
					b.Fatalf("%d blocks, want %d", s.Blocks, snapshotBlocks)
				}
				if wide {
					if bs, _ := p.EngineBlocks(0, 1, nil); len(bs) != 1 || len(bs[0].Bytes()) != 32 {
						b.Fatalf("listed %+v, want a 32-byte hash", bs)
					}
				}
				runtime.KeepAlive(p)
				heap += after.HeapAlloc - before.HeapAlloc
				n++
				b.StartTimer()
			}
			b.ReportMetric(float64(heap)/float64(n)/snapshotBlocks, "heap-B/block")
		})
	}
}
