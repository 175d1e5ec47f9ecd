package kvevents

import (
	"bytes"
	"testing"
)

// TestEncodeSGLang: SGLang's layout, byte for byte as msgspec writes its
// classes (sgl-project/sglang python/sglang/srt/disaggregation/
// kv_events.py@612d5790: EventBatch [ts, events, attn_dp_rank],
// array_like tagged events, BlockStored [block_hashes, parent_block_hash,
// token_ids, block_size, lora_id], BlockRemoved [block_hashes]), with a
// hash past 2^63 written as the negative int64 SGLang's hash_str_to_int64
// gives.
func TestEncodeSGLang(t *testing.T) {
	b := &Batch{TS: 1.5, HasDataParallelRank: true, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0xffff_ffff_ffff_fffe}, TokenIDs: []int64{1, 2}, BlockSize: 2,
			Medium: []byte("GPU"), LoRAName: []byte("ignored"), GroupIdx: 0, HasGroupIdx: true},
		{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: []byte("GPU")},
		{Kind: AllBlocksCleared},
	}}
	want := []byte{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x93,
		0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0xfe, 0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0,
		0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0x05,
		0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd',
		0x00}
	e := Encoder{Encoding: EncodingSGLang}
	got, err := e.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("SGLang payload\n%x\nwant\n%x", got, want)
	}
}
