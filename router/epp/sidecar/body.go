package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The request bodies of vLLM's disaggregated-serving protocol (the
// NixlConnector's: vllm/distributed/kv_transfer/kv_connector/v1/nixl/
// connector.py reads kv_transfer_params, which the chat, completions,
// Responses and Anthropic Messages requests and answers carry:
// vllm/entrypoints/openai/{chat_completion,completion,responses}/
// protocol.py and vllm/entrypoints/anthropic/protocol.py, vLLM at commit
// 8c296de63b47664fc5979831e1ae2d2a14a05b1a; the toy proxy
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py and llm-d's
// sidecar, pkg/sidecar/proxy/connector_nixlv2.go at llm-d/
// llm-d-inference-scheduler commit 520af47896e5f06e43d09aca281a1149187b0ffd,
// send them). router/serve's disagg.go builds the same bodies for its own
// prefill and decode hops (prefillBody, decodeBody, kvTransferParams);
// these are a copy kept to the fields the sidecar needs, in a package
// router/serve, a face of its own, may not import.

// MaxPrefillAnswer bounds a prefill engine's answer, which the sidecar
// reads whole for its kv_transfer_params: 1 MiB (serve's bound).
const MaxPrefillAnswer = 1 << 20

// prefillKVParams is the prefill request's kv_transfer_params: compute the
// prompt's KV and keep it for a remote decode worker to fetch.
var prefillKVParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// errNotObject: a request body that is not a JSON object.
var errNotObject = errors.New("the request body is not a JSON object")

// PrefillBody is the prefill request's body for a client's body of the
// Responses API (responses true) or of chat, completions or Anthropic
// Messages (whose bound is "max_tokens" too): the body with
// kv_transfer_params asking for a remote decode, "stream": false, its
// output bound 1 ("max_output_tokens" for the Responses API, as llm-d's
// sidecar sets it; else "max_tokens", and "max_completion_tokens" when
// present), and without "stream_options", "min_tokens" and
// "min_completion_tokens" (a prefill generates one token). Every other
// member passes unchanged. Errors: a body that is not a JSON object.
// Linear in the body.
func PrefillBody(body []byte, responses bool) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) {
		m["kv_transfer_params"] = prefillKVParams
		m["stream"] = json.RawMessage("false")
		one := json.RawMessage("1")
		if responses {
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
// the client sent. Errors: a body that is not a JSON object.
func DecodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) { m["kv_transfer_params"] = kv })
}

// KVTransferParams returns the kv_transfer_params object of a prefill
// answer as the answer spells it; false when there is none (absent, null,
// not an object, or the answer is not a JSON object).
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
// (members in key order, HTML characters not escaped).
func editJSON(body []byte, edit func(map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotObject, err)
	}
	if m == nil {
		return nil, errNotObject
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
