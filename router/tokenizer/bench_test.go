package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// BenchmarkEngineConversation measures Engine over a 20-turn
// conversation against an httptest engine on loopback that tokenizes with
// testdata/bytebpe-bos.json (File, ChatML): form=chat sends the messages
// (EncodeChat), form=text the client's own ChatML rendering as a
// completions prompt (Encode); info=true serves /tokenizer_info, so text
// prompts are spliced at safe cuts. One op is the whole conversation
// with a fresh Engine (empty cache): 20 requests, each the history so
// far, then the 20 again (a client's retries, or another router replica's
// traffic): exact repeats. Reported per request: engine calls
// (calls/req, the learning's two probes included), exact-repeat hits
// (hits/req), splices (splices/req), the token ids the engine computed
// (engine-tokens/req: its tokenizing work; a whole call computes the
// whole prompt, a splice only the rest) against the prompt's
// (prompt-tokens/req), and ns/req (the router's side and the fake
// engine's Go tokenizer, which is slower than vLLM's Rust one).
func BenchmarkEngineConversation(b *testing.B) {
	reqs := conversation(20)
	f := chatmlFile(b)
	for _, form := range []string{"chat", "text"} {
		for _, info := range []bool{false, true} {
			if form == "chat" && info {
				continue // chat prompts are never spliced
			}
			b.Run(fmt.Sprintf("form=%s/info=%v", form, info), func(b *testing.B) {
				fe := newFakeEngine(b, f)
				fe.info = info
				ctx := context.Background()
				var s EngineStats
				var promptTokens int64
				b.ReportAllocs()
				for b.Loop() {
					e, err := NewEngine("m", fe.url, EngineOptions{})
					if err != nil {
						b.Fatal(err)
					}
					for range 2 {
						for _, msgs := range reqs {
							var ids []int64
							if form == "chat" {
								ids, err = e.EncodeChat(ctx, msgs, "")
							} else {
								ids, err = e.Encode(ctx, chatml(msgs))
							}
							if err != nil {
								b.Fatal(err)
							}
							promptTokens += int64(len(ids))
						}
					}
					st := e.Stats()
					s.Calls += st.Calls
					s.CacheHits += st.CacheHits
					s.Splices += st.Splices
					s.Tokens += st.Tokens
				}
				n := float64(b.N * 2 * len(reqs))
				b.ReportMetric(float64(s.Calls)/n, "calls/req")
				b.ReportMetric(float64(s.CacheHits)/n, "hits/req")
				b.ReportMetric(float64(s.Splices)/n, "splices/req")
				b.ReportMetric(float64(s.Tokens)/n, "engine-tokens/req")
				b.ReportMetric(float64(promptTokens)/n, "prompt-tokens/req")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/req")
			})
		}
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
			ids, err := f.EncodeChat(ctx, msgs, "")
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

// BenchmarkEngineCallOverhead is the router's side of one /tokenize call
// (the body's JSON, a loopback HTTP round trip, the answer's JSON) against
// an engine that answers a ready list of ids without tokenizing: what the
// engine source costs the router per call, apart from the engine's own
// tokenizer (Hugging Face's Rust tokenizers in vLLM and SGLang; not
// measured here). Compare with BenchmarkFileConversation's in-process
// tokenizer.json (ns per token).
func BenchmarkEngineCallOverhead(b *testing.B) {
	for _, tokens := range []int{1 << 10, 8 << 10} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			ids := make([]int64, tokens)
			for i := range ids {
				ids[i] = int64(100 + i%50000)
			}
			answer, _ := json.Marshal(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 1 << 17})
			s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.URL.Path != "/tokenize" {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write(answer)
			}))
			b.Cleanup(s.Close)
			prompt := strings.Repeat("word ", tokens) // about a token per 5 bytes
			e, err := NewEngine("m", func(context.Context) (string, error) { return s.URL, nil }, EngineOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.call(ctx, nil, map[string]any{"model": "m", "prompt": prompt, "add_special_tokens": true}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(tokens), "ns/token")
		})
	}
}
