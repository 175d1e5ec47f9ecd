package cluster

import (
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestCodecRoundTrip(t *testing.T) {
	in := []Record{
		{Kind: KindReset},
		{Kind: KindBooked, ID: "req-1#0", At: 1_700_000_000_123_456_789, Worker: "vllm-0", Model: "llama", Role: shared.RoleDecode,
			PromptTokens: 4096, BlockSize: 16, BlockHashes: []uint64{1, 1 << 63, 42}, Rank: 3, HasRank: true},
		{Kind: KindBooked, ID: "", Worker: "w", Role: shared.RoleAggregated, BlockHashes: []uint64{}, HasRank: true},
		{Kind: KindFirstToken, ID: "req-1#0"},
		{Kind: KindReleased, ID: "req-1#0"},
	}
	msg := []byte{wireVersion}
	for i := range in {
		if n := len(appendRecord(nil, &in[i])); n > in[i].size() {
			t.Errorf("record %d encodes to %d bytes, over its size bound %d", i, n, in[i].size())
		}
		msg = appendRecord(msg, &in[i])
	}
	var out []Record
	if err := decode(msg, func(r *Record) {
		c := *r
		c.BlockHashes = slices.Clone(r.BlockHashes)
		out = append(out, c)
	}); err != nil {
		t.Fatal(err)
	}
	in[2].BlockHashes = nil // an empty list decodes as none
	if diff := cmp.Diff(in, out, cmp.Comparer(func(a, b []uint64) bool { return slices.Equal(a, b) })); diff != "" {
		t.Fatalf("round trip (-in +out):\n%s", diff)
	}
}

// TestCodecVersion1: a version 1 message (no rank) still decodes, its
// bookings without a rank.
func TestCodecVersion1(t *testing.T) {
	v2 := appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "x", Worker: "w", BlockHashes: []uint64{7}, Rank: 5})
	v1 := append([]byte{wireVersionV1}, v2[1:len(v2)-1]...) // without the trailing rank
	var got []Record
	if err := decode(v1, func(r *Record) { got = append(got, *r) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "x" || got[0].HasRank || got[0].Rank != 0 || !slices.Equal(got[0].BlockHashes, []uint64{7}) {
		t.Fatalf("version 1 booking decoded as %+v", got)
	}
}

func TestCodecBounds(t *testing.T) {
	long := make([]byte, maxMessage+1)
	long[0] = wireVersion
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"too long", long},
		{"empty", nil},
		{"version", []byte{3}},
		{"kind", []byte{wireVersion, 0}},
		{"truncated id", []byte{wireVersion, byte(KindReleased), 5, 'a'}},
		{"string over the bound", append([]byte{wireVersion, byte(KindReleased), 0x81, 0x04}, make([]byte, 513)...)},
		{"hashes over the bound", []byte{wireVersion, byte(KindBooked), 0, 0, 0, 0, 0, 0, 0, 0x81, 0x80, 0x04}},
		{"hashes past the end", []byte{wireVersion, byte(KindBooked), 0, 0, 0, 0, 0, 0, 0, 2, 1, 2, 3}},
		{"role", []byte{wireVersion, byte(KindBooked), 0, 0, 0, 0, 7, 0, 0, 0}},
	} {
		n := 0
		if err := decode(tc.msg, func(*Record) { n++ }); !errors.Is(err, errMalformed) || n != 0 {
			t.Errorf("%s: %v after %d records, want errMalformed and none", tc.name, err, n)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(appendRecord([]byte{wireVersion}, &Record{Kind: KindBooked, ID: "x", Worker: "w", BlockHashes: []uint64{7}}))
	f.Add([]byte{wireVersion, byte(KindReset)})
	f.Fuzz(func(t *testing.T, msg []byte) {
		_ = decode(msg, func(r *Record) {
			if len(r.ID) > maxString || len(r.Worker) > maxString || len(r.BlockHashes) > maxHashes {
				t.Fatalf("a record past the bounds: %+v", r)
			}
		})
	})
}
