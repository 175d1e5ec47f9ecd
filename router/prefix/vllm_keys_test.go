package prefix

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// mp writes msgpack by hand, as msgspec encodes vLLM's structs (the
// smallest encoding of each value), so these tests read the engine's
// bytes, not the router's own encoder's.
type mp []byte

func (m mp) arr(n int) mp {
	switch {
	case n < 16:
		return append(m, 0x90|byte(n))
	case n < 1<<16:
		return append(m, 0xdc, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(m, 0xdd), uint32(n))
}

func (m mp) mapN(n int) mp { return append(m, 0x80|byte(n)) } // n < 16

func (m mp) str(s string) mp {
	switch {
	case len(s) < 32:
		m = append(m, 0xa0|byte(len(s)))
	case len(s) < 256:
		m = append(m, 0xd9, byte(len(s)))
	default:
		m = binary.BigEndian.AppendUint16(append(m, 0xda), uint16(len(s)))
	}
	return append(m, s...)
}

func (m mp) bin(b []byte) mp { return append(append(m, 0xc4, byte(len(b))), b...) } // len < 256

func (m mp) nil() mp { return append(m, 0xc0) }

func (m mp) uint(v uint64) mp {
	switch {
	case v < 128:
		return append(m, byte(v))
	case v < 256:
		return append(m, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(m, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(m, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(m, 0xcf), v)
}

func (m mp) int(v int64) mp {
	switch {
	case v >= 0:
		return m.uint(uint64(v))
	case v >= -32:
		return append(m, byte(v))
	case v >= math.MinInt8:
		return append(m, 0xd0, byte(v))
	}
	return binary.BigEndian.AppendUint64(append(m, 0xd3), uint64(v))
}

func (m mp) f64(v float64) mp {
	return binary.BigEndian.AppendUint64(append(m, 0xcb), math.Float64bits(v))
}

func (m mp) ints(vs []int64) mp {
	m = m.arr(len(vs))
	for _, v := range vs {
		m = m.int(v)
	}
	return m
}

// vllmStored is one BlockStored as vLLM's BlockPool.cache_full_blocks
// builds it (fork main vllm/v1/core/block_pool.py, vMaroon/vllm@8c296de6),
// in the positional layout of vllm/distributed/kv_events.py there
// (array_like=True, omit_defaults=True, tag=True: ["BlockStored",
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name, extra_keys, group_idx]; kv_cache_spec_* at their default None
// are left out). Hashes are ints (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1,
// the default); hashBytes, when set, gives them as raw bytes instead
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, or an offloading connector).
type vllmStored struct {
	hashes    []uint64
	hashBytes [][]byte
	parent    *uint64
	// parentBytes, when set, is the parent's raw bytes hash (with
	// hashBytes).
	parentBytes []byte
	tokens      []int64
	blockSize   int64
	loraID      *int64
	medium      string
	loraName    *string
	// extraKeys, one per block, each the msgpack of the block's tuple or
	// nil for None; nil for the field's None.
	extraKeys []mp
	groupIdx  int64
}

func (e vllmStored) encode(m mp) mp {
	m = m.arr(10).str("BlockStored")
	if e.hashBytes != nil {
		m = m.arr(len(e.hashBytes))
		for _, b := range e.hashBytes {
			m = m.bin(b)
		}
	} else {
		m = m.arr(len(e.hashes))
		for _, h := range e.hashes {
			m = m.uint(h)
		}
	}
	if e.parentBytes != nil {
		m = m.bin(e.parentBytes)
	} else if e.parent != nil {
		m = m.uint(*e.parent)
	} else {
		m = m.nil()
	}
	m = m.ints(e.tokens).int(e.blockSize)
	if e.loraID != nil {
		m = m.int(*e.loraID)
	} else {
		m = m.nil()
	}
	m = m.str(e.medium)
	if e.loraName != nil {
		m = m.str(*e.loraName)
	} else {
		m = m.nil()
	}
	if e.extraKeys == nil {
		m = m.nil()
	} else {
		m = m.arr(len(e.extraKeys))
		for _, k := range e.extraKeys {
			if k == nil {
				m = m.nil()
			} else {
				m = append(m, k...)
			}
		}
	}
	return m.int(e.groupIdx)
}

// vllmRemoved is BlockRemoved as BlockPool._maybe_evict_cached_block
// builds it: ["BlockRemoved", [hash], medium, group_idx].
func vllmRemoved(m mp, medium string, group int64, hashes ...uint64) mp {
	m = m.arr(4).str("BlockRemoved").arr(len(hashes))
	for _, h := range hashes {
		m = m.uint(h)
	}
	return m.str(medium).int(group)
}

// vllmBatch is a KVEventBatch (array_like: [ts, events,
// data_parallel_rank]) of already encoded events.
func vllmBatch(events ...mp) []byte {
	m := mp{}.arr(3).f64(1.7e9).arr(len(events))
	for _, e := range events {
		m = append(m, e...)
	}
	return m.int(0)
}

// applyWire decodes an engine payload and applies it.
func applyWire(t *testing.T, p *Precise, payload []byte) {
	t.Helper()
	var d kvevents.Decoder
	var b kvevents.Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatalf("decoding the engine's payload: %v", err)
	}
	p.Apply(&b)
}

func seq(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

func sp(s string) *string { return &s }
func ip(v int64) *int64   { return &v }

// tuple is the msgpack of a Python tuple of strings and (identifier,
// offset) pairs, as msgspec writes an extra-keys entry.
func tuple(parts ...any) mp {
	m := mp{}.arr(len(parts))
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			m = m.str(v)
		case mmKey:
			m = m.arr(2).str(v.id).int(v.off)
		case []byte:
			m = m.bin(v)
		}
	}
	return m
}

