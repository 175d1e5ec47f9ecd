package live

import (
	"bytes"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
)

// Meter reads one engine answer as a face passes it on (the HTTP face's
// proxy copies it, the ext_proc face is shown it): the first byte records
// the request's first token (admission.Handle.FirstToken) and, for a
// stream, switchyard_time_to_first_token_seconds, and for a decision of a
// canaried policy its TTFT (router.Router.CanaryTTFT); a stream's SSE events
// ("\n\n"-terminated, about one token each) advance the request's
// progress (the prompt plus one token per event,
// admission.Handle.Progress); a non-streamed answer's body (when kept, at
// most 1 MiB) and a stream's last chunk mentioning "usage" are kept, and
// Done reads the engine's usage from them: the token families,
// switchyard_prefix_belief_total, switchyard_prompt_token_match_total and
// the context tokens the booking ends with. One Meter per attempt; not
// safe for concurrent use.
type Meter struct {
	rt *Runtime
	h  *admission.Handle
	d  router.Decision
	// What the meter needs of its Request, copied (a Meter is kept by
	// value: the Request need not outlive the intake).
	start     time.Time
	label, id string
	tokens    int    // Request.Tokens
	blockSize int    // Request.BlockSize
	stream    bool   // Request.Stream
	api       API    // Request.API
	exact     bool   // the prompt was keyed by its token ids (Request.IDs)
	keep      bool   // keep a non-streamed body for its usage
	first     bool   // the first byte was seen
	events    int64  // SSE events seen
	last      byte   // the last byte seen
	kept      []byte // the non-streamed body, while keep
	// streamed is a stream's latest chunk that mentions "usage" (at most
	// one chunk), read by Done.
	streamed []byte
	// respID is the id of the response the engine stored (ResponseID).
	respID string
	// idRead: a non-streamed Responses answer's kept body was searched
	// for its id.
	idRead bool
	// sse reads a Responses or Messages stream's events (gen.go).
	sse *sseReader
	// continued: the attempt continues a migrated request (Continued).
	continued bool
	// tail holds a chat or completions stream's last bytes (tailN of
	// them), for Ended.
	tail  [16]byte
	tailN int
}

// Ended reports whether the answer read so far ends as a whole answer of
// its schema does: a chat or completions stream with "data: [DONE]", a
// Responses stream with its final event (response.completed, .incomplete
// or .failed), a Messages stream with message_stop. A stream that ends
// without it was cut, whatever the transport said (an engine that sends
// its stream unchunked and dies ends it with what reads as a clean end of
// body). Always true for an answer that is not streamed.
func (m *Meter) Ended() bool {
	switch {
	case !m.stream:
		return true
	case m.sse != nil:
		return m.sse.ended
	}
	return bytes.HasSuffix(bytes.TrimRight(m.tail[:m.tailN], "\r\n"), doneMark)
}

var doneMark = []byte("data: [DONE]")

// keepTail keeps chunk's last bytes in the tail.
func (m *Meter) keepTail(chunk []byte) {
	if len(chunk) >= len(m.tail) {
		m.tailN = copy(m.tail[:], chunk[len(chunk)-len(m.tail):])
		return
	}
	if m.tailN+len(chunk) > len(m.tail) {
		drop := m.tailN + len(chunk) - len(m.tail)
		m.tailN = copy(m.tail[:], m.tail[drop:m.tailN])
	}
	m.tailN += copy(m.tail[m.tailN:], chunk)
}

// Continued marks the meter's attempt as the continuation of a migrated
// request (router/migrate): its first byte is not the request's TTFT (the
// client had its first token from an earlier attempt) nor a canary's,
// and its usage's prompt is the original prompt plus the tokens generated
// before, so Done counts its tokens but neither compares the prompt's
// count nor the prefix belief.
func (m *Meter) Continued() { m.continued = true }

// Meter returns the meter of one attempt of req, booked by h on d's
// worker. keep says whether a non-streamed answer's body is kept for its
// usage (up to 1 MiB: past it, it is dropped); sizeHint, when positive,
// is the body's length, for which room is made at once.
func (rt *Runtime) Meter(h *admission.Handle, d router.Decision, req *Request, keep bool, sizeHint int64) Meter {
	// A non-streamed Responses answer is kept for its id too (the
	// previous_response_id binding), whatever keep says.
	keep = (keep || req.API == APIResponses) && !req.Stream
	m := Meter{rt: rt, h: h, d: d, start: req.Start, label: req.Label, id: req.ID, tokens: req.Tokens, blockSize: req.BlockSize,
		stream: req.Stream, api: req.API, exact: req.IDs != nil, keep: keep}
	if req.Stream && (req.API == APIResponses || req.API == APIMessages) {
		m.sse = newSSEReader(req.API)
	}
	if m.keep && sizeHint > 0 && sizeHint <= MaxUsageBody {
		m.kept = make([]byte, 0, sizeHint)
	}
	return m
}

