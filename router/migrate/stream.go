package migrate

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync/atomic"

	"github.com/tidwall/gjson"
)

// API is the schema of a migratable answer.
type API uint8

// The schemas a Stream reads.
const (
	// Chat is OpenAI's chat completions (/v1/chat/completions): each
	// chunk's choices[0].delta.content carries the generated text.
	Chat API = iota + 1
	// Completions is OpenAI's completions (/v1/completions): each
	// chunk's choices[0].text carries it.
	Completions
)

// MaxEvent bounds one SSE event a Stream holds while it waits for the
// event's end: 1 MiB. A longer event is passed on as it arrives and the
// answer stops being migratable (a cut then ends with an error event).
const MaxEvent = 1 << 20

// Budget is the router's account of the bytes every Stream keeps
// (Policy.TotalBytes); safe for concurrent use.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Used returns the bytes kept now.
func (b *Budget) Used() int64 { return b.used.Load() }

func (b *Budget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *Budget) give(n int64) { b.used.Add(-n) }

// Cut is a stream found cut by its content: an engine error event.
type Cut struct {
	Cause Cause
	// Event is the engine's error event, its data line's JSON, passed on
	// to the client when the request does not migrate.
	Event []byte
}

// Stream reads one streamed chat or completions answer as it passes
// from the engine to the client, across every attempt of the request: it
// passes complete SSE events only (a partial event is held until its
// blank line, so a cut never leaves half an event at the client), keeps
// what a continuation needs (choice 0's text so far, the token ids the
// engine returned with vLLM's return_token_ids, the prompt's token ids)
// within Policy.MaxBytes and the router's Budget, and notes the answer's
// end (finish_reason, "data: [DONE]"). On a continuation's answer it
// makes the stream read as one: the chat role chunk is not repeated,
// every chunk carries the first attempt's id, and the usage chunk counts
// the whole answer. Not safe for concurrent use; Close returns what it
// kept to the budget.
//
// Event shapes follow vLLM's OpenAI server (ChatCompletionStreamResponse
// and CompletionStreamResponse in vllm/entrypoints/openai/protocol.py:
// "prompt_token_ids" at the top of a chat stream's first chunk and in a
// completions stream's first choice, "token_ids" in each choice), and
// OpenAI's chunk objects otherwise.
type Stream struct {
	api    API
	pol    Policy
	budget *Budget
	// strip: the router asked the engine for token ids the client did not
	// ask for; they are removed from what the client sees.
	strip bool
	// usage: the client asked for the usage chunk
	// (stream_options.include_usage).
	usage bool

	pend []byte // the event being received

	text      []byte
	ids       []int64
	promptIDs []int64
	held      int64 // bytes taken from budget
	keep      bool  // still keeping (within the bounds)
	why       Outcome
	// tokens counts the generated tokens: token ids where every content
	// chunk carried them, else one per content chunk (vLLM sends one
	// chunk per engine step, one token each without speculation).
	events   int
	idsEvery bool
	id       string // the first chunk's id
	finished bool
	done     bool
	// usageSeen: a usage chunk passed; usedUp: the answer was cut with
	// every token max_tokens allowed generated (UsedUp).
	usageSeen bool
	usedUp    bool
	other     string // why the answer cannot be continued ("": it can)

	// Of the attempt being read.
	cont       bool  // it continues an earlier attempt
	before     int   // tokens generated before this attempt
	promptBase int64 // the original prompt's tokens, -1 when unknown
	sawRole    bool
}

// NewStream returns a Stream of api under pol; strip: the router added
// return_token_ids to the request, which the client did not ask for;
// usage: the client asked for the usage chunk.
func NewStream(api API, pol Policy, budget *Budget, strip, usage bool) *Stream {
	return &Stream{api: api, pol: pol, budget: budget, strip: strip, usage: usage, keep: true, idsEvery: true, promptBase: -1}
}

