package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// MaxPayloadBytes is the largest payload a Decoder accepts by default
// (16 MiB): vLLM publishes one batch per engine step, a few KiB to a few
// hundred KiB (a long prompt's token ids); a 16 MiB batch is ~2 million
// token ids.
const MaxPayloadBytes = 16 << 20

// maxDepth bounds the nesting of values the decoder skips or keeps raw
// (extra keys, unknown fields), so a hostile payload cannot recurse deeply.
const maxDepth = 32

// Decoding errors.
var (
	// ErrTooLarge: a payload over the decoder's size limit.
	ErrTooLarge = errors.New("kv events: payload too large")
	// ErrMalformed: a payload that is not an event batch.
	ErrMalformed = errors.New("kv events: malformed payload")
)

// Decoder decodes payloads into a reused Batch without allocating once
// the Batch's slices have grown to the largest batch seen. Work and memory
// are linear in the payload's size: every count is checked against the
// bytes left before anything is sized by it, and nesting is bounded.
// Not safe for concurrent use.
type Decoder struct {
	// MaxPayload is the largest payload accepted, in bytes; 0 means
	// MaxPayloadBytes.
	MaxPayload int

	payload []byte
	r       bytes.Reader
	d       *msgpack.Decoder
}

// Decode decodes payload into b, reusing b's slices. Strings and extra
// keys in b point into payload: keep payload unchanged while b is used.
// Events of a type it does not know decode with Kind 0 (their fields are
// skipped); fields it does not know are skipped. Errors wrap ErrTooLarge
// or ErrMalformed and say what and where.
func (x *Decoder) Decode(payload []byte, b *Batch) error {
	limit := x.MaxPayload
	if limit <= 0 {
		limit = MaxPayloadBytes
	}
	if len(payload) > limit {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), limit)
	}
	x.payload = payload
	x.r.Reset(payload)
	if x.d == nil {
		x.d = msgpack.NewDecoder(&x.r)
	} else {
		x.d.ResetReader(&x.r)
	}
	b.TS, b.DataParallelRank, b.HasDataParallelRank = 0, 0, false
	b.Events = b.Events[:0]
	if err := x.batch(b); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if x.r.Len() != 0 {
		return fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, x.r.Len())
	}
	return nil
}

func (x *Decoder) pos() int { return len(x.payload) - x.r.Len() }

func isArray(c byte) bool {
	return c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return c >= msgpcode.FixedMapLow && c <= msgpcode.FixedMapHigh || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isBytes(c byte) bool {
	return c >= msgpcode.FixedStrLow && c <= msgpcode.FixedStrHigh ||
		c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32 ||
		c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

func (x *Decoder) peek() (byte, error) {
	c, err := x.d.PeekCode()
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return c, err
}

// arrayLen reads an array header (-1 for nil) whose n elements must fit in
// the bytes left (each takes at least one).
func (x *Decoder) arrayLen() (int, error) {
	n, err := x.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > x.r.Len() {
		return 0, fmt.Errorf("array of %d elements in %d bytes", n, x.r.Len())
	}
	return n, nil
}

func (x *Decoder) mapLen() (int, error) {
	n, err := x.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > x.r.Len()/2 {
		return 0, fmt.Errorf("map of %d entries in %d bytes", n, x.r.Len())
	}
	return n, nil
}

// str reads a str or bin value as a slice of the payload; nil for nil.
func (x *Decoder) str() ([]byte, error) {
	n, err := x.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > x.r.Len() {
		return nil, fmt.Errorf("string of %d bytes in %d", n, x.r.Len())
	}
	p := x.pos()
	_, _ = x.r.Seek(int64(n), io.SeekCurrent)
	return x.payload[p : p+n : p+n], nil
}

// skip skips one value, nesting at most maxDepth deep.
func (x *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested over %d deep", maxDepth)
	}
	c, err := x.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := x.arrayLen()
		for i := 0; i < n && err == nil; i++ {
			err = x.skip(depth + 1)
		}
		return err
	case isMap(c):
		n, err := x.mapLen()
		for i := 0; i < 2*n && err == nil; i++ {
			err = x.skip(depth + 1)
		}
		return err
	case isBytes(c):
		_, err := x.str()
		return err
	}
	return x.d.Skip() // a scalar or an extension: no nesting
}

