package sidecar

import (
	"encoding/json"

	"github.com/switchyard-router/switchyard/router/live"
)

// The request bodies of vLLM's disaggregated-serving protocol: the
// sidecar sends the same ones as router/serve's two hops, built by one
// set of functions in router/live (live.PrefillBody, live.DecodeBody,
// live.KVTransferParams), whose doc comments cite vLLM's and llm-d's
// sources. These keep the sidecar's names.

// MaxPrefillAnswer bounds a prefill engine's answer, which the sidecar
// reads whole for its kv_transfer_params: live.MaxPrefillAnswer, 1 MiB.
const MaxPrefillAnswer = live.MaxPrefillAnswer

// PrefillBody is the prefill request's body for a client's body of the
// Responses API (responses true) or of chat, completions or Anthropic
// Messages: live.PrefillBody (kv_transfer_params asking for a remote
// decode, "stream": false, the output bound 1 in "max_output_tokens" for
// the Responses API, else "max_tokens"). Errors: a body that is not a
// JSON object (wrapping live.ErrBadRequest). Linear in the body.
func PrefillBody(body []byte, responses bool) ([]byte, error) {
	api := live.APIChat
	if responses {
		api = live.APIResponses
	}
	return live.PrefillBody(body, api)
}

// DecodeBody is the decode request's body: live.DecodeBody, the client's
// body with the prefill answer's kv_transfer_params (kv, a JSON object).
// Errors: a body that is not a JSON object.
func DecodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	return live.DecodeBody(body, kv)
}

// KVTransferParams returns the kv_transfer_params object of a prefill
// answer as the answer spells it (live.KVTransferParams); false when
// there is none.
func KVTransferParams(answer []byte) (json.RawMessage, bool) {
	return live.KVTransferParams(answer)
}
