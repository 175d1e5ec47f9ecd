package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

var batchOpts = cmp.Options{cmpopts.IgnoreUnexported(Event{}), cmpopts.EquateEmpty(), cmpopts.EquateNaNs()}

func TestDecodeRoundTrip(t *testing.T) {
	for _, enc := range []Encoder{{Encoding: EncodingArray}, {Encoding: EncodingMap}, {Encoding: EncodingMapEnvelope}, {Encoding: EncodingMap, HashBytes: true}} {
		want := sampleBatch(t)
		p, err := enc.Encode(want)
		if err != nil {
			t.Fatal(err)
		}
		var got Batch
		var d Decoder
		if err := d.Decode(p, &got); err != nil {
			t.Fatalf("encoding %d: %v", enc.Encoding, err)
		}
		if enc.HashBytes {
			want = withBytesHashes(want)
		}
		if diff := cmp.Diff(want, &got, batchOpts); diff != "" {
			t.Fatalf("encoding %d hash bytes %v (-want +got):\n%s", enc.Encoding, enc.HashBytes, diff)
		}
	}
}

// withBytesHashes is b with each event's hashes sent as 8 bytes
// (Encoder.HashBytes), as its decoding says them.
func withBytesHashes(b *Batch) *Batch {
	for i := range b.Events {
		ev := &b.Events[i]
		if len(ev.BlockHashes) == 0 {
			continue
		}
		ev.RawHashes = nil
		for _, h := range ev.BlockHashes {
			ev.RawHashes = append(ev.RawHashes, RawHash{Form: HashBytes, Bytes: binary.BigEndian.AppendUint64(nil, h)})
		}
	}
	return b
}

// TestDecodeOlderAndForeignLayouts: what engines other than the encoder
// send: an old 5-field BlockStored and 1-field BlockRemoved, a 2-field
// batch, 32-byte (sha256) and signed hashes, fields and events of types
// this package does not know.
func TestDecodeOlderAndForeignLayouts(t *testing.T) {
	sha := bytes.Repeat([]byte{0xab}, 24)
	sha = append(sha, 1, 2, 3, 4, 5, 6, 7, 8)
	p := rawOf(t, []any{3.25, []any{
		[]any{"BlockStored", []any{sha, int64(-1)}, nil, []any{1, 2}, 1, nil},
		[]any{"BlockRemoved", []any{[]byte{1, 2}}},
		[]any{"Unheard", 1, []any{2}},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{5}, "new_field": map[string]any{"x": []any{1}}},
	}})
	var got Batch
	var d Decoder
	if err := d.Decode(p, &got); err != nil {
		t.Fatal(err)
	}
	want := &Batch{TS: 3.25, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0x0102030405060708, ^uint64(0)}, TokenIDs: []int64{1, 2}, BlockSize: 1,
			RawHashes: []RawHash{{Form: HashBytes, Bytes: sha}, {Form: HashNegative}}},
		{Kind: BlockRemoved, BlockHashes: []uint64{0x0102}, RawHashes: []RawHash{{Form: HashBytes, Bytes: []byte{1, 2}}}},
		{Kind: 0},
		{Kind: BlockRemoved, BlockHashes: []uint64{5}},
	}}
	if diff := cmp.Diff(want, &got, batchOpts); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestDecodeRejects(t *testing.T) {
	nested := bytes.Repeat([]byte{0x91}, 100) // [[[[…
	nested = append(nested, 0x01)
	cases := map[string]struct {
		p    []byte
		want error
		msg  string
	}{
		"not a batch":     {rawOf(t, "hello"), ErrMalformed, "decoding array length"},
		"short batch":     {rawOf(t, []any{1.0}), ErrMalformed, "batch of 1 fields"},
		"truncated":       {rawOf(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2}}}})[:8], ErrMalformed, "EOF"},
		"trailing bytes":  {append(rawOf(t, []any{1.0, []any{}}), 0x01), ErrMalformed, "1 bytes after the batch"},
		"count too large": {[]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "array of 4294967295 elements in 0 bytes"},
		"nil hash":        {rawOf(t, []any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}}), ErrMalformed, "nil block hash"},
		"untyped map":     {rawOf(t, []any{1.0, []any{map[string]any{"block_hashes": []any{}}}}), ErrMalformed, `without a "type"`},
	}
	// deep nesting: an unknown event whose one field nests 100 arrays.
	dn := rawOf(t, []any{1.0, []any{[]any{"Unheard", 0}}})
	cases["deep nesting"] = struct {
		p    []byte
		want error
		msg  string
	}{append(dn[:len(dn)-1], nested...), ErrMalformed, "nested over 32 deep"}
	for name, c := range cases {
		var d Decoder
		err := d.Decode(c.p, &Batch{})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %v, want %v containing %q", name, err, c.want, c.msg)
		}
	}
	d := Decoder{MaxPayload: 4}
	if err := d.Decode(rawOf(t, []any{1.0, []any{}}), &Batch{}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

func TestDecodeNoAllocs(t *testing.T) {
	for _, enc := range []Encoder{{Encoding: EncodingArray}, {Encoding: EncodingMapEnvelope, HashBytes: true}} {
		p, err := enc.Encode(sampleBatch(t))
		if err != nil {
			t.Fatal(err)
		}
		p = slices.Clone(p)
		var d Decoder
		var b Batch
		if err := d.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(100, func() { _ = d.Decode(p, &b) }); a != 0 {
			t.Errorf("encoding %d: %.1f allocations per decode, want 0", enc.Encoding, a)
		}
	}
}

// FuzzDecode: Decode never panics, and what it decodes re-encodes and
// decodes to the same batch.
func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoder{{Encoding: EncodingArray}, {Encoding: EncodingMap, HashBytes: true}, {Encoding: EncodingMapEnvelope}} {
		p, err := enc.Encode(sampleBatch(&testing.T{}))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(slices.Clone(p))
	}
	b, _ := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", []any{[]byte("abc")}, nil, []any{1}, 1, nil}}, nil})
	f.Add(b)
	f.Fuzz(func(t *testing.T, p []byte) {
		var d Decoder
		var got Batch
		if d.Decode(p, &got) != nil {
			return
		}
		got.Events = slices.DeleteFunc(got.Events, func(e Event) bool { return e.Kind == 0 })
		for _, enc := range []Encoder{{Encoding: EncodingArray}, {Encoding: EncodingMapEnvelope, HashBytes: true}} {
			q, err := enc.Encode(&got)
			if err != nil {
				if errors.Is(err, ErrEncode) { // extra keys not one per block: the engine's error, not ours
					return
				}
				t.Fatal(err)
			}
			var again Batch
			if err := d.Decode(slices.Clone(q), &again); err != nil {
				t.Fatalf("re-encoded batch does not decode: %v", err)
			}
			opts := batchOpts
			if enc.HashBytes {
				// Hashes sent as ints come back as bytes: their folds are
				// the same.
				opts = append(opts, cmpopts.IgnoreFields(Event{}, "RawHashes"))
			}
			if diff := cmp.Diff(&got, &again, opts); diff != "" {
				t.Fatalf("round trip (-first +second):\n%s", diff)
			}
		}
	})
}

