package prefix

import "math"

// A block's extra keys, in canonical form. vLLM hashes each block as
// hash((parent, token ids, extra keys)), its extra keys a tuple built by
// generate_block_hash_extra_keys (vllm/v1/core/kv_cache_utils.py):
//
//	LoRA name (every block of a LoRA request) + multimodal items
//	(identifier, offset in the block) + cache_salt (a prompt's first block
//	only) + prompt-embedding digests (sha256 bytes)
//
// The router keys blocks by its own hash of the same parts, so that the
// request side (Key: IDs, LoRA, Salt, MM) and the engine side (BlockStored:
// lora_name and each block's extra_keys) give a block the same key
// whatever the engine's hash function and seed. Each part is folded into
// a digest under a tag:
//
//	'L' the LoRA adapter's name (lora_name; on the engine side also the
//	    first extra key when it equals lora_name)
//	'I' the deprecated lora_id, for an engine that sends no lora_name (no
//	    request presents it: such blocks never match)
//	'M' a multimodal item: its identifier and its offset from the block's
//	    first token (negative when the item began in an earlier block)
//	'S' any other string: the cache salt on a prompt's first block (a
//	    request sets it there only), or a bare multimodal identifier of
//	    older vLLM releases (no request presents those)
//	'E' bytes: a prompt-embedding digest (no request presents those)
//	'U' anything else, as its raw msgpack bytes (never presented)
//
// in the order vLLM lists them. A block with no part keeps the plain
// token content id, so base-model, unsalted, text-only blocks key exactly
// as TokenBlocks does; a block with parts has its content id
// ChainHash(token content id, digest).

// extrasDigest folds a block's extra keys into a 64-bit digest: FNV-1a 64
// over each part's tag, length and bytes, so parts cannot run into one
// another. n counts the parts.
type extrasDigest struct {
	h uint64
	n int
}

func (d *extrasDigest) reset() { d.h, d.n = fnvOffset, 0 }

func (d *extrasDigest) byte1(c byte) {
	d.h ^= uint64(c)
	d.h *= fnvPrime
}

func (d *extrasDigest) word(v uint64) {
	for range 8 {
		d.byte1(byte(v))
		v >>= 8
	}
}

// bytes adds a part of tag and content b.
func (d *extrasDigest) bytes(tag byte, b []byte) {
	d.byte1(tag)
	d.word(uint64(len(b)))
	for _, c := range b {
		d.byte1(c)
	}
	d.n++
}

// str is bytes for a string, without converting it.
func (d *extrasDigest) str(tag byte, s string) {
	d.byte1(tag)
	d.word(uint64(len(s)))
	for i := 0; i < len(s); i++ {
		d.byte1(s[i])
	}
	d.n++
}

// int adds a part of tag and integer v.
func (d *extrasDigest) int(tag byte, v int64) {
	d.byte1(tag)
	d.word(uint64(v))
	d.n++
}

// mm adds a multimodal item: identifier id at offset off from the block's
// first token.
func (d *extrasDigest) mm(id []byte, off int64) {
	d.bytes('M', id)
	d.word(uint64(off))
}

// mmString is mm for a string identifier.
func (d *extrasDigest) mmString(id string, off int64) {
	d.str('M', id)
	d.word(uint64(off))
}

// content returns the block's content id: id when the block has no
// extra-key part, else ChainHash(id, digest).
func (d *extrasDigest) content(id uint64) uint64 {
	if d.n == 0 {
		return id
	}
	return ChainHash(id, d.h)
}