type mmKey struct {
	id  string
	off int64
}

// A LoRA request's blocks, as vLLM publishes them (tests/v1/core/
// test_prefix_caching.py test_kv_cache_events_with_lora: block size 16,
// LoRARequest(lora_name="test_lora", lora_int_id=42), list(range(16·n))
// tokens; test_kv_cache_utils.py test_generate_block_hash_extra_keys_lora:
// every block's extra keys are ("test_lora",)), match a Key with LoRA
// "test_lora" and no other: not the base model, not another adapter. A
// continuation (parent set) extends the chain.
func TestVLLMLoRABlocksMatchTheAdapter(t *testing.T) {
	x := New(16)
	_ = x.AddWorker(cand(1), 100)
	p := x.Precise(cand(1))
	p.MarkLive()
	lora := vllmStored{
		hashes: []uint64{0xa1b2c3d4e5f60718, 0x1122334455667788, 0xfedcba9876543210}, tokens: seq(0, 48), blockSize: 16,
		loraID: ip(42), medium: "GPU", loraName: sp("test_lora"),
		extraKeys: []mp{tuple("test_lora"), tuple("test_lora"), tuple("test_lora")},
	}
	applyWire(t, p, vllmBatch(lora.encode(nil)))
	ids := seq(0, 64)
	for _, tc := range []struct {
		name string
		key  *Key
		want int
	}{
		{"the adapter", &Key{IDs: ids, LoRA: "test_lora"}, 48},
		{"the base model", &Key{IDs: ids}, 0},
		{"another adapter", &Key{IDs: ids, LoRA: "other_lora"}, 0},
		{"the adapter, salted", &Key{IDs: ids, LoRA: "test_lora", Salt: "s"}, 0},
	} {
		if got, ok := x.OverlapTokens(cand(1), nil, tc.key); got != tc.want || !ok {
			t.Errorf("%s: OverlapTokens = %d, %v; want %d exact", tc.name, got, ok, tc.want)
		}
	}
	// The request's next turn: one more block, chained to the last.
	next := vllmStored{
		hashes: []uint64{0x0102030405060708}, parent: ptr(0xfedcba9876543210), tokens: seq(48, 16), blockSize: 16,
		loraID: ip(42), medium: "GPU", loraName: sp("test_lora"), extraKeys: []mp{tuple("test_lora")},
	}
	applyWire(t, p, vllmBatch(next.encode(nil)))
	if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: ids, LoRA: "test_lora"}); got != 64 {
		t.Errorf("after the continuation: %d tokens, want 64", got)
	}
	if s := p.Stats(); s.GPUBlocks != 4 || s.SkippedParent+s.SkippedMalformed != 0 {
		t.Errorf("stats %+v, want 4 GPU blocks, none skipped", s)
	}
	// The same adapter's blocks in the map layout (vLLM's snapshot
	// branch, vMaroon/vllm@08ee3e54: events are tagged maps).
	y := New(16)
	_ = y.AddWorker(cand(1), 100)
	q := y.Precise(cand(1))
	q.MarkLive()
	m := mp{}.mapN(9).str("type").str("BlockStored").
		str("block_hashes").arr(1).uint(7).
		str("parent_block_hash").nil().
		str("token_ids").ints(seq(0, 16)).
		str("block_size").int(16).
		str("lora_id").int(42).
		str("medium").str("GPU").
		str("lora_name").str("test_lora").
		str("extra_keys").arr(1)
	m = append(m, tuple("test_lora")...)
	applyWire(t, q, vllmBatch(m))
	if got, ok := y.OverlapTokens(cand(1), nil, &Key{IDs: ids, LoRA: "test_lora"}); got != 16 || !ok {
		t.Errorf("map layout: OverlapTokens = %d, %v; want 16 exact", got, ok)
	}
	if got, _ := y.OverlapTokens(cand(1), nil, &Key{IDs: ids}); got != 0 {
		t.Errorf("map layout, base model: %d tokens, want 0", got)
	}
}

