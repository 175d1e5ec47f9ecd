package mockworker

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

// TestVLLMBlockHashes: the mock's block hashes are vLLM's
// (vllm/v1/core/kv_cache_utils.py hash_block_tokens with
// vllm/utils/hashing.py sha256_cbor, init_none_hash with PYTHONHASHSEED
// "0", maybe_convert_block_hash's low 64 bits), with the extra keys of
// generate_block_hash_extra_keys: the LoRA name on every block
// (tests/v1/core/test_kv_cache_utils.py
// test_generate_block_hash_extra_keys_lora: ("test_lora_adapter",)),
// the cache salt on block 0 only (…_cache_salt: ("salt",) for the block
// starting at 0, None otherwise), LoRA before salt. The expected values
// were computed outside this code, by sha256 over canonical CBOR written
// by hand per RFC 8949; block 0 of the plain case is, byte for byte:
//
//	83                    array(3): (parent, tokens, extra_keys)
//	5820 <NONE_HASH>      bytes(32)
//	90 01 02 … 0f 10      array(16) of the token ids 1..16
//	f6                    None
//
// with NONE_HASH = sha256(61 30), the CBOR text string "0".
func TestVLLMBlockHashes(t *testing.T) {
	h, err := newEngineHasher(false, "0")
	if err != nil {
		t.Fatal(err)
	}
	none := sha256.Sum256([]byte{0x61, '0'})
	if got := hex.EncodeToString(h.none[:]); got != hex.EncodeToString(none[:]) ||
		got != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Fatalf("NONE_HASH %s", got)
	}
	block0 := append(append([]byte{0x83, 0x58, 0x20}, none[:]...), 0x90)
	for i := byte(1); i <= 16; i++ {
		block0 = append(block0, i)
	}
	block0 = append(block0, 0xf6)
	if d := sha256.Sum256(block0); hex.EncodeToString(d[:]) != "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea" {
		t.Fatalf("hand-written block 0 hashes to %x", d)
	}

	ids := make([]int64, 64)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	for _, c := range []struct {
		name       string
		lora, salt string
		n          int
		want       []uint64
	}{
		{"plain", "", "", 64, []uint64{3236607068019569386, 2758186210834249151, 5191110061519319221, 17013564117172258520}},
		{"lora", "ad1", "", 48, []uint64{896934114758974002, 4048387985669920188, 2013072458129285803}},
		{"salt", "", "s1", 48, []uint64{2098375440168515790, 13351230569374862786, 4997034330794856585}},
		{"lora and salt", "ad1", "s1", 48, []uint64{8535775692285830676, 9529146155116454865, 1609834978130274703}},
		// A partial last block is not hashed.
		{"partial", "", "", 40, []uint64{3236607068019569386, 2758186210834249151}},
	} {
		got, err := h.tokenBlocks(ids[:c.n], 16, c.lora, c.salt)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}

	// Without a seed NONE_HASH is random: two engines disagree.
	a, _ := newEngineHasher(false, "")
	b, _ := newEngineHasher(false, "")
	ha, _ := a.tokenBlocks(ids, 16, "", "")
	hb, _ := b.tokenBlocks(ids, 16, "", "")
	if slices.Equal(ha, hb) {
		t.Fatal("two unseeded engines hash alike")
	}
}

// TestSGLangPageHashes: SGLang's page hashes (python/sglang/srt/mem_cache
// get_hash_str: sha256 of the previous page's digest and each token id
// as 4 bytes little-endian; hash_str_to_int64: the first 8 bytes, signed),
// computed outside this code for pages [1 2 3 4] and [5 6 7 8]: the first
// is negative as an int64 (-3488128144981237669).
func TestSGLangPageHashes(t *testing.T) {
	h, err := newEngineHasher(true, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.tokenBlocks([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, 4, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{14958615928728313947, 5674439469042975057}; !slices.Equal(got, want) || int64(got[0]) != -3488128144981237669 {
		t.Fatalf("SGLang page hashes %v, want %v", got, want)
	}
	// A LoRA request's pages are in their own namespace.
	lora, _ := h.tokenBlocks([]int64{1, 2, 3, 4}, 4, "ad1", "")
	if lora[0] == got[0] {
		t.Fatal("a LoRA page hashes like the base model's")
	}
}
