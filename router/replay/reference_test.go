package replay

import (
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

// kvReference feeds records to a kvRef, as a replay does.
func kvReference(records []trace.Record, groupTokens, engineBlock int, capacity int64) report.KVReference {
	ref := newKVRef(groupTokens, engineBlock, capacity)
	for i := range records {
		ref.add(&records[i])
	}
	return ref.result()
}

// TestKVReferenceByHand walks a 4-block LRU (2 engine blocks of 16 tokens
// per 32-token trace block) through whole and partial evictions; every
// number is worked out in the comments.
func TestKVReferenceByHand(t *testing.T) {
	a := []uint64{1, 2}
	recs := []trace.Record{
		{InputLength: 64, HashIDs: a},           // miss; cache A1 A2 (4 blocks)
		{InputLength: 64, HashIDs: a},           // 4 cached, capped at ⌊63/16⌋ = 3: 48 tokens
		{InputLength: 40, HashIDs: []uint64{3}}, // miss; B (2 blocks) evicts A2 whole
		{InputLength: 64, HashIDs: a},           // A1 only: 2 blocks, 32 tokens; A2 back evicts B
		{InputLength: 16, HashIDs: []uint64{4}}, // capped at ⌊15/16⌋ = 0; C (1 block) takes one of A2's
		{InputLength: 64, HashIDs: a},           // A1 (2) + A2 (1 left) = 3 blocks: 48 tokens
		{InputLength: 100},                      // no hashes: prompt tokens only
	}
	got := kvReference(recs, 32, 16, 4)
	// prompt 64+64+40+64+16+64+100 = 412; hits 48+32+48 = 128; the
	// ceiling serves 48 at each repeat of A: 144.
	want := report.KVReference{HitRatio: round4(128.0 / 412), CeilingRatio: round4(144.0 / 412)}
	if got != want {
		t.Fatalf("kvReference = %+v, want %+v", got, want)
	}
	if got := kvReference(nil, 32, 16, 4); got != (report.KVReference{}) {
		t.Errorf("empty trace: %+v", got)
	}
}

// A cache large enough for everything is the ceiling.
func TestKVReferenceUnboundedEqualsCeiling(t *testing.T) {
	recs := []trace.Record{
		{InputLength: 1000, HashIDs: []uint64{1, 2}},
		{InputLength: 1500, HashIDs: []uint64{1, 2, 3}},
		{InputLength: 600, HashIDs: []uint64{1, 9}},
	}
	got := kvReference(recs, 512, 16, 1<<40)
	if got.HitRatio != got.CeilingRatio || got.HitRatio == 0 {
		t.Fatalf("%+v: want equal, non-zero", got)
	}
	// Request 2 finds request 1's 1000 tokens: 512/16 + ⌊488/16⌋ = 62 blocks
	// (992 tokens, under its cap of ⌊1499/16⌋); request 3 finds block 1's
	// 32 blocks (512 tokens). 1504 of 3100.
	if want := round4(1504.0 / 3100); got.HitRatio != want {
		t.Errorf("hit ratio %v, want %v", got.HitRatio, want)
	}
}

// TestGroupSetMatchesMap raises many groups, some many times, some with
// counts kept out of line (>= groupBig), through several growths of every
// table, and checks every count against a plain map.
func TestGroupSetMatchesMap(t *testing.T) {
	s := newGroupSet()
	want := make(map[uint64]int32)
	x := uint64(1)
	for i := range 100_000 {
		x = x*6364136223846793005 + 1442695040888963407
		h := x >> (i % 3 * 20) // some small hashes too
		if i%7 == 0 {
			h = uint64(i % 1000) // the same groups again
		}
		b := int32(x>>40) % 40
		if i%1000 == 0 {
			b = groupBig + int32(i%3) - 1 // groupBig-1, groupBig, groupBig+1
		}
		s.raise(h, b)
		if b > 0 {
			want[h] = max(want[h], b)
		}
	}
	for h, c := range want {
		if got := s.get(h); got != c {
			t.Fatalf("get(%#x) = %d, want %d", h, got, c)
		}
	}
	var n int
	for i := range s.shards {
		n += s.shards[i].n
	}
	if n != len(want) || len(s.big) == 0 {
		t.Errorf("%d groups in the tables (%d out of line), want %d and some out of line", n, len(s.big), len(want))
	}
	for _, h := range []uint64{2, 1 << 63, 12345678901} {
		if _, ok := want[h]; !ok && s.get(h) != 0 {
			t.Errorf("get(%#x) = %d for a group never raised", h, s.get(h))
		}
	}
}

// BenchmarkKVReference feeds the conversation trace (12,031 requests)
// to the KV reference with 512-token groups of 16-token engine blocks,
// in the LRU capacity of 8 default simulated workers (220,000 blocks) and
// of one (27,500 blocks, which evicts more).
func BenchmarkKVReference(b *testing.B) {
	recs := readTrace(b, "mooncake_conversation_trace.jsonl")
	for _, workers := range []int64{8, 1} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for b.Loop() {
				kvReference(recs, 512, 16, workers*27_500)
			}
		})
	}
}
