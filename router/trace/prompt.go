package trace

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/tidwall/gjson"

	"github.com/switchyard-router/switchyard/router/apiconv"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// A JSONL trace line may carry a request's prompt in place of its
// input_length and hash_ids: a line with an "input" field is an OpenAI
// Responses request, one with a "messages" field an Anthropic Messages
// request, beside the line's "timestamp" (ms, required), optional
// "output_length" (else the request's max_output_tokens or max_tokens)
// and the optional classifier fields (priority, policy_class,
// session_id). The prompt is rendered as router/live keys the request:
// the chat messages vLLM builds from it (router/apiconv, which cites the
// vLLM source it follows) and its tools, rendered by
// prefix.RenderChatTools (a tools line, then per message its role and
// content, and its tool calls, tool call id and reasoning when set). Its
// input_length is the rendering's length in tokens at prefix.DefaultCharsPerToken bytes a token, rounded up, and its
// hash_ids are the rendering's blocks of MooncakeBlockTokens tokens
// (MooncakeBlockTokens·DefaultCharsPerToken bytes), chained, the last
// partial block included: so two lines share their leading ids exactly as
// far as their renderings share whole blocks, and a conversation's later
// turn extends its earlier turns' ids.

// promptBlockBytes is the bytes of rendered prompt one hash id covers.
const promptBlockBytes = MooncakeBlockTokens * prefix.DefaultCharsPerToken

// promptShape reports whether a JSONL trace line carries a prompt, and
// whether as a Responses request (else Messages).
func promptShape(b []byte) (carries, responses bool) {
	// Most lines are Mooncake's: not looked at further.
	if !bytes.Contains(b, []byte(`"input"`)) && !bytes.Contains(b, []byte(`"messages"`)) {
		return false, false
	}
	if apiconv.TooDeep(b) || !gjson.ValidBytes(b) {
		return false, false
	}
	v := gjson.ParseBytes(b)
	if !v.IsObject() {
		return false, false
	}
	if v.Get("input").Exists() {
		return true, true
	}
	return v.Get("messages").Exists(), false
}

// decodePromptLine reads a line promptShape found to carry a prompt into
// the Mooncake line it stands for.
func decodePromptLine(b []byte, responses bool) (*mooncakeLine, error) {
	var (
		req *apiconv.Request
		err error
	)
	if responses {
		req, err = apiconv.Responses(b)
	} else {
		req, err = apiconv.AnthropicPrompt(b)
	}
	if err != nil {
		return nil, err
	}
	v := gjson.ParseBytes(b)
	for _, f := range []string{"input_length", "hash_ids"} {
		if v.Get(f).Exists() {
			return nil, fmt.Errorf("a line with a prompt has no %q: it comes from the prompt", f)
		}
	}
	var l mooncakeLine
	count := func(name string) (*int64, error) {
		r := v.Get(name)
		if !r.Exists() || r.Type == gjson.Null {
			return nil, nil
		}
		n, err := parseCount([]byte(r.Raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if n > math.MaxInt64 {
			return nil, fmt.Errorf("%s: %d out of range", name, n)
		}
		x := int64(n)
		return &x, nil
	}
	if l.Timestamp, err = count("timestamp"); err != nil {
		return nil, err
	}
	if l.Timestamp == nil {
		return nil, errors.New(`missing or null field "timestamp"`)
	}
	if *l.Timestamp > maxMillis {
		return nil, fmt.Errorf("timestamp %d ms %w", *l.Timestamp, ErrDurationOverflow)
	}
	if l.OutputLength, err = count("output_length"); err != nil {
		return nil, err
	}
	if l.OutputLength == nil {
		if req.MaxTokens <= 0 {
			return nil, errors.New(`missing field "output_length" (or the request's max_output_tokens or max_tokens)`)
		}
		l.OutputLength = &req.MaxTokens
	}
	if p := v.Get("priority"); p.Exists() && p.Type != gjson.Null {
		if p.Type != gjson.Number || p.Float() != float64(p.Int()) {
			return nil, fmt.Errorf("priority %s, want an integer", p.Raw)
		}
		n := p.Int()
		l.Priority = &n
	}
	for _, f := range []struct {
		name string
		dst  **string
	}{{"policy_class", &l.PolicyClass}, {"session_id", &l.SessionID}} {
		if r := v.Get(f.name); r.Exists() && r.Type != gjson.Null {
			if r.Type != gjson.String {
				return nil, fmt.Errorf("%s %s, want a string", f.name, r.Raw)
			}
			s := r.String()
			*f.dst = &s
		}
	}
	msgs := make([]prefix.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = prefix.ChatMessage{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID,
			ToolCalls: m.ToolCalls, Reasoning: m.Reasoning, HasReasoning: m.HasReasoning}
	}
	// The tools and tool calls too, as router serve keys the request
	// (router/live's renderMessages): an agentic trace's prompts are as
	// long, and share prefixes, as the engine renders them.
	text := prefix.RenderChatTools(req.Tools, msgs)
	in := int64(prefix.EstimateTokens(text, prefix.DefaultCharsPerToken))
	l.InputLength = &in
	ids := promptHashIDs(text)
	l.HashIDs = &ids
	return &l, nil
}

// promptHashIDs returns the chained hashes of text's blocks of
// promptBlockBytes bytes, a trailing partial block included: prefix's
// TextBlocks for the full blocks, then the partial block's FNV-1a 64
// chained on.
func promptHashIDs(text string) []hashID {
	full := prefix.TextBlocks(text, MooncakeBlockTokens, prefix.DefaultCharsPerToken)
	ids := make([]hashID, 0, len(full)+1)
	var h uint64
	for _, x := range full {
		ids = append(ids, hashID(x))
		h = x
	}
	if rest := text[len(full)*promptBlockBytes:]; rest != "" {
		id := uint64(14695981039346656037) // FNV-1a 64
		for i := 0; i < len(rest); i++ {
			id = (id ^ uint64(rest[i])) * 1099511628211
		}
		ids = append(ids, hashID(prefix.ChainHash(h, id)))
	}
	return ids
}
