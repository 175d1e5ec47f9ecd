package kvevents

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// generic decodes a payload into plain Go values, for comparing an
// encoding with the layout the package doc gives.
func generic(t *testing.T, p []byte) any {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(p, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func rawOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sampleBatch(t *testing.T) *Batch {
	return &Batch{
		TS: 1.5,
		Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{7, 1 << 63}, ParentBlockHash: 3, HasParent: true,
				TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 2, Medium: []byte("GPU"),
				ExtraKeys: [][]byte{nil, rawOf(t, []any{"img", 5})}, GroupIdx: 1, HasGroupIdx: true},
			{Kind: BlockStored, BlockHashes: []uint64{9}, TokenIDs: []int64{5, 6}, BlockSize: 2, LoRAID: 4, HasLoRAID: true, LoRAName: []byte("ad")},
			{Kind: BlockRemoved, BlockHashes: []uint64{7}, Medium: []byte("CPU")},
			{Kind: AllBlocksCleared},
		},
		DataParallelRank: 2, HasDataParallelRank: true,
	}
}

// TestEncodeArrayLayout: the positional layout, field by field, with
// trailing default fields left out (msgspec array_like + omit_defaults).
func TestEncodeArrayLayout(t *testing.T) {
	var e Encoder
	p, err := e.Encode(sampleBatch(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{1.5, []any{
		[]any{"BlockStored", []any{int8(7), uint64(1 << 63)}, int8(3), []any{int8(1), int8(2), int8(3), int8(4)}, int8(2), nil, "GPU", nil,
			[]any{nil, []any{"img", int8(5)}}, int8(1)},
		[]any{"BlockStored", []any{int8(9)}, nil, []any{int8(5), int8(6)}, int8(2), int8(4), nil, "ad"},
		[]any{"BlockRemoved", []any{int8(7)}, "CPU"},
		[]any{"AllBlocksCleared"},
	}, int8(2)}
	if diff := cmp.Diff(want, generic(t, p)); diff != "" {
		t.Fatalf("array layout (-want +got):\n%s", diff)
	}
}

// TestEncodeMapLayout: events as maps with "type", fields with a default
// left out at it, fields without one always present; the envelope an
// array or a map.
func TestEncodeMapLayout(t *testing.T) {
	events := []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{int8(7), uint64(1 << 63)}, "parent_block_hash": int8(3),
			"token_ids": []any{int8(1), int8(2), int8(3), int8(4)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil,
			"extra_keys": []any{nil, []any{"img", int8(5)}}, "group_idx": int8(1)},
		map[string]any{"type": "BlockStored", "block_hashes": []any{int8(9)}, "parent_block_hash": nil, "token_ids": []any{int8(5), int8(6)},
			"block_size": int8(2), "lora_id": int8(4), "medium": nil, "lora_name": "ad"},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(7)}, "medium": "CPU"},
		map[string]any{"type": "AllBlocksCleared"},
	}
	e := Encoder{Encoding: EncodingMap}
	p, err := e.Encode(sampleBatch(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]any{1.5, events, int8(2)}, generic(t, p)); diff != "" {
		t.Fatalf("map layout (-want +got):\n%s", diff)
	}
	e.Encoding = EncodingMapEnvelope
	if p, err = e.Encode(sampleBatch(t)); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"ts": 1.5, "events": events, "data_parallel_rank": int8(2)}
	if diff := cmp.Diff(want, generic(t, p)); diff != "" {
		t.Fatalf("map envelope (-want +got):\n%s", diff)
	}
	// The rank at its default (None) is left out of either envelope.
	b := &Batch{TS: 2}
	if p, err = e.Encode(b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]any{"ts": 2.0, "events": []any{}}, generic(t, p)); diff != "" {
		t.Fatalf("map envelope without rank (-want +got):\n%s", diff)
	}
	e.Encoding = EncodingArray
	if p, err = e.Encode(b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]any{2.0, []any{}}, generic(t, p)); diff != "" {
		t.Fatalf("array envelope without rank (-want +got):\n%s", diff)
	}
}

func TestEncodeHashBytes(t *testing.T) {
	e := Encoder{HashBytes: true}
	p, err := e.Encode(&Batch{Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{0x0102030405060708}}}})
	if err != nil {
		t.Fatal(err)
	}
	ev := generic(t, p).([]any)[1].([]any)[0].([]any)
	if diff := cmp.Diff([]any{[]byte{1, 2, 3, 4, 5, 6, 7, 8}}, ev[1]); diff != "" {
		t.Fatalf("hash as bytes (-want +got):\n%s", diff)
	}
}

func TestEncodeRejects(t *testing.T) {
	var e Encoder
	for name, b := range map[string]*Batch{
		"unknown kind":         {Events: []Event{{Kind: 9}}},
		"extra keys per block": {Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1, 2}, ExtraKeys: [][]byte{nil}}}},
		"extra keys not one value": {Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1},
			ExtraKeys: [][]byte{{0x01, 0x02}}}}},
	} {
		if _, err := e.Encode(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestMessageFrames(t *testing.T) {
	m := Message("kv", 258, []byte{0x90})
	if len(m.Frames) != 3 || string(m.Frames[0]) != "kv" || binary.BigEndian.Uint64(m.Frames[1]) != 258 ||
		len(m.Frames[1]) != 8 || string(m.Frames[2]) != "\x90" {
		t.Fatalf("frames %q", m.Frames)
	}
}
