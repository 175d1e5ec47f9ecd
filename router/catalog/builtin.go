package catalog

import (
	"fmt"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

// builtinTypes is the one list of built-in component types, by kind. Adding
// a type to package builtin means adding it here.
func builtinTypes() []shared.TypeInfo {
	return []shared.TypeInfo{
		// Filters.
		builtin.BusyType(),
		builtin.SLOType(),
		// Scorers.
		builtin.KVAffinityType(),
		builtin.KVCostType(),
		builtin.NormalizedScoreType(),
		// Pickers.
		builtin.CacheAwareType(),
		builtin.LeastLoadedType(),
		builtin.MinCostType(),
		builtin.PowerOfTwoType(),
		builtin.RandomType(),
		builtin.RoundRobinType(),
		// Request classifiers.
		builtin.HeaderPriorityType(),
		builtin.PromptLengthClassType(),
		builtin.SessionAffinityType(),
	}
}

// base holds the built-in types, registered once at init. It is never
// modified afterwards: Default hands out clones.
var base = New()

func init() {
	for _, t := range builtinTypes() {
		if err := base.Register(SourceBuiltin, t); err != nil {
			panic(fmt.Sprintf("catalog: registering built-in types: %v", err))
		}
	}
}

// Default returns a new catalog holding every built-in type, which the
// caller may extend (e.g. with a bundle's plugin types) without affecting
// other callers.
func Default() *Catalog { return base.Clone() }
