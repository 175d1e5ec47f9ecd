package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRawHashes: the hashes as engines send them survive decoding and
// re-encoding exactly, where their 64-bit folds do not say them. vLLM
// with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends its 32-byte
// sha256_cbor hashes as bytes (vllm/v1/core/kv_cache_utils.py
// maybe_convert_block_hash; msgspec writes bytes as msgpack bin), the
// parent too; SGLang sends signed 64-bit ints (hash_str_to_int64), here
// one negative; vLLM's default sends the low 64 bits as a non-negative
// int, up to 2^64-1 (a msgpack uint 64). An event of plain ints has no
// RawHashes; one that mixes forms says each hash's.
func TestRawHashes(t *testing.T) {
	h1, h2 := sha256.Sum256([]byte("block 1")), sha256.Sum256([]byte("block 2"))
	parent := sha256.Sum256([]byte("parent"))
	vllm := map[string]any{"type": "BlockStored", "block_hashes": []any{h1[:], h2[:]}, "parent_block_hash": parent[:],
		"token_ids": []any{1, 2, 3, 4}, "block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	removed := map[string]any{"type": "BlockRemoved", "block_hashes": []any{h2[:]}, "medium": "CPU"}
	sglang := []any{"BlockStored", []any{int64(-5), int64(7)}, int64(-9), []any{5, 6}, 1, nil}
	ints := []any{"BlockRemoved", []any{uint64(1<<64 - 1), uint64(3)}}
	mixed := []any{"BlockRemoved", []any{uint64(3), h1[:], int64(-2)}}
	p := rawOf(t, []any{1.0, []any{vllm, removed, sglang, ints, mixed}, 0})
	var got Batch
	var d Decoder
	if err := d.Decode(slices.Clone(p), &got); err != nil {
		t.Fatal(err)
	}
	fold := func(b [32]byte) uint64 { return binary.BigEndian.Uint64(b[24:]) }
	want := []struct {
		hashes []uint64
		raw    []RawHash
	}{
		{[]uint64{fold(h1), fold(h2)}, []RawHash{{HashBytes, h1[:]}, {HashBytes, h2[:]}}},
		{[]uint64{fold(h2)}, []RawHash{{HashBytes, h2[:]}}},
		{[]uint64{uint64(1<<64 - 5), 7}, []RawHash{{Form: HashNegative}, {}}},
		{[]uint64{1<<64 - 1, 3}, nil},
		{[]uint64{3, fold(h1), uint64(1<<64 - 2)}, []RawHash{{}, {HashBytes, h1[:]}, {Form: HashNegative}}},
	}
	for i, w := range want {
		ev := got.Events[i]
		if diff := cmp.Diff(w.hashes, ev.BlockHashes); diff != "" {
			t.Errorf("event %d hashes (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(w.raw, ev.RawHashes); diff != "" {
			t.Errorf("event %d raw hashes (-want +got):\n%s", i, diff)
		}
	}
	if got.Events[0].ParentBlockHash != fold(parent) || got.Events[2].ParentBlockHash != uint64(1<<64-9) {
		t.Errorf("parents %x, %x: want the folds", got.Events[0].ParentBlockHash, got.Events[2].ParentBlockHash)
	}
	// Re-encoded (a relay does), every hash is written as it came,
	// whatever the encoder's own setting for plain hashes.
	for _, enc := range []Encoder{{Encoding: EncodingMap}, {Encoding: EncodingArray, HashBytes: true}} {
		q, err := enc.Encode(&got)
		if err != nil {
			t.Fatal(err)
		}
		var again Batch
		if err := d.Decode(slices.Clone(q), &again); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if i == 3 && enc.HashBytes {
				continue // plain ints: written as the encoder's bytes
			}
			if diff := cmp.Diff(got.Events[i].RawHashes, again.Events[i].RawHashes); diff != "" {
				t.Errorf("encoding %d: event %d raw hashes (-decoded +re-encoded):\n%s", enc.Encoding, i, diff)
			}
		}
		if gen := generic(t, q); !bytes.Contains(q, h1[:]) || gen == nil {
			t.Errorf("encoding %d: the 32-byte hash is not in the payload", enc.Encoding)
		}
	}
	// Decoding stays allocation-free once the batch's storage has grown.
	if a := testing.AllocsPerRun(100, func() { _ = d.Decode(p, &got) }); a != 0 {
		t.Errorf("%.1f allocations per decode, want 0", a)
	}
}
