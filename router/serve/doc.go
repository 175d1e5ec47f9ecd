// Package serve is the HTTP front end of `router serve`: an
// OpenAI-compatible proxy that routes each completion request by the
// Router's policy, passes the engine's answer through (SSE chunk by chunk,
// flushed as it arrives), and releases the request's booking exactly once
// however it ends: the body's end, a worker error, the client leaving
// before or after the headers, or the request timeout.
//
// It is a face of the live runtime (router/live), the sibling of
// router/epp: the runtime parses, keys and admits the request
// (live.Runtime.Key, Admit), reads the engine's answer (live.Meter) and
// counts it; serve reads the HTTP request and its body (bounded by the
// body budgets), answers in the OpenAI shapes, sends each attempt to the
// engine and passes the answer through, retries a worker that failed
// before a byte, and walks disaggregated models' two hops. It imports
// router/live and the parts below it, never router/epp.
//
// Each hop of a request (admission.Path: one aggregated hop, or a prefill
// hop then a decode hop, as replay walks them) is one admission.Handle:
// Admit classifies it once and places it or queues it, Wait returns its
// worker, FirstToken and Progress follow the answer, Retry places it again
// with the failed worker excluded and the same classification, and End,
// deferred, ends it exactly once. The Server keeps no map of its own; the
// runtime's dispatcher places queued requests.
//
// Server is the front end over a live.Runtime; Face makes it the face a
// live.Daemon serves (`router serve` on --listen, `router epp` on
// --http-listen), and its DebugRoutes add /debug/route to the daemon's
// debug listener.
//
// Endpoints:
//
//	POST /v1/chat/completions  routed, streamed or not
//	POST /v1/completions       routed, streamed or not
//	GET  /v1/models            the union of the workers' models
//	GET  /metrics              the server's Prometheus registry
//	GET  /healthz              alive
//	GET  /readyz               policy loaded and a worker ready; JSON Readiness: why, per worker and plugin
//
// The routing key is the prompt's token ids when the request carries them
// (prompt_token_ids, or a prompt that is an array of integers), hashed
// block_size ids per block; otherwise the prompt text (for chat, the
// messages rendered as "role: content\n" lines) hashed in blocks of
// block_size * chars_per_token bytes. chars_per_token (default 4) is an
// approximation of the tokenizer: equal text prefixes still give equal
// block hashes, but block boundaries and the prompt's token count are
// estimates.
//
// # Disaggregated prefill and decode
//
// A model is served in two hops, by vLLM's disaggregated proxy protocol
// (the NixlConnector toy proxy), when no aggregated worker of the fleet
// serves it and a prefill worker does; a model with an aggregated worker
// is served aggregated, as above. The rules:
//
//  1. Mode: with prefill workers but no decode worker the answer is 503
//     no_worker, before any prefill; a model no worker lists stays a 404
//     model_not_found.
//  2. Prefill hop: admitted with role prefill and the prompt's block
//     hashes (classifier, queue and capacity as for an aggregated
//     request). The body is the client's with "kv_transfer_params":
//     {"do_remote_decode": true, "do_remote_prefill": false, and
//     remote_engine_id, remote_block_ids, remote_host, remote_port null},
//     "stream": false, "max_tokens": 1 ("max_completion_tokens": 1 when
//     set), and no stream_options, min_tokens or min_completion_tokens.
//     A prefill worker that fails before its answer is complete (nothing
//     has reached the client) is excluded and the prefill placed again,
//     up to MaxRetries times, then 502. The answer is read whole (at most
//     1 MiB; more is a 502): a non-2xx answer goes to the client as is
//     and ends the request; a 2xx answer without a kv_transfer_params
//     object is a 502 bad_prefill_answer. The prefill hop's handle gets
//     FirstToken and End(Completed: the prompt plus one token) once the
//     answer is read, End(Aborted) on every other path.
//  3. Decode hop: admitted with role decode (classifier, queue and
//     capacity as for the prefill hop; the request id gets "#d"), the
//     prompt's token count and no block hashes (the KV arrives by
//     transfer, not from the decode worker's prefix cache, so the prefix
//     index must not record it). The body is the client's with the
//     prefill answer's kv_transfer_params copied in verbatim. The handle
//     gets FirstToken at the answer's first byte and End exactly once
//     when the answer ends or fails or the client leaves. A decode
//     worker that fails before a byte is excluded (Handle.Retry) and the
//     hop placed again, up to MaxRetries times, then 502. The
//     answer passes through as an aggregated answer does.
//  4. Headers: X-Switchyard-Worker names the decode worker,
//     X-Switchyard-Prefill-Worker the prefill worker (also on a prefill
//     error passed through). Requests, duration and TTFT are counted
//     once per client request; the selection duration once per hop and
//     attempt, labelled role="prefill" or "decode".
//  5. Every prefill and decode booking ends exactly once, whatever ends
//     the request: completion, cancellation, worker failure or timeout.
//
// The request timeout bounds both hops together; the client's
// X-Request-Id is sent on both.
package serve
