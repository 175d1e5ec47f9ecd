package live

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The request bodies of vLLM's disaggregated-serving protocol, shared by
// both live faces' two-hop paths (router/serve's disagg.go and
// router/epp/sidecar): the prefill hop asks an engine to compute the
// prompt's KV and keep it for a remote decode (kv_transfer_params with
// do_remote_decode, as vLLM's NixlConnector reads it:
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py); its
// answer's kv_transfer_params, passed to the decode hop, say where the KV
// is. Chat and completions requests and answers carry kv_transfer_params
// (vllm/entrypoints/openai/{chat_completion,completion}/protocol.py);
// Responses ones since vLLM pull request 37424 (ResponsesRequest and
// ResponsesResponse.kv_transfer_params, set by responses_full_generator
// in vllm/entrypoints/openai/responses/serving.py@0001948b); Anthropic
// Messages ones through the chat completion vLLM runs for them
// (AnthropicMessagesRequest and AnthropicMessagesResponse.
// kv_transfer_params: vllm/entrypoints/anthropic/protocol.py and
// serving.py@0001948b). vLLM's toy proxy
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) and llm-d's
// sidecar (llm-d/llm-d-inference-scheduler pkg/sidecar/proxy/
// connector_nixlv2.go at commit 520af47896e5f06e43d09aca281a1149187b0ffd)
// send the same bodies.

// MaxPrefillAnswer bounds a prefill engine's answer, which a two-hop path
// reads whole for its kv_transfer_params: 1 MiB.
const MaxPrefillAnswer = 1 << 20

// prefillKVParams is the prefill request's kv_transfer_params: compute the
// prompt's KV and keep it for a remote decode worker to fetch.
var prefillKVParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// PrefillBody is the prefill request's body for a client's body of schema
// api (a generation schema: APICompletions, APIChat, APIResponses,
// APIMessages): the body with kv_transfer_params asking for a remote
// decode, "stream": false, its output bound 1 in the schema's own field
// ("max_output_tokens" for the Responses API; "max_tokens" for the
// others, Anthropic Messages' included, and "max_completion_tokens" too
// when the body sets it), and without "stream_options", "min_tokens" and
// "min_completion_tokens" (a prefill generates one token). Every other
// member passes unchanged; members come out in key order, HTML characters
// not escaped. Errors wrap ErrBadRequest: a body that is not a JSON
// object. Linear in the body.
func PrefillBody(body []byte, api API) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) {
		m["kv_transfer_params"] = prefillKVParams
		m["stream"] = json.RawMessage("false")
		one := json.RawMessage("1")
		if api == APIResponses {
			m["max_output_tokens"] = one
		} else {
			m["max_tokens"] = one
			if _, ok := m["max_completion_tokens"]; ok {
				m["max_completion_tokens"] = one
			}
		}
		delete(m, "stream_options")
		delete(m, "min_tokens")
		delete(m, "min_completion_tokens")
	})
}

// DecodeBody is the decode request's body: the client's body with the
// prefill answer's kv_transfer_params (kv, a JSON object) in place of any
// the client sent, whatever the schema. Errors wrap ErrBadRequest: a body
// that is not a JSON object. Linear in the body.
func DecodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) { m["kv_transfer_params"] = kv })
}

// KVTransferParams returns the kv_transfer_params object of a prefill
// answer (not streamed: PrefillBody sets "stream": false) as the answer
// spells it. Every generation schema's answer carries it as a top-level
// member: the chat completion's and completion's, the ResponsesResponse's
// and the Anthropic message's (see the sources above). False when there
// is none: absent, null, not an object, or an answer that is not a JSON
// object. Linear in the answer.
func KVTransferParams(answer []byte) (json.RawMessage, bool) {
	var v struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(answer, &v) != nil {
		return nil, false
	}
	kv := bytes.TrimSpace(v.KV)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, false
	}
	return kv, true
}

// editJSON decodes a JSON object, edits its members and encodes it again
// (members in key order, HTML characters not escaped). Errors wrap
// ErrBadRequest for a body that is not a JSON object.
func editJSON(body []byte, edit func(map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: the request body is not a JSON object: %w", ErrBadRequest, err)
	}
	if m == nil {
		return nil, fmt.Errorf("%w: the request body is not a JSON object", ErrBadRequest)
	}
	edit(m)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encoding the rewritten body: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
