package migrate

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"sync/atomic"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"
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
	// ask for; the client sees them null, as vLLM sends them unasked.
	strip bool
	// usage: the client asked for the usage chunk
	// (stream_options.include_usage).
	usage bool

	pend []byte // the event being received

	text      []byte
	ids       []int32 // token ids: every vocabulary in use fits (tokenID)
	promptIDs []int32
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
	// skipping: an event over MaxEvent is being passed on unread;
	// skipNL: its last byte so far ended a line.
	skipping, skipNL bool
	// off: migration is off (Policy.Limit 0).
	off bool
	// passed counts the events passed to the client; roleSent: a chat
	// chunk with the role passed.
	passed   int
	roleSent bool
	// keepRole: the chunk being read carries the client's first role.
	keepRole bool
	// usageSeen: a usage chunk passed; usedUp: the answer was cut with
	// every token max_tokens allowed generated (UsedUp).
	usageSeen bool
	usedUp    bool
	other     string // why the answer cannot be continued ("": it can)

	// Of the attempt being read.
	cont       bool  // it continues an earlier attempt
	before     int   // tokens generated before this attempt
	promptBase int64 // the original prompt's tokens, -1 when unknown
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
func (s *Stream) IDs() []int32 {
	if s.idsEvery && s.keep {
		return s.ids
	}
	return nil
}

// PromptIDs returns the prompt's token ids when the engine returned them.
func (s *Stream) PromptIDs() []int32 { return s.promptIDs }

// Migratable reports whether a cut now could continue, and the outcome
// when it could not (TooLong, NotMigratable).
func (s *Stream) Migratable() (bool, Outcome) {
	switch {
	case s.off:
		return false, OverLimit
	case s.other != "":
		return false, NotMigratable
	case !s.keep:
		return false, s.why
	}
	return true, Migrated
}

// Reason says why the answer cannot be continued, "" when it can.
func (s *Stream) Reason() string {
	if s.off {
		return "migration is off (migration limit 0)"
	}
	if s.other != "" {
		return s.other
	}
	if !s.keep {
		return "the answer so far is over the migration bounds"
	}
	return ""
}

// Continue starts the reading of the next attempt's answer: its chunks
// continue the stream (Feed). When no event had reached the client the
// attempt simply starts the stream (the answer is read as a first one);
// else it continues it: a chat role chunk the client had is not
// repeated, every chunk carries the first attempt's id, and the usage
// chunk counts the whole answer: the original prompt (its token ids'
// count when the engine gave them, else the continuation's prompt less
// the tokens generated before) and every generated token.
func (s *Stream) Continue() {
	s.pend, s.skipping = s.pend[:0], false
	if s.passed == 0 {
		s.id = ""
		return
	}
	s.cont, s.before = true, s.Tokens()
	if s.promptIDs != nil {
		s.promptBase = int64(len(s.promptIDs))
	}
}

// Feed reads the next chunk of the engine's answer and appends to out
// what goes to the client: every SSE event the chunk completes, rewritten
// as the stream needs. cut is non-nil when an event reports an engine
// failure (a server-side error event): the event is not passed on, and
// what follows it is dropped. An event longer than MaxEvent is passed on
// as it arrives, unread (the answer is then not migratable), and events
// are read again after its end. Linear in the chunk: each event is
// copied once, the held rest once per chunk.
func (s *Stream) Feed(chunk, out []byte) ([]byte, *Cut) {
	if s.skipping {
		n, ended := s.skipEvent(chunk)
		out = append(out, chunk[:n]...)
		if !ended {
			return out, nil
		}
		s.skipping = false
		chunk = chunk[n:]
	}
	if len(chunk) == 0 {
		return out, nil
	}
	// An event ends at a blank line: "\n\n" (or "\r\n\r\n").
	start := len(s.pend)
	s.pend = append(s.pend, chunk...)
	at, from := 0, max(start-3, 0)
	for {
		end := eventEnd(s.pend, max(from, at))
		if end < 0 {
			break
		}
		var cut *Cut
		out, cut = s.event(s.pend[at:end], out)
		if cut != nil {
			s.pend = s.pend[:0]
			return out, cut
		}
		at = end
	}
	rest := s.pend[at:]
	if len(rest) > MaxEvent {
		// Too long to hold: pass on what arrived and the rest of the
		// event as it comes.
		out = append(out, rest...)
		s.pend = s.pend[:0]
		s.other, s.skipping, s.skipNL = errEventTooLong, true, rest[len(rest)-1] == '\n'
		return out, nil
	}
	s.pend = s.pend[:copy(s.pend, rest)]
	return out, nil
}

