// Package live is the live runtime both live faces run on: router/serve
// (the OpenAI HTTP face) and router/epp (the Envoy ext_proc face), which
// are siblings that import this package and never each other.
//
// Its one job is the request's life between a face and the selection
// core:
//
//   - Daemon: the runtime without its command line. It loads the policy
//     file (loader.LoadBundle), builds the Router with admission, the
//     workers (workers.Manager) from the policy file's worker blocks, the
//     workers file and the pods (WorkerSource), the engines' KV-event
//     subscriptions (kvsubs.go), the tokenizers, the cluster replica, the
//     reload loop (Reloader: SIGHUP and the policy file's watch) and the
//     debug listener (/debug/pprof/, /debug/workers,
//     /debug/workers/NAME/blocks, and the face's own views), then serves
//     its Face (FaceFunc) until its context ends.
//   - Runtime: request intake (ParseRequest, Key, Admit, and Place, which
//     does all three and waits for a placement), admission's dispatcher,
//     readiness (Readiness), and the request metrics (CountRequest).
//   - Meter: the one reader of an engine's answer: SSE events counted,
//     first byte and time to first token, usage kept and read, the
//     context tokens the booking ends with. serve's proxy and the EPP's
//     response phase (Place, Answer, FirstByte, Finish) both read with it.
//
// It imports the selection core (router), loader, admission, cluster, workers,
// tokenizer, config, upstream and the other parts below the faces; never
// a face, nor cmd/router.
package live
