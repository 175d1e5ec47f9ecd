package shared

import "time"

// EventKind is one step of a request's lifecycle. The values match the
// plugin protocol's EventKind enum.
type EventKind uint8

// The lifecycle events. Per request they come in the order
//
//	sent? -> first_token? -> completed | aborted
//
// exactly one of completed or aborted ends every request, and a request can
// end without sent (rejected, expired in the queue, cancelled or failed
// before dispatch) or without first_token.
const (
	// EventSent: the request was dispatched to Event.Worker.
	EventSent EventKind = iota + 1
	// EventFirstToken: the worker produced the request's first token.
	EventFirstToken
	// EventCompleted: the request finished normally on Event.Worker, with
	// Event.ContextTokens of prompt plus generated tokens.
	EventCompleted
	// EventAborted: the request ended without completing, for Event.Reason;
	// Event.Worker is set when it had been sent.
	EventAborted
)

// String returns "sent", "first_token", "completed" or "aborted".
func (k EventKind) String() string {
	switch k {
	case EventSent:
		return "sent"
	case EventFirstToken:
		return "first_token"
	case EventCompleted:
		return "completed"
	case EventAborted:
		return "aborted"
	}
	return "unknown"
}

// Event is one lifecycle step of one request.
type Event struct {
	Kind      EventKind
	RequestID string
	// Worker is the worker the request was sent to, valid when HasWorker:
	// always on sent and completed; on first_token and aborted when the
	// request had been sent.
	Worker    WorkerID
	HasWorker bool
	// ContextTokens is, on completed, the prompt plus generated tokens.
	ContextTokens int64
	// Reason says why, on aborted (e.g. "client cancelled", "due time
	// passed in queue", "worker error: ...").
	Reason string
	// At is when the event happened on the router's clock (simulated time
	// in replay).
	At time.Time
}

// EventListener is an optional capability, found by type assertion, of
// components (filters, scorers, pickers, classifier factories) and of the
// per-partition Classifiers that want every request's lifecycle.
//
// Delivery is in order and lossless: per request, sent? -> first_token? ->
// completed | aborted, and a request can end without sent. Events arrive in
// batches, in the order they happened; a batch may mix requests. A
// ClassifierFactory and each of its per-partition Classifiers hear the
// requests of every partition the factory serves (in process and in a
// plugin alike: a Classifier keeps what it learns of its own requests,
// found by id), and a filter, scorer or picker those selected by the
// policies it is in. A listener may see events of requests it never saw
// otherwise (another partition's, a retry, a request its partition
// rejected) and must ignore those it does not know.
//
// OnEvents is called from one goroutine per listener, never concurrently
// with itself (but concurrently with the component's other methods), and
// must not block for long: a slow listener delays its own later batches.
// The slice and its events are valid only during the call; the router
// reuses the buffer, so copy what you keep.
type EventListener interface {
	OnEvents(events []Event)
}
