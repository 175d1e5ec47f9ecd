// Package router assembles a Router from its parts: the resolved policies
// per role, the fleet of workers with their bookings, the prefix index, and
// the selection pipeline (or the hosted fast path for picker-only
// policies). Replay and serve both drive the same Router.
//
// Floors: this root package imports its parts (router/catalog,
// router/config, router/fleet, router/pipeline, router/prefix,
// router/supervisor) and the in-process components (hosted, builtin via the
// catalog); no part imports the root.
//
// A Bundle is what a policy file resolves to at run time (per-role
// policies plus the plugin Host serving them); Router.Reload swaps bundles
// under load and Reloader drives it from SIGHUP or file changes.
package router
