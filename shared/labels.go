package shared

import (
	"slices"
	"strconv"
	"strings"
)

// Label is one key=value label of a worker.
type Label struct {
	Key, Value string
}

// Labels is one worker's labels, sorted by Key, each key once. The router
// builds a worker's Labels once, when the worker joins, and every decision
// shares it (Candidates.Labels): treat it as read-only.
//
// A worker's labels are, in this order of precedence: the router-set keys
// (LabelRole, LabelModel, LabelDPRank), then the labels its worker block
// sets (`labels = { ... }` in the workers or policy file) or, for a worker
// found by Kubernetes pod discovery, its pod's labels.
type Labels []Label

// The keys the router sets on every worker's labels. A worker block may not
// set a key under the "switchyard.io/" prefix; a pod label with one of these
// keys is overridden.
const (
	// LabelRole is the worker's role: "aggregated", "prefill" or "decode".
	LabelRole = "switchyard.io/role"
	// LabelModel is the models the worker serves (its block's `models`, or
	// those its engine reports at GET /v1/models), sorted and joined by
	// ","; absent when none is known (simulated workers in router replay
	// serve every model and have none).
	LabelModel = "switchyard.io/model"
	// LabelDPRank is the worker's data-parallel rank in decimal ("0",
	// "1", ...); present only on workers whose engine reports
	// data-parallel ranks.
	LabelDPRank = "switchyard.io/dp-rank"
	// LabelClass is the worker's hardware class, for policies and
	// per-class latency models that must tell a fleet's kinds of hardware
	// apart. Router replay sets it on every simulated worker: "speed-"
	// and the worker's speed relative to the modelled H100 ("speed-1",
	// "speed-2"; router/replay Options.Speeds). Router serve does not set
	// it: it is the one key under LabelPrefix a worker block's (or pod's)
	// labels may set, to name the worker's hardware ("h100", "a10g").
	LabelClass = "switchyard.io/class"
	// LabelPrefix is the prefix of every router-set key.
	LabelPrefix = "switchyard.io/"
)

// LabelsOf returns m as Labels, sorted by key; nil for an empty map.
func LabelsOf(m map[string]string) Labels {
	if len(m) == 0 {
		return nil
	}
	l := make(Labels, 0, len(m))
	for k, v := range m {
		l = append(l, Label{k, v})
	}
	slices.SortFunc(l, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	return l
}

// Get returns the value of key and whether the worker has it, by binary
// search: O(log n).
func (l Labels) Get(key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(l, key, func(e Label, k string) int { return strings.Compare(e.Key, k) })
	if !ok {
		return "", false
	}
	return l[i].Value, true
}

// Map returns a new map of the labels.
func (l Labels) Map() map[string]string {
	m := make(map[string]string, len(l))
	for _, e := range l {
		m[e.Key] = e.Value
	}
	return m
}

// Sorted reports whether the keys are strictly ascending (sorted, each
// once), as Labels must be.
func (l Labels) Sorted() bool {
	for i := 1; i < len(l); i++ {
		if l[i-1].Key >= l[i].Key {
			return false
		}
	}
	return true
}

// WorkerLabels builds a worker's Labels from its own labels (a worker
// block's or a pod's; may be nil) and what the router knows of it: its
// role, its models (LabelModel when any) and, when dataParallel, its rank
// (LabelDPRank). The router-set keys win over own labels of the same key.
func WorkerLabels(own map[string]string, role Role, models []string, dataParallel bool, rank uint32) Labels {
	set := make(map[string]string, len(own)+3)
	for k, v := range own {
		set[k] = v
	}
	if role != "" {
		set[LabelRole] = string(role)
	}
	if ms := modelList(models); ms != "" {
		set[LabelModel] = ms
	}
	if dataParallel {
		set[LabelDPRank] = strconv.FormatUint(uint64(rank), 10)
	}
	return LabelsOf(set)
}

// modelList joins the non-empty models, sorted and each once, by ",".
func modelList(models []string) string {
	if len(models) == 0 {
		return ""
	}
	ms := make([]string, 0, len(models))
	for _, m := range models {
		if m != "" {
			ms = append(ms, m)
		}
	}
	slices.Sort(ms)
	return strings.Join(slices.Compact(ms), ",")
}