// skipEvent finds the end of the over-long event being passed on in
// chunk: the bytes up to and including its blank line, and whether it
// ended there.
func (s *Stream) skipEvent(chunk []byte) (int, bool) {
	for i, c := range chunk {
		switch c {
		case '\n':
			if s.skipNL {
				return i + 1, true
			}
			s.skipNL = true
		case '\r':
		default:
			s.skipNL = false
		}
	}
	return len(chunk), false
}

const errEventTooLong = "an event of the answer is over 1 MiB"

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

var (
	doneData = []byte("[DONE]")
	doneLine = []byte("\n[DONE]")
)

// parsers parse the events' JSON (fastjson: no allocation once warm).
var parsers fastjson.ParserPool

// event reads one whole event and appends what the client gets of it.
func (s *Stream) event(ev, out []byte) ([]byte, *Cut) {
	data := dataOf(ev)
	if data == nil {
		return append(out, ev...), nil // a comment, a keep-alive
	}
	s.passed++
	if t := bytes.TrimSpace(data); bytes.Equal(t, doneData) || bytes.HasSuffix(t, doneLine) {
		// The terminator (also as the last data line of an event that
		// holds others: an engine that leaves out the blank lines).
		s.done = true
		return append(out, ev...), nil
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(data)
	if err != nil || v.Type() != fastjson.TypeObject {
		// Passed on as the engine sent it; what it held is unknown, so
		// the answer cannot be continued without repeating or losing it.
		s.other = "the engine sent an event that is not a JSON object"
		return append(out, ev...), nil
	}
	if e := v.Get("error"); e != nil || string(v.GetStringBytes("object")) == "error" {
		if serverSide(v) {
			return out, &Cut{Cause: CauseEngineError, Event: append([]byte(nil), data...)}
		}
		return append(out, ev...), nil
	}
	if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		s.usageSeen = true
	}
	if s.id == "" {
		s.id = string(v.GetStringBytes("id"))
	}
	choices := v.GetArray("choices")
	if !s.cont {
		s.readPrompt(v, choices)
	}
	for i, c := range choices {
		if i > 0 || c.GetInt("index") != 0 {
			s.other = "the answer has several choices"
			break
		}
		if s.choice(c) {
			s.passed--
			return out, nil
		}
	}
	switch {
	case s.cont:
		return s.rewrite(data, out), nil
	case s.strip:
		out = append(out, "data: "...)
		out = appendNulled(out, data, tokenIDsKey, promptIDsKey)
		return append(out, "\n\n"...), nil
	}
	return append(out, ev...), nil
}

// serverSide reports whether an error event is the engine's failure
// (a code of 500 or more, or none; vLLM's ErrorInfo.code is the HTTP
// status) rather than the request's.
func serverSide(v *fastjson.Value) bool {
	code := v.Get("error", "code")
	if code == nil {
		code = v.Get("code")
	}
	switch {
	case code != nil && code.Type() == fastjson.TypeNumber:
		return code.GetInt() >= 500
	case code != nil && code.Type() == fastjson.TypeString:
		// A status as a string ("400"); a name ("invalid_value") says
		// nothing of the side.
		if n, err := strconv.Atoi(string(code.GetStringBytes())); err == nil {
			return n >= 500
		}
	}
	return true
}

