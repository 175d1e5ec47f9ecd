package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
)

// send sends one request through ext_proc with method and path: its
// headers, and its body when body is not "" (a request without a body
// is whole with its headers, as a GET is). It returns the stream, the
// picked destination header ("" when it was answered at once) and the
// answer that completed the request.
func (e *routerEnv) send(t *testing.T, ctx context.Context, method, path, id, body string) (*envoy, string, *extprocv3.ProcessingResponse) {
	t.Helper()
	ev := newEnvoy(t, ctx, e.client)
	hdr := headersMsg(id, body == "", nil)
	hs := hdr.GetRequestHeaders().GetHeaders().GetHeaders()
	hs[0].RawValue, hs[1].RawValue = []byte(method), []byte(path)
	ev.mustSend(hdr)
	var r *extprocv3.ProcessingResponse
	if body == "" {
		r = ev.mustRecv()
		if c := r.GetRequestHeaders().GetResponse(); c != nil {
			dest, _ := destination(t, r, c)
			return ev, dest, r
		}
		return ev, "", r
	}
	ev.mustRecv()
	ev.mustSend(bodyMsg(body, true))
	r = ev.mustRecv()
	if c := r.GetRequestBody().GetResponse(); c != nil {
		dest, _ := destination(t, r, c)
		return ev, dest, r
	}
	return ev, "", r
}

// answer runs a picked request's response: its status, then body in one
// chunk ending the stream.
func (ev *envoy) answer(status, body string) {
	ev.t.Helper()
	ev.mustSend(respHeadersStatus("", status))
	ev.mustRecv()
	ev.mustSend(respBodyMsg(body, true))
	ev.mustRecv()
	ev.finish()
}

// other returns the endpoint of e's two that is not ep.
func (e *routerEnv) other(ep string) string {
	if ep == e.eps[0] {
		return e.eps[1]
	}
	return e.eps[0]
}

// prefillTokens returns the prefill tokens booked on the worker at
// endpoint ep.
func (e *routerEnv) prefillTokens(ep string) int64 {
	var n int64
	for _, w := range e.r.Workers("m", shared.RoleAggregated) {
		if e.eps[int(w.Name[1]-'0')] == ep {
			n += w.Load(false).ActivePrefillTokens
		}
	}
	return n
}

