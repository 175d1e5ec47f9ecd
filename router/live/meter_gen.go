package live

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"
)

// MaxResponseID bounds the response ids a Meter takes (ResponseID): 256
// bytes; a longer id is ignored. vLLM's ids are "resp_" and 32 hex
// digits (ResponsesRequest.request_id,
// vllm/entrypoints/openai/responses/protocol.py).
const MaxResponseID = 256

// sseLine bounds the bytes of an SSE line an sseReader looks at: enough
// for the longest event name of either schema
// ("event: response.code_interpreter_call_code.delta").
const sseLine = 96

// eventKind is what an sseReader makes of an event, by its name.
type eventKind uint8

const (
	evOther     eventKind = iota // a lifecycle event: no token, nothing kept
	evToken                      // it carries generated tokens: one step of progress
	evCreated                    // Responses' response.created: the response's id
	evCompleted                  // Responses' final event: the response's usage (and id)
	evStart                      // Messages' message_start: the prompt's usage
	evMsgDelta                   // Messages' message_delta: the output's usage
	evStop                       // Messages' message_stop: the stream's end
)

// classify names the kind of the event name of a stream of schema api.
//
// Responses (OpenAI's streaming events, as vLLM emits them:
// vllm/entrypoints/openai/responses/protocol.py, StreamingResponsesResponse,
// each written "event: TYPE\ndata: JSON\n\n" by the API router): the
// events whose name ends ".delta" (response.output_text.delta,
// response.reasoning_text.delta, response.function_call_arguments.delta,
// ...) carry generated text; response.created carries the response (its
// id); response.completed, and response.incomplete and response.failed
// that end a stream in their place, carry its usage.
//
// Messages (Anthropic's streaming events, as vLLM's
// message_stream_converter writes them, "event: TYPE\ndata: JSON\n\n":
// vllm/entrypoints/anthropic/serving.py): content_block_delta carries
// generated text (text, thinking or tool input); message_start carries
// message.usage (input tokens), message_delta the final usage (output
// tokens).
func classify(api API, name string) eventKind {
	if api == APIResponses {
		switch {
		case strings.HasSuffix(name, ".delta"):
			return evToken
		case name == "response.created":
			return evCreated
		case name == "response.completed" || name == "response.incomplete" || name == "response.failed":
			return evCompleted
		}
		return evOther
	}
	switch name {
	case "content_block_delta":
		return evToken
	case "message_start":
		return evStart
	case "message_delta":
		return evMsgDelta
	case "message_stop":
		return evStop
	}
	return evOther
}

// sseReader reads a Responses or Messages stream as it passes, chunk by
// chunk, holding at most one line's first sseLine bytes and, while one of
// the events it reads is passing, that event's bytes (at most
// MaxUsageBody: a longer event is not read). It counts the events that
// carry tokens, and keeps the response's id and usage.
type sseReader struct {
	api   API
	line  [sseLine]byte
	lineN int // the current line's length (its first sseLine bytes in line)
	// kind of the current event (its event: line); named: it had one;
	// lines: it has had a line.
	kind         eventKind
	named, lines bool
	capturing    bool   // the current event's bytes are kept in capture
	over         bool   // the current event outgrew MaxUsageBody
	capture      []byte // the current event's lines after its event: line
	respID       string
	// The usage read so far: Responses' from its final event; Messages'
	// input side from message_start, its output (and input, when given)
	// from message_delta.
	usage usage
	// Messages' usage fields, as the events give them (-1: not given).
	in, cacheRead, cacheCreate, out int64
	// ended: the stream's final event passed (Responses' response.completed,
	// .incomplete or .failed; Messages' message_stop).
	ended bool
}

// newSSEReader returns the reader of a stream of schema api (APIResponses
// or APIMessages).
func newSSEReader(api API) *sseReader {
	return &sseReader{api: api, in: -1, cacheRead: -1, cacheCreate: -1, out: -1}
}

// read reads the next chunk and returns how many token-carrying events
// ended in it. Linear in the chunk.
func (r *sseReader) read(chunk []byte) (tokens int64) {
	start := 0 // where the captured bytes of this chunk begin
	for i, c := range chunk {
		switch c {
		case '\r':
			continue
		case '\n':
		default:
			if r.lineN < sseLine {
				r.line[r.lineN] = c
			}
			r.lineN++
			continue
		}
		if r.lineN == 0 { // a blank line: the event ends
			if r.capturing {
				r.keep(chunk[start:i])
				r.finish()
			}
			if r.kind == evToken || (!r.named && r.lines) {
				tokens++
			}
			if r.kind == evCompleted || r.kind == evStop {
				r.ended = true
			}
			r.kind, r.named, r.lines, r.capturing, r.over = evOther, false, false, false, false
			r.capture = r.capture[:0]
			continue
		}
		r.lines = true
		if name, ok := bytes.CutPrefix(r.line[:min(r.lineN, sseLine)], []byte("event:")); ok && !r.named {
			r.named = true
			r.kind = classify(r.api, string(bytes.TrimSpace(name)))
			if r.kind >= evCreated && r.kind != evStop && !(r.kind == evCreated && r.respID != "") {
				r.capturing, start = true, i+1
			}
		}
		r.lineN = 0
	}
	if r.capturing {
		r.keep(chunk[start:])
	}
	return tokens
}

