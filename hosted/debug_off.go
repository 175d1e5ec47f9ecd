//go:build !switchyard_debug

package hosted

// debugChecks enables the ascending-ids check in Select; build with
// -tags switchyard_debug to turn it on.
const debugChecks = false