// Close gives back what the stream kept; idempotent.
func (s *Stream) Close() {
	if s.held > 0 && s.budget != nil {
		s.budget.give(s.held)
	}
	s.held, s.text, s.ids, s.promptIDs = 0, nil, nil, nil
	s.keep = false
}

// Done reports whether the stream's terminator ("data: [DONE]") passed.
func (s *Stream) Done() bool { return s.done }

// Finished reports whether choice 0's finish_reason passed: the answer
// ended, whatever followed.
func (s *Stream) Finished() bool { return s.finished }

// Tokens returns the tokens generated so far, over every attempt.
func (s *Stream) Tokens() int {
	if s.idsEvery && len(s.ids) > 0 {
		return len(s.ids)
	}
	return s.events
}

// Text returns choice 0's text so far (nil once not kept).
func (s *Stream) Text() []byte { return s.text }

// IDs returns the generated token ids so far when the engine returned
// every one, else nil.
func (s *Stream) IDs() []int64 {
	if s.idsEvery && s.keep {
		return s.ids
	}
	return nil
}

// PromptIDs returns the prompt's token ids when the engine returned them.
func (s *Stream) PromptIDs() []int64 { return s.promptIDs }

// Migratable reports whether a cut now could continue, and the outcome
// when it could not (TooLong, NotMigratable).
func (s *Stream) Migratable() (bool, Outcome) {
	switch {
	case s.other != "":
		return false, NotMigratable
	case !s.keep:
		return false, s.why
	}
	return true, Migrated
}

// Reason says why the answer cannot be continued, "" when it can.
func (s *Stream) Reason() string {
	if s.other != "" {
		return s.other
	}
	if !s.keep {
		return "the answer so far is over the migration bounds"
	}
	return ""
}

// Continue starts the reading of a continuation's answer: its chunks
// continue the stream (Feed). promptTokens is the original prompt's
// token count when known (the first attempt's prompt_token_ids; else
// -1: the usage chunk's prompt_tokens is the continuation's less the
// tokens generated before).
func (s *Stream) Continue() {
	s.pend = s.pend[:0]
	s.cont, s.before, s.sawRole = true, s.Tokens(), false
	if s.promptIDs != nil {
		s.promptBase = int64(len(s.promptIDs))
	}
}

// Feed reads the next chunk of the engine's answer and appends to out
// what goes to the client: every SSE event the chunk completes, rewritten
// as the stream needs. cut is non-nil when an event reports an engine
// failure (a server-side error event): the event is not passed on, and
// what follows it is dropped. Linear in the chunk.
func (s *Stream) Feed(chunk, out []byte) ([]byte, *Cut) {
	for len(chunk) > 0 {
		if s.other == errEventTooLong {
			return append(out, chunk...), nil
		}
		// An event ends at a blank line: "\n\n" (or "\r\n\r\n").
		start := len(s.pend)
		s.pend = append(s.pend, chunk...)
		chunk = nil
		from := max(start-3, 0)
		for {
			end := eventEnd(s.pend, from)
			if end < 0 {
				break
			}
			ev := s.pend[:end]
			var cut *Cut
			out, cut = s.event(ev, out)
			rest := s.pend[end:]
			if cut != nil {
				s.pend = s.pend[:0]
				return out, cut
			}
			s.pend = append(s.pend[:0], rest...)
			from = 0
		}
		if len(s.pend) > MaxEvent {
			// Too long to hold: pass it on and stop reading events.
			out = append(out, s.pend...)
			s.pend = s.pend[:0]
			s.other = errEventTooLong
		}
	}
	return out, nil
}

const errEventTooLong = "an event of the answer is over 1 MiB"

// Pending reports whether part of an event is held (an answer ending
// now ends mid-event).
func (s *Stream) Pending() bool { return len(bytes.TrimSpace(s.pend)) > 0 }

