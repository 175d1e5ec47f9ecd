// Package synth generates synthetic request traces in the Mooncake JSON
// lines format that package trace reads: multi-turn chat sessions that
// share a few system prompts of several lengths, arriving in bursts. It
// exists so that policies are compared on a third trace shape besides the
// two recorded Mooncake traces (issue #14 §2).
//
// The generator is seeded and deterministic: it reads no wall clock, draws
// every random number from one PCG stream (math/rand/v2) seeded by
// Params.Seed, and keeps simulated time in integer microseconds, so equal
// Params give byte-identical output. Floating point is used only to turn a
// uniform draw into an exponential, lognormal or Zipf one, each rounded at
// once to whole microseconds or tokens; on another architecture a
// different last bit of math.Exp or math.Log (which have assembly
// versions) could in principle move one value across such a rounding
// boundary. The bundled testdata/traces/synthetic_sessions.jsonl was
// generated on linux/amd64.
//
// # Shape
//
// Sessions start by a two-state Markov-modulated Poisson process: calm
// periods at Params.SessionRate sessions per second alternate with bursts
// at BurstFactor times that rate, each period lasting an exponential time
// (means CalmMean and BurstMean). Each session picks one system prompt,
// with Zipf popularity (exponent SystemPromptZipf) over
// SystemPromptTokens in list order. Its first turn's prompt is the system
// prompt and a user message; every later turn's prompt is the whole
// previous prompt, the previous answer (its output tokens) and a new user
// message. A session has a geometric number of turns (mean MeanTurns) and
// ends early when its next prompt would exceed MaxPromptTokens. The next
// turn arrives after the previous answer has streamed (AnswerTimePerToken
// per output token, from the previous turn's arrival) and an exponential
// think time (mean ThinkTime).
//
// # Hash ids
//
// As in the Mooncake traces, a request has one hash id per 512-token
// prompt block (ceil(input_length/512) ids, the last one covering a
// partial block), and an id names the content of its block, so two
// requests share a KV prefix exactly as far as their leading ids are
// equal. A system prompt's full blocks have the same ids in every session
// that uses it; its partial last block, which holds the start of the first
// user message, is the session's own. A turn reuses the ids of the
// previous turn's full blocks only: the previous turn's partial last block
// gets a new id, since more text (the answer) now fills it. Every other
// block of a session is new. Ids are numbered from 0 in the order they are
// created: the system prompts' blocks first, then each session's as the
// session is generated.
package synth

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/switchyard-router/switchyard/internal/heap"
	"github.com/switchyard-router/switchyard/router/trace"
)

// blockTokens is the number of prompt tokens per hash id.
const blockTokens = trace.MooncakeBlockTokens

// MaxRequests bounds Params.Requests: a million requests are about 170 MB
// of JSON lines at the default shape, far more than any replay needs.
const MaxRequests = 1_000_000