// A salted request's blocks (test_generate_block_hash_extra_keys_cache_salt:
// ("salt",) on the block starting at token 0, None on the others) match a
// Key with that Salt only; an unsalted request's blocks match only
// unsalted requests. With LoRA, block 0's keys are (lora_name, salt).
func TestVLLMSaltedBlocksMatchTheSalt(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 100)
	p := x.Precise(cand(1))
	p.MarkLive()
	salted := vllmStored{hashes: []uint64{101, 102, 103}, tokens: seq(0, 12), blockSize: 4, medium: "GPU",
		extraKeys: []mp{tuple("salt"), nil, nil}}
	plain := vllmStored{hashes: []uint64{201, 202}, tokens: seq(100, 8), blockSize: 4, medium: "GPU"}
	both := vllmStored{hashes: []uint64{301, 302}, tokens: seq(200, 8), blockSize: 4, medium: "GPU",
		loraID: ip(1), loraName: sp("ad"), extraKeys: []mp{tuple("ad", "salt"), tuple("ad")}}
	applyWire(t, p, vllmBatch(salted.encode(nil), plain.encode(nil), both.encode(nil)))
	for _, tc := range []struct {
		name string
		key  *Key
		want int
	}{
		{"salted, same salt", &Key{IDs: seq(0, 13), Salt: "salt"}, 12},
		{"salted, no salt", &Key{IDs: seq(0, 13)}, 0},
		{"salted, other salt", &Key{IDs: seq(0, 13), Salt: "pepper"}, 0},
		{"unsalted, no salt", &Key{IDs: seq(100, 8)}, 8},
		{"unsalted, a salt", &Key{IDs: seq(100, 8), Salt: "salt"}, 0},
		{"adapter and salt", &Key{IDs: seq(200, 8), LoRA: "ad", Salt: "salt"}, 8},
		{"adapter, no salt", &Key{IDs: seq(200, 8), LoRA: "ad"}, 0},
		{"salt, no adapter", &Key{IDs: seq(200, 8), Salt: "salt"}, 0},
	} {
		if got, ok := x.OverlapTokens(cand(1), nil, tc.key); got != tc.want || !ok {
			t.Errorf("%s: OverlapTokens = %d, %v; want %d exact", tc.name, got, ok, tc.want)
		}
	}
}