// event adds one block's extra keys as a BlockStored event carries them:
// raw, the msgpack encoding of the block's tuple (an array), or nil
// (None). lora is the event's lora_name (nil: none); its part was added
// already, and a first string element equal to it is that same name, not
// another part. Parts it cannot read are added as 'U' with their raw
// bytes, so they never match a request.
func (d *extrasDigest) event(raw, lora []byte) {
	if len(raw) == 0 {
		return
	}
	r := mpReader{b: raw}
	n, ok := r.arrayLen()
	if !ok {
		if r.isNil() {
			return
		}
		d.bytes('U', raw)
		return
	}
	for k := range n {
		start := r.i
		switch {
		case r.isStr():
			s, ok := r.str()
			if !ok {
				d.bytes('U', raw[start:])
				return
			}
			if k == 0 && lora != nil && string(s) == string(lora) {
				continue
			}
			d.bytes('S', s)
		case r.isBin():
			b, ok := r.bin()
			if !ok {
				d.bytes('U', raw[start:])
				return
			}
			d.bytes('E', b)
		default:
			if id, off, ok := r.mmItem(); ok {
				d.mm(id, off)
				continue
			}
			r.i = start
			if !r.skip(maxExtraDepth) {
				d.bytes('U', raw[start:])
				return
			}
			d.bytes('U', raw[start:r.i])
		}
	}
}

// maxExtraDepth bounds the nesting of an extra key the reader skips (the
// decoder bounds it at 32 already).
const maxExtraDepth = 32

// mpReader reads the msgpack subset extra keys use, from b at i. Every
// read checks the bytes left; a failed read reports false.
type mpReader struct {
	b []byte
	i int
}

func (r *mpReader) peek() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	return r.b[r.i], true
}

func (r *mpReader) isNil() bool { c, ok := r.peek(); return ok && c == 0xc0 }

func (r *mpReader) isStr() bool {
	c, ok := r.peek()
	return ok && (c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb)
}

func (r *mpReader) isBin() bool { c, ok := r.peek(); return ok && c >= 0xc4 && c <= 0xc6 }

// uint reads an n-byte big-endian length or value.
func (r *mpReader) uint(n int) (uint64, bool) {
	if len(r.b)-r.i < n {
		return 0, false
	}
	var v uint64
	for _, c := range r.b[r.i : r.i+n] {
		v = v<<8 | uint64(c)
	}
	r.i += n
	return v, true
}

// take returns the next n bytes.
func (r *mpReader) take(n uint64) ([]byte, bool) {
	if n > uint64(len(r.b)-r.i) {
		return nil, false
	}
	out := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return out, true
}

func (r *mpReader) arrayLen() (int, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.i++
		n = uint64(c & 0x0f)
	case c == 0xdc || c == 0xdd:
		r.i++
		if n, ok = r.uint(2 << (c - 0xdc)); !ok {
			return 0, false
		}
	default:
		return 0, false
	}
	// Every element takes at least one byte.
	if n > uint64(len(r.b)-r.i) {
		return 0, false
	}
	return int(n), true
}

func (r *mpReader) str() ([]byte, bool) {
	c, _ := r.peek()
	r.i++
	var n uint64
	var ok bool
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n, ok = uint64(c&0x1f), true
	case c == 0xd9:
		n, ok = r.uint(1)
	case c == 0xda:
		n, ok = r.uint(2)
	default: // 0xdb
		n, ok = r.uint(4)
	}
	if !ok {
		return nil, false
	}
	return r.take(n)
}

func (r *mpReader) bin() ([]byte, bool) {
	c, _ := r.peek()
	r.i++
	n, ok := r.uint(1 << (c - 0xc4))
	if !ok {
		return nil, false
	}
	return r.take(n)
}

// int reads an integer that fits int64.
func (r *mpReader) int() (int64, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	switch {
	case c <= 0x7f:
		r.i++
		return int64(c), true
	case c >= 0xe0:
		r.i++
		return int64(int8(c)), true
	case c >= 0xcc && c <= 0xcf:
		r.i++
		v, ok := r.uint(1 << (c - 0xcc))
		if !ok || v > math.MaxInt64 {
			return 0, false
		}
		return int64(v), true
	case c >= 0xd0 && c <= 0xd3:
		r.i++
		n := 1 << (c - 0xd0)
		v, ok := r.uint(n)
		if !ok {
			return 0, false
		}
		shift := 64 - 8*n
		return int64(v<<shift) >> shift, true
	}
	return 0, false
}