// Params configures Generate. DefaultParams gives the documented defaults,
// which produce 10,000 requests over about 10 minutes of simulated time.
// Where a default mimics a published statistic the field says which;
// otherwise it is our choice, made to give a trace with real prefix reuse
// that loads 8 simulated workers (docs/replay.md) without overloading them.
type Params struct {
	// Seed seeds the one random stream. Default 1 (like router replay's
	// default seed).
	Seed uint64
	// Requests is the number of requests to generate, 1 to MaxRequests.
	// The trace is the first Requests requests in arrival order of an
	// endless session process, so later turns of the last sessions are
	// cut off. Default 10,000 (our choice: close to the 12,031 requests of
	// the bundled Mooncake conversation trace, replayed in seconds).
	Requests int

	// SystemPromptTokens are the system prompts' lengths in tokens, in
	// order of popularity (the first is the most used); 1 to 64 prompts
	// of 1 to 2^20-1 tokens. Default 2,300, 700, 8,500, 1,200, 5,400,
	// 3,300 tokens: 4, 1, 16, 2, 10 and 6 full blocks plus a partial one,
	// lengths mixed in popularity (our choice).
	SystemPromptTokens []int
	// SystemPromptZipf is the Zipf exponent s of the system prompts'
	// popularity: prompt i (0-based) is picked with probability
	// proportional to 1/(i+1)^s. 0 is uniform; at most 10. Default 1, the
	// classic Zipf law (our choice), giving shares 41%, 20%, 14%, 10%, 8%
	// and 7% to the six default prompts.
	SystemPromptZipf float64

	// MeanTurns is the mean of the geometric number of turns a session
	// would have without the MaxPromptTokens cap: after each turn the
	// session ends with probability 1/MeanTurns. At least 1, at most
	// 1,000. Default 5 (our choice).
	MeanTurns float64
	// UserTokensMedian and UserTokensSigma are the lognormal user message
	// length, in tokens: median × e^(sigma·Z) for a standard normal Z,
	// rounded and clamped to 1..MaxUserTokens. Defaults 400 and 1.0 (mean
	// about 660 tokens; our choice: questions with pasted text or code,
	// so that a session's own blocks, not the shared system prompts, hold
	// most of its prompt by the second or third turn).
	UserTokensMedian float64
	UserTokensSigma  float64
	// MaxUserTokens caps one user message, in tokens, 1 to 2^20-1.
	// Default 8,192 (our choice).
	MaxUserTokens int
	// OutputTokensMedian and OutputTokensSigma are the lognormal answer
	// length (output_length), in tokens, clamped to 1..MaxOutputTokens.
	// Defaults 320 and 0.5 (mean about 360), near the bundled Mooncake
	// conversation trace's output lengths (mean 343, median 350 tokens).
	OutputTokensMedian float64
	OutputTokensSigma  float64
	// MaxOutputTokens caps one answer, in tokens. Default 4,096 (our
	// choice).
	MaxOutputTokens int
	// MaxPromptTokens caps a prompt (input_length), in tokens: a session
	// whose next prompt would be longer ends instead. At least the longest
	// system prompt plus MaxUserTokens, so that every first turn fits, and
	// at most 2^20. Default 32,768
	// (our choice: a common context window; the bundled Mooncake
	// conversation trace's prompts reach about 126,000 tokens).
	MaxPromptTokens int

	// ThinkTime is the mean of the exponential time a user takes, after
	// the answer, to send the next turn. Default 20 s (our choice).
	ThinkTime time.Duration
	// AnswerTimePerToken is how long the answer takes to reach the user
	// per output token, counted from the turn's arrival, before the think
	// time starts. Default 25 ms (our choice: 40 tokens per second
	// streamed).
	AnswerTimePerToken time.Duration

	// SessionRate is the rate of new sessions in calm periods, in sessions
	// per second, 0.01 to 10,000. Default 2.5 (our choice, tuned so that
	// router replay's 8 simulated workers are loaded in the bursts but
	// keep up; docs/replay.md has the tables).
	SessionRate float64
	// BurstFactor multiplies SessionRate during bursts; 1 to 1,000
	// (1 means no bursts). Default 4 (our choice).
	BurstFactor float64
	// CalmMean and BurstMean are the mean lengths of the exponentially
	// distributed calm periods and bursts, 1 s to 24 h. Defaults 60 s and
	// 15 s (our choice): a fifth of the time is in bursts, which bring half
	// of the sessions.
	CalmMean  time.Duration
	BurstMean time.Duration
}

// DefaultParams returns the documented defaults of every Params field.
func DefaultParams() Params {
	return Params{
		Seed:               1,
		Requests:           10_000,
		SystemPromptTokens: []int{2300, 700, 8500, 1200, 5400, 3300},
		SystemPromptZipf:   1,
		MeanTurns:          5,
		UserTokensMedian:   400,
		UserTokensSigma:    1.0,
		MaxUserTokens:      8192,
		OutputTokensMedian: 320,
		OutputTokensSigma:  0.5,
		MaxOutputTokens:    4096,
		MaxPromptTokens:    32768,
		ThinkTime:          20 * time.Second,
		AnswerTimePerToken: 25 * time.Millisecond,
		SessionRate:        2.5,
		BurstFactor:        4,
		CalmMean:           60 * time.Second,
		BurstMean:          15 * time.Second,
	}
}

