// Package router is the selection core: a Router places one request
// (Place) with the resolved policy of its role over the fleet of workers,
// books the chosen worker and records the prompt in the prefix index,
// with no router-wide lock; books a request on a named worker without a
// policy (Bind); and swaps bundles of policies under load (Apply), each
// drained before it is closed. Above it, router/admission classifies,
// queues and tracks requests with handles; replay and serve both drive
// that. Reading a policy file into a Bundle (its plugins started, its
// reloads) is router/loader's job, above the core.
//
// Floors: this root package imports, of this module, only its parts
// router/fleet, router/prefix and router/pipeline, the resolved policy
// they all pass around (router/policy, which imports only the SDK, so
// hosted can use it too), the hosted fast path (hosted) and the SDK
// (shared); no part imports the root. TestCoreImports keeps it so.
//
// The root holds the selection core and the bundle swap only: router.go
// (Router, Place, Bind, bookings, the prefix index behind Prefix),
// explain.go (Explain: a decision with its trace, for /debug/route),
// shadow.go (the shadow decisions Place asks beside the live one, inline
// for replay or on bounded goroutines for serve; switchyard_shadow_*) and
// bundle.go (Bundle: compiled role policies, their decisions in flight,
// drain and close; Apply's other half).
package router
