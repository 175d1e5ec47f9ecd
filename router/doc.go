// Package router assembles a Router from its parts: the resolved policies
// per role, the fleet of workers with their bookings, the prefix index, and
// the selection pipeline (or the hosted fast path for picker-only
// policies). Replay and serve both drive the same Router.
//
// Floors: this root package imports its parts (router/catalog,
// router/config, router/fleet, router/pipeline, router/prefix) and the
// in-process components (hosted, builtin via the catalog); no part imports
// the root.
package router