// ErrInvalidParams is wrapped by every error of Params.Validate (as a
// *ParamError).
var ErrInvalidParams = errors.New("invalid trace parameters")

// ParamError reports one Params field out of its range. Its message reads
// "synth: Requests = 0: want 1 to 1000000"; it unwraps to
// ErrInvalidParams.
type ParamError struct {
	Field string // the Params field, "SessionRate"
	Value string // its value as given, "0"
	Want  string // what it must be, in words: "more than 0 sessions per second"
}

// Error implements error.
func (e *ParamError) Error() string {
	return fmt.Sprintf("synth: %s = %s: want %s", e.Field, e.Value, e.Want)
}

// Unwrap returns ErrInvalidParams.
func (e *ParamError) Unwrap() error { return ErrInvalidParams }

// maxSystemPrompts bounds len(Params.SystemPromptTokens).
const maxSystemPrompts = 64

// Bounds of Params fields that keep the work and the output of Generate
// linear in Params.Requests and every line readable by package trace.
const (
	// maxDuration bounds the duration fields (a day): simulated time, in
	// int64 microseconds, cannot overflow within MaxRequests sessions.
	maxDuration = 24 * time.Hour
	// minSessionRate (one session per 100 s) and the 1 s minimum of
	// CalmMean and BurstMean bound how many periods one session gap
	// crosses.
	minSessionRate = 0.01
	// maxPromptTokens (2^20 tokens, 2,048 hash ids) keeps a line far
	// under trace.MaxLineBytes.
	maxPromptTokens = 1 << 20
)

// Validate returns a *ParamError for the first field out of its range
// (the ranges are in the field docs), or nil.
func (p Params) Validate() error {
	bad := func(field string, v any, want string) error {
		return &ParamError{Field: field, Value: fmt.Sprint(v), Want: want}
	}
	inRange := func(v, lo, hi float64) bool { return v >= lo && v <= hi } // false for NaN
	switch {
	case p.Requests < 1 || p.Requests > MaxRequests:
		return bad("Requests", p.Requests, fmt.Sprintf("1 to %d", MaxRequests))
	case len(p.SystemPromptTokens) == 0 || len(p.SystemPromptTokens) > maxSystemPrompts:
		return bad("SystemPromptTokens", p.SystemPromptTokens, fmt.Sprintf("1 to %d system prompt lengths", maxSystemPrompts))
	case !inRange(p.SystemPromptZipf, 0, 10):
		return bad("SystemPromptZipf", p.SystemPromptZipf, "an exponent from 0 (uniform) to 10")
	case !inRange(p.MeanTurns, 1, 1000):
		return bad("MeanTurns", p.MeanTurns, "a mean from 1 to 1000 turns per session")
	case p.MaxUserTokens < 1 || p.MaxUserTokens >= maxPromptTokens:
		return bad("MaxUserTokens", p.MaxUserTokens, fmt.Sprintf("1 to %d tokens", maxPromptTokens-1))
	case p.MaxOutputTokens < 1 || p.MaxOutputTokens > math.MaxInt32:
		return bad("MaxOutputTokens", p.MaxOutputTokens, fmt.Sprintf("1 to %d tokens", math.MaxInt32))
	case !inRange(p.UserTokensMedian, 1, float64(p.MaxUserTokens)):
		return bad("UserTokensMedian", p.UserTokensMedian, fmt.Sprintf("1 to %d tokens (MaxUserTokens)", p.MaxUserTokens))
	case !inRange(p.UserTokensSigma, 0, 5):
		return bad("UserTokensSigma", p.UserTokensSigma, "0 to 5")
	case !inRange(p.OutputTokensMedian, 1, float64(p.MaxOutputTokens)):
		return bad("OutputTokensMedian", p.OutputTokensMedian, fmt.Sprintf("1 to %d tokens (MaxOutputTokens)", p.MaxOutputTokens))
	case !inRange(p.OutputTokensSigma, 0, 5):
		return bad("OutputTokensSigma", p.OutputTokensSigma, "0 to 5")
	case p.ThinkTime < 0 || p.ThinkTime > maxDuration:
		return bad("ThinkTime", p.ThinkTime, "0 to 24h")
	case p.AnswerTimePerToken < 0 || p.AnswerTimePerToken > time.Second:
		return bad("AnswerTimePerToken", p.AnswerTimePerToken, "0 to 1s per token")
	case !inRange(p.SessionRate, minSessionRate, 10_000):
		return bad("SessionRate", p.SessionRate, fmt.Sprintf("%g to 10000 sessions per second", minSessionRate))
	case !inRange(p.BurstFactor, 1, 1000):
		return bad("BurstFactor", p.BurstFactor, "1 (no bursts) to 1000")
	case p.CalmMean < time.Second || p.CalmMean > maxDuration:
		return bad("CalmMean", p.CalmMean, "1s to 24h")
	case p.BurstMean < time.Second || p.BurstMean > maxDuration:
		return bad("BurstMean", p.BurstMean, "1s to 24h")
	}
	longest := 0
	for i, n := range p.SystemPromptTokens {
		if n < 1 || n >= maxPromptTokens {
			return bad(fmt.Sprintf("SystemPromptTokens[%d]", i), n, fmt.Sprintf("1 to %d tokens", maxPromptTokens-1))
		}
		longest = max(longest, n)
	}
	if least := longest + p.MaxUserTokens; p.MaxPromptTokens < least || p.MaxPromptTokens > maxPromptTokens {
		return bad("MaxPromptTokens", p.MaxPromptTokens, fmt.Sprintf(
			"%d to %d tokens (at least the longest system prompt, %d, plus MaxUserTokens, %d, so that a first turn fits)",
			least, maxPromptTokens, longest, p.MaxUserTokens))
	}
	return nil
}

