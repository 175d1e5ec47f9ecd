package shared

import (
	"context"
	"time"
)

// Classification is what a classifier sets on a request before selection.
// The zero value is a valid classification: priority 0, the queue's default
// class, no due time, the default scheduling cost and no target.
type Classification struct {
	// Priority orders requests within a queue class, higher first. Any int,
	// negative included.
	Priority int
	// PolicyClass names the queue class the request waits in; "" means the
	// queue's default class.
	PolicyClass string
	// DueAt is the request's deadline for leaving the queue: a request still
	// queued at DueAt is rejected with a clear status. Zero: no due time.
	DueAt time.Time
	// SchedulingCostTokens is the request's charge against its class's
	// quantum in the queue's weighted round robin. 0 means the default,
	// which the router fills: the request's uncached prompt tokens, at
	// least 1. Negative values are refused.
	SchedulingCostTokens int64
	// Target is an advisory worker, valid when HasTarget: a soft target.
	// An explicit pin in the request still wins, and a target that is not
	// among the candidates is ignored.
	Target    WorkerID
	HasTarget bool
}

// Classifier classifies the requests of one router partition (one model and
// role). It is called once per request, before selection; the router stores
// the result per live request id and reuses it when the request is retried,
// so a retry is never classified twice.
//
// Classify must be safe for concurrent use. An error or a panic in Classify
// fails only that request, with an error naming the classifier and the
// request: the router (and Serve, in a plugin process) recovers the panic
// and the classifier keeps serving the other requests. A negative
// SchedulingCostTokens fails the request the same way.
//
// A Classifier that also implements EventListener hears the lifecycle of
// the requests of its partition.
type Classifier interface {
	Classify(ctx context.Context, req *Request) (Classification, error)
}

// ClassifierFactory is the Component a classifier type's TypeInfo.New
// returns (kind KindClassifier). The router calls NewClassifier once per
// partition (model and role) that the policy file's request_classifier
// serves, and routes each request to its partition's Classifier.
//
// A factory holding resources may implement Closer; the router closes it
// when the bundle is discarded, after the last Classify of every partition.
type ClassifierFactory interface {
	Component
	NewClassifier(pc PartitionContext) (Classifier, error)
}

// PartitionContext is what a classifier is given for its partition. Its
// functions are safe for concurrent use and remain valid for the
// classifier's lifetime.
type PartitionContext struct {
	// Model is the partition's model name.
	Model string
	// Role is the worker role the partition selects for.
	Role Role
	// BlockSize is the router's default tokens per KV block (> 0), as
	// InstanceInfo.BlockSize; each request carries its own
	// (Request.BlockSize).
	BlockSize int
	// Workers returns a non-blocking snapshot of the partition's workers
	// with their configured capacity, in ascending (ID, DPRank) order. The
	// snapshot is immutable: the router publishes a new slice when
	// membership changes instead of modifying the old one, so the call is
	// cheap, does not allocate, and the caller must not modify the result.
	Workers func() []WorkerInfo
	// Progress returns a live request's prompt plus generated tokens so far
	// (monotonic while the request lives), or false once the request ended
	// or when the id is unknown.
	Progress func(requestID string) (tokens int64, ok bool)
	// Now is the router's clock: simulated time in replay, wall-clock time
	// in serve. Nil means time.Now. Classifiers with time-based state (TTLs,
	// due times) read it so that replays repeat exactly.
	Now func() time.Time
	// Sessions, when set, shares the partition's session bindings with
	// the other router replicas of a cluster (router/cluster,
	// docs/replicas.md). nil: bindings are this router's own (no cluster
	// block, replay, a classifier served out of process).
	Sessions SessionStore
}

// SessionStore shares one partition's session bindings (session id ->
// worker) between router replicas. Its methods never block and never
// wait on the network: the host keeps a local mirror of the shared
// bindings and writes through a bounded queue, so a classifier may call
// them from Classify and OnEvents, under its own lock. Safe for
// concurrent use.
type SessionStore interface {
	// Bind shares that session's request was sent to worker at at (the
	// router's clock): the last binding shared wins. It may be dropped
	// (a full queue, NATS away); the host counts it.
	Bind(session string, worker WorkerID, at time.Time)
	// Binding returns the latest binding shared for session, by this
	// replica or another: its worker and when it was made. false when
	// none is known, it expired, or it names a worker this router does
	// not have in the partition.
	Binding(session string) (worker WorkerID, at time.Time, ok bool)
}

// WorkerInfo is one worker of a partition as a classifier sees it.
type WorkerInfo struct {
	ID     WorkerID
	DPRank uint32
	// TotalKVBlocks is the worker's KV-cache capacity in blocks (the
	// CAPACITY input), configured or reported by its engine; 0 when
	// unknown (unavailable).
	TotalKVBlocks int64
}