// eventEnd returns the end (past the blank line) of the first event in
// b, searching from from; -1 when b holds no whole event.
func eventEnd(b []byte, from int) int {
	for i := from; i+1 < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if b[i+1] == '\n' {
			return i + 2
		}
		if b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// dataOf returns the data of an SSE event: its "data:" lines' values
// joined (the common case, one line, without a copy); nil when it has
// none.
func dataOf(ev []byte) []byte {
	var data []byte
	n := 0
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		if n == 0 {
			data = v
		} else {
			if n == 1 {
				data = append([]byte(nil), data...)
			}
			data = append(append(data, '\n'), v...)
		}
		n++
	}
	return data
}

var doneData = []byte("[DONE]")

// event reads one whole event and appends what the client gets of it.
func (s *Stream) event(ev, out []byte) ([]byte, *Cut) {
	data := dataOf(ev)
	if data == nil {
		return append(out, ev...), nil // a comment, a keep-alive
	}
	if bytes.Equal(bytes.TrimSpace(data), doneData) {
		s.done = true
		return append(out, ev...), nil
	}
	if !gjson.ValidBytes(data) {
		return append(out, ev...), nil
	}
	if e := gjson.GetBytes(data, "error"); e.Exists() || gjson.GetBytes(data, "object").Str == "error" {
		if serverSide(data) {
			return out, &Cut{Cause: CauseEngineError, Event: append([]byte(nil), data...)}
		}
		return append(out, ev...), nil
	}
	rewrite := s.strip || s.cont
	if u := gjson.GetBytes(data, "usage"); u.IsObject() {
		s.usageSeen = true
	}
	if s.id == "" {
		s.id = gjson.GetBytes(data, "id").Str
	}
	if !s.cont {
		s.readPrompt(data)
	}
	choices := gjson.GetBytes(data, "choices")
	if choices.IsArray() {
		n := 0
		skip := false
		choices.ForEach(func(_, c gjson.Result) bool {
			n++
			if n > 1 || c.Get("index").Int() != 0 {
				s.other = "the answer has several choices"
				return false
			}
			skip = s.choice(c)
			return true
		})
		if skip {
			return out, nil
		}
	}
	if !rewrite {
		return append(out, ev...), nil
	}
	return s.rewrite(data, out), nil
}

// serverSide reports whether an error event is the engine's failure
// (a code of 500 or more, or none; vLLM's ErrorInfo.code is the HTTP
// status) rather than the request's.
func serverSide(data []byte) bool {
	code := gjson.GetBytes(data, "error.code")
	if !code.Exists() {
		code = gjson.GetBytes(data, "code")
	}
	if code.Type == gjson.Number {
		return code.Int() >= 500
	}
	return true
}

// readPrompt keeps a first attempt's prompt token ids (vLLM: the chat
// chunk's top-level prompt_token_ids, the completions choice's).
func (s *Stream) readPrompt(data []byte) {
	if s.promptIDs != nil {
		return
	}
	p := gjson.GetBytes(data, "prompt_token_ids")
	if !p.IsArray() {
		p = gjson.GetBytes(data, "choices.0.prompt_token_ids")
	}
	if !p.IsArray() {
		return
	}
	ids := make([]int64, 0, 64)
	p.ForEach(func(_, v gjson.Result) bool {
		ids = append(ids, v.Int())
		return true
	})
	if s.account(int64(8 * len(ids))) {
		s.promptIDs = ids
	}
}