// mmItem reads a multimodal item, a 2-array [identifier str, offset int].
// It reports false (r unchanged or past a partial read: the caller
// rewinds) for anything else.
func (r *mpReader) mmItem() ([]byte, int64, bool) {
	if c, ok := r.peek(); !ok || c != 0x92 {
		return nil, 0, false
	}
	r.i++
	if !r.isStr() {
		return nil, 0, false
	}
	id, ok := r.str()
	if !ok {
		return nil, 0, false
	}
	off, ok := r.int()
	return id, off, ok
}

// skip passes one value, nested at most depth deep.
func (r *mpReader) skip(depth int) bool {
	if depth <= 0 {
		return false
	}
	c, ok := r.peek()
	if !ok {
		return false
	}
	r.i++
	var n uint64
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return true
	case c >= 0xa0 && c <= 0xbf:
		_, ok = r.take(uint64(c & 0x1f))
		return ok
	case c >= 0x90 && c <= 0x9f:
		return r.skipN(uint64(c&0x0f), depth)
	case c >= 0x80 && c <= 0x8f:
		return r.skipN(2*uint64(c&0x0f), depth)
	}
	switch c {
	case 0xcc, 0xd0:
		_, ok = r.take(1)
	case 0xcd, 0xd1:
		_, ok = r.take(2)
	case 0xce, 0xd2, 0xca:
		_, ok = r.take(4)
	case 0xcf, 0xd3, 0xcb:
		_, ok = r.take(8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16: type byte + data
		_, ok = r.take(1 + 1<<(c-0xd4))
	case 0xc4, 0xc5, 0xc6: // bin 8/16/32
		if n, ok = r.uint(1 << (c - 0xc4)); ok {
			_, ok = r.take(n)
		}
	case 0xd9, 0xda, 0xdb: // str 8/16/32
		if n, ok = r.uint(1 << (c - 0xd9)); ok {
			_, ok = r.take(n)
		}
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32: length, type byte, data
		if n, ok = r.uint(1 << (c - 0xc7)); ok {
			_, ok = r.take(n + 1)
		}
	case 0xdc, 0xdd:
		if n, ok = r.uint(2 << (c - 0xdc)); ok {
			ok = r.skipN(n, depth)
		}
	case 0xde, 0xdf:
		if n, ok = r.uint(2 << (c - 0xde)); ok {
			ok = r.skipN(2*n, depth)
		}
	default:
		return false
	}
	return ok
}

func (r *mpReader) skipN(n uint64, depth int) bool {
	if n > uint64(len(r.b)-r.i) {
		return false
	}
	for range n {
		if !r.skip(depth - 1) {
			return false
		}
	}
	return true
}

// MMItem is a multimodal item of a prompt as vLLM places it: its
// identifier (vLLM's mm_feature.identifier: the item's hash, or the
// request's multi_modal_uuids entry) and the token positions of its
// placeholder, Offset to Offset+Length-1.
type MMItem struct {
	Identifier string
	Offset     int
	Length     int
}

// keyDigest sets d to the extra-key parts of the request block of tokens
// [start, end): vLLM's generate_block_hash_extra_keys for a request with
// adapter lora, items mm (sorted by Offset) and salt.
func keyDigest(d *extrasDigest, start, end int, lora, salt string, mm []MMItem) {
	d.reset()
	if lora != "" {
		d.str('L', lora)
	}
	for _, it := range mm {
		if it.Offset >= end {
			break
		}
		if it.Offset+it.Length > start {
			d.mmString(it.Identifier, int64(it.Offset-start))
		}
	}
	if start == 0 && salt != "" {
		d.str('S', salt)
	}
}
