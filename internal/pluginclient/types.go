package pluginclient

import (
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// These are the Go shapes of the switchyard.plugin.v1 calls as the router
// makes them; the generated protocol types stay inside this package.

// Description is what Describe returns: the plugin's version, the API
// versions it speaks, and its component types. The types' New is nil on
// the host side: the host creates instances through Configure.
type Description struct {
	PluginVersion string
	APIVersions   []uint32
	Types         []shared.TypeInfo
	// ExpectedDecideP99 is the p99 time of one Decide task the plugin
	// declares it expects (DescribeResponse.expected_decide_p99_nanos,
	// capped at math.MaxInt64 ns); 0 when it declares none.
	ExpectedDecideP99 time.Duration
}

// ConfigureRequest asks a plugin for a new component instance.
type ConfigureRequest struct {
	Info   shared.InstanceInfo // Name is the instance name later tasks refer to
	Type   string
	Params shared.Params
}

// ConfigureResult is what ConfigureInstance returns.
type ConfigureResult struct {
	// Inputs the instance declares.
	Inputs shared.Inputs
	// Events says the instance wants lifecycle events (SendEvents).
	Events bool
	// Diagnostics are the plugin's reasons for refusing the instance; the
	// other fields are then zero.
	Diagnostics []Diagnostic
}

// Diagnostic is one problem a plugin reports at Configure. Param names the
// parameter it is about ("" for the whole block), so the host can point at
// that attribute's file:line:col.
type Diagnostic struct {
	Param   string
	Summary string
	Detail  string
}

// Stage is one component instance of a decision task, with a scorer's
// weight (ignored for filters and pickers).
type Stage struct {
	Instance string
	Kind     shared.Kind
	Weight   float64
}

// Task is one decision for a plugin: a run of consecutive components of one
// policy (filters, then scorers, then at most the picker) over one
// request's candidates.
type Task struct {
	Request    *shared.Request
	Candidates *shared.Candidates
	Stages     []Stage
}

// TaskResult is a task's answer in terms of the rows it was sent.
type TaskResult struct {
	// Kept are the rows that survived the task's filters, ascending; nil
	// means every row.
	Kept []uint32
	// Costs, one per kept row, are the weighted sum of the task's scorers;
	// nil when it had none.
	Costs []float64
	// Picked is the chosen row (an index into the rows sent) when the task
	// ended with a picker; -1 otherwise.
	Picked int
	// FilteredBy names the filter that left no row, when one did.
	FilteredBy string
}

// ClassifyCall is one Classify call of a classifier instance.
type ClassifyCall struct {
	// Instance is the classifier instance's name.
	Instance string
	// Request is the request to classify (its Role and Model name the
	// partition in the plugin).
	Request *shared.Request
	// WorkersVersion numbers the partition's worker list; Workers is sent
	// only when SendWorkers is set (the plugin may not have that version).
	WorkersVersion uint64
	SendWorkers    bool
	Workers        []shared.WorkerInfo
	// Now is the router's clock; zero means time.Now.
	Now time.Time
}

// EventStats are a Client's lifecycle event counters.
type EventStats struct {
	// Sent is the events sent and Batches the EventBatch messages they went
	// in; MaxBatch is the most events in one batch.
	Sent, Batches, MaxBatch int64
	// Acked is the batches the plugin acknowledged.
	Acked int64
	// Dropped is the events dropped: queued beyond MaxQueuedEvents,
	// queued after the Events stream failed (the plugin exited, or broke
	// the stream), or in the round that was in flight when it failed (not
	// acknowledged, so perhaps not delivered).
	Dropped int64
}
