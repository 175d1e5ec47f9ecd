package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects a wire layout (see the package doc).
type Encoding uint8

// The encodings.
const (
	// EncodingArray is vLLM's layout before PR 42892: the batch and every
	// event are positional arrays, an event's first element its type name.
	EncodingArray Encoding = iota
	// EncodingMap is the layout after PR 42892 as released engines send
	// it: events are maps keyed by field name with a "type" key, fields at
	// their default left out; the batch stays a positional array.
	EncodingMap
	// EncodingMapEnvelope is EncodingMap with the batch a map as well
	// (keys ts, events, data_parallel_rank), as the EventBatch class
	// without array_like declares it.
	EncodingMapEnvelope
	// EncodingSGLang is SGLang's layout (sgl-project/sglang
	// python/sglang/srt/disaggregation/kv_events.py at 612d5790): batch
	// and events positional arrays, BlockStored [type, block_hashes,
	// parent_block_hash, token_ids, block_size, lora_id], BlockRemoved
	// [type, block_hashes], hashes signed 64-bit integers (SGLang's
	// hash_str_to_int64; a uint64 is written as its two's complement).
	// Fields SGLang does not have (medium, lora_name, extra_keys, …) are
	// left out.
	EncodingSGLang
)

// Encoder encodes batches. The zero value encodes EncodingArray with
// integer block hashes. Not safe for concurrent use.
type Encoder struct {
	// Encoding is the layout.
	Encoding Encoding
	// HashBytes encodes block hashes as 8-byte big-endian bytes (vLLM's
	// default ExternalBlockHash is bytes) instead of unsigned ints.
	HashBytes bool

	buf bytes.Buffer
	enc *msgpack.Encoder
	tmp [8]byte
}

// ErrEncode: a batch that cannot be encoded (an unknown kind, extra keys
// not one per block, extra keys that are not one msgpack value).
var ErrEncode = errors.New("kv events: cannot encode")

// Encode returns b's msgpack payload. The slice is reused by the next
// Encode; copy it to keep it.
func (e *Encoder) Encode(b *Batch) ([]byte, error) {
	if e.enc == nil {
		e.enc = msgpack.NewEncoder(&e.buf)
	}
	e.buf.Reset()
	if err := e.batch(b); err != nil {
		return nil, err
	}
	return e.buf.Bytes(), nil
}

func (e *Encoder) batch(b *Batch) error {
	m := e.enc
	if e.Encoding == EncodingMapEnvelope {
		n := 2
		if b.HasDataParallelRank {
			n++
		}
		_ = m.EncodeMapLen(n)
		_ = m.EncodeString("ts")
	} else if b.HasDataParallelRank {
		_ = m.EncodeArrayLen(3)
	} else {
		_ = m.EncodeArrayLen(2)
	}
	_ = m.EncodeFloat64(b.TS)
	if e.Encoding == EncodingMapEnvelope {
		_ = m.EncodeString("events")
	}
	_ = m.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		if err := e.event(&b.Events[i]); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.HasDataParallelRank {
		if e.Encoding == EncodingMapEnvelope {
			_ = m.EncodeString("data_parallel_rank")
		}
		_ = m.EncodeInt(b.DataParallelRank)
	}
	return nil
}

// field is one event field: its wire name, whether it has a default in
// vLLM's class (None) and is at it, and how to write its value.
type field struct {
	name      string
	atDefault bool // only for fields declared with a default
	write     func() error
}

