package live

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// chatOf is the chat completions request with msgs: the request vLLM
// builds from a Responses or Messages request, as a client would send it.
func chatOf(t *testing.T, tools string, msgs []prefix.ChatMessage) *CompletionRequest {
	t.Helper()
	type m struct {
		Role       string          `json:"role"`
		Content    string          `json:"content"`
		Name       string          `json:"name,omitempty"`
		ToolCallID string          `json:"tool_call_id,omitempty"`
		ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
		Reasoning  *string         `json:"reasoning,omitempty"`
	}
	var list []m
	for _, x := range msgs {
		e := m{Role: x.Role, Content: x.Content, Name: x.Name, ToolCallID: x.ToolCallID}
		if x.ToolCalls != "" {
			e.ToolCalls = json.RawMessage(x.ToolCalls)
		}
		if x.HasReasoning {
			e.Reasoning = &x.Reasoning
		}
		list = append(list, e)
	}
	body := map[string]any{"model": "m", "messages": list}
	if tools != "" {
		body["tools"] = json.RawMessage(tools)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := ParseRequest(b, APIChat)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// genCases are Responses and Messages requests with the chat messages vLLM
// builds from them: Responses by construct_input_messages
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d), Messages by
// _convert_anthropic_to_openai_request (vllm/entrypoints/anthropic/serving.py
// at 0001948b). Request shapes follow OpenAI's Responses reference
// (input items: message, function_call, function_call_output, reasoning)
// and Anthropic's Messages reference (system blocks, tool_use,
// tool_result, thinking).
var genCases = []struct {
	name  string
	api   API
	body  string
	want  []prefix.ChatMessage
	tools string
}{
	{"responses string input", APIResponses,
		`{"model":"m","instructions":"Be brief.","input":"What is 2+2?"}`,
		[]prefix.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is 2+2?"}}, ""},
	{"responses empty instructions", APIResponses,
		`{"model":"m","instructions":"","input":"hi"}`,
		[]prefix.ChatMessage{{Role: "user", Content: "hi"}}, ""},
	{"responses items", APIResponses, `{"model":"m","input":[
		{"role":"developer","content":"Use tools."},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris?"},{"type":"input_image","image_url":"data:x"},{"type":"input_text","text":"And Rome?"}]},
		{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"look it up"}]},
		{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call","id":"fc_2","call_id":"call_2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"18C"},
		{"type":"function_call_output","call_id":"call_2","output":"24C"},
		{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Paris 18C, Rome 24C.","annotations":[]},{"type":"output_text","text":"dropped"}]},
		{"role":"user","content":"Thanks"}]}`,
		[]prefix.ChatMessage{
			{Role: "developer", Content: "Use tools."},
			{Role: "user", Content: "Weather in Paris?\nAnd Rome?"},
			{Role: "assistant", Content: "", Reasoning: "look it up", HasReasoning: true, // reasoning + both calls
				ToolCalls: `[{"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"type":"function"},` +
					`{"id":"call_2","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"},"type":"function"}]`},
			{Role: "tool", Content: "18C", ToolCallID: "call_1"},
			{Role: "tool", Content: "24C", ToolCallID: "call_2"},
			{Role: "assistant", Content: "Paris 18C, Rome 24C."},
			{Role: "user", Content: "Thanks"},
		}, ""},
	{"responses tools and a reasoning summary", APIResponses, `{"model":"m","tools":[
		{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},
		{"type":"web_search_preview"}],
		"input":[{"role":"user","content":"Paris?"},
		{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"use the tool"}]},
		{"type":"reasoning","id":"rs_2","summary":[]}]}`,
		[]prefix.ChatMessage{
			{Role: "user", Content: "Paris?"},
			{Role: "assistant", Reasoning: "use the tool", HasReasoning: true},
			{Role: "assistant", Reasoning: "", HasReasoning: true},
		},
		`[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}]`},
	{"responses assistant fills a call's message", APIResponses, `{"model":"m","input":[
		{"role":"user","content":"x"},
		{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
		{"role":"assistant","content":"calling f"},
		{"role":"assistant","content":"again"}]}`,
		[]prefix.ChatMessage{{Role: "user", Content: "x"},
			{Role: "assistant", Content: "calling f", ToolCalls: `[{"id":"c","function":{"name":"f","arguments":"{}"},"type":"function"}]`},
			{Role: "assistant", Content: "again"}}, ""},
	{"messages", APIMessages, `{"model":"m","max_tokens":64,
		"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; h=abc"},{"type":"text","text":"You are "},{"type":"text","text":"helpful."}],
		"messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"use the tool","signature":"s"},{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"18C"},{"type":"text","text":"sunny"}]},{"type":"text","text":"And Rome?"}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":"24C"}]},
		{"role":"system","content":" Be brief."},
		{"role":"assistant","content":[{"type":"tool_use","id":"toolu_3","name":"f","input":{}}]}]}`,
		[]prefix.ChatMessage{
			{Role: "system", Content: "You are helpful. Be brief."},
			{Role: "user", Content: "Weather in Paris?"},
			{Role: "assistant", Content: "Let me check.", Reasoning: "use the tool", HasReasoning: true,
				ToolCalls: `[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`},
			{Role: "tool", Content: "18C\nsunny", ToolCallID: "toolu_1"},
			{Role: "user", Content: "And Rome?"},
			{Role: "tool", Content: "24C", ToolCallID: "toolu_2"}, // the user message itself is dropped: nothing left
			{Role: "assistant", Content: "", ToolCalls: `[{"id":"toolu_3","type":"function","function":{"name":"f","arguments":"{}"}}]`},
		}, ""},
	{"messages tools", APIMessages, `{"model":"m","max_tokens":64,
		"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},{"name":"noop","input_schema":{"type":"object"},"description":null}],
		"messages":[{"role":"user","content":"Paris?"},
		{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{ "city" : "Paris", "units": ["C"] }}]},
		{"role":"user","content":[{"type":"tool_use","id":"toolu_9","name":"x","input":{}},{"type":"thinking","thinking":"hm"}]}]}`,
		[]prefix.ChatMessage{
			{Role: "user", Content: "Paris?"},
			{Role: "assistant", ToolCalls: `[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"units\":[\"C\"]}"}}]`},
			// the last user message has no content block: dropped
		},
		`[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},` +
			`{"type":"function","function":{"name":"noop","parameters":{"type":"object"}}}]`},
	{"messages string system", APIMessages,
		`{"model":"m","max_tokens":1,"system":"Sys","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"b"}]}]}`,
		[]prefix.ChatMessage{{Role: "system", Content: "Sys"}, {Role: "user", Content: "a\nb"}}, ""},
}

// The key of a Responses or Messages request is the key of the chat
// request with the messages vLLM builds from it: the same text, the same
// spans (so the same messages for the engine's /tokenize), and the same
// token ids through a tokenizer with a chat template.
func TestGenKeyIsTheChatKey(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)})
	set, err := tokenizer.FromConfig([]config.Tokenizer{
		{Model: "m", Source: config.TokenizerSourceFile, Path: "../tokenizer/testdata/bytebpe.json", Config: "../tokenizer/testdata/chatml_config.json"},
	}, nil, tokenizer.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.rt.SetTokenizers(set)
	ctx := context.Background()
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			req, err := ParseRequest([]byte(c.body), c.api)
			if err != nil {
				t.Fatal(err)
			}
			if req.Model != "m" {
				t.Errorf("model %q", req.Model)
			}
			got := req.Key()
			if msgs := got.messages(); !slices.Equal(msgs, c.want) {
				t.Fatalf("messages\n %+v\nwant\n %+v", msgs, c.want)
			}
			if tools := got.tools(); tools != c.tools {
				t.Fatalf("tools\n %s\nwant\n %s", tools, c.tools)
			}
			chat := chatOf(t, c.tools, c.want).Key()
			if got.text != chat.text || !slices.Equal(got.chat, chat.chat) || !cmp.Equal(got.ext, chat.ext, cmp.AllowUnexported(chatExt{}, msgExt{}, textSpan{})) {
				t.Fatalf("key %q %v, want the chat request's %q %v", got.text, got.chat, chat.text, chat.chat)
			}
			if want := prefix.RenderChatTools(c.tools, c.want); got.text != want {
				t.Fatalf("text %q, want RenderChatTools's %q", got.text, want)
			}
			ex := &Request{Model: "m", Label: "m"}
			e.rt.Key(ctx, ex, got)
			want, err := set.For("m").EncodeChat(ctx, c.want, c.tools)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 || !slices.Equal(ex.IDs, want) || ex.Tokens != len(want) {
				t.Fatalf("ids %v (tokens %d), want the template's %v", ex.IDs, ex.Tokens, want)
			}
			exChat := &Request{Model: "m", Label: "m"}
			e.rt.Key(ctx, exChat, chat)
			if !slices.Equal(ex.Hashes, exChat.Hashes) {
				t.Fatalf("hashes %v, want the chat request's %v", ex.Hashes, exChat.Hashes)
			}
		})
	}
}