// TestDecodeNewerFieldsAndMediumCase: the fields vLLM added after
// kv_cache_spec_sliding_window (locality and ownership, PR 52067;
// session_id, the snapshot branch vMaroon/vllm@08ee3e54 of PR 57789;
// origin, PR 51699) decode in both layouts, and a medium is read in any
// case ("gpu", as some offloading connectors send it, is the GPU tier).
// The map events are as msgspec writes vLLM's tagged structs with
// omit_defaults (fields at their default left out) inside the array
// envelope released engines send; the array events are positional.
func TestDecodeNewerFieldsAndMediumCase(t *testing.T) {
	stored := map[string]any{
		"type": "BlockStored", "block_hashes": []any{11, 12}, "parent_block_hash": nil,
		"token_ids": []any{1, 2, 3, 4}, "block_size": 2, "lora_id": nil, "medium": "gpu", "lora_name": nil,
		"locality": "LOCAL", "ownership": "tier-1", "session_id": "s-1", "origin": "REUSED",
	}
	removed := map[string]any{"type": "BlockRemoved", "block_hashes": []any{11}, "medium": "cpu", "locality": "REMOTE", "ownership": "tier-2"}
	positional := []any{"BlockStored", []any{13}, 12, []any{5, 6}, 2, nil, "Gpu", nil, nil, nil, nil, nil, "LOCAL", "tier-3", "s-2", "NEW"}
	positionalRemoved := []any{"BlockRemoved", []any{13}, "storage", 1, "REMOTE", "tier-4"}
	p := rawOf(t, []any{2.5, []any{stored, removed, positional, positionalRemoved}, 0})
	var got Batch
	var d Decoder
	if err := d.Decode(p, &got); err != nil {
		t.Fatal(err)
	}
	want := &Batch{TS: 2.5, DataParallelRank: 0, HasDataParallelRank: true, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{11, 12}, TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 2, Medium: []byte(MediumGPU),
			Locality: []byte("LOCAL"), Ownership: []byte("tier-1"), SessionID: []byte("s-1"), Origin: []byte("REUSED")},
		{Kind: BlockRemoved, BlockHashes: []uint64{11}, Medium: []byte(MediumCPU), Locality: []byte("REMOTE"), Ownership: []byte("tier-2")},
		{Kind: BlockStored, BlockHashes: []uint64{13}, ParentBlockHash: 12, HasParent: true, TokenIDs: []int64{5, 6}, BlockSize: 2,
			Medium: []byte(MediumGPU), Locality: []byte("LOCAL"), Ownership: []byte("tier-3"), SessionID: []byte("s-2"), Origin: []byte("NEW")},
		{Kind: BlockRemoved, BlockHashes: []uint64{13}, Medium: []byte(MediumStorage), GroupIdx: 1, HasGroupIdx: true,
			Locality: []byte("REMOTE"), Ownership: []byte("tier-4")},
	}}
	if diff := cmp.Diff(want, &got, batchOpts); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		m    []byte
		want bool
	}{{nil, true}, {[]byte("GPU"), true}, {[]byte("gPu"), true}, {[]byte("CPU"), false}, {[]byte("GPU0"), false}} {
		if IsGPU(c.m) != c.want {
			t.Errorf("IsGPU(%q) = %v", c.m, !c.want)
		}
	}
	// They survive the encoder (the cluster's relay re-encodes batches).
	for _, enc := range []Encoder{{Encoding: EncodingArray}, {Encoding: EncodingMap}} {
		q, err := enc.Encode(&got)
		if err != nil {
			t.Fatal(err)
		}
		var again Batch
		if err := d.Decode(slices.Clone(q), &again); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, &again, batchOpts); diff != "" {
			t.Fatalf("encoding %d round trip (-want +got):\n%s", enc.Encoding, diff)
		}
	}
}
