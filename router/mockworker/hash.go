package mockworker

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// engineHasher computes the engine's own block hashes, the values its KV
// events carry and its prefix cache is keyed by. They are opaque to a
// router: with vLLM the chain starts from a NONE_HASH that is random per
// process unless seeded.
//
// vLLM (vllm/v1/core/kv_cache_utils.py hash_block_tokens,
// init_none_hash, generate_block_hash_extra_keys,
// maybe_convert_block_hash; vllm/utils/hashing.py sha256_cbor): block i's
// hash is sha256 of the canonical CBOR of (parent's 32-byte hash, or
// NONE_HASH for block 0; the block's token ids; extra keys), the extra
// keys being None or a tuple of the LoRA adapter's name (every block of
// a LoRA request) then the cache_salt (block 0 only). NONE_HASH is 32
// random bytes, or with a seed (vLLM's PYTHONHASHSEED) sha256 of the
// seed's CBOR text string. A KV event carries the low 64 bits of the
// hash (big-endian), VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES' default. This
// is vLLM's hash with prefix_caching_hash_algo "sha256_cbor"; its
// default "sha256" pickles the same tuple instead, which only Python
// reproduces.
//
// SGLang (python/sglang/srt/mem_cache utils get_hash_str,
// hash_str_to_int64): a page's hash is sha256 of the previous page's
// 32-byte hash (none for the first page) followed by each token id as 4
// bytes little-endian; the event carries its first 8 bytes as a signed
// 64-bit integer. A LoRA or salted request's first page is chained from
// sha256("lora\x00salt") instead (SGLang keys such requests in their own
// namespace; the exact root is the mock's).
//
// A text prompt without a tokenizer has no token ids: its blocks are
// chunks of block size × CharsPerToken bytes, hashed the same way with
// the bytes in place of the ids (a CBOR byte string for vLLM).
type engineHasher struct {
	sglang bool
	none   [32]byte
	enc    cbor.EncMode
}

// newEngineHasher returns vLLM's hasher (sglang false) with NONE_HASH from
// seed ("" means random), or SGLang's.
func newEngineHasher(sglang bool, seed string) (*engineHasher, error) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		return nil, fmt.Errorf("CBOR encoder: %w", err)
	}
	h := &engineHasher{sglang: sglang, enc: em}
	if seed == "" {
		_, _ = rand.Read(h.none[:])
		return h, nil
	}
	b, err := em.Marshal(seed)
	if err != nil {
		return nil, fmt.Errorf("hash seed: %w", err)
	}
	h.none = sha256.Sum256(b)
	return h, nil
}

// extraKeys are block i's extra keys in vLLM's order (LoRA name, then the
// cache salt on block 0), nil when there are none.
func extraKeys(i int, lora, salt string) []string {
	var k []string
	if lora != "" {
		k = append(k, lora)
	}
	if salt != "" && i == 0 {
		k = append(k, salt)
	}
	return k
}

// blocks hashes the n full blocks of a prompt, content(i) giving block i's
// token ids or bytes, and returns each block's 64-bit external hash.
func (h *engineHasher) blocks(n int, content func(i int) any, lora, salt string) ([]uint64, error) {
	if n <= 0 {
		return nil, nil
	}
	out := make([]uint64, n)
	var parent [32]byte
	if h.sglang {
		var buf []byte
		hasRoot := lora != "" || salt != ""
		if hasRoot {
			parent = sha256.Sum256([]byte(lora + "\x00" + salt))
		}
		for i := range n {
			buf = buf[:0]
			if i > 0 || hasRoot {
				buf = append(buf, parent[:]...)
			}
			switch c := content(i).(type) {
			case []int64:
				for _, id := range c {
					buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
				}
			case []byte:
				buf = append(buf, c...)
			}
			parent = sha256.Sum256(buf)
			out[i] = binary.BigEndian.Uint64(parent[:8])
		}
		return out, nil
	}
	parent = h.none
	for i := range n {
		var extra any // None
		if k := extraKeys(i, lora, salt); k != nil {
			extra = k
		}
		b, err := h.enc.Marshal([]any{parent[:], content(i), extra})
		if err != nil {
			return nil, fmt.Errorf("hashing block %d: %w", i, err)
		}
		parent = sha256.Sum256(b)
		out[i] = binary.BigEndian.Uint64(parent[24:])
	}
	return out, nil
}

// tokenBlocks hashes the full blocks of ids at bs tokens per block.
func (h *engineHasher) tokenBlocks(ids []int64, bs int, lora, salt string) ([]uint64, error) {
	return h.blocks(len(ids)/bs, func(i int) any { return ids[i*bs : (i+1)*bs] }, lora, salt)
}

// textBlocks hashes the full chunks of text at bs·cpt bytes per block.
func (h *engineHasher) textBlocks(text string, bs, cpt int, lora, salt string) ([]uint64, error) {
	n := bs * cpt
	return h.blocks(len(text)/n, func(i int) any { return []byte(text[i*n : (i+1)*n]) }, lora, salt)
}
