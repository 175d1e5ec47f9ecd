package kvevents

import (
	"bytes"
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
		if diff := cmp.Diff(want, &got, batchOpts); diff != "" {
			t.Fatalf("encoding %d hash bytes %v (-want +got):\n%s", enc.Encoding, enc.HashBytes, diff)
		}
	}
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
		{Kind: BlockStored, BlockHashes: []uint64{0x0102030405060708, ^uint64(0)}, TokenIDs: []int64{1, 2}, BlockSize: 1},
		{Kind: BlockRemoved, BlockHashes: []uint64{0x0102}},
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
			if diff := cmp.Diff(&got, &again, batchOpts); diff != "" {
				t.Fatalf("round trip (-first +second):\n%s", diff)
			}
		}
	})
}