func (x *Decoder) batch(b *Batch) error {
	c, err := x.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := x.mapLen()
		if err != nil {
			return err
		}
		for range n {
			k, err := x.str()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch string(k) {
			case "ts":
				b.TS, err = x.d.DecodeFloat64()
			case "events":
				err = x.events(b)
			case "data_parallel_rank":
				b.DataParallelRank, b.HasDataParallelRank, err = x.optInt()
			default:
				err = x.skip(1)
			}
			if err != nil {
				return fmt.Errorf("batch %s: %w", keyText(k), err)
			}
		}
		return nil
	}
	n, err := x.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch of %d fields, want [ts, events, data_parallel_rank]", n)
	}
	if b.TS, err = x.d.DecodeFloat64(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := x.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if b.DataParallelRank, b.HasDataParallelRank, err = x.optInt(); err != nil {
			return fmt.Errorf("batch data_parallel_rank: %w", err)
		}
	}
	for range n - 3 {
		if err := x.skip(1); err != nil {
			return err
		}
	}
	return nil
}

func (x *Decoder) events(b *Batch) error {
	n, err := x.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range max(n, 0) {
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:i+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		ev := &b.Events[i]
		*ev = Event{BlockHashes: ev.BlockHashes[:0], TokenIDs: ev.TokenIDs[:0], extra: ev.extra[:0], raw: ev.raw[:0]}
		if err := x.event(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// The event fields, in BlockStored's declaration order.
type fieldID uint8

const (
	fUnknown fieldID = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fLocality
	fOwnership
	fSessionID
	fOrigin
)

// The positional (array layout) order of the fields: vLLM's declaration
// order. locality and ownership follow kv_cache_spec_sliding_window in
// vLLM main (PR 52067) and in the snapshot branch (vMaroon/vllm@08ee3e54,
// PR 57789), which adds session_id after them; origin (PR 51699, open) is
// taken to come last. Only map-layout events are sent with these fields
// by the vLLM versions that have them (their events are maps).
var (
	storedOrder  = []fieldID{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow, fLocality, fOwnership, fSessionID, fOrigin}
	removedOrder = []fieldID{fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership}
)

func fieldByName(k []byte) fieldID {
	switch string(k) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "locality":
		return fLocality
	case "ownership":
		return fOwnership
	case "session_id":
		return fSessionID
	case "origin":
		return fOrigin
	}
	return fUnknown
}

func kindByName(k []byte) Kind {
	switch string(k) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

func (x *Decoder) event(ev *Event) error {
	c, err := x.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := x.mapLen()
		if err != nil {
			return err
		}
		typed := false
		for range n {
			k, err := x.str()
			if err != nil {
				return fmt.Errorf("key: %w", err)
			}
			if string(k) == "type" {
				name, err := x.str()
				if err != nil {
					return fmt.Errorf("type: %w", err)
				}
				ev.Kind, typed = kindByName(name), true
				continue
			}
			if err := x.field(ev, fieldByName(k)); err != nil {
				return fmt.Errorf("%s: %w", keyText(k), err)
			}
		}
		if !typed {
			return errors.New(`map without a "type" key`)
		}
		return nil
	}
	n, err := x.arrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("empty event array, want [type, fields...]")
	}
	name, err := x.str()
	if err != nil {
		return fmt.Errorf("type: %w", err)
	}
	ev.Kind = kindByName(name)
	var order []fieldID
	switch ev.Kind {
	case BlockStored:
		order = storedOrder
	case BlockRemoved:
		order = removedOrder
	}
	for i := range n - 1 {
		f := fUnknown
		if i < len(order) {
			f = order[i]
		}
		if err := x.field(ev, f); err != nil {
			return fmt.Errorf("%s field %d: %w", ev.Kind, i+1, err)
		}
	}
	return nil
}

func (x *Decoder) field(ev *Event, f fieldID) error {
	var err error
	switch f {
	case fBlockHashes:
		err = x.hashes(ev)
	case fParent:
		ev.ParentBlockHash, ev.HasParent, err = x.hash(true)
	case fTokenIDs:
		ev.TokenIDs, err = x.ints(ev.TokenIDs)
	case fBlockSize:
		ev.BlockSize, err = x.d.DecodeInt64()
	case fLoRAID:
		ev.LoRAID, ev.HasLoRAID, err = x.optInt()
	case fMedium:
		ev.Medium, err = x.str()
		ev.Medium = canonicalMedium(ev.Medium)
	case fLoRAName:
		ev.LoRAName, err = x.str()
	case fExtraKeys:
		var n int
		if n, err = x.arrayLen(); err != nil || n < 0 {
			return err
		}
		ev.ExtraKeys = ev.extra[:0]
		for range n {
			var c byte
			if c, err = x.peek(); err != nil {
				return err
			}
			if c == msgpcode.Nil {
				_ = x.d.DecodeNil()
				ev.ExtraKeys = append(ev.ExtraKeys, nil)
				continue
			}
			p := x.pos()
			if err = x.skip(1); err != nil {
				return err
			}
			ev.ExtraKeys = append(ev.ExtraKeys, x.payload[p:x.pos():x.pos()])
		}
		ev.extra = ev.ExtraKeys
	case fGroupIdx:
		ev.GroupIdx, ev.HasGroupIdx, err = x.optInt()
	case fSpecKind:
		ev.SpecKind, err = x.str()
	case fSlidingWindow:
		ev.SlidingWindow, ev.HasSlidingWindow, err = x.optInt()
	case fLocality:
		ev.Locality, err = x.str()
	case fOwnership:
		ev.Ownership, err = x.str()
	case fSessionID:
		ev.SessionID, err = x.str()
	case fOrigin:
		ev.Origin, err = x.str()
	default:
		err = x.skip(1)
	}
	return err
}

// canonicalMedium returns the known tier m names in any case as its
// canonical upper-case name (MediumGPU, MediumCPU, MediumStorage), else m.
func canonicalMedium(m []byte) []byte {
	switch {
	case m == nil:
		return nil
	case bytes.EqualFold(m, mediumGPU):
		return mediumGPU
	case bytes.EqualFold(m, mediumCPU):
		return mediumCPU
	case bytes.EqualFold(m, mediumStorage):
		return mediumStorage
	}
	return m
}

// ints appends an array of integers, read straight from the payload (the
// hot path: a stored block carries block_size token ids, each a few
// bytes, where the msgpack.Decoder's per-value reads dominate).
func (x *Decoder) ints(dst []int64) ([]int64, error) {
	n, err := x.arrayLen()
	if err != nil {
		return dst, err
	}
	p := x.payload
	i := x.pos()
	for range n {
		if i >= len(p) {
			return dst, io.ErrUnexpectedEOF
		}
		c := p[i]
		var v int64
		var w int // bytes after the code
		switch {
		case c <= 0x7f || c >= 0xe0: // positive or negative fixint
			v = int64(int8(c))
		case c == msgpcode.Uint8:
			w = 1
		case c == msgpcode.Uint16, c == msgpcode.Int16:
			w = 2
		case c == msgpcode.Uint32, c == msgpcode.Int32:
			w = 4
		case c == msgpcode.Uint64, c == msgpcode.Int64:
			w = 8
		case c == msgpcode.Int8:
			w = 1
		default:
			return dst, fmt.Errorf("integer expected, found code %#x", c)
		}
		if w > 0 {
			if i+1+w > len(p) {
				return dst, io.ErrUnexpectedEOF
			}
			b := p[i+1 : i+1+w]
			switch c {
			case msgpcode.Uint8:
				v = int64(b[0])
			case msgpcode.Int8:
				v = int64(int8(b[0]))
			case msgpcode.Uint16:
				v = int64(binary.BigEndian.Uint16(b))
			case msgpcode.Int16:
				v = int64(int16(binary.BigEndian.Uint16(b)))
			case msgpcode.Uint32:
				v = int64(binary.BigEndian.Uint32(b))
			case msgpcode.Int32:
				v = int64(int32(binary.BigEndian.Uint32(b)))
			default:
				v = int64(binary.BigEndian.Uint64(b))
			}
		}
		i += 1 + w
		dst = append(dst, v)
	}
	_, _ = x.r.Seek(int64(i), io.SeekStart)
	return dst, nil
}

func (x *Decoder) optInt() (int64, bool, error) {
	c, err := x.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, x.d.DecodeNil()
	}
	v, err := x.d.DecodeInt64()
	return v, err == nil, err
}

