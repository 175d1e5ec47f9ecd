package live

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// toolsTemplate is a ChatML template that renders what tool-use templates
// (Qwen's, Hermes') render: the tools, as JSON, ahead of the
// conversation; each message's name, reasoning, tool calls (name and
// arguments as JSON) and tool_call_id. Every field the router carries
// changes its rendering, so a field lost on the way changes the ids.
const toolsTemplate = `{%- if tools %}<|im_start|>system
# Tools
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{%- if message.name %} ({{ message.name }}){% endif %}
{%- if message.tool_call_id %} [{{ message.tool_call_id }}]{% endif %}
{% if message.reasoning_content is defined %}<think>{{ message.reasoning_content }}</think>{% endif %}
{{- message.content }}
{%- if message.tool_calls %}{% for tc in message.tool_calls %}
<tool_call>{"id": {{ tc.id | tojson }}, "name": {{ tc.function.name | tojson }}, "arguments": {{ tc.function.arguments | tojson }}}</tool_call>
{%- endfor %}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// toolsTokenizer is the test byte-level BPE with toolsTemplate.
func toolsTokenizer(t *testing.T) *tokenizer.File {
	t.Helper()
	tmpl, err := tokenizer.ParseChatTemplate("tools", toolsTemplate, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadFile("../tokenizer/testdata/bytebpe.json", tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The tools of toolCases, as chat completions tools.
const chatTools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},` +
	`{"type":"function","function":{"name":"now"}}]`

// toolCases are agentic requests of each API, with the /tokenize chat
// request vLLM builds from each: the messages and tools its chat
// template receives, written here from vLLM's conversions
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d,
// construct_input_messages and construct_tool_dicts;
// vllm/entrypoints/anthropic/serving.py at 0001948b,
// _convert_anthropic_to_openai_request), not from the router's reading.
var toolCases = []struct {
	name, path, body string
	// usage is the answer's usage field that counts the prompt's tokens.
	usage string
	// tokenize is the /tokenize chat request of the same conversation.
	tokenize string
}{
	{"chat", "/v1/chat/completions", `{"model":"m","max_tokens":2,"tools":` + chatTools + `,"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","name":"ann","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"reasoning":"use the tool","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"18C"},
		{"role":"user","content":"And now?"}]}`,
		"prompt_tokens",
		`{"model":"m","tools":` + chatTools + `,"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","name":"ann","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"reasoning":"use the tool","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"18C"},
		{"role":"user","content":"And now?"}]}`},
	{"responses", "/v1/responses", `{"model":"m","max_output_tokens":2,"instructions":"be brief",
		"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
			{"type":"function","name":"now"},{"type":"web_search_preview"}],
		"input":[{"role":"user","content":"Weather in Paris?"},
		{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"use the tool"}]},
		{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"18C"},
		{"role":"user","content":[{"type":"input_text","text":"And now?"}]}]}`,
		"input_tokens",
		`{"model":"m","tools":` + chatTools + `,"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","reasoning":"use the tool","tool_calls":[{"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"},"type":"function"}]},
		{"role":"tool","content":"18C","tool_call_id":"call_1"},
		{"role":"user","content":"And now?"}]}`},
	{"messages", "/v1/messages", `{"model":"m","max_tokens":2,"system":"be brief",
		"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
			{"name":"now","input_schema":{"type":"object"}}],
		"messages":[{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"use the tool","signature":"s"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18C"},{"type":"text","text":"And now?"}]}]}`,
		"input_tokens",
		`{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
			{"type":"function","function":{"name":"now","parameters":{"type":"object"}}}],"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","reasoning":"use the tool","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"toolu_1","content":"18C"},
		{"role":"user","content":"And now?"}]}`},
}

// postJSON posts body to url and decodes the 200 answer into v.
func postJSON(t *testing.T, url, body string, v any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("POST %s: %v: %s", url, err, raw)
	}
}

