// Package migrate is request migration: what a router keeps of an answer
// while it streams, and how it continues the generation on another worker
// when the engine serving it dies, hangs, cuts the stream or is drained,
// so that the client sees one answer with every token once.
//
// The policy (Policy, Cause, Outcome) is shared by every face: router
// serve continues real streams (Stream, Continuation), router replay
// continues simulated requests on simulated engine failures with the
// same limits, so a replay shows what a migration costs (the extra
// prefill of the prompt and the tokens generated so far, the time from
// the cut to the next token).
//
// The idea and its default limit follow Dynamo's frontend
// (--migration-limit: a request is continued on another worker from
// the exact point of failure, up to that many times).
package migrate

import "fmt"

// Defaults of Policy.
const (
	// DefaultLimit is how many times one request may be migrated
	// (Policy.Limit); Dynamo's --migration-limit has the same meaning.
	// 3: an engine restart wave of a rolling upgrade touches a request
	// at most once or twice; a request that fails on three engines in a
	// row is more likely the cause than the victim.
	DefaultLimit = 3
	// DefaultMaxTokens bounds the generated tokens a request may have
	// before its cut and still migrate (Policy.MaxTokens): past it the
	// continuation's prefill would cost more than the answer is likely
	// worth, and what is kept of it grows with it. 32,768 tokens.
	DefaultMaxTokens = 32768
	// DefaultMaxBytes bounds what the router keeps per request of the
	// answer so far (its text and token ids, Policy.MaxBytes): 1 MiB,
	// about 250,000 tokens of English text; a request past it is not
	// migrated (a cut then ends its stream with an error event).
	DefaultMaxBytes = 1 << 20
	// DefaultTotalBytes bounds what the router keeps of every answer in
	// flight together (Policy.TotalBytes): 256 MiB. A request that would
	// take more stops keeping (it will not migrate) rather than the
	// router growing.
	DefaultTotalBytes = 256 << 20
)

// Policy says when a cut request migrates. The zero value is not
// usable: start from DefaultPolicy.
type Policy struct {
	// Limit is how many times one request may migrate (>= 0; 0 turns
	// migration off: a cut is only detected and reported).
	Limit int
	// MaxTokens bounds the tokens generated before a cut for the request
	// to migrate.
	MaxTokens int
	// MaxBytes bounds what is kept per request (text and token ids, in
	// bytes as kept: 4 per token id).
	MaxBytes int
	// TotalBytes bounds what is kept of every request in flight.
	TotalBytes int64
}

// DefaultPolicy returns the policy with every default.
func DefaultPolicy() Policy {
	return Policy{Limit: DefaultLimit, MaxTokens: DefaultMaxTokens, MaxBytes: DefaultMaxBytes, TotalBytes: DefaultTotalBytes}
}

// Validate reports a policy with a negative or zero bound.
func (p Policy) Validate() error {
	switch {
	case p.Limit < 0:
		return fmt.Errorf("migration limit %d: want >= 0 (0: no migration)", p.Limit)
	case p.MaxTokens <= 0:
		return fmt.Errorf("migration max tokens %d: want > 0", p.MaxTokens)
	case p.MaxBytes <= 0:
		return fmt.Errorf("migration max bytes %d: want > 0", p.MaxBytes)
	case p.TotalBytes <= 0:
		return fmt.Errorf("migration total bytes %d: want > 0", p.TotalBytes)
	}
	return nil
}

// Cause is why an answer was cut; the metrics' cause label.
type Cause string

// The causes of a cut.
const (
	// CauseReset: the engine's connection failed mid-answer (reset,
	// a read error, a chunked body cut short).
	CauseReset Cause = "reset"
	// CauseEOF: the answer ended without its terminator (a stream
	// without its final "data: [DONE]", a body shorter than its
	// Content-Length): an engine that closes its connection when it dies
	// looks like this when it sends its stream unchunked.
	CauseEOF Cause = "eof"
	// CauseEngineError: the engine sent an error event mid-stream.
	CauseEngineError Cause = "engine_error"
	// CauseStall: no byte of the answer arrived for the stall time.
	CauseStall Cause = "stall"
	// CauseDrain: the engine left the fleet (drained) and its grace
	// period ended with the request still running.
	CauseDrain Cause = "drain"
	// CauseFailure: the engine failed (replay's --fail).
	CauseFailure Cause = "failure"
)

// Causes lists every Cause, for metrics that start at zero.
var Causes = []Cause{CauseReset, CauseEOF, CauseEngineError, CauseStall, CauseDrain, CauseFailure}

// Outcome is what became of a cut request; the metrics' outcome label.
type Outcome string

// The outcomes of a cut.
const (
	// Migrated: the generation continued on another worker.
	Migrated Outcome = "migrated"
	// Finished: the answer had ended before the cut (its finish reason
	// was seen, only the terminator was missing): the router ended it
	// and nothing was sent again.
	Finished Outcome = "finished"
	// OverLimit: the request had migrated Limit times already.
	OverLimit Outcome = "over_limit"
	// TooLong: the answer so far was past MaxTokens or MaxBytes, or the
	// router's TotalBytes was in use: nothing was kept to continue from.
	TooLong Outcome = "too_long"
	// NotMigratable: the request is of a kind that does not migrate
	// (several choices, an API without a continuation form).
	NotMigratable Outcome = "not_migratable"
	// NoWorker: no other worker could take the continuation.
	NoWorker Outcome = "no_worker"
	// Refused: the continuation's engine refused it (its error reached
	// the client in the stream: for instance the context window).
	Refused Outcome = "refused"
)

// Outcomes lists every Outcome, for metrics that start at zero.
var Outcomes = []Outcome{Migrated, Finished, OverLimit, TooLong, NotMigratable, NoWorker, Refused}

// Decide returns whether a request cut after generated tokens, having
// migrated migrations times already, may migrate again, and the outcome
// when it may not.
func (p Policy) Decide(migrations, generated int) (bool, Outcome) {
	switch {
	case migrations >= p.Limit:
		return false, OverLimit
	case generated > p.MaxTokens:
		return false, TooLong
	}
	return true, Migrated
}
