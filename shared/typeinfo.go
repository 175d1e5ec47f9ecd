package shared

// TypeInfo describes one component type: what the catalog registers and what
// a plugin's Describe returns. Like Caddy's ModuleInfo, New returns a fresh
// instance and has no side effects beyond it.
type TypeInfo struct {
	// Name is the type name used in policy files, e.g. "round-robin".
	// Identifier characters [A-Za-z0-9_.-]; "default" is reserved.
	Name string
	// Kind is filter, scorer, picker or classifier.
	Kind Kind
	// Inputs are the inputs an instance may declare (informational; each
	// instance reports its own through Component.Inputs).
	Inputs Inputs
	// Params is the parameter schema, in documentation order.
	Params []ParamSpec
	// Events, for a classifier type served out of process, says that its
	// per-partition Classifiers implement EventListener although the
	// factory New returns does not: the host then forwards lifecycle
	// events to the instance. (A component that itself implements
	// EventListener needs no flag; in process the router finds listeners
	// by type assertion and ignores this field.)
	Events bool
	// Doc is a one-paragraph description for `router validate` and docs.
	Doc string
	// New builds an instance for info from decoded parameters (defaults
	// applied). A parameter it refuses is reported as a *ParamError (several
	// joined with errors.Join); any other error refuses the whole block. The
	// result must implement the interface matching Kind.
	New func(info InstanceInfo, p Params) (Component, error)
}

// InstanceInfo says where a component instance is being created.
type InstanceInfo struct {
	// Name identifies the instance within its bundle, e.g. "decode/kv/cost"
	// (role, policy, block); out-of-process instances are addressed by it.
	Name string
	// Role is the worker role the instance selects for; empty for request
	// classifiers and for policies that no role uses.
	Role Role
	// BlockSize is the router's default tokens per KV block (> 0): the
	// policy file's router.block_size, 512 when unset. Each request
	// carries its own (Request.BlockSize: its model's engines' block size
	// unless router.block_size is set), which its hashes and overlaps are
	// in: read that one per request.
	BlockSize int
}

// Param returns the spec of the named parameter.
func (t *TypeInfo) Param(name string) (ParamSpec, bool) {
	for _, p := range t.Params {
		if p.Name == name {
			return p, true
		}
	}
	return ParamSpec{}, false
}

// WithDefaults returns a copy of p with the schema's defaults filled in for
// absent parameters.
func (t *TypeInfo) WithDefaults(p Params) Params {
	out := make(Params, len(t.Params))
	for k, v := range p {
		out[k] = v
	}
	for _, spec := range t.Params {
		if _, ok := out[spec.Name]; !ok && spec.Default != nil {
			out[spec.Name] = spec.Default
		}
	}
	return out
}
