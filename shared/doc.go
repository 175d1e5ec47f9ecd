// Package shared is the Switchyard plugin SDK: the component contracts
// (Filter, Scorer, Picker, and the request classifier: ClassifierFactory,
// Classifier), request lifecycle events (EventListener), the request and
// candidate types they see, the declared-input flags, parameter schemas,
// the typed errors, and the go-plugin glue that serves them out of process
// (Serve, with the Handshake and APIVersion it speaks).
//
// Built-in components (package builtin) and out-of-process plugins implement
// the same interfaces, so a component written for one can be served as the
// other unchanged. Plugin authors import only this package; it never imports
// the router. The router's side is no part of the SDK: its plugin client
// and the decision tasks it sends (internal/pluginclient), the resolved
// policy it runs (router/policy) and its guard around a classifier call
// (router/admission).
//
// Module: this package is the root of the SDK module,
// github.com/switchyard-router/switchyard/shared (shared/go.mod), which also
// holds the generated protocol (shared/pluginproto/switchyard/plugin/v1) and
// the wire encodings both ends agree on (shared/pluginwire). The module
// requires only go-plugin, grpc, protobuf, hclog and golang.org/x/time, so a
// plugin's go.mod carries none of the router's dependencies. It is tagged
// shared/vX.Y.Z; what a minor release may change is in docs/sdk.md.
//
// Concurrency: one component instance serves every request concurrently.
// Every method must be safe for concurrent use; state kept between calls
// lives in atomics or behind a lock inside the component.
package shared