// FirstByte records the answer's first byte, once: the handle's
// FirstToken (its prefill is done), for a stream
// switchyard_time_to_first_token_seconds since the request's Start, and
// for a decision of a canaried policy its TTFT (router.Router.CanaryTTFT).
func (m *Meter) FirstByte() {
	if m.first {
		return
	}
	m.first = true
	m.h.FirstToken()
	if m.continued {
		return
	}
	if m.rt.met != nil && m.stream {
		m.rt.met.ttft.WithLabelValues(m.label).Observe(time.Since(m.start).Seconds())
	}
	if m.d.Canary != nil {
		// A canary's candidate is judged on its TTFT (router.Router.
		// CanaryTTFT): the first byte of a streamed or whole answer.
		m.rt.r.CanaryTTFT(m.d, time.Since(m.start))
	}
}

// Read reads the next chunk of the answer, in order: it counts its SSE
// events (advancing the handle's progress when some ended) and keeps what
// Done needs of it. Linear in the chunk.
func (m *Meter) Read(chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	before := m.events
	if m.sse != nil {
		m.events += m.sse.read(chunk)
		if m.events > before {
			m.h.Progress(m.Tokens())
		}
		return
	}
	for _, c := range chunk {
		if c == '\n' && m.last == '\n' {
			m.events++
		}
		m.last = c
	}
	if m.stream {
		m.keepTail(chunk)
	}
	switch {
	case m.keep:
		if len(m.kept)+len(chunk) <= MaxUsageBody {
			m.kept = append(m.kept, chunk...)
		} else {
			m.keep, m.kept = false, nil
		}
	case m.stream && m.rt.met != nil && bytes.Contains(chunk, usageKey):
		m.streamed = append(m.streamed[:0], chunk...)
	}
	if m.events > before {
		m.h.Progress(m.Tokens())
	}
}

// ResponseID returns the id of the response the engine answered with and
// stored, once the answer carried it; "" before, and for the other
// schemas: a non-streamed Responses answer's top-level "id" (read from
// its kept body, at most MaxUsageBody, once the answer is whole), a
// streamed one's response.created event's response.id (vLLM's
// ResponsesResponse.id, vllm/entrypoints/openai/responses/protocol.py).
// An id longer than MaxResponseID bytes, or not a string, is ignored.
func (m *Meter) ResponseID() string {
	if m.sse != nil {
		return m.sse.respID
	}
	if m.api == APIResponses && m.keep && !m.idRead && m.complete() {
		m.idRead = true
		m.respID = responseID(m.kept, "id")
	}
	return m.respID
}

// complete reports whether the kept body is a whole JSON value.
func (m *Meter) complete() bool {
	return len(m.kept) > 0 && nesting(m.kept, maxNesting) <= maxNesting && gjson.ValidBytes(m.kept)
}

// Tokens returns the context tokens the answer has reached so far: the
// prompt plus one token per SSE event (for the Responses and Messages
// schemas, per event that carries generated tokens: see sseReader).
func (m *Meter) Tokens() int64 { return int64(m.tokens) + m.events }

// Done reads the usage of the completed answer and counts it (the token
// families, the prefix belief, the prompt's token count against the
// engine's), and returns the context tokens to end the booking with: a
// non-streamed answer's usage.total_tokens when it has one, else Tokens.
func (m *Meter) Done() int64 {
	var u usage
	switch {
	case m.sse != nil:
		u = m.sse.usage
	case m.keep && (m.api == APIResponses || m.api == APIMessages):
		u = readGenUsage(m.kept, m.api)
		m.ResponseID()
	case m.keep:
		u = readUsage(m.kept)
	case m.streamed != nil:
		u = streamUsage(m.streamed)
	}
	rt := m.rt
	rt.countUsage(m.label, u)
	if m.continued {
		if m.keep && u.total > 0 {
			return u.total
		}
		return m.Tokens()
	}
	rt.countBelief(m.id, m.blockSize, m.d, u)
	rt.checkPromptTokens(promptCount{label: m.label, id: m.id, worker: m.d.Worker.Name, chat: m.api != APICompletions,
		exact: m.exact, tokens: m.tokens}, u)
	if m.keep && u.total > 0 {
		return u.total
	}
	return m.Tokens()
}