// readPrompt keeps a first attempt's prompt token ids (vLLM: the chat
// chunk's top-level prompt_token_ids, the completions choice's).
func (s *Stream) readPrompt(v *fastjson.Value, choices []*fastjson.Value) {
	if s.promptIDs != nil {
		return
	}
	ids := v.GetArray("prompt_token_ids")
	if ids == nil && len(choices) > 0 {
		ids = choices[0].GetArray("prompt_token_ids")
	}
	if ids == nil {
		return
	}
	if !s.account(int64(4 * len(ids))) {
		return
	}
	s.promptIDs = make([]int32, len(ids))
	for i, id := range ids {
		s.promptIDs[i] = s.tokenID(id)
	}
}

// tokenID reads a token id; one that is not a number from 0 to 2^31-1
// (no vocabulary has more) makes the answer not migratable.
func (s *Stream) tokenID(v *fastjson.Value) int32 {
	n, err := v.Int64()
	if err != nil || n < 0 || n > math.MaxInt32 {
		s.other = "the engine returned a token id that is not one"
		return 0
	}
	return int32(n)
}

// choice reads choice 0 of a chunk; skip: the chunk is not passed on (a
// continuation's repeated chat role chunk).
func (s *Stream) choice(c *fastjson.Value) (skip bool) {
	var text []byte
	if s.api == Chat {
		d := c.Get("delta")
		if d.Exists("tool_calls") || d.Exists("function_call") {
			s.other = "the answer calls tools"
		}
		if len(d.GetStringBytes("reasoning_content")) > 0 || len(d.GetStringBytes("reasoning")) > 0 {
			s.other = "the answer carries reasoning content"
		}
		text = d.GetStringBytes("content")
		if d.Exists("role") {
			fr := c.Get("finish_reason")
			if s.cont && s.roleSent && len(text) == 0 && (fr == nil || fr.Type() == fastjson.TypeNull) && len(c.GetArray("token_ids")) == 0 {
				return true // the client had the role
			}
			s.keepRole = !s.roleSent
			s.roleSent = true
		}
	} else {
		text = c.GetStringBytes("text")
	}
	ids := c.GetArray("token_ids")
	if len(text) > 0 || len(ids) > 0 {
		s.events++
		s.keepText(text)
		if ids != nil {
			s.keepIDs(ids)
		} else {
			s.idsEvery = false
		}
	}
	if fr := c.Get("finish_reason"); fr != nil && fr.Type() != fastjson.TypeNull {
		s.finished = true
	}
	return false
}

// keepText keeps t, choice 0's next text, for a continuation: not when
// the answer cannot continue (s.other: migration off, several choices...),
// which would only take from the budget.
func (s *Stream) keepText(t []byte) {
	if !s.keep || s.off || s.other != "" || len(t) == 0 {
		return
	}
	if s.account(int64(len(t))) {
		s.text = append(s.text, t...)
	}
}

