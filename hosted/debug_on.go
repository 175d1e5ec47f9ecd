//go:build switchyard_debug

package hosted

// debugChecks enables the ascending-ids check in Select: this build has the
// switchyard_debug tag.
const debugChecks = true