// hash reads one block hash (see the package doc); nil only when nullable.
func (x *Decoder) hash(nullable bool) (uint64, bool, error) {
	h, _, ok, err := x.rawHash(nullable)
	return h, ok, err
}

// rawHash reads one block hash: its fold and how it came (the bytes of a
// bytes hash point into the payload); nil only when nullable.
func (x *Decoder) rawHash(nullable bool) (uint64, RawHash, bool, error) {
	c, err := x.peek()
	if err != nil {
		return 0, RawHash{}, false, err
	}
	switch {
	case c == msgpcode.Nil:
		if !nullable {
			return 0, RawHash{}, false, errors.New("nil block hash")
		}
		return 0, RawHash{}, false, x.d.DecodeNil()
	case isBytes(c):
		b, err := x.str()
		if err != nil {
			return 0, RawHash{}, false, err
		}
		return FoldHash(b), RawHash{Form: HashBytes, Bytes: b}, true, nil
	case isSigned(c):
		v, err := x.d.DecodeInt64()
		if err == nil && v < 0 {
			return uint64(v), RawHash{Form: HashNegative}, true, nil
		}
		return uint64(v), RawHash{}, err == nil, err
	}
	h, err := x.d.DecodeUint64()
	return h, RawHash{}, err == nil, err
}