// choice reads choice 0 of a chunk; skip: the chunk is not passed on (a
// continuation's repeated chat role chunk).
func (s *Stream) choice(c gjson.Result) (skip bool) {
	var text gjson.Result
	if s.api == Chat {
		d := c.Get("delta")
		if d.Get("tool_calls").Exists() || d.Get("function_call").Exists() {
			s.other = "the answer calls tools"
		}
		if r := d.Get("reasoning_content"); r.Exists() && r.Str != "" {
			s.other = "the answer carries reasoning content"
		}
		if r := d.Get("reasoning"); r.Exists() && r.Str != "" {
			s.other = "the answer carries reasoning content"
		}
		text = d.Get("content")
		if d.Get("role").Exists() {
			if fr := c.Get("finish_reason"); s.cont && text.Str == "" && fr.Type == gjson.Null && len(c.Get("token_ids").Array()) == 0 {
				return true
			}
			s.sawRole = true
		}
	} else {
		text = c.Get("text")
	}
	ids := c.Get("token_ids")
	content := text.Str != "" || (ids.IsArray() && len(ids.Array()) > 0)
	if content {
		s.events++
		s.keepText(text.Str)
		if ids.IsArray() {
			s.keepIDs(ids)
		} else {
			s.idsEvery = false
		}
	}
	if fr := c.Get("finish_reason"); fr.Exists() && fr.Type != gjson.Null {
		s.finished = true
	}
	return false
}

func (s *Stream) keepText(t string) {
	if !s.keep || t == "" {
		return
	}
	if s.account(int64(len(t))) {
		s.text = append(s.text, t...)
	}
}

func (s *Stream) keepIDs(ids gjson.Result) {
	ids.ForEach(func(_, v gjson.Result) bool {
		if s.keep && s.account(8) {
			s.ids = append(s.ids, v.Int())
		}
		return true
	})
}

// account takes n more bytes for what is kept, within MaxBytes and the
// budget; false (and keeping stops) when it cannot.
func (s *Stream) account(n int64) bool {
	if !s.keep {
		return false
	}
	if s.held+n > int64(s.pol.MaxBytes) || s.Tokens() > s.pol.MaxTokens || (s.budget != nil && !s.budget.take(n)) {
		s.Close()
		s.keep, s.why = false, TooLong
		return false
	}
	s.held += n
	return true
}

// rewrite appends the client's version of a chunk with data: without the
// token ids the router asked for, with the first attempt's id, and a
// continuation's usage counting the whole answer.
func (s *Stream) rewrite(data, out []byte) []byte {
	b := data
	if s.strip {
		b = remove(b, "choices.0.token_ids")
		b = remove(b, "choices.0.prompt_token_ids")
		b = remove(b, "prompt_token_ids")
	}
	if s.cont {
		if !s.strip {
			// The client asked for the ids: it had the prompt's already.
			b = remove(b, "choices.0.prompt_token_ids")
			b = remove(b, "prompt_token_ids")
		}
		if s.id != "" {
			b = replace(b, "id", strconv.Quote(s.id))
		}
		if u := gjson.GetBytes(b, "usage"); u.IsObject() {
			b = replace(b, "usage", s.wholeUsage(u))
		}
	}
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// wholeUsage is a continuation's usage counted for the whole answer: the
// original prompt, every generated token.
func (s *Stream) wholeUsage(u gjson.Result) string {
	prompt := u.Get("prompt_tokens").Int()
	completion := u.Get("completion_tokens").Int()
	orig := s.promptBase
	if orig < 0 {
		orig = max(prompt-int64(s.before), 0)
	}
	completion += int64(s.before)
	b := []byte(`{"prompt_tokens":`)
	b = strconv.AppendInt(b, orig, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, orig+completion, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, completion, 10)
	if c := u.Get("prompt_tokens_details.cached_tokens"); c.Exists() {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, min(c.Int(), orig), 10)
		b = append(b, '}')
	}
	return string(append(b, '}'))
}