// Request is one generated request.
type Request struct {
	// Arrival is the request's arrival in simulated time, a whole number
	// of milliseconds (the trace's timestamp).
	Arrival time.Duration
	// InputLength and OutputLength are the prompt and answer lengths in
	// tokens.
	InputLength, OutputLength int
	// HashIDs holds one id per 512-token prompt block
	// (ceil(InputLength/512)); see the package doc.
	HashIDs []uint64
	// Session is the session's 0-based number, in order of its start;
	// SessionID is "s" and that number, the trace's session_id.
	Session   int
	SessionID string
	// Turn is the request's 0-based turn in its session.
	Turn int
	// SystemPrompt is the index in Params.SystemPromptTokens of the
	// session's system prompt.
	SystemPrompt int
}

// Interval is a span of simulated time, [Start, End).
type Interval struct {
	Start, End time.Duration
}

// Summary describes a generated trace.
type Summary struct {
	// Requests is the number of requests generated (Params.Requests).
	Requests int
	// Sessions is the number of sessions with at least one request in the
	// trace.
	Sessions int
	// Last is the last request's arrival.
	Last time.Duration
	// Bursts are the burst periods that started before Last, in order
	// (the last one may end after Last); none when BurstFactor is 1.
	Bursts []Interval
	// SystemPromptIDs holds, per system prompt, the hash ids of its full
	// blocks (none for a prompt under 512 tokens).
	SystemPromptIDs [][]uint64
}

// Generate validates p and generates its trace, calling emit with each
// request in arrival order (ties in session order, then turn order). The
// request's HashIDs are its own: emit may keep them but not change them.
// Generate stops at the first error of emit and returns it. Its memory is
// bounded by the sessions in progress (one queued turn each), not by
// p.Requests.
func Generate(p Params, emit func(Request) error) (Summary, error) {
	if err := p.Validate(); err != nil {
		return Summary{}, err
	}
	g := newGenerator(p)
	var (
		sum      Summary
		sessions int // sessions with a request emitted
	)
	sum.SystemPromptIDs = g.systemIDs
	flush := func(until int64) error {
		for g.pending.Len() > 0 && g.pending.At(0).at <= until && sum.Requests < p.Requests {
			t := g.pending.Pop()
			r := t.req
			r.Arrival = time.Duration(t.at/1000) * time.Millisecond
			if r.Turn == 0 {
				sessions++
			}
			if err := emit(r); err != nil {
				return err
			}
			g.next(t)
			sum.Requests++
			sum.Last = r.Arrival
		}
		return nil
	}
	for sum.Requests < p.Requests {
		start := g.nextSessionStart()
		// No later session starts before start: every pending turn up to
		// it is final.
		if err := flush(start); err != nil {
			return Summary{}, err
		}
		if sum.Requests == p.Requests {
			break
		}
		g.addSession(start)
	}
	sum.Sessions = sessions
	for _, b := range g.bursts {
		if b.Start <= sum.Last && p.BurstFactor > 1 {
			sum.Bursts = append(sum.Bursts, b)
		}
	}
	return sum, nil
}

