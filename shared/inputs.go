package shared

import "strings"

// Inputs is a set of per-worker inputs a component declares it reads. The
// router computes only the inputs that some component of a policy declared,
// so a component must declare everything it reads from Candidates.
type Inputs uint32

const (
	// InputActiveRequests is the router-owned in-flight request count of each
	// worker (Candidates.ActiveRequests), booked at dispatch and released at
	// completion, error, cancel or worker removal.
	InputActiveRequests Inputs = 1 << iota
	// InputOccupancy is the deprecated alias of InputActiveRequests. Loading a
	// policy that declares it warns; it is removed in v2.0. The router treats
	// it exactly as InputActiveRequests (see Normalize).
	InputOccupancy
	// InputLoad is the per-worker Load record (Candidates.Load): booked prefill
	// tokens and decode blocks plus engine-reported KV usage and queue length.
	InputLoad
	// InputCache is the request's prefix overlap with each worker in blocks
	// (Candidates.OverlapBlocks), from the router's prefix index.
	InputCache
	// InputCapacity is each worker's KV capacity in blocks
	// (Candidates.TotalKVBlocks); 0 for a worker whose capacity is
	// unknown (unavailable: an engine that has not reported it yet).
	InputCapacity
	// InputLabels is each worker's name and labels (Candidates.Names and
	// Candidates.Labels: a worker block's or pod's labels plus the
	// router-set LabelRole, LabelModel and LabelDPRank). The columns are
	// filled only when some component of the policy declares it, so a
	// policy that does not pays nothing for them.
	InputLabels
	// InputLatency is each row's predicted time to first token and time
	// per output token for this request (Candidates.PredictedTTFT and
	// Candidates.PredictedTPOT), from the router's online latency
	// predictor (router/predict). In-process components only: plugin
	// protocol v1 does not carry the columns, so the flag never travels:
	// a plugin that sets its bit declares nothing by it (PluginInputs).
	InputLatency

	inputsEnd
)

// AllInputs is the union of every defined input flag.
const AllInputs = inputsEnd - 1

// PluginInputs is the inputs an out-of-process component may declare:
// every input but LATENCY, which plugin protocol v1 does not carry.
const PluginInputs = AllInputs &^ InputLatency

var inputNames = [...]string{"ACTIVE_REQUESTS", "OCCUPANCY", "LOAD", "CACHE", "CAPACITY", "LABELS", "LATENCY"}

// Normalize folds the deprecated OCCUPANCY alias into ACTIVE_REQUESTS and
// drops unknown bits.
func (in Inputs) Normalize() Inputs {
	if in&InputOccupancy != 0 {
		in = in&^InputOccupancy | InputActiveRequests
	}
	return in & AllInputs
}

// Has reports whether every flag of want is in the set.
func (in Inputs) Has(want Inputs) bool { return in&want == want }

// String renders the set as "ACTIVE_REQUESTS|CACHE", or "none".
func (in Inputs) String() string {
	var parts []string
	for i, name := range inputNames {
		if in&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

// ParseInput returns the flag named by its policy-file name ("ACTIVE_REQUESTS",
// "OCCUPANCY", "LOAD", "CACHE", "CAPACITY", "LABELS", "LATENCY") and whether the name
// is known.
func ParseInput(name string) (Inputs, bool) {
	for i, n := range inputNames {
		if n == name {
			return 1 << i, true
		}
	}
	return 0, false
}