// remove returns b without the member at path (b itself when it has
// none; a copy otherwise).
func remove(b []byte, path string) []byte {
	r := gjson.GetBytes(b, path)
	if !r.Exists() || r.Index <= 0 {
		return b
	}
	// Back from the value over `"key"\s*:\s*`.
	i := r.Index - 1
	for i >= 0 && isSpace(b[i]) {
		i--
	}
	if i < 0 || b[i] != ':' {
		return b
	}
	i--
	for i >= 0 && isSpace(b[i]) {
		i--
	}
	if i < 0 || b[i] != '"' {
		return b
	}
	i--
	for i >= 0 && !(b[i] == '"' && (i == 0 || b[i-1] != '\\')) {
		i--
	}
	if i < 0 {
		return b
	}
	start, end := i, r.Index+len(r.Raw)
	// The comma before (or, for a first member, after) goes too.
	j := start - 1
	for j >= 0 && isSpace(b[j]) {
		j--
	}
	if j >= 0 && b[j] == ',' {
		start = j
	} else {
		k := end
		for k < len(b) && isSpace(b[k]) {
			k++
		}
		if k < len(b) && b[k] == ',' {
			end = k + 1
		}
	}
	c := make([]byte, 0, len(b)-(end-start))
	return append(append(c, b[:start]...), b[end:]...)
}

// replace returns b with the value at path replaced by raw (b when it
// has none).
func replace(b []byte, path, raw string) []byte {
	r := gjson.GetBytes(b, path)
	if !r.Exists() || r.Index <= 0 {
		return b
	}
	c := make([]byte, 0, len(b)-len(r.Raw)+len(raw))
	c = append(c, b[:r.Index]...)
	c = append(c, raw...)
	return append(c, b[r.Index+len(r.Raw):]...)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// UsedUp records that the answer had generated every token its
// max_tokens allowed when it was cut (migrate.ErrNothingLeft): EndEvents
// then ends it with finish_reason "length".
func (s *Stream) UsedUp() { s.usedUp = true }

// EndEvents returns the events that end a cut stream whose answer had
// ended (Finished, or UsedUp): for UsedUp a last chunk with
// finish_reason "length" (of model, created at the Unix time created),
// then, when the client asked for usage and none passed and the prompt's
// token count is known (the engine returned its ids), the usage chunk,
// then "data: [DONE]". Nothing is sent to an engine again.
func (s *Stream) EndEvents(model string, created int64) []byte {
	var b []byte
	head := func() {
		b = append(b, `data: {"id":`...)
		b = strconv.AppendQuote(b, s.id)
		if s.api == Chat {
			b = append(b, `,"object":"chat.completion.chunk","created":`...)
		} else {
			b = append(b, `,"object":"text_completion","created":`...)
		}
		b = strconv.AppendInt(b, created, 10)
		b = append(b, `,"model":`...)
		b = strconv.AppendQuote(b, model)
	}
	if s.usedUp && !s.finished {
		head()
		if s.api == Chat {
			b = append(b, `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
		} else {
			b = append(b, `,"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
		}
	}
	if s.usage && !s.usageSeen && s.promptIDs != nil {
		head()
		p, c := int64(len(s.promptIDs)), int64(s.Tokens())
		b = append(b, `,"choices":[],"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, p, 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, p+c, 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, c, 10)
		b = append(b, "}}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

// Event returns the SSE event whose data is data (one line: JSON as the
// engines send it); nil for nil.
func Event(data []byte) []byte {
	if data == nil {
		return nil
	}
	b := make([]byte, 0, len(data)+8)
	b = append(b, "data: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// ErrorEvent returns the error event the router sends in a stream it
// cannot continue: OpenAI's error object, as vLLM sends one mid-stream
// ({"error": {"message", "type", "param", "code"}}).
func ErrorEvent(msg, typ, code string) []byte {
	b := []byte(`data: {"error":{"message":`)
	b = strconv.AppendQuote(b, msg)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = strconv.AppendQuote(b, code)
	return append(b, "}}\n\n"...)
}

// WithDone returns events followed by the stream's terminator.
func WithDone(events []byte) []byte { return append(events, "data: [DONE]\n\n"...) }

// EngineErrorEvent returns an engine's error answer body (a refused
// continuation's) as an event of the stream, compacted to one line; nil
// when the body is not a JSON object.
func EngineErrorEvent(body []byte) []byte {
	var c bytes.Buffer
	if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() || json.Compact(&c, body) != nil {
		return nil
	}
	return Event(c.Bytes())
}