// Responses' previous_response_id, cache_salt and stream are read; the
// salt seeds the key as a chat request's does.
func TestResponsesFields(t *testing.T) {
	req, err := ParseRequest([]byte(`{"model":"m","stream":true,"input":"hi","previous_response_id":"resp_abc","cache_salt":"s1","previous_response_id":"resp_def"}`), APIResponses)
	if err != nil {
		t.Fatal(err)
	}
	if !req.Stream || req.PreviousResponseID != "resp_def" || req.Key().salt != "s1" {
		t.Fatalf("stream %v previous %q salt %q", req.Stream, req.PreviousResponseID, req.Key().salt)
	}
	req, err = ParseRequest([]byte(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`), APIMessages)
	if err != nil {
		t.Fatal(err)
	}
	if !req.Stream || req.PreviousResponseID != "" || req.Key().salt != "" {
		t.Fatalf("messages: stream %v previous %q salt %q", req.Stream, req.PreviousResponseID, req.Key().salt)
	}
}

// Bad bodies are refused with ErrBadRequest, naming the field.
func TestGenBadBodies(t *testing.T) {
	for _, c := range []struct {
		api        API
		body, want string
	}{
		{APIResponses, `{"model":"m"}`, "input"},
		{APIResponses, `{"input":"x"}`, "model"},
		{APIResponses, `{"model":"m","input":5}`, "input"},
		{APIResponses, `{"model":5,"input":"x"}`, `"model"`},
		{APIResponses, `{"model":"m","input":"x","stream":"yes"}`, `"stream"`},
		{APIResponses, `{"model":"m","input":"x","instructions":[1]}`, `"instructions"`},
		{APIResponses, `{"model":"m","input":"x","previous_response_id":7}`, `"previous_response_id"`},
		{APIResponses, `{"model":"m","input":"x","cache_salt":""}`, "cache_salt"},
		{APIResponses, `{"model":"m","input":[5]}`, `"input[0]"`},
		{APIResponses, `{"model":"m","input":[{"content":"x"}]}`, "input[0].role"},
		{APIResponses, `{"model":"m","input":[{"role":"user","content":"a"},{"role":"user","content":7}]}`, "input[1].content"},
		{APIResponses, `{"model":"m","input":[{"type":"item_reference","id":"x"}]}`, "input[0].type"},
		{APIResponses, `{"model":"m","input":[{"role":"user","content":[1]}]}`, `"input[0].content[0]"`},
		{APIResponses, `{"model":"m","input":"x","max_output_tokens":1.5}`, "max_output_tokens"},
		{APIResponses, `[1]`, "JSON object"},
		{APIResponses, `{"model":"m","input":"x"`, "not valid JSON"},
		{APIResponses, strings.Repeat("[", 200), "nested too deeply"},
		{APIMessages, `{"model":"m","messages":[]}`, "max_tokens"},
		{APIMessages, `{"model":"m","max_tokens":0,"messages":[]}`, "max_tokens must be positive"},
		{APIMessages, `{"model":"m","max_tokens":"8","messages":[]}`, `"max_tokens"`},
		{APIMessages, `{"model":"","max_tokens":8,"messages":[]}`, "model"},
		{APIMessages, `{"model":"m","max_tokens":8}`, "messages is required"},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":{}}`, `"messages"`},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"video"}]}]}`, "messages[0].content[0].type"},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`, `"messages[0].content[0].text"`},
		{APIMessages, `{"model":"m","max_tokens":8,"system":5,"messages":[]}`, "system"},
		{APIMessages, `{"model":"m","max_tokens":8,"system":[{"type":"nope"}],"messages":[]}`, "system[0].type"},
		{APIMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":7}]}]}`, "messages[1].content[0].content"},
	} {
		_, err := ParseRequest([]byte(c.body), c.api)
		if err == nil || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %.60s: error %v, want ErrBadRequest naming %q", c.api, c.body, err, c.want)
		}
	}
}
