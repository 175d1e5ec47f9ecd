package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// engineCounter reads a counter of a mock engine's /metrics (its samples
// of every label set added).
func engineCounter(t *testing.T, e *mockEngine, name string) float64 {
	t.Helper()
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q", name, line)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("engine %s has no %s", e.URL, name)
	}
	return sum
}

// sseNamed splits a stream of named SSE events into their types and data
// ("" for a data line without an event line, as "data: [DONE]").
func sseNamed(t *testing.T, b []byte) (types, data []string) {
	t.Helper()
	typ := ""
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case line == "":
			typ = ""
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			types, data = append(types, typ), append(data, strings.TrimPrefix(line, "data: "))
		default:
			t.Fatalf("not an SSE line: %q", line)
		}
	}
	return types, data
}

// TestDisaggResponsesAndMessages: a disaggregated model's Responses and
// Anthropic Messages requests, streamed and not, run in two hops through
// real mock engines. The prefill engine gets the body bounded in the
// schema's own field (Responses: max_output_tokens 1, no max_tokens;
// Messages: max_tokens 1), not streamed, asking for a remote decode, and
// answers kv_transfer_params naming itself in the schema's answer; the
// decode engine gets the client's body plus exactly those
// kv_transfer_params and computes no prompt token; the client gets the
// decode engine's answer, in the API's own format.
func TestDisaggResponsesAndMessages(t *testing.T) {
	engines, bs := pdFleet(t, 50)
	e := newEnv(t, envOptions{}, bs...)
	type tc struct {
		path   string
		stream bool
		body   string
	}
	var cases []tc
	for i, stream := range []bool{false, true} {
		cases = append(cases,
			tc{"/v1/responses", stream, fmt.Sprintf(`{"model":"m","stream":%v,"max_output_tokens":4,"temperature":0.5,"instructions":"be <brief>","input":[{"role":"user","content":[{"type":"input_text","text":"tell me %d"}]}]}`, stream, i)},
			tc{"/v1/messages", stream, fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":4,"system":"be <brief>","messages":[{"role":"user","content":[{"type":"text","text":"tell me %d"}]}]}`, stream, i)})
	}
	for i, c := range cases {
		id := fmt.Sprintf("api-%d", i)
		what := fmt.Sprintf("%s stream %v", c.path, c.stream)
		resp, err := post(t, context.Background(), e.url+c.path, c.body, "X-Request-Id", id)
		if err != nil {
			t.Fatal(err)
		}
		answer, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d, %v: %s", what, resp.StatusCode, err, answer)
		}
		pw, dw := resp.Header.Get("X-Switchyard-Prefill-Worker"), resp.Header.Get("X-Switchyard-Worker")
		if pdRoles[pw] != shared.RolePrefill || pdRoles[dw] != shared.RoleDecode {
			t.Fatalf("%s: prefill worker %q, decode worker %q", what, pw, dw)
		}

		// The prefill hop, in the schema's own fields.
		pc := findCall(t, engines[pw], id)
		if pc.path != c.path {
			t.Errorf("%s: the prefill went to %s", what, pc.path)
		}
		want := jsonObject(t, []byte(c.body))
		want["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
		want["stream"] = false
		if c.path == "/v1/responses" {
			want["max_output_tokens"] = float64(1)
		} else {
			want["max_tokens"] = float64(1)
		}
		if diff := cmp.Diff(want, jsonObject(t, pc.body)); diff != "" {
			t.Errorf("%s: prefill body (-want +got):\n%s", what, diff)
		}
		var pa struct {
			Object string         `json:"object"` // "response" for the Responses API
			Type   string         `json:"type"`   // "message" for Messages
			KV     map[string]any `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(pc.answer, &pa); err != nil || pa.KV == nil || pa.KV["remote_engine_id"] != "engine-"+pw {
			t.Fatalf("%s: prefill answer %s, want kv_transfer_params naming engine-%s", what, pc.answer, pw)
		}
		if (c.path == "/v1/responses" && pa.Object != "response") || (c.path == "/v1/messages" && pa.Type != "message") {
			t.Errorf("%s: prefill answer %s is not in the API's format", what, pc.answer)
		}

		// The decode hop: the client's body plus the prefill's
		// kv_transfer_params, verbatim; its answer reaches the client.
		dc := findCall(t, engines[dw], id)
		want = jsonObject(t, []byte(c.body))
		want["kv_transfer_params"] = pa.KV
		if diff := cmp.Diff(want, jsonObject(t, dc.body)); diff != "" {
			t.Errorf("%s: decode body (-want +got):\n%s", what, diff)
		}
		if !bytes.Equal(dc.answer, answer) {
			t.Errorf("%s: the client got\n%s\nthe decode engine answered\n%s", what, answer, dc.answer)
		}
		checkAPIAnswer(t, what, c.path, c.stream, resp.Header.Get("Content-Type"), answer)
	}
	// The decode engines computed no prompt token; the prefill engines
	// computed every prompt.
	var prefilled float64
	for name, role := range pdRoles {
		got := engineCounter(t, engines[name], "vllm:prompt_tokens_total")
		if role == shared.RoleDecode && got != 0 {
			t.Errorf("decode engine %s computed %v prompt tokens, want 0", name, got)
		}
		if role == shared.RolePrefill {
			prefilled += got
		}
	}
	if prefilled < float64(len(cases)) {
		t.Errorf("prefill engines computed %v prompt tokens for %d prompts", prefilled, len(cases))
	}
	e.settle(t)
	if got := e.metric(t, "switchyard_requests_total", "model", "m", "code", "200"); got != float64(len(cases)) {
		t.Errorf("requests_total{m,200} = %v, want %d", got, len(cases))
	}
	if got := selections(t, e); !cmp.Equal(got, map[string]uint64{"prefill": uint64(len(cases)), "decode": uint64(len(cases))}) {
		t.Errorf("selection observations by role %v, want %d of each", got, len(cases))
	}
}

// checkAPIAnswer checks a decode answer of 4 tokens is in its API's
// format: a ResponsesResponse or Responses events ending with
// response.completed; an Anthropic message or Anthropic events from
// message_start to message_stop.
func checkAPIAnswer(t *testing.T, what, path string, stream bool, contentType string, answer []byte) {
	t.Helper()
	const text = " lorem ipsum dolor sit"
	if bytes.Contains(answer, []byte("kv_transfer_params")) {
		t.Errorf("%s: the answer carries kv_transfer_params: %s", what, answer)
	}
	if !stream {
		var a struct {
			Object string `json:"object"`
			Type   string `json:"type"`
			Output []struct {
				Content []struct{ Text string } `json:"content"`
			} `json:"output"`
			Content []struct{ Text string } `json:"content"`
		}
		if err := json.Unmarshal(answer, &a); err != nil {
			t.Fatalf("%s: %v: %s", what, err, answer)
		}
		ok := a.Object == "response" && len(a.Output) == 1 && len(a.Output[0].Content) == 1 && a.Output[0].Content[0].Text == text
		if path == "/v1/messages" {
			ok = a.Type == "message" && len(a.Content) == 1 && a.Content[0].Text == text
		}
		if !ok {
			t.Errorf("%s: answer %s, want the 4 tokens in the API's format", what, answer)
		}
		return
	}
	if contentType != "text/event-stream" {
		t.Errorf("%s: content type %q", what, contentType)
	}
	types, data := sseNamed(t, answer)
	var got strings.Builder
	for i, typ := range types {
		var d struct {
			Delta json.RawMessage `json:"delta"`
		}
		switch typ {
		case "response.output_text.delta":
			var s string
			_ = json.Unmarshal([]byte(data[i]), &d)
			_ = json.Unmarshal(d.Delta, &s)
			got.WriteString(s)
		case "content_block_delta":
			var td struct{ Text string }
			_ = json.Unmarshal([]byte(data[i]), &d)
			_ = json.Unmarshal(d.Delta, &td)
			got.WriteString(td.Text)
		}
	}
	first, last := "response.created", "response.completed"
	if path == "/v1/messages" {
		first, last = "message_start", "message_stop"
		if len(data) > 0 && data[len(data)-1] == "[DONE]" {
			types = types[:len(types)-1]
		}
	}
	if got.String() != text || len(types) == 0 || types[0] != first || types[len(types)-1] != last {
		t.Errorf("%s: events %v, text %q; want %s .. %s with the 4 tokens", what, types, got.String(), first, last)
	}
}

// TestDisaggResponsesFollowUp: a disaggregated model's Responses answer
// (streamed or not) binds its id to the decode worker that answered it;
// a follow-up naming it (previous_response_id) runs in one hop on that
// decode worker, with the client's body unchanged (no
// kv_transfer_params: the decode engine computes the whole conversation,
// which only it stores; no prefill engine is asked), and is answered by
// it; GET /v1/responses/{id} reaches it too. An id the router never saw
// is vLLM's 404.
func TestDisaggResponsesFollowUp(t *testing.T) {
	engines, bs := pdFleet(t, 50)
	e := newEnv(t, envOptions{}, bs...)
	for i, stream := range []bool{false, true} {
		what := fmt.Sprintf("first stream %v", stream)
		resp, err := post(t, context.Background(), e.url+"/v1/responses",
			fmt.Sprintf(`{"model":"m","stream":%v,"max_output_tokens":3,"input":"remember %d"}`, stream, i))
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		dw := resp.Header.Get("X-Switchyard-Worker")
		if resp.StatusCode != http.StatusOK || pdRoles[dw] != shared.RoleDecode {
			t.Fatalf("%s: status %d, decode worker %q: %s", what, resp.StatusCode, dw, answer)
		}
		var first struct {
			ID string `json:"id"`
		}
		if stream {
			_, data := sseNamed(t, answer)
			var created struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			_ = json.Unmarshal([]byte(data[0]), &created)
			first.ID = created.Response.ID
		} else {
			_ = json.Unmarshal(answer, &first)
		}
		if !strings.HasPrefix(first.ID, "resp_") {
			t.Fatalf("%s: no response id in %s", what, answer)
		}

		prefills := len(engines["p1"].callsSoFar()) + len(engines["p2"].callsSoFar())
		id := fmt.Sprintf("follow-%d", i)
		body := fmt.Sprintf(`{"model":"m","max_output_tokens":2,"previous_response_id":%q,"input":"and now?"}`, first.ID)
		resp, err = post(t, context.Background(), e.url+"/v1/responses", body, "X-Request-Id", id)
		if err != nil {
			t.Fatal(err)
		}
		answer, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchyard-Worker") != dw || resp.Header.Get("X-Switchyard-Prefill-Worker") != "" {
			t.Fatalf("%s: follow-up status %d, worker %q, prefill worker %q; want 200 from %s alone: %s", what, resp.StatusCode,
				resp.Header.Get("X-Switchyard-Worker"), resp.Header.Get("X-Switchyard-Prefill-Worker"), dw, answer)
		}
		if got := len(engines["p1"].callsSoFar()) + len(engines["p2"].callsSoFar()); got != prefills {
			t.Errorf("%s: the follow-up reached a prefill engine (%d requests, was %d)", what, got, prefills)
		}
		fc := findCall(t, engines[dw], id)
		if string(fc.body) != body {
			t.Errorf("%s: the decode engine got %s, want the client's body unchanged", what, fc.body)
		}
		var a struct {
			Object             string `json:"object"`
			PreviousResponseID string `json:"previous_response_id"`
			Usage              struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(answer, &a); err != nil || a.Object != "response" || a.PreviousResponseID != first.ID || a.Usage.OutputTokens != 2 {
			t.Errorf("%s: follow-up answer %s", what, answer)
		}
		// Retrieving the stored response reaches the same engine.
		gr, err := http.Get(e.url + "/v1/responses/" + first.ID)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := io.ReadAll(gr.Body)
		_ = gr.Body.Close()
		var st struct{ ID string }
		if err := json.Unmarshal(stored, &st); err != nil || gr.StatusCode != http.StatusOK || st.ID != first.ID || gr.Header.Get("X-Switchyard-Worker") != dw {
			t.Errorf("%s: GET the stored response: status %d, worker %q: %s", what, gr.StatusCode, gr.Header.Get("X-Switchyard-Worker"), stored)
		}
	}
	resp, err := post(t, context.Background(), e.url+"/v1/responses", `{"model":"m","previous_response_id":"resp_unknown","input":"x"}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := `{"error":{"message":"Response with id 'resp_unknown' not found.","type":"invalid_request_error","param":"response_id","code":404}}`; resp.StatusCode != http.StatusNotFound ||
		string(bytes.TrimSpace(b)) != want {
		t.Errorf("unknown id: status %d, %s; want 404 %s", resp.StatusCode, b, want)
	}
	e.settle(t)
}
