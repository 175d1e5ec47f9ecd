package migrate

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// A vLLM chat stream with return_token_ids (prompt_token_ids at the top
// of the first chunk, token_ids per choice) and include_usage.
var chatEvents = []string{
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}` + "\n\n",
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":[10]}]}` + "\n\n",
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null,"token_ids":[11]}]}` + "\n\n",
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","token_ids":[12]}]}` + "\n\n",
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}` + "\n\n",
	"data: [DONE]\n\n",
}

func feedAll(t *testing.T, s *Stream, events []string, step int) string {
	t.Helper()
	all := strings.Join(events, "")
	var out []byte
	for i := 0; i < len(all); i += step {
		var cut *Cut
		out, cut = s.Feed([]byte(all[i:min(i+step, len(all))]), out)
		if cut != nil {
			t.Fatalf("unexpected cut %+v", cut)
		}
	}
	return string(out)
}

func TestStreamStripsWhatTheRouterAsked(t *testing.T) {
	for _, step := range []int{1, 7, 1 << 20} {
		s := NewStream(Chat, DefaultPolicy(), nil, true, true)
		got := feedAll(t, s, chatEvents, step)
		if strings.Contains(got, `"token_ids":[`) {
			t.Fatalf("step %d: token ids reached the client:\n%s", step, got)
		}
		if n := strings.Count(got, "data: "); n != len(chatEvents) {
			t.Fatalf("step %d: %d events passed, want %d", step, n, len(chatEvents))
		}
		// Everything else is byte for byte the engine's; the ids are null,
		// as vLLM sends them unasked.
		want := strings.NewReplacer(`"prompt_token_ids":[1,2,3]`, `"prompt_token_ids":null`, `"token_ids":[10]`, `"token_ids":null`,
			`"token_ids":[11]`, `"token_ids":null`, `"token_ids":[12]`, `"token_ids":null`).Replace(strings.Join(chatEvents, ""))
		if got != want {
			t.Fatalf("step %d:\n got %s\nwant %s", step, got, want)
		}
		if s.Tokens() != 3 || string(s.Text()) != "Hello world!" || !reflect.DeepEqual(s.IDs(), []int32{10, 11, 12}) ||
			!reflect.DeepEqual(s.PromptIDs(), []int32{1, 2, 3}) || !s.Finished() || !s.Done() {
			t.Fatalf("step %d: tokens %d text %q ids %v prompt %v finished %v done %v", step, s.Tokens(), s.Text(), s.IDs(), s.PromptIDs(), s.Finished(), s.Done())
		}
	}
}

func TestStreamClientAskedForIDs(t *testing.T) {
	s := NewStream(Chat, DefaultPolicy(), nil, false, true)
	if got := feedAll(t, s, chatEvents, 5); got != strings.Join(chatEvents, "") {
		t.Fatalf("the client's own ids were changed:\n%s", got)
	}
}

func TestStreamHoldsPartialEvents(t *testing.T) {
	s := NewStream(Chat, DefaultPolicy(), nil, false, false)
	half := chatEvents[2][:len(chatEvents[2])/2]
	out, cut := s.Feed([]byte(chatEvents[0]+chatEvents[1]+half), nil)
	if cut != nil || string(out) != chatEvents[0]+chatEvents[1] {
		t.Fatalf("passed %q", out)
	}
	if len(s.pend) == 0 || s.Tokens() != 1 || string(s.Text()) != "Hello" || s.Done() || s.Finished() {
		t.Fatalf("held %d bytes, tokens %d text %q", len(s.pend), s.Tokens(), s.Text())
	}
}

func TestStreamErrorEvents(t *testing.T) {
	// vLLM's in-stream error (ErrorResponse, code the HTTP status).
	server := `data: {"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	client := `data: {"error":{"message":"bad grammar","type":"BadRequestError","param":null,"code":400}}` + "\n\n"
	s := NewStream(Chat, DefaultPolicy(), nil, false, false)
	out, cut := s.Feed([]byte(chatEvents[0]+chatEvents[1]+server+"data: [DONE]\n\n"), nil)
	if cut == nil || cut.Cause != CauseEngineError || !strings.Contains(string(cut.Event), "engine dead") {
		t.Fatalf("cut %+v", cut)
	}
	if string(out) != chatEvents[0]+chatEvents[1] {
		t.Fatalf("passed %q", out)
	}
	for _, own := range []string{client, `data: {"error":{"message":"bad","type":"BadRequestError","param":null,"code":"400"}}` + "\n\n"} {
		s = NewStream(Chat, DefaultPolicy(), nil, false, false)
		if out, cut = s.Feed([]byte(own), nil); cut != nil || string(out) != own {
			t.Fatalf("a request's own error: cut %+v out %q", cut, out)
		}
	}
	s = NewStream(Chat, DefaultPolicy(), nil, false, false)
	out, cut = s.Feed([]byte(client), nil)
	if cut != nil || string(out) != client {
		t.Fatalf("a request's own error: cut %+v out %q", cut, out)
	}
}

func TestStreamBounds(t *testing.T) {
	b := NewBudget(1 << 20)
	pol := DefaultPolicy()
	pol.MaxBytes = 25 // the prompt's 3 ids (12 bytes), "Hello" (5) and its id (4): 21
	s := NewStream(Chat, pol, b, true, false)
	feedAll(t, s, chatEvents[:2], 1<<20)
	if ok, _ := s.Migratable(); !ok || b.Used() != 21 {
		t.Fatalf("within MaxBytes: migratable %v, budget %d, want 21", ok, b.Used())
	}
	feedAll(t, s, chatEvents[2:3], 1<<20) // " world" (6) and its id: 31 > 25
	if ok, why := s.Migratable(); ok || why != TooLong || b.Used() != 0 || s.Text() != nil {
		t.Fatalf("over MaxBytes: migratable %v (%s), budget %d, text %q", ok, why, b.Used(), s.Text())
	}
	// The router's budget: a stream cannot keep past it.
	b = NewBudget(20)
	s1 := NewStream(Chat, DefaultPolicy(), b, true, false)
	feedAll(t, s1, chatEvents[:2], 1<<20) // 12 + 5 + 4 = 21 > 20
	if ok, _ := s1.Migratable(); ok || b.Used() != 0 {
		t.Fatalf("budget: migratable %v used %d", ok, b.Used())
	}
	s2 := NewStream(Chat, DefaultPolicy(), b, false, false)
	feedAll(t, s2, chatEvents[1:2], 1<<20) // 5 + 4
	if b.Used() != 9 {
		t.Fatalf("used %d, want 9", b.Used())
	}
	s2.Close()
	s2.Close()
	if b.Used() != 0 {
		t.Fatalf("used %d after Close, want 0", b.Used())
	}
}

func TestBeginAddsReturnTokenIDs(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	up, s := Begin(body, Chat, DefaultPolicy(), nil)
	if !gjson.GetBytes(up, "return_token_ids").Bool() || !s.strip || gjson.GetBytes(up, "model").Str != "m" || !json.Valid(up) {
		t.Fatalf("upstream %s strip %v", up, s.strip)
	}
	up, s = Begin([]byte(`{ }`), Chat, DefaultPolicy(), nil)
	if string(up) != `{"return_token_ids":true}` || !s.strip {
		t.Fatalf("empty object: %s", up)
	}
	// The client's own setting is kept, and nothing is stripped.
	own := []byte(`{"return_token_ids":false,"messages":[]}`)
	if up, s = Begin(own, Chat, DefaultPolicy(), nil); string(up) != string(own) || s.strip {
		t.Fatalf("client's own: %s", up)
	}
	for _, c := range []struct{ body, why string }{
		{`{"n":2,"prompt":"a"}`, "several choices"},
		{`{"best_of":3,"prompt":"a"}`, "best_of"},
		{`{"echo":true,"prompt":"a"}`, "echoes"},
	} {
		up, s := Begin([]byte(c.body), Completions, DefaultPolicy(), nil)
		if ok, o := s.Migratable(); ok || o != NotMigratable || !strings.Contains(s.Reason(), c.why) || string(up) != c.body {
			t.Errorf("%s: migratable %v %s %q, body %s", c.body, ok, o, s.Reason(), up)
		}
	}
	off := DefaultPolicy()
	off.Limit = 0
	up, s = Begin(body, Chat, off, nil)
	if ok, o := s.Migratable(); string(up) != string(body) || !strings.Contains(s.Reason(), "migration is off") || ok || o != OverLimit {
		t.Fatalf("limit 0: %s %q, migratable %v (%s)", up, s.Reason(), ok, o)
	}
}

// TestNotMigratableKeepsNoText: a stream that cannot continue (migration
// off, several choices) keeps none of its text, which only a continuation
// reads; the token ids the engine sent (here unasked by the router) stay
// kept, as they count the tokens and the usage of a stream ended by the
// router: 3 prompt and 2 generated ids, 20 bytes.
func TestNotMigratableKeepsNoText(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	off := DefaultPolicy()
	off.Limit = 0
	for _, c := range []struct {
		name string
		pol  Policy
		body []byte
	}{
		{"limit 0", off, body},
		{"n 2", DefaultPolicy(), []byte(`{"model":"m","stream":true,"n":2,"messages":[{"role":"user","content":"hi"}]}`)},
	} {
		b := NewBudget(1 << 20)
		_, s := Begin(c.body, Chat, c.pol, b)
		feedAll(t, s, chatEvents[:3], 1<<20)
		if s.Text() != nil || b.Used() != 20 || s.Tokens() != 2 {
			t.Errorf("%s: text %q, budget used %d, tokens %d: want none, 20, 2", c.name, s.Text(), b.Used(), s.Tokens())
		}
		s.Close()
	}
	// A migratable one keeps its text, within the budget.
	b := NewBudget(1 << 20)
	_, s := Begin(body, Chat, DefaultPolicy(), b)
	feedAll(t, s, chatEvents[:3], 1<<20)
	if string(s.Text()) != "Hello world" || b.Used() != 20+int64(len("Hello world")) {
		t.Errorf("migratable: text %q, budget used %d", s.Text(), b.Used())
	}
	s.Close()
}

func TestChatContinuation(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"seed":7,"temperature":0.5,"max_tokens":10,"min_tokens":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	up, s := Begin(body, Chat, DefaultPolicy(), nil)
	feedAll(t, s, chatEvents[:3], 1<<20) // cut after "Hello world"
	next, err := Continuation(up, s)
	if err != nil {
		t.Fatal(err)
	}
	g := func(p string) gjson.Result { return gjson.GetBytes(next, p) }
	if g("max_tokens").Int() != 8 || g("min_tokens").Int() != 0 || g("seed").Int() != 7 || g("temperature").Float() != 0.5 ||
		!g("continue_final_message").Bool() || g("add_generation_prompt").Bool() || !g("add_generation_prompt").Exists() ||
		g("messages.#").Int() != 2 || g("messages.1.role").Str != "assistant" || g("messages.1.content").Str != "Hello world" ||
		!g("return_token_ids").Bool() || !g("stream_options.include_usage").Bool() {
		t.Fatalf("continuation %s", next)
	}
	// The continuation's answer: its role chunk is dropped, its id is the
	// first attempt's, its usage counts the whole answer.
	s.Continue()
	cont := []string{
		`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3,10,11]}` + "\n\n",
		`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","token_ids":[12]}]}` + "\n\n",
		`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	got := feedAll(t, s, cont, 3)
	want := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","token_ids":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":3}}}` + "\n\n" +
		"data: [DONE]\n\n"
	if got != want {
		t.Fatalf("continued stream:\n got %s\nwant %s", got, want)
	}
	if string(s.Text()) != "Hello world!" || s.Tokens() != 3 || !s.Done() {
		t.Fatalf("text %q tokens %d", s.Text(), s.Tokens())
	}
}

func TestChatContinuesTheClientsFinalMessage(t *testing.T) {
	body := []byte(`{"stream":true,"continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Say: "}]}`)
	up, s := Begin(body, Chat, DefaultPolicy(), nil)
	feedAll(t, s, chatEvents[:3], 1<<20)
	next, err := Continuation(up, s)
	if err != nil {
		t.Fatal(err)
	}
	if n := gjson.GetBytes(next, "messages.#").Int(); n != 2 || gjson.GetBytes(next, "messages.1.content").Str != "Say: Hello world" {
		t.Fatalf("continuation %s", next)
	}
	// A chat request without max_tokens sets none.
	if gjson.GetBytes(next, "max_tokens").Exists() {
		t.Fatalf("max_tokens set: %s", next)
	}
}

var completionEvents = []string{
	`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hello","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[5,6],"token_ids":[10]}]}` + "\n\n",
	`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[11]}]}` + "\n\n",
}

func TestCompletionsContinuation(t *testing.T) {
	// With the engine's token ids: the prompt's ids then the generated.
	body := []byte(`{"model":"m","stream":true,"prompt":"Say hi","max_tokens":5}`)
	up, s := Begin(body, Completions, DefaultPolicy(), nil)
	if got := feedAll(t, s, completionEvents, 4); strings.Contains(got, `_ids":[`) {
		t.Fatalf("ids reached the client: %s", got)
	}
	next, err := Continuation(up, s)
	if err != nil {
		t.Fatal(err)
	}
	if p := gjson.GetBytes(next, "prompt").Raw; p != "[5,6,10,11]" || gjson.GetBytes(next, "max_tokens").Int() != 3 {
		t.Fatalf("continuation %s", next)
	}
	// Without them (an engine that ignores return_token_ids): the text.
	noIDs := strings.NewReplacer(`,"prompt_token_ids":[5,6]`, "", `,"token_ids":[10]`, "", `,"token_ids":[11]`, "")
	_, s = Begin(body, Completions, DefaultPolicy(), nil)
	feedAll(t, s, []string{noIDs.Replace(completionEvents[0]), noIDs.Replace(completionEvents[1])}, 1<<20)
	next, err = Continuation(body, s)
	if err != nil {
		t.Fatal(err)
	}
	if p := gjson.GetBytes(next, "prompt").Str; p != "Say hiHello world" || gjson.GetBytes(next, "max_tokens").Int() != 3 {
		t.Fatalf("continuation %s", next)
	}
	// max_tokens unset: vLLM's default of 16.
	_, s = Begin([]byte(`{"prompt":["Say hi"],"stream":true}`), Completions, DefaultPolicy(), nil)
	feedAll(t, s, []string{noIDs.Replace(completionEvents[0])}, 1<<20)
	if next, err = Continuation([]byte(`{"prompt":["Say hi"],"stream":true}`), s); err != nil || gjson.GetBytes(next, "max_tokens").Int() != 15 ||
		gjson.GetBytes(next, "prompt").Str != "Say hiHello" {
		t.Fatalf("continuation %s, %v", next, err)
	}
	// A prompt of ids with no generated ids has no form.
	ids := []byte(`{"prompt":[1,2],"stream":true}`)
	_, s = Begin(ids, Completions, DefaultPolicy(), nil)
	feedAll(t, s, []string{noIDs.Replace(completionEvents[0])}, 1<<20)
	if _, err = Continuation(ids, s); !errors.Is(err, ErrNotMigratable) {
		t.Fatalf("ids prompt without ids: %v", err)
	}
	// Every allowed token generated: nothing to continue.
	full := []byte(`{"prompt":"a","stream":true,"max_tokens":2}`)
	up, s = Begin(full, Completions, DefaultPolicy(), nil)
	feedAll(t, s, completionEvents, 1<<20)
	if _, err = Continuation(up, s); !errors.Is(err, ErrNothingLeft) {
		t.Fatalf("used up: %v", err)
	}
}

func TestRemoveMember(t *testing.T) {
	for _, c := range []struct{ in, path, want string }{
		{`{"a":1,"b":2}`, "a", `{"b":2}`},
		{`{"a":1,"b":2}`, "b", `{"a":1}`},
		{`{"a":1 , "b" : [1,2] , "c":3}`, "b", `{"a":1  , "c":3}`},
		{`{"a":{"x":"q\"b","y":1}}`, "a.y", `{"a":{"x":"q\"b"}}`},
		{`{"choices":[{"delta":{"role":"assistant","content":"t3 "}}]}`, "choices.0.delta.role", `{"choices":[{"delta":{"content":"t3 "}}]}`},
		{`{"a":1}`, "z", `{"a":1}`},
	} {
		if got := string(removeMember([]byte(c.in), c.path)); got != c.want {
			t.Errorf("removeMember(%s, %s) = %s, want %s", c.in, c.path, got, c.want)
		}
	}
}

func TestReplaceAndNulled(t *testing.T) {
	if got := string(replace([]byte(`{"id":"x","b":1}`), "id", `"yy"`)); got != `{"id":"yy","b":1}` {
		t.Errorf("replace: %s", got)
	}
	if got := string(nulled([]byte(`{"a":{"token_ids":[1,2]},"b":null}`), "a.token_ids")); got != `{"a":{"token_ids":null},"b":null}` {
		t.Errorf("nulled: %s", got)
	}
	if in := []byte(`{"b":null}`); &nulled(in, "b")[0] != &in[0] {
		t.Error("nulled copied a null value")
	}
}

func TestPolicyDecide(t *testing.T) {
	p := DefaultPolicy()
	for _, c := range []struct {
		migrations, generated int
		ok                    bool
		o                     Outcome
	}{{0, 10, true, Migrated}, {2, 0, true, Migrated}, {3, 0, false, OverLimit}, {0, DefaultMaxTokens + 1, false, TooLong}} {
		if ok, o := p.Decide(c.migrations, c.generated); ok != c.ok || o != c.o {
			t.Errorf("Decide(%d, %d) = %v %s", c.migrations, c.generated, ok, o)
		}
	}
	if err := (Policy{Limit: -1, MaxTokens: 1, MaxBytes: 1, TotalBytes: 1}).Validate(); err == nil {
		t.Error("negative limit accepted")
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Error(err)
	}
}

func TestAppendNulled(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"token_ids":[1,2]}`, `{"a":1,"token_ids":null}`},
		{`{"token_ids":[1,2],"a":1}`, `{"token_ids":null,"a":1}`},
		{`{"choices":[{"text":"say \"token_ids\": [9]","token_ids":[3]}],"prompt_token_ids":[1, 2]}`, `{"choices":[{"text":"say \"token_ids\": [9]","token_ids":null}],"prompt_token_ids":null}`},
		{`{"prompt_token_ids" : [1] , "choices":[{"token_ids" :[4]}]}`, `{"prompt_token_ids" : null , "choices":[{"token_ids" :null}]}`},
		{`{"a":"no ids","token_ids":null}`, `{"a":"no ids","token_ids":null}`},
	} {
		got := appendNulled(nil, []byte(c.in), tokenIDsKey, promptIDsKey)
		if string(got) != c.want {
			t.Errorf("appendNulled(%s) = %s, want %s", c.in, got, c.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: invalid JSON", c.in)
		}
	}
}

// TestTokenIDsOutOfRange: an id that is not a token id (negative, past
// 2^31-1, not a number) makes the answer not migratable.
func TestTokenIDsOutOfRange(t *testing.T) {
	for _, id := range []string{"-1", "2147483648", `"7"`, "1.5"} {
		s := NewStream(Completions, DefaultPolicy(), nil, false, false)
		ev := `data: {"id":"c","choices":[{"index":0,"text":"a","token_ids":[` + id + `]}]}` + "\n\n"
		feedAll(t, s, []string{ev}, 1<<20)
		if ok, o := s.Migratable(); ok || o != NotMigratable {
			t.Errorf("id %s: migratable %v (%s)", id, ok, o)
		}
	}
}

// TestStreamOverLongEvent: an event over MaxEvent passes whole, unread
// (the answer is then not migratable), and the events after it are read:
// the terminator is seen, the ids of later chunks are made null.
func TestStreamOverLongEvent(t *testing.T) {
	big := `data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", MaxEvent+64<<10) + `"},"token_ids":[9]}]}` + "\n\n"
	all := chatEvents[0] + chatEvents[1] + big + chatEvents[2] + chatEvents[3] + "data: [DONE]\n\n"
	// Read as serve reads, at most 32 KiB at a time (held: at most
	// MaxEvent and one read).
	for _, step := range []int{4096, 32 << 10} {
		s := NewStream(Chat, DefaultPolicy(), nil, true, false)
		var out []byte
		for i := 0; i < len(all); i += step {
			var cut *Cut
			out, cut = s.Feed([]byte(all[i:min(i+step, len(all))]), out)
			if cut != nil {
				t.Fatalf("cut %+v", cut)
			}
		}
		got := string(out)
		if !s.Done() || strings.Count(got, "data: [DONE]") != 1 || !strings.Contains(got, big) ||
			strings.Contains(got, `"token_ids":[11]`) || !strings.Contains(got, `"content":" world"},"logprobs":null,"finish_reason":null,"token_ids":null`) {
			t.Fatalf("step %d: done %v, %d bytes out", step, s.Done(), len(got))
		}
		if ok, o := s.Migratable(); ok || o != NotMigratable || !strings.Contains(s.Reason(), "over 1 MiB") {
			t.Errorf("step %d: migratable %v (%s) %q", step, ok, o, s.Reason())
		}
	}
}

// TestStreamMalformedEvents: an event whose data is not a JSON object is
// passed on as sent and makes the answer not migratable; a terminator as
// the last data line of an event that holds others (an engine that leaves
// out the blank lines) ends the stream.
func TestStreamMalformedEvents(t *testing.T) {
	s := NewStream(Chat, DefaultPolicy(), nil, false, false)
	out, _ := s.Feed([]byte("data: {not json\n\n"), nil)
	if string(out) != "data: {not json\n\n" || s.Done() {
		t.Fatalf("out %q", out)
	}
	if ok, o := s.Migratable(); ok || o != NotMigratable {
		t.Errorf("migratable %v (%s)", ok, o)
	}
	s = NewStream(Chat, DefaultPolicy(), nil, false, false)
	noBlank := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\ndata: [DONE]\n\n"
	if out, _ = s.Feed([]byte(noBlank), nil); string(out) != noBlank || !s.Done() {
		t.Fatalf("out %q, done %v", out, s.Done())
	}
}

// TestStreamCutBeforeAnyEvent: an answer cut before any event reached
// the client is simply sent again: the request itself, and its answer
// read as a first one (its role and id pass as they are).
func TestStreamCutBeforeAnyEvent(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	up, s := Begin(body, Chat, DefaultPolicy(), nil)
	next, err := Continuation(up, s)
	if err != nil || string(next) != string(up) {
		t.Fatalf("continuation %s, %v: want the request itself", next, err)
	}
	s.Continue()
	got := feedAll(t, s, chatEvents, 7)
	if strings.Count(got, `"role":"assistant"`) != 1 || !strings.Contains(got, `"id":"chatcmpl-1"`) {
		t.Fatalf("restarted stream %s", got)
	}
	// Cut after the role chunk alone: the request itself again, and the
	// role not repeated.
	up, s = Begin(body, Chat, DefaultPolicy(), nil)
	feedAll(t, s, chatEvents[:1], 1<<20)
	if next, err = Continuation(up, s); err != nil || string(next) != string(up) {
		t.Fatalf("continuation %s, %v", next, err)
	}
	s.Continue()
	if got = feedAll(t, s, chatEvents, 1<<20); strings.Contains(got, `"role"`) {
		t.Fatalf("the role repeated: %s", got)
	}
}

// TestStreamRoleWithFirstToken: a continuation whose engine sends the
// role with its first token keeps the role only when the client had
// none.
func TestStreamRoleWithFirstToken(t *testing.T) {
	first := `data: {"id":"a","choices":[{"index":0,"delta":{"role":"assistant","content":"t0 "}}]}` + "\n\n"
	cont := `data: {"id":"b","choices":[{"index":0,"delta":{"role":"assistant","content":"t1 "}}]}` + "\n\n"
	s := NewStream(Chat, DefaultPolicy(), nil, false, false)
	feedAll(t, s, []string{first}, 1<<20)
	s.Continue()
	if got := feedAll(t, s, []string{cont}, 1<<20); strings.Contains(got, "role") || !strings.Contains(got, `"id":"a"`) {
		t.Fatalf("continued: %s", got)
	}
}
