package tokenizer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// conversation returns the requests of a chat of turns turns: each is the
// whole history (a 2 KB system prompt, then per turn a ~200-byte user
// message and a ~400-byte answer) plus the new user message.
func conversation(turns int) [][]prefix.ChatMessage {
	words := strings.Fields("hello world the system user assistant answer question token cache prefix router engine block")
	text := func(seed, n int) string {
		var b strings.Builder
		for i := 0; b.Len() < n; i++ {
			b.WriteString(words[(seed*7+i*i+i)%len(words)])
			b.WriteByte(' ')
		}
		return b.String()
	}
	history := []prefix.ChatMessage{{Role: "system", Content: text(0, 2000)}}
	var reqs [][]prefix.ChatMessage
	for t := 1; t <= turns; t++ {
		history = append(history, prefix.ChatMessage{Role: "user", Content: text(2*t, 200)})
		reqs = append(reqs, append([]prefix.ChatMessage(nil), history...))
		history = append(history, prefix.ChatMessage{Role: "assistant", Content: text(2*t+1, 400)})
	}
	return reqs
}

// BenchmarkEngineConversation measures Engine.EncodeChat over a 20-turn
// conversation against an httptest engine whose /tokenize renders ChatML
// and tokenizes with testdata/bytebpe-bos.json (File) on loopback. One op
// is the whole conversation with a fresh Engine (empty prefix cache): 20
// requests, each the history so far. The timed loop holds the router's
// side (JSON encoding, the cache lookups, the HTTP round trips) and the
// fake engine's rendering and tokenizing. Reported per request: engine
// calls, token ids the calls returned, and ns. min-coverage=1 is the
// cache off for growing prompts (only exact repeats would hit).
func BenchmarkEngineConversation(b *testing.B) {
	reqs := conversation(20)
	fe := newFakeEngine(b, chatmlFile(b))
	for _, cov := range []float64{DefaultMinCoverage, 1} {
		b.Run(fmt.Sprintf("min-coverage=%g", cov), func(b *testing.B) {
			ctx := context.Background()
			var calls, tokens int64
			b.ReportAllocs()
			for b.Loop() {
				e, err := NewEngine("m", fe.url, EngineOptions{MinCoverage: cov})
				if err != nil {
					b.Fatal(err)
				}
				for _, msgs := range reqs {
					if _, err := e.EncodeChat(ctx, msgs); err != nil {
						b.Fatal(err)
					}
				}
				s := e.Stats()
				calls += s.Calls
				tokens += s.Tokens
			}
			n := float64(b.N * len(reqs))
			b.ReportMetric(float64(calls)/n, "calls/req")
			b.ReportMetric(float64(tokens)/n, "tokens/req")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/req")
		})
	}
}

// BenchmarkFileConversation is the same conversation tokenized in
// process by File (ChatML template, testdata/bytebpe-bos.json): every
// request renders and tokenizes its whole history.
func BenchmarkFileConversation(b *testing.B) {
	reqs := conversation(20)
	f := chatmlFile(b)
	ctx := context.Background()
	var tokens int64
	b.ReportAllocs()
	for b.Loop() {
		for _, msgs := range reqs {
			ids, err := f.EncodeChat(ctx, msgs)
			if err != nil {
				b.Fatal(err)
			}
			tokens += int64(len(ids))
		}
	}
	n := float64(b.N * len(reqs))
	b.ReportMetric(float64(tokens)/n, "tokens/req")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/req")
}

// BenchmarkFileLongRun encodes a run of letters without whitespace of
// each size: linear in its size (ns/byte flat), as maxRunBytes makes it.
func BenchmarkFileLongRun(b *testing.B) {
	f := loadFile(b, "bytebpe.json", nil)
	for _, n := range []int{4 << 10, 16 << 10, 64 << 10} {
		text := strings.Repeat("hello", n/5)
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			for b.Loop() {
				if _, err := f.Encode(context.Background(), text); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(text)), "ns/byte")
		})
	}
}