// WriteJSONL generates p's trace (Generate) and writes it to w as Mooncake
// JSON lines, one request a line, in the field order and spacing of the
// published Mooncake traces plus session_id:
//
//	{"timestamp": 1203, "input_length": 2450, "output_length": 310, "hash_ids": [0, 1, 2, 3, 17], "session_id": "s0"}
//
// It returns Generate's summary, and the first error of generation or of
// writing to w.
func WriteJSONL(w io.Writer, p Params) (Summary, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	var line []byte
	sum, err := Generate(p, func(r Request) error {
		line = appendLine(line[:0], r)
		_, err := bw.Write(line)
		return err
	})
	if err != nil {
		return Summary{}, err
	}
	return sum, bw.Flush()
}

// appendLine appends r's JSON line, with its newline, to b.
func appendLine(b []byte, r Request) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendInt(b, r.Arrival.Milliseconds(), 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(r.InputLength), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(r.OutputLength), 10)
	b = append(b, `, "hash_ids": [`...)
	for i, id := range r.HashIDs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, id, 10)
	}
	b = append(b, `], "session_id": "`...)
	b = append(b, r.SessionID...)
	return append(b, "\"}\n"...)
}

// generator is the state of one Generate call. Times are integer
// microseconds of simulated time.
type generator struct {
	p   Params
	rng *rand.Rand

	systemIDs [][]uint64 // per system prompt, its full blocks' ids
	zipfCum   []float64  // cumulative popularity weights
	nextID    uint64

	// The session arrival process: the current period (burst or calm)
	// ends at periodEnd; now is the last session start.
	now, periodEnd int64
	burst          bool
	bursts         []Interval

	sessions int              // sessions started
	pending  heap.Heap[*turn] // by turnLess
}

func newGenerator(p Params) *generator {
	g := &generator{p: p, rng: rand.New(rand.NewPCG(p.Seed, pcgStream)), pending: heap.New(turnLess)}
	var total float64
	for i, n := range p.SystemPromptTokens {
		ids := make([]uint64, n/blockTokens)
		for k := range ids {
			ids[k] = g.newID()
		}
		g.systemIDs = append(g.systemIDs, ids)
		total += 1 / math.Pow(float64(i+1), p.SystemPromptZipf)
		g.zipfCum = append(g.zipfCum, total)
	}
	g.periodEnd = g.exp(p.CalmMean.Microseconds())
	return g
}

// pcgStream is the second PCG seed word, fixed so Params.Seed alone
// names the stream.
const pcgStream = 0x5377_6974_6368_7964 // "Switchyd"

func (g *generator) newID() uint64 {
	id := g.nextID
	g.nextID++
	return id
}

// uniform returns a uniform draw in (0, 1): never 0, so its logarithm is
// finite.
func (g *generator) uniform() float64 {
	return (float64(g.rng.Uint64()>>11) + 0.5) / (1 << 53)
}

// exp returns an exponential draw with mean meanUS microseconds, rounded
// to a whole microsecond.
func (g *generator) exp(meanUS int64) int64 {
	return int64(math.Round(-math.Log(g.uniform()) * float64(meanUS)))
}

