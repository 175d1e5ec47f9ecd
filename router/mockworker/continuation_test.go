package mockworker

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/sim"
)

// answer is what a client assembles from one generation request: the
// text, the generated token ids (return_token_ids), the prompt's ids and
// the usage.
type answer struct {
	text      string
	ids       []int64
	promptIDs []int64
	usage     usage
	finish    string
}

// generate sends body to path (streamed or not, return_token_ids and the
// usage chunk on) and assembles the answer, checking the shapes vLLM
// gives return_token_ids: the prompt's ids at the top of a chat answer or
// its first chunk, in the (first) choice of a completions one, and the
// generated ids in each choice.
func generate(t *testing.T, url, path string, body map[string]any, stream bool) answer {
	t.Helper()
	chat := strings.Contains(path, "chat")
	body["return_token_ids"] = true
	body["stream"] = stream
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	resp, err := http.Post(url+path, "application/json", strings.NewReader(mustJSON(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b[:n])
	}
	type ch struct {
		Text    *string `json:"text"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason   *string  `json:"finish_reason"`
		TokenIDs       []int64  `json:"token_ids"`
		PromptTokenIDs *[]int64 `json:"prompt_token_ids"`
	}
	type msg struct {
		Choices        []ch     `json:"choices"`
		PromptTokenIDs *[]int64 `json:"prompt_token_ids"`
		Usage          *usage   `json:"usage"`
	}
	var a answer
	add := func(i int, m msg) {
		if m.Usage != nil {
			a.usage = *m.Usage
		}
		if len(m.Choices) == 0 {
			return
		}
		c := m.Choices[0]
		first := i == 0
		switch {
		case chat && m.PromptTokenIDs != nil:
			if !first {
				t.Errorf("chunk %d repeats prompt_token_ids", i)
			}
			a.promptIDs = *m.PromptTokenIDs
		case !chat && c.PromptTokenIDs != nil:
			if !first {
				t.Errorf("chunk %d repeats prompt_token_ids", i)
			}
			a.promptIDs = *c.PromptTokenIDs
		}
		if chat && c.PromptTokenIDs != nil || !chat && m.PromptTokenIDs != nil {
			t.Errorf("prompt_token_ids in the wrong place: %+v", m)
		}
		switch {
		case c.Text != nil:
			a.text += *c.Text
		case c.Message != nil:
			a.text += c.Message.Content
		case c.Delta != nil:
			a.text += c.Delta.Content
		}
		a.ids = append(a.ids, c.TokenIDs...)
		if stream && len(c.TokenIDs) != 1 {
			t.Errorf("chunk %d: token_ids %v, want the chunk's one token", i, c.TokenIDs)
		}
		if c.FinishReason != nil {
			a.finish = *c.FinishReason
		}
	}
	if stream {
		data, _ := sseEvents(t, resp.Body)
		if len(data) == 0 || data[len(data)-1] != "[DONE]" {
			t.Fatalf("stream does not end with [DONE]: %q", data)
		}
		for i, d := range data[:len(data)-1] {
			var m msg
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatalf("chunk %q: %v", d, err)
			}
			add(i, m)
		}
	} else {
		var m msg
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		add(0, m)
	}
	if a.promptIDs == nil {
		t.Errorf("%s: no prompt_token_ids", path)
	}
	return a
}

// TestContinuation: a request continued after k of its n tokens — chat
// continuing its final (assistant) message, completions with the text so
// far appended to a text prompt, completions with the generated ids
// appended to the prompt's ids — with max_tokens n-k generates exactly the
// rest of the uninterrupted answer, text and ids, streamed or not, with
// and without a tokenizer; its usage counts its own prompt.
func TestContinuation(t *testing.T) {
	const n = 11
	for _, tok := range []bool{false, true} {
		cfg := Config{Model: testModel}
		if tok {
			cfg.Tokenizer = testTokenizer(t)
		}
		_, url := startServer(t, cfg)
		for _, stream := range []bool{false, true} {
			name := map[bool]string{false: "no tokenizer", true: "tokenizer"}[tok] + map[bool]string{false: "/whole", true: "/streamed"}[stream]
			t.Run(name, func(t *testing.T) {
				msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me"}}
				// The prompt ends with a filler word: the answer starts
				// after it.
				const prompt = "once upon a time ipsum"
				ids := []any{5, 6, 7, 8}

				chat := generate(t, url, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": n}, stream)
				text := generate(t, url, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": n}, stream)
				byIDs := generate(t, url, "/v1/completions", map[string]any{"prompt": ids, "max_tokens": n}, stream)
				if chat.text != textFrom(0, n) || !slices.Equal(chat.ids, idsFrom(0, n)) || chat.finish != "length" {
					t.Fatalf("chat answer %q %v %q", chat.text, chat.ids, chat.finish)
				}
				if text.text != textFrom(2, n) || !slices.Equal(text.ids, idsFrom(2, n)) {
					t.Fatalf("completion of %q: %q %v, want it to start after ipsum", prompt, text.text, text.ids)
				}
				if byIDs.text != textFrom(0, n) || !slices.Equal(byIDs.promptIDs, []int64{5, 6, 7, 8}) || byIDs.usage.PromptTokens != 4 {
					t.Fatalf("completion of ids: %q prompt ids %v usage %+v", byIDs.text, byIDs.promptIDs, byIDs.usage)
				}
				for _, k := range []int{0, 1, 4, 8, 10} {
					so := textFrom(0, k)
					cmsgs := append(slices.Clone(msgs), map[string]any{"role": "assistant", "content": so})
					c := generate(t, url, "/v1/chat/completions", map[string]any{"messages": cmsgs, "max_tokens": n - k,
						"continue_final_message": true, "add_generation_prompt": false}, stream)
					if so+c.text != chat.text || !slices.Equal(append(slices.Clone(chat.ids[:k]), c.ids...), chat.ids) {
						t.Errorf("chat continued after %d: %q + %q, want %q", k, so, c.text, chat.text)
					}
					if c.usage.CompletionTokens != n-k {
						t.Errorf("chat continued after %d: usage %+v", k, c.usage)
					}
					if tok && k > 0 && c.usage.PromptTokens != len(c.promptIDs) {
						t.Errorf("chat continued after %d: prompt tokens %d, prompt ids %d", k, c.usage.PromptTokens, len(c.promptIDs))
					}

					tc := generate(t, url, "/v1/completions", map[string]any{"prompt": prompt + text.text[:len(textFrom(2, k))], "max_tokens": n - k}, stream)
					if textFrom(2, k)+tc.text != text.text || !slices.Equal(append(slices.Clone(text.ids[:k]), tc.ids...), text.ids) {
						t.Errorf("text continued after %d: %q, want the rest of %q", k, tc.text, text.text)
					}
					if tok && tc.usage.PromptTokens != text.usage.PromptTokens+k {
						t.Errorf("text continued after %d: %d prompt tokens, want %d + %d (generated words are one token each)",
							k, tc.usage.PromptTokens, text.usage.PromptTokens, k)
					}

					// The token-id continuation of each: the prompt's ids
					// as the engine reported them plus the generated ones.
					for i, orig := range []answer{byIDs, text} {
						if k == 0 && i == 1 && !tok {
							// Synthetic ids of a text prompt do not end
							// with the word it ends with: a continuation
							// after 0 tokens is the original request.
							continue
						}
						cont := append(slices.Clone(orig.promptIDs), orig.ids[:k]...)
						ic := generate(t, url, "/v1/completions", map[string]any{"prompt": cont, "max_tokens": n - k}, stream)
						if s0 := fillerIndex(orig.ids[0]); ic.text != textFrom(wordAt(s0, k), n-k) || !slices.Equal(ic.ids, orig.ids[k:]) {
							t.Errorf("ids continued after %d: %q %v, want the rest of %q %v", k, ic.text, ic.ids, orig.text, orig.ids)
						}
						if ic.usage.PromptTokens != orig.usage.PromptTokens+k || ic.usage.CompletionTokens != n-k {
							t.Errorf("ids continued after %d: usage %+v, want %d prompt tokens", k, ic.usage, orig.usage.PromptTokens+k)
						}
					}
				}
			})
		}
	}
}

// TestContinueFinalMessageErrors: vLLM's refusals.
func TestContinueFinalMessageErrors(t *testing.T) {
	_, url := startServer(t, Config{Model: testModel})
	for _, tt := range []struct {
		name  string
		body  map[string]any
		msg   string
		param any
	}{
		{"both", map[string]any{"messages": []map[string]any{{"role": "assistant", "content": " lorem"}},
			"continue_final_message": true, "add_generation_prompt": true},
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True.", nil},
		{"last is the user's", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}},
			"continue_final_message": true},
			"continue_final_message requires a final assistant message", "messages"},
	} {
		resp, body := post(t, url+"/v1/chat/completions", tt.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   any    `json:"param"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || e.Error.Message != tt.msg ||
			e.Error.Type != "BadRequestError" || e.Error.Param != tt.param || e.Error.Code != 400 {
			t.Errorf("%s: %d %s", tt.name, resp.StatusCode, body)
		}
	}
	// add_generation_prompt left out (true by default) does not conflict.
	resp, body := post(t, url+"/v1/chat/completions", map[string]any{"max_tokens": 3,
		"messages": []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": " sit"}}, "continue_final_message": true})
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 || c.Choices[0].Message.Content != " amet consectetur adipiscing" {
		t.Errorf("continuing after sit: %d %s", resp.StatusCode, body)
	}
}

// TestContextWindow: a continuation that no longer fits the context gets
// vLLM's own 400, on chat (max_completion_tokens named) as on
// completions.
func TestContextWindow(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks, cfg.BlockSize = 4, 16 // max_model_len 64
	_, url := startServer(t, Config{Model: testModel, Sim: cfg})
	ids := make([]int, 60)
	resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 5})
	want := `{"error":{"code":400,"message":"This model's maximum context length is 64 tokens. However, you requested 5 output tokens and your prompt contains 60 input tokens, for a total of 65 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=60)","param":"input_tokens","type":"BadRequestError"}}`
	if resp.StatusCode != 400 || strings.TrimSpace(string(body)) != want {
		t.Errorf("completions: %d %s", resp.StatusCode, body)
	}
	if resp, body := post(t, url+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 4}); resp.StatusCode != 200 {
		t.Errorf("60 + 4: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/v1/chat/completions", map[string]any{"max_completion_tokens": 65,
		"messages": []map[string]any{{"role": "user", "content": "hi"}}})
	if resp.StatusCode != 400 || !strings.Contains(string(body), `max_completion_tokens=65cannot be greater than max_model_len=max_total_tokens=64.`) ||
		!strings.Contains(string(body), `"param":"max_completion_tokens"`) {
		t.Errorf("chat: %d %s", resp.StatusCode, body)
	}
}