// TestRouterPickerPoolingByLoad: the pooling and scoring endpoints are
// picked by the policy among the workers serving the model, by load:
// with one worker holding a chat request, an embeddings request goes to
// the other, booked there with its inputs' size (12 tokens: 40 and 8
// characters at 4 a token) until its answer ends. Each pooling path of
// the table is picked and booked; a body without a model is 400 in
// OpenAI's words, one whose model is not a string 400 naming it, both
// booking nothing.
func TestRouterPickerPoolingByLoad(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	held, busy, r := e.pick(t, t.Context(), "chat", chatOf(strings.Repeat("a held chat request ", 20)), nil)
	if busy == "" {
		t.Fatalf("chat not picked: %v", r)
	}
	emb := fmt.Sprintf(`{"model":"m","input":[%q,%q]}`, strings.Repeat("x", 40), strings.Repeat("y", 8))
	ev, got, r := e.send(t, t.Context(), "POST", "/v1/embeddings", "emb", emb)
	if got != e.other(busy) {
		t.Fatalf("embeddings picked %q (%v) while %s holds a request, want the idle %s", got, r, busy, e.other(busy))
	}
	if a := e.active(); a[busy] != 1 || a[got] != 1 {
		t.Fatalf("bookings %v, want one on each", a)
	}
	if n := e.prefillTokens(got); n != 12 {
		t.Errorf("embeddings booked with %d prefill tokens, want 12 (its inputs' size)", n)
	}
	ev.answer("200", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":3,"total_tokens":3}}`)
	e.eventually(t, "the embeddings booking ends", func() bool { a := e.active(); return a[got] == 0 && a[busy] == 1 })
	held.complete()
	e.settle(t)

	for _, path := range []string{"/pooling", "/classify", "/v1/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"} {
		body := `{"model":"m","query":"q","documents":["a","b"],"text_1":"x","text_2":"y","input":"z"}`
		ev, got, r := e.send(t, t.Context(), "POST", path+"?x=1", path, body)
		if got != e.eps[0] && got != e.eps[1] {
			t.Fatalf("%s: picked %q (%v)", path, got, r)
		}
		if a := e.active(); a[got] != 1 {
			t.Fatalf("%s: bookings %v, want one on %s", path, a, got)
		}
		ev.answer("200", `{"data":[]}`)
		e.settle(t)
	}

	for _, tc := range []struct{ body, msg string }{
		{`{"input":"x"}`, "invalid request: you must provide a model parameter"},
		{`{"model":7,"input":"x"}`, `invalid request: "model" must not be a JSON number`},
		{`[1]`, "invalid request: body must be a JSON object, not a JSON array"},
	} {
		ev, got, r := e.send(t, t.Context(), "POST", "/v1/embeddings", "bad", tc.body)
		if got != "" {
			t.Fatalf("%s picked %q", tc.body, got)
		}
		if status, body := immediateOf(t, r); status != 400 || body["code"] != "invalid_request" || body["message"] != tc.msg {
			t.Errorf("%s: %d %v, want 400 invalid_request %q", tc.body, status, body, tc.msg)
		}
		ev.finish()
	}
	e.settle(t)
}

// TestRouterPickerUtilitiesNotBooked: tokenize and detokenize go to the
// ready worker serving the model with the fewest requests in flight
// (serve's rule, live.Runtime.UtilityWorker), with no fallbacks, and are
// not booked: while one worker holds a chat request each goes to the
// other, and the bookings stay as they were; with both idle, ties
// alternate. A model no worker serves or lists is 404 model_not_found, as
// serve answers it; a body without a model 400.
func TestRouterPickerUtilitiesNotBooked(t *testing.T) {
	e := newRouterEnvWith(t, 2, "", 2)
	held, dests, r := e.pick(t, t.Context(), "chat", chatOf("hold it"), nil)
	busy, _, _ := strings.Cut(dests, ",")
	if busy == "" {
		t.Fatalf("chat not picked: %v", r)
	}
	for i, path := range []string{"/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"} {
		body := `{"model":"m","prompt":"hello"}`
		if strings.Contains(path, "detok") {
			body = `{"model":"m","tokens":[1,2,3]}`
		}
		ev, got, r := e.send(t, t.Context(), "POST", path, fmt.Sprint("tok", i), body)
		if got != e.other(busy) {
			t.Fatalf("%s picked %q (%v) while %s holds a request, want only the idle %s", path, got, r, busy, e.other(busy))
		}
		if a := e.active(); a[busy] != 1 || a[got] != 0 {
			t.Fatalf("%s: bookings %v, want the chat's alone", path, a)
		}
		// The proxy reports a fallback served: nothing is booked to move.
		ev.mustSend(respHeadersMsg(busy))
		ev.mustRecv()
		if a := e.active(); a[busy] != 1 || a[got] != 0 {
			t.Fatalf("%s served elsewhere: bookings %v, want the chat's alone", path, a)
		}
		ev.mustSend(respBodyMsg(`{"tokens":[1],"count":1,"max_model_len":4096}`, true))
		ev.mustRecv()
		ev.finish()
	}
	held.complete()
	e.settle(t)
	seen := map[string]int{}
	for i := range 4 {
		ev, got, _ := e.send(t, t.Context(), "POST", "/tokenize", fmt.Sprint("rr", i), `{"model":"m","prompt":"hi"}`)
		seen[got]++
		ev.answer("200", `{"tokens":[1],"count":1}`)
	}
	if seen[e.eps[0]] != 2 || seen[e.eps[1]] != 2 {
		t.Errorf("idle workers' ties picked %v, want each twice (round-robin)", seen)
	}

	ev, got, r := e.send(t, t.Context(), "POST", "/tokenize", "unknown", `{"model":"nobody","prompt":"hi"}`)
	if status, body := immediateOf(t, r); got != "" || status != 404 || body["code"] != "model_not_found" ||
		body["type"] != "invalid_request_error" || body["message"] != `the model "nobody" does not exist: no worker serves it` {
		t.Errorf("a model no worker serves: picked %q, %d %v; want 404 model_not_found, as serve answers", got, status, body)
	}
	ev.finish()
	ev, _, r = e.send(t, t.Context(), "POST", "/tokenize", "nomodel", `{"prompt":"hi"}`)
	if status, body := immediateOf(t, r); status != 400 || body["message"] != "invalid request: you must provide a model parameter" {
		t.Errorf("no model: %d %v, want 400", status, body)
	}
	ev.finish()
	e.settle(t)
}

// TestRouterPickerPassThrough: a POST under /v1/ that the table does not
// know, naming a model, is picked by load and booked like a pooling
// request; one naming no model is 404 not_found, as serve answers it;
// with DisablePassThrough every such path is 404 not_found. Paths
// outside /v1/, and other methods, are 404 either way.
func TestRouterPickerPassThrough(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	held, busy, _ := e.pick(t, t.Context(), "chat", chatOf("hold it"), nil)
	ev, got, r := e.send(t, t.Context(), "POST", "/v1/images/generations?lang=en", "pass", `{"model":"m","prompt":"say"}`)
	if got != e.other(busy) {
		t.Fatalf("pass-through picked %q (%v), want the idle %s", got, r, e.other(busy))
	}
	if a := e.active(); a[got] != 1 || a[busy] != 1 {
		t.Fatalf("bookings %v, want one on each", a)
	}
	ev.answer("404", `{"detail":"Not Found"}`)
	held.complete()
	e.settle(t)
	for _, tc := range []struct{ method, path, body, msg string }{
		{"POST", "/v1/images/generations", `{"prompt":"say"}`,
			`the path is not one the router routes by its schema, and the body names no "model" to pass it through to`},
		{"POST", "/generate", `{"model":"m"}`, "not found: no endpoint POST /generate"},
		{"PUT", "/v1/x", `{"model":"m"}`, "not found: no endpoint PUT /v1/x"},
	} {
		ev, got, r := e.send(t, t.Context(), tc.method, tc.path, "nf", tc.body)
		if status, body := immediateOf(t, r); got != "" || status != 404 || body["code"] != "not_found" || body["message"] != tc.msg {
			t.Errorf("%s %s %s: picked %q, %d %v; want 404 not_found %q", tc.method, tc.path, tc.body, got, status, body, tc.msg)
		}
		ev.finish()
	}

	off := newRouterEnvPicker(t, 1, "", func(p *RouterPicker) { p.DisablePassThrough = true })
	ev, got, r = off.send(t, t.Context(), "POST", "/v1/images/generations", "off", `{"model":"m","prompt":"say"}`)
	if status, body := immediateOf(t, r); got != "" || status != 404 || body["code"] != "not_found" {
		t.Errorf("pass-through off: picked %q, %d %v; want 404 not_found", got, status, body)
	}
	ev.finish()
	off.settle(t)
}

// TestRouterPickerErrorShapes: errors on /v1/messages come in
// Anthropic's error shape, as serve answers them (and vLLM's Messages
// front end); a method a known path does not take is 405 with the allow
// header of that path.
func TestRouterPickerErrorShapes(t *testing.T) {
	e := newRouterEnv(t, 1, "")
	ev, _, r := e.send(t, t.Context(), "POST", "/v1/messages", "bad", `{"model":"m","max_tokens":8}`)
	ir := r.GetImmediateResponse()
	var anthropic struct {
		Type  string            `json:"type"`
		Error map[string]string `json:"error"`
	}
	if ir.GetStatus().GetCode() != 400 || json.Unmarshal(ir.GetBody(), &anthropic) != nil || anthropic.Type != "error" ||
		anthropic.Error["type"] != "invalid_request_error" || !strings.Contains(anthropic.Error["message"], "messages") || len(anthropic.Error) != 2 {
		t.Errorf("bad Messages body: %v %s, want 400 in Anthropic's shape naming messages", ir.GetStatus(), ir.GetBody())
	}
	ev.finish()
	for _, tc := range []struct{ method, path, allow string }{
		{"DELETE", "/v1/responses/resp_1", "GET, HEAD"},
		{"GET", "/v1/responses/resp_1/cancel", "POST"},
		{"GET", "/v1/embeddings", "POST"},
	} {
		ev, _, r := e.send(t, t.Context(), tc.method, tc.path, "405", "")
		ir := r.GetImmediateResponse()
		allow := ""
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			if h.GetHeader().GetKey() == "allow" {
				allow = string(h.GetHeader().GetRawValue())
			}
		}
		if status, body := immediateOf(t, r); status != 405 || body["code"] != "method_not_allowed" || allow != tc.allow {
			t.Errorf("%s %s: %d %v allow %q, want 405 allow %q", tc.method, tc.path, status, body, allow, tc.allow)
		}
		ev.finish()
	}
}

