package shared

// These are the Go shapes of the switchyard.plugin.v1 calls, as the host
// side client (RemoteClient) and the plugin side server exchange them; the
// generated protocol types stay inside this package.

// APIVersion is the plugin API version this SDK speaks: switchyard.plugin.v1.
// go-plugin negotiates it as the protocol version (VersionedPlugins).
const APIVersion = 1

// Description is what Describe returns: the plugin's version, the API
// versions it speaks, and its component types. The types' New is nil on
// the host side: the host creates instances through Configure.
type Description struct {
	PluginVersion string
	APIVersions   []uint32
	Types         []TypeInfo
}

// ConfigureRequest asks a plugin for a new component instance.
type ConfigureRequest struct {
	Info   InstanceInfo // Name is the instance name later tasks refer to
	Type   string
	Params Params
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
	Kind     Kind
	Weight   float64
}

// Task is one decision for a plugin: a run of consecutive components of one
// policy (filters, then scorers, then at most the picker) over one
// request's candidates.
type Task struct {
	Request    *Request
	Candidates *Candidates
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
