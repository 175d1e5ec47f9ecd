// Package disagg holds the component types of the disagg-filter-score-pick
// example plugin, a policy for disaggregated (prefill/decode) serving served
// out of process in one Decide round trip:
//
//   - min-overlap (filter): keeps workers holding at least
//     min_device_overlap_blocks blocks of the request's prefix;
//   - prefill-cost (scorer): pending prefill blocks plus the request's
//     uncached blocks;
//   - decode-cost (scorer): booked decode blocks;
//   - lowest-cost (picker): the lowest summed cost, ties to the lowest
//     worker id, with no randomness.
//
// Every type is refused in a role other than prefill or decode. The package
// imports only the SDK (shared) and the standard library; main.go in the
// parent directory serves Types() with shared.Serve. README.md documents
// each type's formula, inputs and parameters.
//
// Every instance is stateless and safe for concurrent use.
package disagg

import (
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// Types returns the descriptors of every type this plugin serves, in
// pipeline order: the filter, the two scorers, the picker.
func Types() []shared.TypeInfo {
	return []shared.TypeInfo{MinOverlapType(), PrefillCostType(), DecodeCostType(), LowestCostType()}
}

// Errors the components return for malformed input.
var (
	// ErrRole: the instance was configured for a role other than prefill or
	// decode.
	ErrRole = errors.New("role not supported")
	// ErrMissingColumn: a declared input's column (or the costs slice) is
	// nil or has the wrong length.
	ErrMissingColumn = errors.New("declared input column missing")
	// ErrBlockSize: the request's block size is not positive.
	ErrBlockSize = errors.New("request block size must be > 0")
)

// checkRole refuses every role but prefill and decode. The error is a plain
// error, not a *shared.ParamError: it is about the whole block (where the
// policy is used), not one parameter.
func checkRole(typ string, role shared.Role) error {
	if role == shared.RolePrefill || role == shared.RoleDecode {
		return nil
	}
	got := fmt.Sprintf("%q", role)
	if role == "" {
		got = "no role (the policy is not selected for prefill or decode in worker_selection)"
	}
	return fmt.Errorf("%s: %w: configured for %s; allowed roles: %s, %s (this type is for disaggregated serving)",
		typ, ErrRole, got, shared.RolePrefill, shared.RoleDecode)
}