func (s *Stream) keepIDs(ids []*fastjson.Value) {
	if !s.keep || !s.account(int64(4*len(ids))) {
		return
	}
	for _, v := range ids {
		s.ids = append(s.ids, s.tokenID(v))
	}
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

// The keys of the token ids the router asks for (vLLM's
// return_token_ids).
var (
	tokenIDsKey  = []byte(`"token_ids"`)
	promptIDsKey = []byte(`"prompt_token_ids"`)
)

// appendNulled appends the JSON object data to out with the values of
// the members whose keys are keys (the first of each, at any depth) made
// null: what vLLM sends for them when the client did not ask for token
// ids ("token_ids": null in every choice, "prompt_token_ids": null in
// the first chunk). In valid JSON a key's quoted name with its quotes
// unescaped appears only as a key (a quote inside a string is escaped),
// so a byte search finds it; its value is skipped by its brackets and
// strings. Linear in data.
func appendNulled(out, data []byte, keys ...[]byte) []byte {
	type span struct{ from, to int }
	var cuts [2]span
	n := 0
	for _, k := range keys {
		i := bytes.Index(data, k)
		if i < 0 || n == len(cuts) {
			continue
		}
		from, to, ok := valueSpan(data, i, len(k))
		if ok && string(data[from:to]) != "null" {
			cuts[n] = span{from, to}
			n++
		}
	}
	if n == 2 && cuts[1].from < cuts[0].from {
		cuts[0], cuts[1] = cuts[1], cuts[0]
	}
	at := 0
	for _, c := range cuts[:n] {
		if c.from < at {
			continue // overlapping: cannot happen for distinct keys
		}
		out = append(out, data[at:c.from]...)
		out = append(out, "null"...)
		at = c.to
	}
	return append(out, data[at:]...)
}

// valueSpan returns the span of the value of the member whose key starts
// at i (klen bytes, quotes included); ok false when what follows is not
// ': value'.
func valueSpan(b []byte, i, klen int) (from, to int, ok bool) {
	j := skipSpace(b, i+klen)
	if j >= len(b) || b[j] != ':' {
		return 0, 0, false
	}
	from = skipSpace(b, j+1)
	to, ok = skipValue(b, from)
	return from, to, ok
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at i.
func skipValue(b []byte, i int) (int, bool) {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1, i < len(b)
			}
		case '[', '{':
			depth++
		case ']', '}':
			depth--
			if depth == 0 {
				return i + 1, true
			}
			if depth < 0 {
				return i, true // a scalar ended by its container
			}
		case ',':
			if depth == 0 {
				return i, true
			}
		default:
			if depth == 0 && isSpace(c) {
				return i, true
			}
		}
	}
	return i, depth == 0
}

// rewrite appends a continuation's chunk with data as the client gets
// it: the prompt's ids null (the client had them from the first
// attempt), the token ids the router asked for null, the first
// attempt's id, and its usage counting the whole answer.
func (s *Stream) rewrite(data, out []byte) []byte {
	b := data
	if s.strip {
		b = nulled(b, "choices.0.token_ids")
	}
	b = nulled(b, "choices.0.prompt_token_ids")
	b = nulled(b, "prompt_token_ids")
	if s.api == Chat && !s.keepRole {
		// An engine that sends the role with the first token: the client
		// had the role from the first attempt.
		b = removeMember(b, "choices.0.delta.role")
	}
	s.keepRole = false
	if s.id != "" {
		b = replace(b, "id", strconv.Quote(s.id))
	}
	if u := gjson.GetBytes(b, "usage"); u.IsObject() {
		b = replace(b, "usage", s.wholeUsage(u))
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

// removeMember returns b without the member at path (b itself when it
// has none; a copy otherwise), and the comma that separated it.
func removeMember(b []byte, path string) []byte {
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
	for i >= 0 && (b[i] != '"' || (i > 0 && b[i-1] == '\\')) {
		i--
	}
	if i < 0 {
		return b
	}
	start, end := i, r.Index+len(r.Raw)
	j := start - 1
	for j >= 0 && isSpace(b[j]) {
		j--
	}
	if j >= 0 && b[j] == ',' {
		start = j
	} else if k := skipSpace(b, end); k < len(b) && b[k] == ',' {
		end = k + 1
	}
	c := make([]byte, 0, len(b)-(end-start))
	return append(append(c, b[:start]...), b[end:]...)
}

// nulled returns b with the value at path made null (b when it has none
// or it is null already).
func nulled(b []byte, path string) []byte {
	if r := gjson.GetBytes(b, path); !r.Exists() || r.Type == gjson.Null {
		return b
	}
	return replace(b, path, "null")
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

// Refuse records why the answer cannot be continued (Reason), when a
// continuation could not be built (Continuation's error).
func (s *Stream) Refuse(why string) {
	if s.other == "" {
		s.other = why
	}
}

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