// isSigned reports whether c starts a msgpack int that may be negative (a
// negative fixint or a signed int): a uint or positive fixint cannot be.
func isSigned(c byte) bool {
	return c >= msgpcode.NegFixedNumLow || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64
}

// hashes reads ev's block hashes, and their raw forms (ev.RawHashes)
// when one is not a non-negative int.
func (x *Decoder) hashes(ev *Event) error {
	n, err := x.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		h, raw, _, err := x.rawHash(false)
		if err != nil {
			return err
		}
		if raw.Form != HashUint && ev.RawHashes == nil {
			// The first hash that is not a plain int: the ones before it
			// were.
			ev.RawHashes = ev.raw[:0]
			if ev.RawHashes == nil {
				ev.RawHashes = make([]RawHash, 0, n)
			}
			for range ev.BlockHashes {
				ev.RawHashes = append(ev.RawHashes, RawHash{})
			}
		}
		ev.BlockHashes = append(ev.BlockHashes, h)
		if ev.RawHashes != nil {
			ev.RawHashes = append(ev.RawHashes, raw)
		}
	}
	if ev.RawHashes != nil {
		ev.raw = ev.RawHashes
	}
	return nil
}

// FoldHash folds a bytes block hash to 64 bits: its last 8 bytes read
// big-endian (fewer bytes are zero-extended on the left).
func FoldHash(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var h uint64
	for _, c := range b {
		h = h<<8 | uint64(c)
	}
	return h
}

// maxKeyText bounds a map key of the payload quoted in an error, bytes.
const maxKeyText = 64

// keyText quotes k, a map key from the payload, for an error: at most
// maxKeyText bytes of it, control bytes escaped (untrusted.Bytes), in
// double quotes.
func keyText(k []byte) string {
	return `"` + untrusted.Bytes(k, maxKeyText) + `"`
}
