package migrate

import (
	"fmt"
	"testing"
)

// benchStream is a vLLM chat stream of n tokens with return_token_ids,
// as the engine sends it: one event per token.
func benchStream(n int) [][]byte {
	evs := [][]byte{[]byte(chatEvents[0])}
	for i := range n {
		evs = append(evs, fmt.Appendf(nil, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null,"token_ids":[%d]}]}`+"\n\n", i%1000, 1000+i))
	}
	return append(evs, []byte("data: [DONE]\n\n"))
}

// BenchmarkStreamFeed times what a streamed chat answer costs the router
// per event with migration on: Feed reading one engine event (one token),
// keeping its text and id, and writing the client's copy without the ids
// the router asked for. The timed loop is a whole 1,000-token answer;
// ns/op and B/op are per answer, and the kept-B/answer metric is what the
// router holds for the answer at its end (what a migratable request
// costs in memory besides the Stream itself).
func BenchmarkStreamFeed(b *testing.B) {
	evs := benchStream(1000)
	var bytes int64
	for _, e := range evs {
		bytes += int64(len(e))
	}
	b.SetBytes(bytes)
	b.ReportAllocs()
	var out []byte
	var kept int64
	for b.Loop() {
		s := NewStream(Chat, DefaultPolicy(), nil, true, false)
		for _, e := range evs {
			out, _ = s.Feed(e, out[:0])
		}
		kept = s.held
		s.Close()
	}
	b.ReportMetric(float64(kept), "kept-B/answer")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(evs)), "ns/event")
}