// MaxUsageBody bounds the non-streamed answer bodies a Meter keeps for
// their usage: 1 MiB; a longer one is dropped and its usage not read.
const MaxUsageBody = 1 << 20

// usage is an OpenAI answer's usage object; ok is false when the answer
// has none.
type usage struct {
	prompt, cached, completion, total int64
	ok                                bool
	// hasPrompt: the answer reports usage.prompt_tokens.
	hasPrompt bool
	// hasCached: the answer reports cached_tokens (vLLM does with prefix
	// caching on; cached is 0 when it does not).
	hasCached bool
}

// usageKey marks the chunks of a stream that may carry its usage.
var usageKey = []byte(`"usage"`)

// readUsage reads an OpenAI answer's usage: prompt_tokens,
// prompt_tokens_details.cached_tokens (vLLM with prefix caching reports
// it; 0 when absent), completion_tokens and total_tokens. ok is false
// when the body is not strict JSON nested at most maxNesting levels, or
// has no usage object with a positive count.
func readUsage(body []byte) usage {
	// fastjson's parser builds its error for a malformed body from the rest
	// of the body at each level: checked first, as request bodies are.
	if nesting(body, maxNesting) > maxNesting || !gjson.ValidBytes(body) {
		return usage{}
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return usage{}
	}
	u := usage{
		prompt:     max(v.GetInt64("usage", "prompt_tokens"), 0),
		cached:     max(v.GetInt64("usage", "prompt_tokens_details", "cached_tokens"), 0),
		completion: max(v.GetInt64("usage", "completion_tokens"), 0),
		total:      max(v.GetInt64("usage", "total_tokens"), 0),
	}
	u.ok = u.prompt > 0 || u.completion > 0 || u.total > 0
	u.hasCached = v.Exists("usage", "prompt_tokens_details", "cached_tokens")
	pt := v.Get("usage", "prompt_tokens")
	u.hasPrompt = pt != nil && pt.Type() == fastjson.TypeNumber && pt.GetInt64() >= 0
	return u
}

// streamUsage reads the usage of the last event of an SSE chunk that has
// one ("data: {...}" lines).
func streamUsage(chunk []byte) usage {
	var found usage
	for line := range bytes.Lines(chunk) {
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok || !bytes.Contains(data, usageKey) {
			continue
		}
		if u := readUsage(bytes.TrimSpace(data)); u.ok {
			found = u
		}
	}
	return found
}

// countBelief compares what the prefix index believed the worker held of
// the prompt (b, taken at selection) with what the engine says it served
// from cache (u's cached_tokens), in switchyard_prefix_belief_total, for
// the precise belief (when the worker's KV-event stream was live) and the
// approximate one. The engine computes at least the prompt's last token
// and caches whole blocks of E tokens, so a belief of t tokens means
// min(t, floor((prompt-1)/E)·E) served (vLLM's KV cache manager caps a
// hit at prompt_len-1); E is the engine's block size, or the request's
// key block size when no precise index told it. Answers without cached_tokens, and
// prompts keyed by characters (no belief), are not counted.
//
// A precise belief that differs is logged at debug level with the worker
// and both counts.
func (rt *Runtime) countBelief(id string, blockSize int, d router.Decision, u usage) {
	b := d.Belief
	if rt.met == nil || !b.Taken || !u.ok || !u.hasCached || u.prompt <= 0 {
		return
	}
	e := b.EngineBlockSize
	if e <= 0 {
		e = blockSize
	}
	if e <= 0 {
		e = rt.r.BlockSize()
	}
	limit := (int((u.prompt - 1)) / e) * e
	served := int(u.cached)
	if b.Precise {
		r := compareBelief(min(b.PreciseTokens, limit), served)
		rt.met.belief.WithLabelValues("precise", r).Inc()
		if r != "exact" && rt.log.IsDebug() {
			rt.log.Debug("precise prefix belief differs from the engine's cached tokens", "request_id", id,
				"worker", d.Worker.Name, "rank", d.Worker.DPRank, "believed_tokens", min(b.PreciseTokens, limit),
				"cached_tokens", served, "prompt_tokens", u.prompt, "approximate_tokens", min(b.ApproxTokens, limit))
		}
	}
	rt.met.belief.WithLabelValues("approximate", compareBelief(min(b.ApproxTokens, limit), served)).Inc()
}

