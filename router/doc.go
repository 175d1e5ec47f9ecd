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
// The root holds the selection core and the bundle swap only: router.go
// (Router, Place, bookings), shadow.go (the shadow decisions Place asks
// beside the live one, inline for replay or on bounded goroutines for
// serve; switchyard_shadow_*), bundle.go (Bundle, LoadBundle, Apply and the
// old bundle's drain) and reload.go (Router.Reload: load a policy file into
// a new Bundle and swap it in; switchyard_policy_reloads_total). A Bundle
// is what a policy file resolves to at run time (per-role policies plus the
// plugin Host serving them). What decides when to reload (SIGHUP, the
// policy file's watch) is the live runtime's wiring: live.Reloader, in
// router/live.
package router