// keep adds b to the current event's kept bytes, up to MaxUsageBody.
func (r *sseReader) keep(b []byte) {
	if r.over {
		return
	}
	if len(r.capture)+len(b) > MaxUsageBody {
		r.over, r.capture = true, nil
		return
	}
	r.capture = append(r.capture, b...)
}

// finish reads a kept event: its data lines (joined by "\n", as SSE
// joins them) as JSON.
func (r *sseReader) finish() {
	if r.over {
		return
	}
	var data []byte
	n := 0
	for line := range bytes.Lines(r.capture) {
		d, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		if !ok {
			continue
		}
		d = bytes.TrimPrefix(d, []byte(" "))
		if n == 0 {
			data = d
		} else {
			data = append(append(append([]byte(nil), data...), '\n'), d...)
		}
		n++
	}
	if len(data) == 0 || nesting(data, maxNesting) > maxNesting || !gjson.ValidBytes(data) {
		return
	}
	switch r.kind {
	case evCreated:
		r.respID = responseID(data, "response.id")
	case evCompleted:
		if r.respID == "" {
			r.respID = responseID(data, "response.id")
		}
		if u := responsesUsage(gjson.GetBytes(data, "response.usage")); u.ok {
			r.usage = u
		}
	case evStart:
		r.messagesFields(gjson.GetBytes(data, "message.usage"))
		r.usage = r.messagesUsage()
	case evMsgDelta:
		r.messagesFields(gjson.GetBytes(data, "usage"))
		r.usage = r.messagesUsage()
	}
}

// messagesFields takes the counts a Messages usage object gives.
func (r *sseReader) messagesFields(u gjson.Result) {
	if !u.IsObject() {
		return
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"input_tokens", &r.in}, {"cache_read_input_tokens", &r.cacheRead}, {"cache_creation_input_tokens", &r.cacheCreate}, {"output_tokens", &r.out}} {
		if v := u.Get(f.name); v.Type == gjson.Number {
			*f.dst = max(v.Int(), 0)
		}
	}
}

// messagesUsage is the usage of the Messages counts taken so far.
func (r *sseReader) messagesUsage() usage {
	return anthropicUsage(r.in, r.cacheRead, r.cacheCreate, r.out)
}

// responseID returns the string at path in the JSON body when it is a
// non-empty string of at most MaxResponseID bytes, else "".
func responseID(body []byte, path string) string {
	v := gjson.GetBytes(body, path)
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > MaxResponseID {
		return ""
	}
	return v.String()
}

// readGenUsage reads the usage of a non-streamed Responses or Messages
// answer (responsesUsage, messagesUsage); ok is false when the body is
// not strict JSON nested at most maxNesting levels, or has no usage
// object with a positive count.
func readGenUsage(body []byte, api API) usage {
	if nesting(body, maxNesting) > maxNesting || !gjson.ValidBytes(body) {
		return usage{}
	}
	u := gjson.GetBytes(body, "usage")
	if api == APIResponses {
		return responsesUsage(u)
	}
	return messagesUsage(u)
}

// responsesUsage maps a Responses usage object (vLLM's ResponseUsage,
// vllm/entrypoints/openai/responses/protocol.py; OpenAI's Responses
// reference, "usage") to usage: input_tokens is the prompt,
// input_tokens_details.cached_tokens the cached part of it,
// output_tokens the completion, total_tokens the total.
func responsesUsage(u gjson.Result) usage {
	if !u.IsObject() {
		return usage{}
	}
	out := usage{
		prompt:     max(u.Get("input_tokens").Int(), 0),
		cached:     max(u.Get("input_tokens_details.cached_tokens").Int(), 0),
		completion: max(u.Get("output_tokens").Int(), 0),
		total:      max(u.Get("total_tokens").Int(), 0),
	}
	out.ok = out.prompt > 0 || out.completion > 0 || out.total > 0
	out.hasCached = u.Get("input_tokens_details.cached_tokens").Type == gjson.Number
	in := u.Get("input_tokens")
	out.hasPrompt = in.Type == gjson.Number && in.Int() >= 0
	return out
}

// messagesUsage maps an Anthropic usage object (Anthropic's Messages
// reference, "usage"; vLLM's AnthropicUsage,
// vllm/entrypoints/anthropic/protocol.py) to usage. Anthropic counts the
// prompt in three parts, input_tokens being the part neither read from
// nor written to the cache: the prompt is input_tokens +
// cache_read_input_tokens + cache_creation_input_tokens, the cached part
// cache_read_input_tokens (reported: hasCached, only when the answer
// gives it; vLLM's gives input_tokens alone, the whole prompt), the
// completion output_tokens, the total their sum.
func messagesUsage(u gjson.Result) usage {
	if !u.IsObject() {
		return usage{}
	}
	count := func(name string) int64 {
		if v := u.Get(name); v.Type == gjson.Number {
			return max(v.Int(), 0)
		}
		return -1
	}
	return anthropicUsage(count("input_tokens"), count("cache_read_input_tokens"), count("cache_creation_input_tokens"), count("output_tokens"))
}

// anthropicUsage is messagesUsage of the four counts (-1: not given).
func anthropicUsage(in, read, create, output int64) usage {
	out := usage{cached: max(read, 0), completion: max(output, 0)}
	out.prompt = max(in, 0) + out.cached + max(create, 0)
	out.total = out.prompt + out.completion
	out.ok = out.prompt > 0 || out.completion > 0
	out.hasCached = read >= 0
	out.hasPrompt = in >= 0
	return out
}
