// Package shared is the Switchyard plugin SDK: the component contracts
// (Filter, Scorer, Picker), the request and candidate types they see, the
// declared-input flags, parameter schemas, and the typed selection errors.
//
// Built-in components (package builtin) and out-of-process plugins implement
// the same interfaces, so a component written for one can be served as the
// other unchanged. Plugin authors import only this package; it never imports
// the router.
//
// Concurrency: one component instance serves every request concurrently.
// Every method must be safe for concurrent use; state kept between calls
// lives in atomics or behind a lock inside the component.
package shared
