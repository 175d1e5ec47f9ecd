// Package router is the selection core: a Router places one request
// (Place) with the resolved policy of its role over the fleet of workers,
// books the chosen worker and records the prompt in the prefix index,
// with no router-wide lock; and it swaps bundles under load (Apply,
// Reload). Above it, router/admission classifies, queues and tracks
// requests with handles; replay and serve both drive that.
//
// Floors: this root package imports its parts (router/catalog,
// router/config, router/fleet, router/pipeline, router/prefix,
// router/supervisor) and the in-process components (hosted, builtin via the
// catalog); no part imports the root. The resolved policy they all pass
// around (router/policy) imports only the SDK, so hosted can use it too.
//
// A Bundle is what a policy file resolves to at run time (per-role
// policies plus the plugin Host serving them); Router.Reload swaps bundles
// under load and Reloader drives it from SIGHUP or file changes.
package router