// Multimodal blocks carry (identifier, offset from the block's start)
// per item they overlap (test_generate_block_hash_extra_keys: items
// "hash1" at tokens 0-4 and "hash2" at 10-14; a block of tokens 3-7 has
// ("hash1", -3)); with salt, block 0's keys are (("hash1", 0), "salt")
// (test_generate_block_hash_extra_keys_cache_salt). A Key with the same
// items finds them; without them, or with another identifier, it does
// not. Prompt-embedding digests (bytes) never match a request.
func TestVLLMMultimodalBlocks(t *testing.T) {
	x := New(3)
	_ = x.AddWorker(cand(1), 100)
	p := x.Precise(cand(1))
	p.MarkLive()
	// Block size 3, 18 tokens: blocks [0,3) [3,6) [6,9) [9,12) [12,15)
	// [15,18); hash1 covers 0-4, hash2 10-14. Worked by hand from
	// _gen_mm_extra_hash_keys: block 0 ("hash1", 0); block 1 ("hash1",
	// 0-3 = -3); block 2 none; block 3 ("hash2", 10-9 = 1); block 4
	// ("hash2", 10-12 = -2); block 5 none.
	mm := vllmStored{hashes: []uint64{1, 2, 3, 4, 5, 6}, tokens: seq(0, 18), blockSize: 3, medium: "GPU",
		extraKeys: []mp{tuple(mmKey{"hash1", 0}), tuple(mmKey{"hash1", -3}), nil,
			tuple(mmKey{"hash2", 1}), tuple(mmKey{"hash2", -2}), nil}}
	applyWire(t, p, vllmBatch(mm.encode(nil)))
	items := []MMItem{{Identifier: "hash1", Offset: 0, Length: 5}, {Identifier: "hash2", Offset: 10, Length: 5}}
	for _, tc := range []struct {
		name string
		key  *Key
		want int
	}{
		{"the same items", &Key{IDs: seq(0, 18), MM: items}, 18},
		{"text only", &Key{IDs: seq(0, 18)}, 0},
		{"another second item", &Key{IDs: seq(0, 18), MM: []MMItem{items[0], {Identifier: "hashX", Offset: 10, Length: 5}}}, 9},
		{"the second item elsewhere", &Key{IDs: seq(0, 18), MM: []MMItem{items[0], {Identifier: "hash2", Offset: 11, Length: 4}}}, 9},
	} {
		if got, ok := x.OverlapTokens(cand(1), nil, tc.key); got != tc.want || !ok {
			t.Errorf("%s: OverlapTokens = %d, %v; want %d exact", tc.name, got, ok, tc.want)
		}
	}
	// MM and salt on block 0, block size 5, 20 tokens, hash1 at 0-4.
	y := New(5)
	_ = y.AddWorker(cand(1), 100)
	q := y.Precise(cand(1))
	q.MarkLive()
	salted := vllmStored{hashes: []uint64{11, 12, 13, 14}, tokens: seq(50, 20), blockSize: 5, medium: "GPU",
		extraKeys: []mp{tuple(mmKey{"hash1", 0}, "salt"), nil, nil, nil}}
	embeds := vllmStored{hashes: []uint64{21}, tokens: seq(90, 5), blockSize: 5, medium: "GPU",
		extraKeys: []mp{tuple([]byte{0xde, 0xad, 0xbe, 0xef})}}
	applyWire(t, q, vllmBatch(salted.encode(nil), embeds.encode(nil)))
	one := []MMItem{{Identifier: "hash1", Offset: 0, Length: 5}}
	if got, _ := y.OverlapTokens(cand(1), nil, &Key{IDs: seq(50, 20), MM: one, Salt: "salt"}); got != 20 {
		t.Errorf("MM and salt: %d tokens, want 20", got)
	}
	if got, _ := y.OverlapTokens(cand(1), nil, &Key{IDs: seq(50, 20), MM: one}); got != 0 {
		t.Errorf("MM without the salt: %d tokens, want 0", got)
	}
	if got, _ := y.OverlapTokens(cand(1), nil, &Key{IDs: seq(90, 5)}); got != 0 {
		t.Errorf("prompt-embedding block matched text: %d tokens", got)
	}
	if s := q.Stats(); s.GPUBlocks != 5 {
		t.Errorf("stats %+v, want 5 GPU blocks", s)
	}
}

// An offloading connector's CPU store has no token ids and block_size 0
// and names its blocks by raw bytes hashes even when GPU events use ints
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
// take_events; test_kv_snapshot_bootstrap.py
// test_offload_bytes_resolve_integer_gpu_hash): the bytes fold to the low
// 64 bits, as maybe_convert_block_hash does, and find the GPU store's
// block. A CPU copy is not a GPU hit; it is the CPU-tier figure.
func TestVLLMTokenlessCPUStoreResolves(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 100)
	p := x.Precise(cand(1))
	p.MarkLive()
	// A 32-byte sha256-like hash whose low 64 bits, big-endian, are the
	// int vLLM publishes for the GPU copy.
	raw := make([]byte, 32)
	for i := range raw {
		raw[i] = byte(0x10 + i)
	}
	low := binary.BigEndian.Uint64(raw[24:]) // int.from_bytes(raw, "big") & (2**64-1)
	if low != kvevents.FoldHash(raw) {
		t.Fatalf("FoldHash %x, maybe_convert_block_hash %x", kvevents.FoldHash(raw), low)
	}
	gpu := vllmStored{hashes: []uint64{low - 1, low}, tokens: seq(0, 8), blockSize: 4, medium: "GPU"}
	cpu := vllmStored{hashBytes: [][]byte{raw}, tokens: []int64{}, blockSize: 0, medium: "CPU"}
	applyWire(t, p, vllmBatch(gpu.encode(nil), cpu.encode(nil), vllmRemoved(nil, "GPU", 0, low)))
	key := &Key{IDs: seq(0, 8)}
	if o := x.TierOverlap(cand(1), key); o != (TierOverlap{Precise: true, BlockSize: 4, GPUTokens: 4, CPUTokens: 4}) {
		t.Fatalf("TierOverlap = %+v, want block 0 on GPU, block 1 on CPU", o)
	}
	if s := p.Stats(); s.SkippedUnresolved != 0 || s.CPUBlocks != 1 || s.GPUBlocks != 1 || s.Copies != 2 {
		t.Fatalf("stats %+v", s)
	}
}
