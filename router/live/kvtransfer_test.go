package live

import (
	"errors"
	"testing"
)

// TestPrefillBodyPerSchema: the prefill body bounds the output in each
// schema's own field (Responses: max_output_tokens; chat, completions and
// Messages: max_tokens, and max_completion_tokens when set), is not
// streamed, asks for a remote decode, drops what a one-token prefill
// cannot honour, and keeps every other member as sent (HTML unescaped).
func TestPrefillBodyPerSchema(t *testing.T) {
	const kv = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	for _, tc := range []struct {
		api        API
		body, want string
	}{
		{APIResponses, `{"model":"m","input":"<hi>","max_output_tokens":9,"stream":true,"store":true}`,
			`{"input":"<hi>",` + kv + `,"max_output_tokens":1,"model":"m","store":true,"stream":false}`},
		{APIResponses, `{"model":"m","input":"hi"}`,
			`{"input":"hi",` + kv + `,"max_output_tokens":1,"model":"m","stream":false}`},
		{APIMessages, `{"model":"m","max_tokens":64,"stream":true,"system":"s","messages":[{"role":"user","content":"hi"}]}`,
			`{` + kv + `,"max_tokens":1,"messages":[{"role":"user","content":"hi"}],"model":"m","stream":false,"system":"s"}`},
		{APIChat, `{"model":"m","max_completion_tokens":7,"min_tokens":2,"stream":true,"stream_options":{"include_usage":true},"messages":[]}`,
			`{` + kv + `,"max_completion_tokens":1,"max_tokens":1,"messages":[],"model":"m","stream":false}`},
		{APICompletions, `{"model":"m","prompt":"p","kv_transfer_params":{"x":1}}`,
			`{` + kv + `,"max_tokens":1,"model":"m","prompt":"p","stream":false}`},
	} {
		got, err := PrefillBody([]byte(tc.body), tc.api)
		if err != nil || string(got) != tc.want {
			t.Errorf("%v %s:\n got %s, %v\nwant %s", tc.api, tc.body, got, err, tc.want)
		}
	}
	for _, bad := range []string{`[1]`, `null`, `{"a":`, ``} {
		if _, err := PrefillBody([]byte(bad), APIResponses); !errors.Is(err, ErrBadRequest) {
			t.Errorf("PrefillBody(%q): %v, want ErrBadRequest", bad, err)
		}
		if _, err := DecodeBody([]byte(bad), []byte(`{}`)); !errors.Is(err, ErrBadRequest) {
			t.Errorf("DecodeBody(%q): %v, want ErrBadRequest", bad, err)
		}
	}
}

// TestKVTransferParamsAnswers: the prefill answer's top-level
// kv_transfer_params object, as each schema's answer carries it; none for
// null, a non-object or a body that is not JSON.
func TestKVTransferParamsAnswers(t *testing.T) {
	for _, tc := range []struct {
		answer, want string
	}{
		{`{"id":"resp_1","object":"response","output":[],"kv_transfer_params":{"remote_engine_id":"e","remote_block_ids":[1]}}`,
			`{"remote_engine_id":"e","remote_block_ids":[1]}`},
		{`{"id":"chatcmpl-1","type":"message","content":[],"kv_transfer_params": {"remote_host":"h"} }`, `{"remote_host":"h"}`},
		{`{"kv_transfer_params":null}`, ""},
		{`{"kv_transfer_params":"x"}`, ""},
		{`{"response":{"kv_transfer_params":{"a":1}}}`, ""},
		{`event: response.completed`, ""},
	} {
		got, ok := KVTransferParams([]byte(tc.answer))
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("KVTransferParams(%s) = %s, %v; want %q", tc.answer, got, ok, tc.want)
		}
	}
	got, err := DecodeBody([]byte(`{"model":"m","kv_transfer_params":{"old":1},"input":"<x>"}`), []byte(`{"new":2}`))
	if want := `{"input":"<x>","kv_transfer_params":{"new":2},"model":"m"}`; err != nil || string(got) != want {
		t.Errorf("DecodeBody = %s, %v; want %s", got, err, want)
	}
}
