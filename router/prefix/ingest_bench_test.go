package prefix

import (
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/internal/cputime"
	"github.com/switchyard-router/switchyard/router/kvevents"
)

// BenchmarkIngest decodes engine KV event payloads and applies them to a
// live precise index in steady state, residency counts included: every
// batch stores a 64-block conversation (16-token blocks, chained from the
// previous batch's last block every other batch) and removes the 64
// blocks stored 32 batches earlier, while the index is at its capacity
// bound, so stores also evict. The "tiers" case adds, per batch, what an
// engine with prefix caching and a CPU offloading connector sends too: a
// second copy of the last 8 blocks (vLLM recomputes a block-aligned
// prompt's last block into a new copy), tokenless CPU stores of 16 of the
// blocks, and the removals of those 24 copies 32 batches later.
// The timed loop is Decoder.Decode + Precise.Apply of pre-encoded
// payloads (the array layout; the map layout is reported separately).
// block_events/s counts stored plus removed blocks per wall second;
// block_events/cpu-s per second of the process's CPU time (getrusage),
// the rate on one core that other processes on a shared machine do not
// dilute (GC included; run with -cpu 1 for one thread). Compare the
// cases with benchstat over -count 10 runs.
func BenchmarkIngest(b *testing.B) {
	for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
		name := map[kvevents.Encoding]string{kvevents.EncodingArray: "array", kvevents.EncodingMap: "map"}[enc]
		b.Run(name, func(b *testing.B) { benchIngest(b, enc, false) })
	}
	b.Run("array-tiers", func(b *testing.B) { benchIngest(b, kvevents.EncodingArray, true) })
}

func benchIngest(b *testing.B, enc kvevents.Encoding, tiers bool) {
	const (
		blockSize = 16
		perBatch  = 64
		batches   = 256
		lag       = 32
		dups      = 8
		offloaded = 16
	)
	events := 2 * perBatch
	if tiers {
		events += 2 * (dups + offloaded)
	}
	x := New(512)
	// Capacity 32 router blocks of 512 = 16 Ki tokens; bound 2·16 Ki/16 =
	// 2048 blocks: fewer than the 32·64 = 2048 live ones plus each new batch.
	_ = x.AddWorker(Candidate{ID: 1}, 32)
	p := x.Precise(Candidate{ID: 1})
	p.MarkLive()
	e := kvevents.Encoder{Encoding: enc}
	payloads := make([][]byte, batches)
	hash := func(batch, i int) uint64 { return uint64(batch)<<32 | uint64(i) + 1 }
	for k := range payloads {
		tokens := make([]int64, perBatch*blockSize)
		for i := range tokens {
			tokens[i] = int64(k*7919+i) % 128000
		}
		hashes := make([]uint64, perBatch)
		for i := range hashes {
			hashes[i] = hash(k, i)
		}
		st := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: blockSize, Medium: []byte("GPU")}
		if k%2 == 1 {
			st.ParentBlockHash, st.HasParent = hash(k-1, perBatch-1), true
		}
		old := make([]uint64, perBatch)
		for i := range old {
			old[i] = hash((k+batches-lag)%batches, i)
		}
		batch := &kvevents.Batch{TS: float64(k), Events: []kvevents.Event{st, {Kind: kvevents.BlockRemoved, BlockHashes: old, Medium: []byte("GPU")}}}
		if tiers {
			dup := st
			dup.BlockHashes, dup.TokenIDs = hashes[perBatch-dups:], tokens[(perBatch-dups)*blockSize:]
			dup.ParentBlockHash, dup.HasParent = hash(k, perBatch-dups-1), true
			cpu := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes[:offloaded], TokenIDs: []int64{}, Medium: []byte("CPU")}
			j := (k + batches - lag) % batches
			var oldDup, oldCPU []uint64
			for i := perBatch - dups; i < perBatch; i++ {
				oldDup = append(oldDup, hash(j, i))
			}
			for i := range offloaded {
				oldCPU = append(oldCPU, hash(j, i))
			}
			batch.Events = append(batch.Events, dup, cpu,
				kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: oldDup, Medium: []byte("GPU")},
				kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: oldCPU, Medium: []byte("CPU")})
		}
		pl, err := e.Encode(batch)
		if err != nil {
			b.Fatal(err)
		}
		payloads[k] = slices.Clone(pl)
	}
	var d kvevents.Decoder
	var batch kvevents.Batch
	// Warm up to steady state: every payload once.
	for _, pl := range payloads {
		if err := d.Decode(pl, &batch); err != nil {
			b.Fatal(err)
		}
		p.Apply(&batch)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payloads[0])))
	n := 0
	cpu0 := cputime.Process()
	for b.Loop() {
		pl := payloads[n%batches]
		n++
		if err := d.Decode(pl, &batch); err != nil {
			b.Fatal(err)
		}
		p.Apply(&batch)
	}
	cpu := cputime.Process() - cpu0
	b.ReportMetric(float64(n*events)/b.Elapsed().Seconds(), "block_events/s")
	if cpu > 0 {
		b.ReportMetric(float64(n*events)/cpu.Seconds(), "block_events/cpu-s")
	}
	b.ReportMetric(0, "ns/op")
	if s := p.Stats(); s.Blocks == 0 || s.SkippedParent+s.SkippedMalformed != 0 || tiers && (s.CPUBlocks == 0 || s.Copies <= s.Blocks) {
		b.Fatalf("the benchmark's events did not apply as meant: %+v", s)
	}
}
