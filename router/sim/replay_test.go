package sim

import (
	"path/filepath"
	"testing"

	"github.com/switchyard-router/switchyard/router/trace"
)

const traceDir = "../../testdata/traces"

// chain folds Mooncake hash ids into chained prefix hashes with a
// splitmix64 finaliser over (prev, id), so hash k identifies ids[0..k].
func chain(dst, ids []uint64) []uint64 {
	prev := uint64(0x9e3779b97f4a7c15)
	for _, id := range ids {
		z := prev ^ (id + 0x9e3779b97f4a7c15 + prev<<6 + prev>>2)
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		prev = z ^ z>>31
		dst = append(dst, prev)
	}
	return dst
}

func readTrace(tb testing.TB, name string) []trace.Record {
	tb.Helper()
	recs, err := trace.ReadFile(filepath.Join(traceDir, name))
	if err != nil {
		tb.Fatal(err)
	}
	return recs
}

// replay routes recs round-robin over a fresh cluster of n workers, in the
// driver pattern of the Cluster doc, and returns every event.
func replay(tb testing.TB, recs []trace.Record, n int, cfg Config, events []Event) ([]Event, *Cluster) {
	c, err := NewCluster(n, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	total := 0
	for i := range recs {
		total += len(recs[i].HashIDs)
	}
	hashes := make([]uint64, 0, total)
	reqs := make([]Request, len(recs))
	for i, r := range recs {
		off := len(hashes)
		hashes = chain(hashes, r.HashIDs)
		reqs[i] = Request{ID: i, InputLength: r.InputLength, OutputLength: r.OutputLength,
			PrefixHashes: hashes[off:len(hashes):len(hashes)], PrefixBlockTokens: trace.MooncakeBlockTokens}
	}
	for i := range reqs {
		t := recs[i].Arrival
		events = c.AdvanceTo(t, events)
		if err := c.Submit(t, i%n, &reqs[i]); err != nil {
			tb.Fatal(err)
		}
	}
	return c.Drain(events), c
}

// BenchmarkClusterConversationTrace replays the full Mooncake conversation
// trace (12,031 requests) on 8 default workers, round-robin, including the
// chained-hash computation a router would do. The target is >= 20,000
// requests per wall second for simulator plus router.
func BenchmarkClusterConversationTrace(b *testing.B) {
	recs := readTrace(b, "mooncake_conversation_trace.jsonl")
	events := make([]Event, 0, 2*len(recs))
	var c *Cluster
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		events, c = replay(b, recs, 8, DefaultConfig(), events[:0])
		n++
	}
	if len(events) != 2*len(recs) {
		b.Fatalf("%d events, want %d", len(events), 2*len(recs))
	}
	b.ReportMetric(float64(n*len(recs))/b.Elapsed().Seconds(), "requests/s")
	st := c.Stats()
	b.ReportMetric(float64(st.Steps), "steps")
	b.ReportMetric(float64(st.CacheHitTokens)/float64(st.PrefillTokens+st.CacheHitTokens), "hit-frac")
}