// compareBelief says how a belief of believed tokens compares with the
// served ones: "exact", "over" (believed more) or "under".
func compareBelief(believed, served int) string {
	switch {
	case believed == served:
		return "exact"
	case believed > served:
		return "over"
	}
	return "under"
}

// promptCount is what the router counted of one request's prompt, for
// checkPromptTokens.
type promptCount struct {
	label  string // the model's metrics label
	id     string // the request's id (from the client: escaped when logged)
	worker string // the worker that answered
	chat   bool
	// exact: tokens is the length of the prompt's token ids (the
	// request's own, or its tokenizer's: for a chat request the messages
	// rendered by the model's chat template); otherwise the prompt was
	// keyed by characters and tokens is an estimate.
	exact  bool
	tokens int
}

// checkPromptTokens compares the router's token count of a request's
// prompt (c) with the engine's usage.prompt_tokens (u), in
// switchyard_prompt_token_match_total{model, result}: exact, over (the
// router counted more), under, or unknown when the router had no token
// ids (the prompt was keyed by characters). An answer without
// usage.prompt_tokens (a stream whose client did not ask for its usage)
// is not counted. Its routing key is the engine's only when the counts
// agree, so a difference is logged, at warn, at most once per
// tokenLogInterval per model (the lines held back are counted in the
// next one), with both counts.
func (rt *Runtime) checkPromptTokens(c promptCount, u usage) {
	if !u.hasPrompt {
		return
	}
	result := "unknown"
	if c.exact {
		result = compareBelief(c.tokens, int(u.prompt))
	}
	if rt.met != nil {
		rt.met.promptMatch.WithLabelValues(c.label, result).Inc()
	}
	if result == "exact" || result == "unknown" {
		return
	}
	if ok, suppressed := rt.tokenLogs.allow(c.label); ok {
		rt.log.Warn("the router's token count of a prompt differs from the engine's prompt_tokens: its routing key is not the engine's",
			"model", untrusted.Text(c.label, untrusted.MaxLabel), "request_id", untrusted.Text(c.id, untrusted.MaxLog),
			"worker", c.worker, "chat", c.chat, "router_tokens", c.tokens, "engine_prompt_tokens", u.prompt,
			"suppressed", suppressed)
	}
}

// tokenLogInterval is the least time between two log lines of token
// counts differing for one model: 10 s, the interval the router's other
// rate-limited lines keep (untrusted.NewLimiter's default).
const tokenLogInterval = 10 * time.Second

// maxTokenLogModels bounds the models tokenLog keeps a limit for; the
// models beyond it share one.
const maxTokenLogModels = 1024

// tokenLog rate-limits checkPromptTokens' log lines per model: one line
// per model per tokenLogInterval (untrusted.Limiter), for at most
// maxTokenLogModels models (names the engines report, so their set is
// bounded here, not by the engines); further models share one limit.
type tokenLog struct {
	lim    *untrusted.Limiter
	mu     sync.Mutex
	models map[string]struct{}
}

func newTokenLog() *tokenLog {
	return &tokenLog{lim: untrusted.NewLimiter(tokenLogInterval), models: make(map[string]struct{})}
}

// allow is untrusted.Limiter.Allow for model's cause.
func (t *tokenLog) allow(model string) (bool, uint64) {
	cause := "model " + model
	t.mu.Lock()
	if _, ok := t.models[model]; !ok {
		if len(t.models) < maxTokenLogModels {
			t.models[model] = struct{}{}
		} else {
			cause = "other models"
		}
	}
	t.mu.Unlock()
	return t.lim.Allow(cause)
}

// countUsage adds an answer's usage to the token counters of its model.
func (rt *Runtime) countUsage(label string, u usage) {
	if rt.met == nil || !u.ok {
		return
	}
	rt.met.promptTokens.WithLabelValues(label).Add(float64(u.prompt))
	rt.met.cachedTokens.WithLabelValues(label).Add(float64(min(u.cached, u.prompt)))
	rt.met.completionTokens.WithLabelValues(label).Add(float64(u.completion))
}
