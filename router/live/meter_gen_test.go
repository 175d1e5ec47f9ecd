package live

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router/admission"
)

// Answers shaped as vLLM writes them: Responses by ResponsesResponse and
// its streaming events (vllm/entrypoints/openai/responses/protocol.py at
// 010a69ce, each event "event: TYPE\ndata: JSON\n\n"), Messages by
// messages_full_converter and message_stream_converter
// (vllm/entrypoints/anthropic/serving.py at 0001948b), and, for the
// cache fields, as Anthropic's Messages reference gives them.
const (
	responsesAnswer = `{"id":"resp_6a0c1b2e","created_at":1765000000,"incomplete_details":null,"instructions":null,"metadata":null,"model":"m","object":"response",` +
		`"output":[{"id":"msg_1","content":[{"annotations":[],"text":"4","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}],` +
		`"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":100,"max_tool_calls":null,` +
		`"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"completed","text":null,"top_logprobs":null,"truncation":"disabled",` +
		`"usage":{"input_tokens":21,"input_tokens_details":{"cached_tokens":16,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":2,` +
		`"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":23},"user":null}`

	responsesStream = "event: response.created\n" +
		`data: {"response":{"id":"resp_9f8e7d","created_at":1765000000,"model":"m","object":"response","output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}` + "\n\n" +
		"event: response.in_progress\n" +
		`data: {"response":{"id":"resp_9f8e7d","model":"m","object":"response","output":[],"status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}` + "\n\n" +
		"event: response.output_item.added\n" +
		`data: {"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}` + "\n\n" +
		"event: response.content_part.added\n" +
		`data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":3,"type":"response.content_part.added"}` + "\n\n" +
		"event: response.output_text.delta\n" +
		`data: {"content_index":0,"delta":"Hel","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}` + "\n\n" +
		"event: response.output_text.delta\n" +
		`data: {"content_index":0,"delta":"lo","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":5,"type":"response.output_text.delta"}` + "\n\n" +
		"event: response.output_text.delta\n" +
		`data: {"content_index":0,"delta":"!","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":6,"type":"response.output_text.delta"}` + "\n\n" +
		"event: response.output_text.done\n" +
		`data: {"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"text":"Hello!","type":"response.output_text.done"}` + "\n\n" +
		"event: response.content_part.done\n" +
		`data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"Hello!","type":"output_text"},"sequence_number":8,"type":"response.content_part.done"}` + "\n\n" +
		"event: response.output_item.done\n" +
		`data: {"item":{"id":"msg_1","content":[{"annotations":[],"text":"Hello!","type":"output_text"}],"role":"assistant","status":"completed","type":"message"},"output_index":0,"sequence_number":9,"type":"response.output_item.done"}` + "\n\n" +
		"event: response.completed\n" +
		`data: {"response":{"id":"resp_9f8e7d","model":"m","object":"response","output":[{"id":"msg_1","content":[{"annotations":[],"text":"Hello!","type":"output_text"}],"role":"assistant","status":"completed","type":"message"}],"status":"completed",` +
		`"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":43}},"sequence_number":10,"type":"response.completed"}` + "\n\n"

	messagesAnswer = `{"id":"chatcmpl-4b1f","type":"message","role":"assistant","content":[{"type":"text","text":"Hi there"}],"model":"m","stop_reason":"end_turn",` +
		`"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":null,"cache_read_input_tokens":null},"kv_transfer_params":null}`

	// Anthropic's reference splits the prompt: 5 uncached + 48 read + 0 written.
	messagesAnswerCached = `{"id":"msg_01","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":48,"output_tokens":7}}`

	messagesStream = "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"chatcmpl-4b1f","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":0}}}` + "\n\n" +
		"event: ping\n" + `data: {"type":"ping"}` + "\n\n" +
		"event: content_block_start\n" +
		`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}` + "\n\n" +
		"event: content_block_stop\n" +
		`data: {"type":"content_block_stop","index":0}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":12,"output_tokens":2}}` + "\n\n" +
		"event: message_stop\n" +
		`data: {"type":"message_stop"}` + "\n\n"
)