// lognormal returns median × e^(sigma·Z), rounded and clamped to 1..hi.
// Z is a standard normal draw by the Box-Muller transform.
func (g *generator) lognormal(median, sigma float64, hi int) int {
	u1, u2 := g.uniform(), g.uniform()
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	v := math.Round(median * math.Exp(sigma*z))
	return int(min(max(v, 1), float64(hi)))
}

// nextSessionStart draws the next session's start, moving through calm
// periods and bursts. Both durations and gaps are exponential, so a gap
// that crosses the period's end is drawn again from that end at the new
// rate.
func (g *generator) nextSessionStart() int64 {
	for {
		rate := g.p.SessionRate
		if g.burst {
			rate *= g.p.BurstFactor
		}
		at := g.now + g.exp(int64(math.Round(1e6/rate)))
		if at < g.periodEnd {
			g.now = at
			return at
		}
		g.now = g.periodEnd
		g.burst = !g.burst
		mean := g.p.CalmMean
		if g.burst {
			mean = g.p.BurstMean
		}
		g.periodEnd = g.now + max(g.exp(mean.Microseconds()), 1)
		if g.burst {
			g.bursts = append(g.bursts, Interval{
				Start: time.Duration(g.now) * time.Microsecond,
				End:   time.Duration(g.periodEnd) * time.Microsecond,
			})
		}
	}
}

// session is a session in progress: the state its next turn grows from.
type session struct {
	index, systemPrompt int
	id                  string
}

// addSession starts a session at start and queues its first turn.
func (g *generator) addSession(start int64) {
	p := &g.p
	s := &session{index: g.sessions, id: "s" + strconv.Itoa(g.sessions)}
	g.sessions++
	u := g.uniform() * g.zipfCum[len(g.zipfCum)-1]
	for s.systemPrompt < len(g.zipfCum)-1 && u >= g.zipfCum[s.systemPrompt] {
		s.systemPrompt++
	}
	prompt := p.SystemPromptTokens[s.systemPrompt] + g.lognormal(p.UserTokensMedian, p.UserTokensSigma, p.MaxUserTokens)
	g.push(s, start, 0, prompt, g.systemIDs[s.systemPrompt])
}

// push queues turn t of s, arriving at at with a prompt of prompt tokens
// whose leading blocks have the ids carried (the previous turn's full
// blocks, or the system prompt's); every other block gets a new id.
func (g *generator) push(s *session, at int64, t, prompt int, carried []uint64) {
	ids := make([]uint64, ceilDiv(prompt, blockTokens))
	for k := copy(ids, carried); k < len(ids); k++ {
		ids[k] = g.newID()
	}
	out := g.lognormal(g.p.OutputTokensMedian, g.p.OutputTokensSigma, g.p.MaxOutputTokens)
	g.pending.Push(&turn{at: at, s: s, req: Request{
		InputLength: prompt, OutputLength: out, HashIDs: ids,
		Session: s.index, SessionID: s.id, Turn: t, SystemPrompt: s.systemPrompt,
	}})
}

// next queues the turn that follows t in its session, unless the session
// ends: by chance (probability 1/MeanTurns) or because the next prompt
// would exceed MaxPromptTokens.
func (g *generator) next(t *turn) {
	p, r := &g.p, &t.req
	if g.uniform() < 1/p.MeanTurns {
		return
	}
	prompt := r.InputLength + r.OutputLength + g.lognormal(p.UserTokensMedian, p.UserTokensSigma, p.MaxUserTokens)
	if prompt > p.MaxPromptTokens {
		return
	}
	at := t.at + int64(r.OutputLength)*p.AnswerTimePerToken.Microseconds() + g.exp(p.ThinkTime.Microseconds())
	g.push(t.s, at, r.Turn+1, prompt, r.HashIDs[:r.InputLength/blockTokens])
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// turn is one queued request, its arrival in microseconds and its
// session.
type turn struct {
	at  int64
	s   *session
	req Request
}

// turnLess orders turns by arrival, then session, then turn: a total
// order, so the trace does not depend on the heap's tie-breaking.
func turnLess(a, b *turn) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.req.Session != b.req.Session {
		return a.req.Session < b.req.Session
	}
	return a.req.Turn < b.req.Turn
}