// An agentic request of each API (tools, tool calls, tool results,
// reasoning, a participant's name) is keyed by the token ids the engine
// computes for it: through the engine's /tokenize, the router's ids are
// the mock engine's /tokenize of the conversation vLLM builds from the
// request, and their count is the prompt_tokens (input_tokens) the engine
// answers the request itself with; the tokenizer file with the same
// template gives the same ids. Without the tools and the fields beside
// the content the conversation renders to fewer tokens, so a router that
// dropped them would count under. Keyed by characters, the router's text
// is as long as the rendering an engine without a tokenizer counts.
func TestToolsKeyedAsTheEngineRendersThem(t *testing.T) {
	tok := toolsTokenizer(t)
	m, err := mockworker.New(mockworker.Config{Speedup: 1000, BlockTokens: 16, Model: "m", Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m)
	t.Cleanup(func() { hs.Close(); m.Close() })
	// An engine without a tokenizer counts its prompt's rendering, a
	// byte a token.
	plain, err := mockworker.New(mockworker.Config{Speedup: 1000, BlockTokens: 16, Model: "m", CharsPerToken: 1})
	if err != nil {
		t.Fatal(err)
	}
	hp := httptest.NewServer(plain)
	t.Cleanup(func() { hp.Close(); plain.Close() })

	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)})
	engineSet, err := tokenizer.FromConfig([]config.Tokenizer{{Model: "m", Source: config.TokenizerSourceEngine}},
		func(string) tokenizer.EngineURL {
			return func(context.Context) (string, error) { return hs.URL, nil }
		}, tokenizer.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range toolCases {
		t.Run(c.name, func(t *testing.T) {
			ep, _ := EndpointFor(c.path)
			api := ep.API
			req, err := ParseRequest([]byte(c.body), api)
			if err != nil {
				t.Fatal(err)
			}
			e.rt.SetTokenizers(engineSet)
			ex := &Request{Model: "m", Label: "m"}
			e.rt.Key(ctx, ex, req.Key())
			if ex.KeyedBy != KeyedEngine || ex.TokErr != nil {
				t.Fatalf("keyed by %s (%v), want the engine's /tokenize", ex.KeyedBy, ex.TokErr)
			}

			var want struct{ Tokens []int64 }
			postJSON(t, hs.URL+"/tokenize", c.tokenize, &want)
			if len(want.Tokens) == 0 || !slices.Equal(ex.IDs, want.Tokens) {
				t.Fatalf("ids %v\nwant the engine's /tokenize of vLLM's conversation %v", ex.IDs, want.Tokens)
			}

			var answer struct{ Usage map[string]any }
			postJSON(t, hs.URL+c.path, c.body, &answer)
			if n, _ := answer.Usage[c.usage].(float64); int(n) != ex.Tokens || ex.Tokens != len(ex.IDs) {
				t.Fatalf("router counts %d tokens, the engine's answer %s = %v", ex.Tokens, c.usage, answer.Usage[c.usage])
			}

			// The tokenizer file renders the same template in process.
			msgs, tools := req.Key().messages(), req.Key().tools()
			file, err := tok.EncodeChat(ctx, msgs, tools)
			if err != nil || !slices.Equal(file, want.Tokens) {
				t.Fatalf("the tokenizer file's ids %v (%v), want %v", file, err, want.Tokens)
			}

			// Keyed by characters, the router's text is the rendering the
			// engine without a tokenizer counts.
			postJSON(t, hp.URL+c.path, c.body, &answer)
			if n, _ := answer.Usage[c.usage].(float64); int(n) != len(req.Key().text) {
				t.Fatalf("the router's text is %d bytes, the engine's rendering %v: %q", len(req.Key().text), answer.Usage[c.usage], req.Key().text)
			}

			// What the router counted before it carried them: fewer.
			bare := make([]prefix.ChatMessage, len(msgs))
			for i, m := range msgs {
				bare[i] = prefix.ChatMessage{Role: m.Role, Content: m.Content}
			}
			under, err := tok.EncodeChat(ctx, bare, "")
			if err != nil || len(under) >= len(want.Tokens) {
				t.Fatalf("without tools and tool calls: %d tokens (%v), want fewer than %d", len(under), err, len(want.Tokens))
			}
		})
	}
}