// The meter reads each schema's answers: usage (prompt, cached,
// completion) into the token counters, progress one token per
// token-carrying event only, and the Responses id; a stream read in
// chunks of any size reads the same.
func TestMeterGenSchemas(t *testing.T) {
	for _, c := range []struct {
		name         string
		api          API
		body, answer string
		// What the meter must read.
		prompt, cached, completion float64
		events                     int64 // token-carrying events
		id                         string
		ctxTokens                  int64 // Done's context tokens
	}{
		{name: "responses", api: APIResponses, body: `{"model":"m","input":"What is 2+2?"}`, answer: responsesAnswer,
			prompt: 21, cached: 16, completion: 2, id: "resp_6a0c1b2e", ctxTokens: 23},
		{name: "responses stream", api: APIResponses, body: `{"model":"m","stream":true,"input":"hi"}`, answer: responsesStream,
			prompt: 40, cached: 32, completion: 3, events: 3, id: "resp_9f8e7d"},
		{name: "messages", api: APIMessages, body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, answer: messagesAnswer,
			prompt: 12, completion: 3, ctxTokens: 15},
		{name: "messages cached", api: APIMessages, body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, answer: messagesAnswerCached,
			prompt: 53, cached: 48, completion: 7, ctxTokens: 60},
		{name: "messages stream", api: APIMessages, body: `{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, answer: messagesStream,
			prompt: 12, completion: 2, events: 2},
	} {
		for _, size := range []int{1, 7, 64, len(c.answer)} {
			e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)})
			p, err := e.rt.Place(context.Background(), c.api, http.Header{}, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(c.answer); i += size {
				p.meter.Read([]byte(c.answer[i:min(i+size, len(c.answer))]))
			}
			if got := p.meter.Tokens() - int64(p.PromptTokens); got != c.events {
				t.Errorf("%s in chunks of %d: %d events of progress, want %d", c.name, size, got, c.events)
			}
			if got := p.meter.ResponseID(); got != c.id {
				t.Errorf("%s in chunks of %d: ResponseID %q, want %q", c.name, size, got, c.id)
			}
			ctxTokens := p.meter.Done()
			want := c.ctxTokens
			if want == 0 {
				want = int64(p.PromptTokens) + c.events
			}
			if ctxTokens != want {
				t.Errorf("%s in chunks of %d: Done %d context tokens, want %d", c.name, size, ctxTokens, want)
			}
			met := e.rt.met
			for _, m := range []struct {
				name      string
				got, want float64
			}{
				{"prompt", testutil.ToFloat64(met.promptTokens.WithLabelValues("m")), c.prompt},
				{"cached", testutil.ToFloat64(met.cachedTokens.WithLabelValues("m")), c.cached},
				{"completion", testutil.ToFloat64(met.completionTokens.WithLabelValues("m")), c.completion},
			} {
				if m.got != m.want {
					t.Errorf("%s in chunks of %d: %s tokens %v, want %v", c.name, size, m.name, m.got, m.want)
				}
			}
			// The engine's prompt count was compared with the router's
			// (character-keyed here: unknown).
			if got := testutil.ToFloat64(met.promptMatch.WithLabelValues("m", "unknown")); got != 1 {
				t.Errorf("%s in chunks of %d: prompt token match counted %v times, want 1", c.name, size, got)
			}
			e.rt.End(p.Handle, admission.Completed(ctxTokens))
		}
	}
}

// A Responses stream's id is bounded and read from response.created; an
// id over MaxResponseID, or not a string, is ignored; CRLF line ends and
// an event split anywhere read the same.
func TestMeterResponseIDBounds(t *testing.T) {
	for _, c := range []struct {
		answer, want string
	}{
		{"event: response.created\r\ndata: {\"response\":{\"id\":\"resp_1\"},\"type\":\"response.created\"}\r\n\r\n", "resp_1"},
		{"event: response.created\ndata: {\"response\":{\"id\":\"" + strings.Repeat("x", MaxResponseID+1) + "\"}}\n\n", ""},
		{"event: response.created\ndata: {\"response\":{\"id\":5}}\n\n", ""},
		{"event: response.created\ndata: {\"response\":{\"id\":\"resp_2\"\n\n", ""}, // not JSON
		// No created event: the final event's id.
		{"event: response.completed\ndata: {\"response\":{\"id\":\"resp_3\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1,\"total_tokens\":2}}}\n\n", "resp_3"},
	} {
		r := newSSEReader(APIResponses)
		for i := 0; i < len(c.answer); i++ {
			r.read([]byte{c.answer[i]})
		}
		if r.respID != c.want {
			t.Errorf("%.60q: id %q, want %q", c.answer, r.respID, c.want)
		}
	}
	// An event larger than MaxUsageBody is not kept.
	r := newSSEReader(APIResponses)
	big := "event: response.completed\ndata: {\"response\":{\"id\":\"resp_4\",\"pad\":\"" + strings.Repeat("a", MaxUsageBody) + "\",\"usage\":{\"input_tokens\":1}}}\n\n"
	r.read([]byte(big))
	if r.respID != "" || r.usage.ok || len(r.capture) != 0 {
		t.Errorf("oversized event: id %q usage %+v, %d bytes kept", r.respID, r.usage, len(r.capture))
	}
}

// TestMeterEnded: a chat or completions stream is whole when it ends with
// "data: [DONE]", however its bytes were split; one that does not is
// cut; an answer that is not streamed always reads as whole.
func TestMeterEnded(t *testing.T) {
	whole := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"
	for _, step := range []int{1, 3, 16, 17, len(whole)} {
		m := Meter{stream: true}
		for i := 0; i < len(whole); i += step {
			m.keepTail([]byte(whole[i:min(i+step, len(whole))]))
		}
		if !m.Ended() {
			t.Errorf("step %d: a whole stream read as cut (tail %q)", step, m.tail[:m.tailN])
		}
		cut := Meter{stream: true}
		for i := 0; i < len(whole)-len("data: [DONE]\n\n"); i += step {
			cut.keepTail([]byte(whole[i:min(i+step, len(whole)-len("data: [DONE]\n\n"))]))
		}
		if cut.Ended() {
			t.Errorf("step %d: a cut stream read as whole", step)
		}
	}
	if !(&Meter{}).Ended() {
		t.Error("an answer that is not streamed read as cut")
	}
}
