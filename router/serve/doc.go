// Package serve is the HTTP front end of `router serve`: an
// OpenAI-compatible proxy that routes each completion request by the
// Router's policy (Admit: classify, queue at capacity, select and book),
// passes the engine's answer through (SSE chunk by chunk, flushed as it
// arrives), and releases the request's booking exactly once however it
// ends: the body's end, a worker error, the client leaving before or after
// the headers, or the request timeout.
//
// Endpoints:
//
//	POST /v1/chat/completions  routed, streamed or not
//	POST /v1/completions       routed, streamed or not
//	GET  /v1/models            the union of the workers' models
//	GET  /metrics              the server's Prometheus registry
//	GET  /healthz              alive
//	GET  /readyz               policy loaded, plugins up, a worker ready
//
// The routing key is the prompt's token ids when the request carries them
// (prompt_token_ids, or a prompt that is an array of integers), hashed
// block_size ids per block; otherwise the prompt text (for chat, the
// messages rendered as "role: content\n" lines) hashed in blocks of
// block_size * chars_per_token bytes. chars_per_token (default 4) is an
// approximation of the tokenizer: equal text prefixes still give equal
// block hashes, but block boundaries and the prompt's token count are
// estimates.
package serve
