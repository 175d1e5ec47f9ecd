package migrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tidwall/gjson"
)

// DefaultCompletionsMaxTokens is the max_tokens of a completions request
// that sets none: 16, OpenAI's default and vLLM's
// (CompletionRequest.max_tokens in vllm/entrypoints/openai/protocol.py).
// A chat request without one may generate up to the context window, so
// its continuation sets none either.
const DefaultCompletionsMaxTokens = 16

// ErrNothingLeft: the answer had generated every token it was allowed
// (max_tokens) when it was cut: there is nothing to continue, the answer
// ends with finish_reason "length".
var ErrNothingLeft = errors.New("no tokens left to generate")

// ErrNotMigratable wraps why a request has no continuation form.
var ErrNotMigratable = errors.New("not migratable")

// Begin reads a streamed request's body for migration: it returns the
// body to send the engine (the client's, with "return_token_ids": true
// added when the client did not set it, so that a vLLM engine returns
// the token ids a completions continuation is built from; an engine that
// ignores the field answers without them and continuations are built from
// text) and the Stream that reads the answer. A request of a kind that
// cannot continue (several choices, best_of, echo) still gets a Stream,
// which detects cuts; its Migratable says why not. The body is a JSON
// object the caller has parsed; what Begin adds is a copy.
func Begin(body []byte, api API, pol Policy, budget *Budget) ([]byte, *Stream) {
	rt := gjson.GetBytes(body, "return_token_ids")
	strip := !rt.Exists() || rt.Type == gjson.Null
	usage := gjson.GetBytes(body, "stream_options.include_usage").Bool()
	s := NewStream(api, pol, budget, strip, usage)
	switch {
	case pol.Limit == 0:
		s.off = true
	case gjson.GetBytes(body, "n").Int() > 1:
		s.other = "the request asks for several choices"
	case gjson.GetBytes(body, "best_of").Int() > 1:
		s.other = "the request asks for best_of"
	case api == Completions && gjson.GetBytes(body, "echo").Bool():
		s.other = "the request echoes its prompt"
	}
	if !strip || s.off || s.other != "" {
		s.strip = false
		return body, s
	}
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		s.strip = false
		return body, s
	}
	rest := bytes.TrimLeft(body[i+1:], " \t\r\n")
	out := make([]byte, 0, len(body)+len(`"return_token_ids":true,`))
	out = append(out, body[:i+1]...)
	out = append(out, `"return_token_ids":true`...)
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...), s
}

// Continuation returns the body of the request that continues the
// answer s has read so far, from the body the first attempt sent
// (Begin's): the same request, every sampling parameter and the seed
// kept, with
//
//   - chat: the text so far as the final assistant message (appended to
//     the client's own final assistant message when it asked to continue
//     it), "continue_final_message": true and "add_generation_prompt":
//     false (vLLM's ChatCompletionRequest: the model continues that
//     message rather than starting a new turn);
//   - completions: the prompt's token ids followed by the generated ones
//     when the engine returned both (vLLM's completions API takes a
//     prompt of token ids), else the prompt text followed by the text so
//     far (a prompt given as token ids whose answer carried no ids has no
//     form: ErrNotMigratable);
//
// and max_tokens (chat: also max_completion_tokens; completions: 16 when
// unset), min_tokens and min_completion_tokens less the tokens generated.
// ErrNothingLeft when max_tokens is used up.
func Continuation(body []byte, s *Stream) ([]byte, error) {
	if ok, _ := s.Migratable(); !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotMigratable, s.Reason())
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: the request body: %v", ErrNotMigratable, err)
	}
	n := s.Tokens()
	if n == 0 {
		// Nothing generated yet: the request itself, sent again.
		return append([]byte(nil), body...), nil
	}
	left := false
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		v, ok := m[k]
		if !ok || string(v) == "null" {
			continue
		}
		var mt int64
		if err := json.Unmarshal(v, &mt); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotMigratable, k, err)
		}
		if mt-int64(n) <= 0 {
			return nil, ErrNothingLeft
		}
		m[k] = json.RawMessage(fmt.Sprint(mt - int64(n)))
		left = true
	}
	if s.api == Completions && !left {
		if n >= DefaultCompletionsMaxTokens {
			return nil, ErrNothingLeft
		}
		m["max_tokens"] = json.RawMessage(fmt.Sprint(DefaultCompletionsMaxTokens - n))
	}
	for _, k := range []string{"min_tokens", "min_completion_tokens"} {
		if v, ok := m[k]; ok {
			var mt int64
			if json.Unmarshal(v, &mt) == nil {
				m[k] = json.RawMessage(fmt.Sprint(max(mt-int64(n), 0)))
			}
		}
	}
	var err error
	if s.api == Chat {
		err = continueChat(m, s.Text())
	} else {
		err = continueCompletion(m, s)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func continueChat(m map[string]json.RawMessage, text []byte) error {
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		return fmt.Errorf("%w: the request's messages", ErrNotMigratable)
	}
	if gjson.GetBytes(m["continue_final_message"], "@this").Bool() {
		// The client continues its own final assistant message: the text
		// so far goes after it.
		last := msgs[len(msgs)-1]
		c := gjson.GetBytes(last, "content")
		if c.Type != gjson.String {
			return fmt.Errorf("%w: the final message has no text content", ErrNotMigratable)
		}
		content, _ := json.Marshal(c.Str + string(text))
		msgs[len(msgs)-1] = json.RawMessage(replace(last, "content", string(content)))
	} else {
		msg, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{"assistant", string(text)})
		msgs = append(msgs, msg)
	}
	b, err := json.Marshal(msgs)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotMigratable, err)
	}
	m["messages"] = b
	m["continue_final_message"] = json.RawMessage("true")
	m["add_generation_prompt"] = json.RawMessage("false")
	return nil
}

func continueCompletion(m map[string]json.RawMessage, s *Stream) error {
	if ids, prompt := s.IDs(), s.PromptIDs(); ids != nil && prompt != nil {
		all := make([]int32, 0, len(prompt)+len(ids))
		all = append(append(all, prompt...), ids...)
		b, _ := json.Marshal(all)
		m["prompt"] = b
		delete(m, "prompt_token_ids")
		return nil
	}
	p := gjson.ParseBytes(m["prompt"])
	if p.IsArray() && len(p.Array()) == 1 {
		p = p.Array()[0]
	}
	if p.Type != gjson.String || m["prompt_token_ids"] != nil {
		return fmt.Errorf("%w: the prompt is token ids and the engine returned no generated ids", ErrNotMigratable)
	}
	b, _ := json.Marshal(p.Str + string(s.Text()))
	m["prompt"] = b
	return nil
}