// responsesOf is a Responses request body continuing prev (none when "").
func responsesOf(text, prev string, stream bool) string {
	b := fmt.Sprintf(`{"model":"m","stream":%v,"input":%q`, stream, text)
	if prev != "" {
		b += fmt.Sprintf(`,"previous_response_id":%q`, prev)
	}
	return b + "}"
}

// notFoundBody is vLLM's answer to a response id it does not hold.
func notFoundBody(id string) string {
	return `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}` + "\n"
}

// TestRouterPickerResponsesFollowUps: the id of a Responses answer, read
// from the answer the proxy shows the EPP (a whole body, or a stream's
// response.created event, bound before the chunk carrying it is
// answered), binds the response to the worker that served it; a
// follow-up naming it (previous_response_id) is picked on that worker
// alone, booked there, even while it holds another request and the
// other worker is idle; GET /v1/responses/{id} and its cancel go there
// unbooked. An id no binding knows, and one whose answer was an error,
// answer vLLM's 404 at once; so does a follow-up once its worker has
// left the fleet.
func TestRouterPickerResponsesFollowUps(t *testing.T) {
	e := newRouterEnv(t, 2, "")

	// A whole answer, in two chunks: bound at its end.
	ev, first, r := e.pickPath(t, t.Context(), "/v1/responses", "r1", responsesOf("first question", "", false), nil)
	if first == "" {
		t.Fatalf("not picked: %v", r)
	}
	ev.mustSend(respHeadersMsg(""))
	ev.mustRecv()
	ev.mustSend(respBodyMsg(`{"id":"resp_whole","object":"response","status":"completed",`, false))
	ev.mustRecv()
	if w, _, ok := e.rt.ResponseWorker("m", "resp_whole"); ok {
		t.Fatalf("bound to %s before the answer was whole", w.Name)
	}
	ev.mustSend(respBodyMsg(`"output":[],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}`, true))
	ev.mustRecv()
	ev.finish()
	e.settle(t)

	// A stream: bound at its response.created event.
	ev, streamed, _ := e.pickPath(t, t.Context(), "/v1/responses", "r2", responsesOf("second question", "", true), nil)
	ev.mustSend(respHeadersMsg(""))
	ev.mustRecv()
	ev.mustSend(respBodyMsg("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_stream\",\"status\":\"in_progress\"}}\n\n", false))
	ev.mustRecv()
	if w, _, ok := e.rt.ResponseWorker("m", "resp_stream"); !ok || e.eps[int(w.Name[1]-'0')] != streamed {
		t.Fatalf("resp_stream bound to %v %v while its stream goes on, want %s", w, ok, streamed)
	}
	ev.mustSend(respBodyMsg("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_stream\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n", true))
	ev.mustRecv()
	ev.finish()
	e.settle(t)

	for _, tc := range []struct {
		id, at string
	}{{"resp_whole", first}, {"resp_stream", streamed}} {
		// The worker holding the response is busy, the other idle: the
		// follow-up still goes where its response is, and is booked
		// there.
		held, _, _ := e.pick(t, t.Context(), "held-"+tc.id, chatOf("keep "+tc.at+" busy"), []string{tc.at})
		for i, stream := range []bool{false, true} {
			ev, got, r := e.pickPath(t, t.Context(), "/v1/responses", fmt.Sprint(tc.id, i), responsesOf("and then?", tc.id, stream), nil)
			if got != tc.at {
				t.Fatalf("follow-up of %s (stream %v) picked %q (%v), want %s, which holds it", tc.id, stream, got, r, tc.at)
			}
			if a := e.active(); a[tc.at] != 2 || a[e.other(tc.at)] != 0 {
				t.Fatalf("follow-up of %s: bookings %v, want two on %s", tc.id, a, tc.at)
			}
			ev.complete()
		}
		for _, m := range []struct{ method, path string }{{"GET", "/v1/responses/" + tc.id}, {"GET", "/v1/responses/" + tc.id + "?stream=true&starting_after=2"}, {"POST", "/v1/responses/" + tc.id + "/cancel"}} {
			ev, got, r := e.send(t, t.Context(), m.method, m.path, "get", "")
			if got != tc.at {
				t.Fatalf("%s %s picked %q (%v), want %s", m.method, m.path, got, r, tc.at)
			}
			if a := e.active(); a[tc.at] != 1 {
				t.Fatalf("%s %s: bookings %v, want the held request's alone", m.method, m.path, a)
			}
			ev.answer("200", `{"id":"`+tc.id+`"}`)
		}
		held.complete()
		e.settle(t)
	}

	// An error answer binds nothing, though its body carries an id.
	ev, _, _ = e.pickPath(t, t.Context(), "/v1/responses", "r3", responsesOf("third", "", false), nil)
	ev.answer("500", `{"id":"resp_failed","error":{"message":"boom"}}`)
	e.settle(t)

	for _, tc := range []struct{ method, path, body, id string }{
		{"POST", "/v1/responses", responsesOf("go on", "resp_unknown", false), "resp_unknown"},
		{"POST", "/v1/responses", responsesOf("go on", "resp_failed", true), "resp_failed"},
		{"GET", "/v1/responses/resp_unknown", "", "resp_unknown"},
		{"POST", "/v1/responses/resp_x%27y/cancel", "", "resp_x'y"},
		{"POST", "/v1/responses", responsesOf("go on", strings.Repeat("r", 300), false), untrusted.Text(strings.Repeat("r", 300), untrusted.MaxClient)},
	} {
		ev, got, r := e.send(t, t.Context(), tc.method, tc.path, "nf", tc.body)
		ir := r.GetImmediateResponse()
		if got != "" || ir.GetStatus().GetCode() != 404 || string(ir.GetBody()) != notFoundBody(tc.id) {
			t.Errorf("%s %s: picked %q, %v %s; want 404 %s", tc.method, tc.path, got, ir.GetStatus(), ir.GetBody(), notFoundBody(tc.id))
		}
		ev.finish()
	}

	// The worker holding resp_whole leaves the fleet: its follow-up and
	// GET are answered 404, as the engine that held it is gone.
	var keep []string
	for _, w := range e.r.Workers("m", shared.RoleAggregated) {
		if e.eps[int(w.Name[1]-'0')] != first {
			keep = append(keep, w.Name)
		}
	}
	e.keepOnly(t, keep)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/responses", responsesOf("still there?", "resp_whole", false)},
		{"GET", "/v1/responses/resp_whole", ""},
	} {
		ev, got, r := e.send(t, t.Context(), tc.method, tc.path, "gone", tc.body)
		ir := r.GetImmediateResponse()
		if got != "" || ir.GetStatus().GetCode() != 404 || string(ir.GetBody()) != notFoundBody("resp_whole") {
			t.Errorf("%s %s after its worker left: picked %q, %v %s; want vLLM's 404", tc.method, tc.path, got, ir.GetStatus(), ir.GetBody())
		}
		ev.finish()
	}
	e.settle(t)
	// Counted as serve counts them: the follow-ups under their model, the
	// GETs and cancel of unknown ids under none.
	e.eventually(t, "the refusals counted", func() bool { return e.requests(t, "m", "404") == 4 && e.requests(t, "", "404") == 3 })
}