func (e *Encoder) event(ev *Event) error {
	var fs []field
	switch ev.Kind {
	case BlockStored:
		if ev.ExtraKeys != nil && len(ev.ExtraKeys) != len(ev.BlockHashes) {
			return fmt.Errorf("%w: %d extra keys for %d blocks", ErrEncode, len(ev.ExtraKeys), len(ev.BlockHashes))
		}
		if e.Encoding == EncodingSGLang {
			fs = []field{
				{"block_hashes", false, func() error { return e.blockHashes(ev) }},
				{"parent_block_hash", false, func() error { return e.optHash(ev.ParentBlockHash, ev.HasParent) }},
				{"token_ids", false, func() error { return e.ints(ev.TokenIDs) }},
				{"block_size", false, func() error { return e.enc.EncodeInt(ev.BlockSize) }},
				{"lora_id", false, func() error { return e.optInt(ev.LoRAID, ev.HasLoRAID) }},
			}
			break
		}
		fs = []field{
			{"block_hashes", false, func() error { return e.blockHashes(ev) }},
			{"parent_block_hash", false, func() error { return e.optHash(ev.ParentBlockHash, ev.HasParent) }},
			{"token_ids", false, func() error { return e.ints(ev.TokenIDs) }},
			{"block_size", false, func() error { return e.enc.EncodeInt(ev.BlockSize) }},
			{"lora_id", false, func() error { return e.optInt(ev.LoRAID, ev.HasLoRAID) }},
			{"medium", false, func() error { return e.optStr(ev.Medium) }},
			{"lora_name", false, func() error { return e.optStr(ev.LoRAName) }},
			{"extra_keys", ev.ExtraKeys == nil, func() error { return e.extraKeys(ev.ExtraKeys) }},
			{"group_idx", !ev.HasGroupIdx, func() error { return e.optInt(ev.GroupIdx, ev.HasGroupIdx) }},
			{"kv_cache_spec_kind", ev.SpecKind == nil, func() error { return e.optStr(ev.SpecKind) }},
			{"kv_cache_spec_sliding_window", !ev.HasSlidingWindow, func() error { return e.optInt(ev.SlidingWindow, ev.HasSlidingWindow) }},
			{"locality", ev.Locality == nil, func() error { return e.optStr(ev.Locality) }},
			{"ownership", ev.Ownership == nil, func() error { return e.optStr(ev.Ownership) }},
			{"session_id", ev.SessionID == nil, func() error { return e.optStr(ev.SessionID) }},
			{"origin", ev.Origin == nil, func() error { return e.optStr(ev.Origin) }},
		}
	case BlockRemoved:
		if e.Encoding == EncodingSGLang {
			fs = []field{{"block_hashes", false, func() error { return e.blockHashes(ev) }}}
			break
		}
		fs = []field{
			{"block_hashes", false, func() error { return e.blockHashes(ev) }},
			{"medium", false, func() error { return e.optStr(ev.Medium) }},
			{"group_idx", !ev.HasGroupIdx, func() error { return e.optInt(ev.GroupIdx, ev.HasGroupIdx) }},
			{"locality", ev.Locality == nil, func() error { return e.optStr(ev.Locality) }},
			{"ownership", ev.Ownership == nil, func() error { return e.optStr(ev.Ownership) }},
		}
	case AllBlocksCleared:
	default:
		return fmt.Errorf("%w: unknown kind %v", ErrEncode, ev.Kind)
	}
	if e.Encoding == EncodingArray || e.Encoding == EncodingSGLang {
		// msgspec's array_like with omit_defaults drops trailing fields
		// at their default.
		n := len(fs)
		for n > 0 && fs[n-1].atDefault {
			n--
		}
		_ = e.enc.EncodeArrayLen(1 + n)
		_ = e.enc.EncodeString(ev.Kind.String())
		for _, f := range fs[:n] {
			if err := f.write(); err != nil {
				return err
			}
		}
		return nil
	}
	n := 1
	for _, f := range fs {
		if !f.atDefault {
			n++
		}
	}
	_ = e.enc.EncodeMapLen(n)
	_ = e.enc.EncodeString("type")
	_ = e.enc.EncodeString(ev.Kind.String())
	for _, f := range fs {
		if f.atDefault {
			continue
		}
		_ = e.enc.EncodeString(f.name)
		if err := f.write(); err != nil {
			return err
		}
	}
	return nil
}

func (e *Encoder) hash(h uint64) error {
	switch {
	case e.HashBytes:
		binary.BigEndian.PutUint64(e.tmp[:], h)
		return e.enc.EncodeBytes(e.tmp[:])
	case e.Encoding == EncodingSGLang:
		return e.enc.EncodeInt(int64(h))
	}
	return e.enc.EncodeUint(h)
}

// blockHashes writes ev's block hashes: as they came from an engine where
// ev.RawHashes says how, else by the Encoder's settings.
func (e *Encoder) blockHashes(ev *Event) error {
	if ev.RawHashes != nil && len(ev.RawHashes) != len(ev.BlockHashes) {
		return fmt.Errorf("%w: %d raw hashes for %d blocks", ErrEncode, len(ev.RawHashes), len(ev.BlockHashes))
	}
	_ = e.enc.EncodeArrayLen(len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		if ev.RawHashes == nil {
			_ = e.hash(h)
			continue
		}
		switch r := ev.RawHashes[i]; r.Form {
		case HashNegative:
			_ = e.enc.EncodeInt(int64(h))
		case HashBytes:
			_ = e.enc.EncodeBytes(r.Bytes)
		default:
			_ = e.enc.EncodeUint(h)
		}
	}
	return nil
}

func (e *Encoder) optHash(h uint64, ok bool) error {
	if !ok {
		return e.enc.EncodeNil()
	}
	return e.hash(h)
}

func (e *Encoder) ints(v []int64) error {
	_ = e.enc.EncodeArrayLen(len(v))
	for _, x := range v {
		_ = e.enc.EncodeInt(x)
	}
	return nil
}

func (e *Encoder) optInt(v int64, ok bool) error {
	if !ok {
		return e.enc.EncodeNil()
	}
	return e.enc.EncodeInt(v)
}

func (e *Encoder) optStr(s []byte) error {
	if s == nil {
		return e.enc.EncodeNil()
	}
	// msgspec writes a Python str as a msgpack str.
	return e.enc.EncodeString(string(s))
}

func (e *Encoder) extraKeys(keys [][]byte) error {
	_ = e.enc.EncodeArrayLen(len(keys))
	for i, k := range keys {
		if k == nil {
			_ = e.enc.EncodeNil()
			continue
		}
		if err := checkOneValue(k); err != nil {
			return fmt.Errorf("%w: extra keys of block %d: %w", ErrEncode, i, err)
		}
		e.buf.Write(k)
	}
	return nil
}

// checkOneValue reports whether raw is exactly one msgpack value.
func checkOneValue(raw []byte) error {
	r := bytes.NewReader(raw)
	d := msgpack.NewDecoder(r)
	if err := d.Skip(); err != nil {
		return fmt.Errorf("not a msgpack value: %w", err)
	}
	if r.Len() != 0 {
		return fmt.Errorf("%d bytes after one msgpack value", r.Len())
	}
	return nil
}

// Message returns the three-frame ZMQ message vLLM publishes: topic,
// sequence as 8 bytes big-endian, payload. The payload is not copied.
func Message(topic string, seq uint64, payload []byte) zmq4.Msg {
	return zmq4.NewMsgFrom([]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload)
}
