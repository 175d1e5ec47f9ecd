package epp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// routerEnv is a live.Runtime over a Router loaded from a policy file
// whose worker blocks a workers.Manager probes (mock engines on loopback),
// and the EPP over it (RouterPicker) on an in-memory gRPC connection.
type routerEnv struct {
	rt     *live.Runtime
	r      *router.Router
	mgr    *workers.Manager
	reg    *prometheus.Registry // serve's metrics
	specs  []config.Worker      // the policy file's worker blocks
	client extprocv3.ExternalProcessorClient
	eps    []string // the workers' endpoints, w0 first
}

func newRouterEnv(t *testing.T, n int, queue string) *routerEnv {
	t.Helper()
	return newRouterEnvWith(t, n, queue, 0)
}

// newRouterEnvWith is newRouterEnv with a RouterPicker giving fallbacks
// runners-up.
func newRouterEnvWith(t *testing.T, n int, queue string, fallbacks int) *routerEnv {
	t.Helper()
	return newRouterEnvPicker(t, n, queue, func(p *RouterPicker) { p.Fallbacks = fallbacks })
}

// newRouterEnvPicker is newRouterEnv with a RouterPicker set up by set.
func newRouterEnvPicker(t *testing.T, n int, queue string, set func(*RouterPicker)) *routerEnv {
	t.Helper()
	f := NewFleet(t, FleetOptions{Engines: n, Queue: queue, SetPicker: set})
	e := &routerEnv{rt: f.Runtime, r: f.Router, mgr: f.Manager, reg: f.Registry, specs: f.Specs, client: startServer(t, &Server{Picker: f.Picker})}
	for _, u := range f.URLs {
		ep, err := Endpoint(u)
		if err != nil {
			t.Fatal(err)
		}
		e.eps = append(e.eps, ep)
	}
	return e
}

// keepOnly makes the named workers the fleet's only ones (the others
// leave, as when their blocks are removed) and waits until they are.
func (e *routerEnv) keepOnly(t *testing.T, names []string) {
	t.Helper()
	var keep []config.Worker
	for _, w := range e.specs {
		if slices.Contains(names, w.Name) {
			keep = append(keep, w)
		}
	}
	if err := e.mgr.Sync(keep); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, "the others leave", func() bool { return len(e.r.Workers("m", shared.RoleAggregated)) == len(keep) })
}

// active returns the fleet's in-flight bookings per endpoint.
func (e *routerEnv) active() map[string]int64 {
	out := map[string]int64{}
	for _, w := range e.r.Workers("m", shared.RoleAggregated) {
		i, err := strconv.Atoi(strings.TrimPrefix(w.Name, "w"))
		if err != nil || i >= len(e.eps) {
			panic("worker " + w.Name + " is not the policy file's")
		}
		out[e.eps[i]] += w.ActiveRequests()
	}
	return out
}

// settle waits until no worker has a booking.
func (e *routerEnv) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		total := int64(0)
		for _, n := range e.active() {
			total += n
		}
		if total == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bookings a minute later: %v, want none", e.active())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pick sends a buffered request of body (with the subset hint when
// subset is not nil) and returns its stream and the picked endpoint
// header ("" with the immediate answer when there was none).
func (e *routerEnv) pick(t *testing.T, ctx context.Context, id, body string, subset []string) (*envoy, string, *extprocv3.ProcessingResponse) {
	t.Helper()
	return e.pickPath(t, ctx, "/v1/chat/completions", id, body, subset)
}

// pickPath is pick with the request's :path.
func (e *routerEnv) pickPath(t *testing.T, ctx context.Context, path, id, body string, subset []string) (*envoy, string, *extprocv3.ProcessingResponse) {
	t.Helper()
	ev := newEnvoy(t, ctx, e.client)
	hdr := headersMsg(id, false, nil)
	hdr.GetRequestHeaders().GetHeaders().GetHeaders()[1].RawValue = []byte(path)
	if subset != nil {
		vals := make([]any, len(subset))
		for i, s := range subset {
			vals[i] = s
		}
		v, err := structpb.NewList(vals)
		if err != nil {
			t.Fatal(err)
		}
		hdr.MetadataContext = subsetMD(structpb.NewListValue(v))
	}
	ev.mustSend(hdr)
	ev.mustRecv()
	ev.mustSend(bodyMsg(body, true))
	r := ev.mustRecv()
	if c := r.GetRequestBody().GetResponse(); c != nil {
		ep, _ := destination(t, r, c)
		return ev, ep, r
	}
	return ev, "", r
}

// complete runs a picked request's response to its end.
func (ev *envoy) complete() {
	ev.t.Helper()
	ev.mustSend(respHeadersMsg(""))
	ev.mustRecv()
	ev.mustSend(respBodyMsg("data: x\n\n", false))
	ev.mustRecv()
	ev.mustSend(respBodyMsg("data: [DONE]\n\n", true))
	ev.mustRecv()
	ev.finish()
}

func chatOf(text string) string {
	return fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, text)
}

// prefixA is a long prompt prefix: 1,120 characters, 17 blocks of 16
// estimated tokens.
var prefixA = strings.Repeat("the same long system prompt ", 40)

// TestRouterPickerResponsesAndMessages: the Responses and Messages
// endpoints are picked by the policy as chat is: while one worker holds a
// request, an unrelated one goes to the other; once both are idle, a
// request sharing the first one's long prompt prefix goes where it is
// cached. A Responses body sent to the Messages path is refused 400.
func TestRouterPickerResponsesAndMessages(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	for _, tc := range []struct {
		path string
		body func(text string) string
	}{
		{"/v1/responses", func(text string) string {
			return fmt.Sprintf(`{"model":"m","stream":true,"input":[{"role":"user","content":%q}]}`, text)
		}},
		{"/v1/messages", func(text string) string {
			return fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, text)
		}},
	} {
		prefix := strings.Repeat(tc.path+" carries a long shared prompt ", 30)
		held, first, r := e.pickPath(t, t.Context(), tc.path, tc.path+"a", tc.body(prefix+"question one"), nil)
		if first != e.eps[0] && first != e.eps[1] {
			t.Fatalf("%s: picked %q (%v), not a worker's endpoint %v", tc.path, first, r, e.eps)
		}
		other, second, _ := e.pickPath(t, t.Context(), tc.path, tc.path+"b", tc.body(strings.Repeat("something else entirely ", 50)), nil)
		if second == "" || second == first {
			t.Fatalf("%s: an unrelated request picked %q while %q is busy, want the other worker", tc.path, second, first)
		}
		held.complete()
		other.complete()
		e.settle(t)
		again, got, _ := e.pickPath(t, t.Context(), tc.path, tc.path+"c", tc.body(prefix+"question two"), nil)
		if got != first {
			t.Errorf("%s: the shared prefix picked %q, want %q where it is cached", tc.path, got, first)
		}
		again.complete()
		e.settle(t)
	}
	ev, ep, r := e.pickPath(t, t.Context(), "/v1/messages", "wrong", `{"model":"m","input":"hi"}`, nil)
	if ep != "" || r.GetImmediateResponse().GetStatus().GetCode() != 400 {
		t.Errorf("a Responses body on /v1/messages: picked %q, answer %v; want 400", ep, r)
	}
	_ = ev.st.CloseSend()
}

// TestRouterPickerFollowsKVPolicy: the policy file's kv-cost policy
// decides. While one worker holds a request, a new prompt goes to the
// other; once both are idle, a prompt sharing a long prefix with that one
// goes where the prefix is cached, not where the idle tie would go.
func TestRouterPickerFollowsKVPolicy(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	unrelated, busy, r := e.pick(t, t.Context(), "u", chatOf(strings.Repeat("an unrelated prompt ", 56)), nil)
	if busy != e.eps[0] && busy != e.eps[1] {
		t.Fatalf("picked %q (%v), not a worker's endpoint %v", busy, r, e.eps)
	}
	ev, cached, _ := e.pick(t, t.Context(), "a", chatOf(prefixA+"question one"), nil)
	if cached == "" || cached == busy {
		t.Fatalf("a new prompt picked %q while %q is busy, want the other worker", cached, busy)
	}
	if a := e.active(); a[busy] != 1 || a[cached] != 1 {
		t.Fatalf("bookings %v, want one on each", a)
	}
	unrelated.complete()
	ev.complete()
	e.settle(t)

	for i := range 3 {
		ev, got, _ := e.pick(t, t.Context(), fmt.Sprint("b", i), chatOf(fmt.Sprintf("%squestion %d", prefixA, i+2)), nil)
		if got != cached {
			t.Fatalf("shared prefix %d picked %q, want %q (where the prefix is cached)", i, got, cached)
		}
		ev.complete()
		e.settle(t)
	}
}

// TestRouterPickerSubsetHint: the subset hint narrows the candidates (the
// cached worker is passed over when outside it); a hint naming no worker
// is 503 no_worker.
func TestRouterPickerSubsetHint(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	ev, cached, _ := e.pick(t, t.Context(), "a", chatOf(prefixA+"one"), nil)
	ev.complete()
	e.settle(t)
	var rest string
	for _, ep := range e.eps {
		if ep != cached {
			rest = ep
		}
	}
	for i := range 3 {
		ev, got, _ := e.pick(t, t.Context(), fmt.Sprint("s", i), chatOf(prefixA+"two"), []string{"10.255.0.1:9", rest})
		if got != rest {
			t.Fatalf("subset [%s] picked %q", rest, got)
		}
		ev.complete()
	}
	ev, got, r := e.pick(t, t.Context(), "none", chatOf(prefixA), []string{"10.255.0.1:9"})
	if got != "" {
		t.Fatalf("subset of no worker picked %q", got)
	}
	if status, body := immediateOf(t, r); status != 503 || body["code"] != "no_worker" {
		t.Fatalf("subset of no worker: %d %v, want 503 no_worker", status, body)
	}
	ev.finish()
	// A long hint naming no worker: the message names its first entries
	// and its length, not all 10,000 (nor a 1 MB entry whole).
	long := []string{strings.Repeat("h", 1<<20) + ":1"}
	for i := range 9999 {
		long = append(long, fmt.Sprintf("10.1.%d.%d:9", i/256, i%256))
	}
	ev, got, r = e.pick(t, t.Context(), "long", chatOf(prefixA), long)
	if got != "" {
		t.Fatalf("long subset of no worker picked %q", got)
	}
	status, body := immediateOf(t, r)
	want := "no ready endpoint: no worker is at an endpoint of the subset hint (10000 endpoints): " +
		strings.Repeat("h", 64) + "...,10.1.0.0:9,10.1.0.1:9,10.1.0.2:9,10.1.0.3:9,10.1.0.4:9,10.1.0.5:9,10.1.0.6:9,..."
	if status != 503 || body["code"] != "no_worker" || body["message"] != want {
		t.Fatalf("long subset of no worker: %d %v, want 503 no_worker %q", status, body, want)
	}
	ev.finish()
	e.settle(t)
}

// TestRouterPickerBookingsReturnToZero: 30 requests, every third stream
// reset (cancelled) after the pick, some of those after the first token;
// the others complete. The fleet's bookings return to 0. A bad body is
// 400 and books nothing.
func TestRouterPickerBookingsReturnToZero(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	for i := range 30 {
		ctx, cancel := context.WithCancel(t.Context())
		ev, ep, r := e.pick(t, ctx, fmt.Sprint("r", i), chatOf(fmt.Sprintf("%sprompt %d", prefixA[:40*(i%5)], i)), nil)
		if ep == "" {
			t.Fatalf("request %d not picked: %v", i, r)
		}
		switch {
		case i%3 != 0:
			ev.complete()
		case i%2 == 0:
			ev.mustSend(respHeadersMsg(""))
			ev.mustRecv()
			ev.mustSend(respBodyMsg("data: x\n\n", false))
			ev.mustRecv()
		}
		cancel()
	}
	e.settle(t)

	ev, ep, r := e.pick(t, t.Context(), "bad", `{"model":"m","messages":"nope"}`, nil)
	if ep != "" {
		t.Fatalf("bad body picked %q", ep)
	}
	if status, body := immediateOf(t, r); status != 400 || body["code"] != "invalid_request" || !strings.Contains(body["message"].(string), "messages") {
		t.Fatalf("bad body: %d %v, want 400 invalid_request naming messages", status, body)
	}
	ev.finish()
	e.settle(t)

	// serve's families count the EPP's requests as serve counts its own:
	// 20 completed (200), 10 reset (499), the bad body (400, no model);
	// 25 streamed answers had a first byte.
	e.eventually(t, "the request counts", func() bool {
		return e.requests(t, "m", "200") == 20 && e.requests(t, "m", "499") == 10 && e.requests(t, "", "400") == 1
	})
	if n := histogramCount(t, e.reg, "switchyard_time_to_first_token_seconds"); n != 25 {
		t.Errorf("time to first token observed %d times, want 25", n)
	}
	if n := histogramCount(t, e.reg, "switchyard_request_duration_seconds"); n != 31 {
		t.Errorf("request duration observed %d times, want 31", n)
	}
}

// requests returns switchyard_requests_total{model, code} of e's registry
// (0 when absent).
func (e *routerEnv) requests(t *testing.T, model, code string) float64 {
	t.Helper()
	return e.counter(t, "switchyard_requests_total", map[string]string{"model": model, "code": code})
}

// counter returns the value of the counter family name's series whose
// labels include want (0 when absent).
func (e *routerEnv) counter(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// histogramCount sums the sample counts of every series of the histogram
// family name.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// eventually waits up to a minute for cond.
func (e *routerEnv) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in a minute", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRouterPickerFallbacksAndServed: the destination lists the policy's
// runners-up after the pick, each endpoint once; when the proxy reports
// that a fallback served, the booking moves there, and an endpoint no
// worker has leaves it where it is.
func TestRouterPickerFallbacksAndServed(t *testing.T) {
	e := newRouterEnvWith(t, 3, "", 2)
	ev, _, r := e.pick(t, t.Context(), "a", chatOf("a question"), nil)
	hdr, _ := destination(t, r, r.GetRequestBody().GetResponse())
	dest := strings.Split(hdr, ",")
	if len(dest) != 3 || !slices.Contains(e.eps, dest[0]) || !slices.Contains(e.eps, dest[1]) || !slices.Contains(e.eps, dest[2]) ||
		dest[0] == dest[1] || dest[1] == dest[2] || dest[0] == dest[2] {
		t.Fatalf("destination %v, want the three workers' endpoints, each once", dest)
	}
	if got := e.active(); got[dest[0]] != 1 {
		t.Fatalf("bookings %v, want 1 on the pick %s", got, dest[0])
	}
	// The proxy fell back to the second: the booking follows.
	ev.mustSend(respHeadersMsg(dest[1]))
	ev.mustRecv()
	if got := e.active(); got[dest[0]] != 0 || got[dest[1]] != 1 {
		t.Fatalf("after served by %s: bookings %v, want it moved there", dest[1], got)
	}
	ev.mustSend(respBodyMsg("data: [DONE]\n\n", true))
	ev.mustRecv()
	ev.finish()
	e.settle(t)

	// An endpoint the EPP does not know: the booking stays on the pick.
	ev, dests, _ := e.pick(t, t.Context(), "b", chatOf("another question"), nil)
	ep, _, _ := strings.Cut(dests, ",")
	ev.mustSend(respHeadersMsg("192.0.2.1:1"))
	ev.mustRecv()
	if got := e.active(); got[ep] != 1 {
		t.Fatalf("served by an unknown endpoint: bookings %v, want 1 on the pick %s", got, ep)
	}
	ev.complete()
	e.settle(t)
}

// TestRouterPickerQueueFull: one worker of capacity 1 and a queue of 1:
// with a request held, of two more one waits and the other is 429
// queue_full; the waiting one is picked once the held one completes.
func TestRouterPickerQueueFull(t *testing.T) {
	e := newRouterEnv(t, 1, "queue {\n  max_active_requests = 1\n  max_waiting         = 1\n  class \"all\" {\n    weight = 1\n  }\n}\n")
	held, ep, r := e.pick(t, t.Context(), "held", chatOf("held"), nil)
	if ep != e.eps[0] {
		t.Fatalf("first request: %q %v", ep, r)
	}
	type answer struct {
		ev  *envoy
		r   *extprocv3.ProcessingResponse
		err error
	}
	answers := make(chan answer, 2)
	for _, id := range []string{"x", "y"} {
		ev := newEnvoy(t, t.Context(), e.client)
		ev.mustSend(headersMsg(id, false, nil))
		ev.mustRecv()
		ev.mustSend(bodyMsg(chatOf(id), true))
		go func() {
			r, err := ev.st.Recv()
			answers <- answer{ev, r, err}
		}()
	}
	wait := func() answer {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatalf("recv: %v", a.err)
			}
			return a
		case <-time.After(time.Minute):
			t.Fatal("no answer within a minute")
		}
		return answer{}
	}
	shed := wait()
	if status, body := immediateOf(t, shed.r); status != 429 || body["code"] != "queue_full" {
		t.Fatalf("with the queue full: %d %v, want 429 queue_full", status, body)
	}
	shed.ev.finish()
	if got := e.active()[ep]; got != 1 {
		t.Fatalf("bookings %d while one is held and one waits, want 1", got)
	}
	held.complete()
	queued := wait()
	c := queued.r.GetRequestBody().GetResponse()
	if c == nil {
		t.Fatalf("queued request's answer %v, want its pick", queued.r)
	}
	if hdr, _ := destination(t, queued.r, c); hdr != ep {
		t.Fatalf("queued request picked %q, want %q", hdr, ep)
	}
	queued.ev.complete()
	e.settle(t)
}

// TestEndpoint: a worker URL's endpoint.
func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.1:8000":     "10.0.0.1:8000",
		"http://10.0.0.1:8000/v1/": "10.0.0.1:8000",
		"http://[fd00::1]:8000":    "[fd00::1]:8000",
		"https://vllm.example":     "vllm.example:443",
		"http://vllm.example":      "vllm.example:80",
	} {
		if got, err := Endpoint(in); got != want || err != nil {
			t.Errorf("Endpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.1", "unix:///sock", "grpc://h"} {
		if got, err := Endpoint(bad); err == nil {
			t.Errorf("Endpoint(%q) = %q, want an error", bad, got)
		}
	}
}

// TestPathAPI: what a method and path are (route), as serve's routes read them:
// the schema of an endpoint of the table (the query aside), a stored
// response's id (unescaped), a pass-through POST under /v1/ unless it is
// off; another method on a known path is a *MethodError naming the
// methods it takes, anything else ErrNotFound, each naming the request's
// method and path, bounded and escaped.
func TestPathAPI(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		pass         bool
		want         routed
		err, allow   string
	}{
		{"POST", "/v1/chat/completions", true, routed{api: live.APIChat}, "", ""},
		{"", "", true, routed{api: live.APIChat}, "", ""},
		{"POST", "/v1/completions?x=1", true, routed{api: live.APICompletions}, "", ""},
		{"POST", "/v1/responses", true, routed{api: live.APIResponses}, "", ""},
		{"POST", "/v1/messages?beta=true", true, routed{api: live.APIMessages}, "", ""},
		{"POST", "/v1/embeddings", true, routed{api: live.APIPool}, "", ""},
		{"POST", "/v2/rerank", false, routed{api: live.APIPool}, "", ""},
		{"POST", "/tokenize", true, routed{api: live.APIUtility}, "", ""},
		{"POST", "/v1/detokenize", false, routed{api: live.APIUtility}, "", ""},
		{"POST", "/v1/audio/translations", false, routed{api: live.APIAudio}, "", ""},
		{"POST", "/v1/images/generations?x=1", true, routed{api: live.APIOther}, "", ""},
		{"GET", "/v1/responses/resp_1", false, routed{stored: "resp_1"}, "", ""},
		{"HEAD", "/v1/responses/resp_1?stream=true&starting_after=3", false, routed{stored: "resp_1"}, "", ""},
		{"GET", "/v1/responses/a%2Fb", false, routed{stored: "a/b"}, "", ""},
		{"POST", "/v1/responses/resp_1/cancel", false, routed{stored: "resp_1"}, "", ""},
		{"GET", "/v1/chat/completions", true, routed{}, "method not allowed: GET is not allowed on /v1/chat/completions: an inference request is a POST", "POST"},
		{"PUT", "/v1/completions?x=1", true, routed{}, "method not allowed: PUT is not allowed on /v1/completions: an inference request is a POST", "POST"},
		{"GET", "", true, routed{}, "method not allowed: GET is not allowed on /v1/chat/completions: an inference request is a POST", "POST"},
		{"G\x1b[31mET", "/v1/completions", true, routed{}, `method not allowed: G\x1b[31mET is not allowed on /v1/completions: an inference request is a POST`, "POST"},
		{"DELETE", "/v1/embeddings", true, routed{}, "method not allowed: DELETE is not allowed on /v1/embeddings: an inference request is a POST", "POST"},
		{"DELETE", "/v1/responses/resp_1", true, routed{}, "method not allowed: DELETE is not allowed on /v1/responses/resp_1: it takes GET, HEAD", "GET, HEAD"},
		{"GET", "/v1/responses/resp_1/cancel", true, routed{}, "method not allowed: GET is not allowed on /v1/responses/resp_1/cancel: it takes POST", "POST"},
		{"POST", "/v1/responses/resp_1/input_items", true, routed{}, "not found: no endpoint POST /v1/responses/resp_1/input_items", ""},
		{"GET", "/v1/responses/%zz", true, routed{}, "not found: no endpoint GET /v1/responses/%zz: the response id is not a valid path segment", ""},
		{"POST", "/v1/images/generations", false, routed{}, "not found: no endpoint POST /v1/images/generations (the pass-through of other paths under /v1/ is off: --pass-through=false)", ""},
		{"GET", "/v1/audio/voices", true, routed{}, "not found: no endpoint GET /v1/audio/voices", ""},
		{"POST", "/generate", true, routed{}, "not found: no endpoint POST /generate", ""},
		{"POST", "/" + strings.Repeat("a", 300), true, routed{}, "not found: no endpoint POST /" + strings.Repeat("a", 255) + "...(301 bytes)", ""},
		{"GET", "/v1/models", true, routed{}, "not found: no endpoint GET /v1/models", ""},
		{"", "//v1/completions?a=b", true, routed{}, "not found: no endpoint POST //v1/completions: the path is not in canonical form (/v1/completions)", ""},
		{"POST", "/v1/../v1/x", true, routed{}, "not found: no endpoint POST /v1/../v1/x: the path is not in canonical form (/v1/x)", ""},
		{"POST", "/v1/chat%2Fcompletions", true, routed{}, "not found: no endpoint POST /v1/chat%2Fcompletions: the path is not in canonical form (a percent-escape where none is needed)", ""},
	} {
		got, err := route(tc.method, tc.path, tc.pass)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("route(%q, %q) = %+v, %v; want %+v, nil", tc.method, tc.path, got, err, tc.want)
			}
			continue
		}
		kind := ErrNotFound
		if tc.allow != "" {
			kind = ErrMethodNotAllowed
		}
		var me *MethodError
		if !errors.Is(err, kind) || err.Error() != tc.err {
			t.Errorf("route(%q, %q) error %v, want %q (%v)", tc.method, tc.path, err, tc.err, kind)
		} else if tc.allow != "" && (!errors.As(err, &me) || me.Allow != tc.allow) {
			t.Errorf("route(%q, %q) error %#v, want a *MethodError allowing %q", tc.method, tc.path, err, tc.allow)
		}
	}
}

// TestMapErr: serve's errors map to the Picker's, keeping serve's words.
func TestMapErr(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		err  error
		kind error
	}{
		{fmt.Errorf("%w: model is required", live.ErrBadRequest), ErrBadRequest},
		{shared.ErrNoWorkers, ErrNoEndpoint},
		{router.ErrAllExcluded, ErrNoEndpoint},
		{context.DeadlineExceeded, ErrShed},
		{admission.ErrQueueFull, ErrShed},
		{admission.ErrDue, ErrPastDue},
	} {
		got := mapErr(ctx, tc.err)
		if !errors.Is(got, tc.kind) || !errors.Is(got, tc.err) || !strings.Contains(got.Error(), tc.err.Error()) {
			t.Errorf("mapErr(%v) = %v, want %v wrapping it", tc.err, got, tc.kind)
		}
	}
}

// TestRouterPickerCountsUsage: the answers' usage, read from the response
// body the proxy shows the EPP, lands in serve's token families as serve
// counts its own: a whole non-streamed body, and a stream's last usage
// event.
func TestRouterPickerCountsUsage(t *testing.T) {
	e := newRouterEnv(t, 1, "")
	ev, ep, r := e.pick(t, t.Context(), "plain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if ep == "" {
		t.Fatalf("not picked: %v", r)
	}
	ev.mustSend(respHeadersMsg(""))
	ev.mustRecv()
	// The body in two chunks: usage is read from the whole of it.
	ev.mustSend(respBodyMsg(`{"choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":12,`, false))
	ev.mustRecv()
	ev.mustSend(respBodyMsg(`"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":4}}}`, true))
	ev.mustRecv()
	ev.finish()

	ev, _, _ = e.pick(t, t.Context(), "stream", chatOf("stream it"), nil)
	ev.mustSend(respHeadersMsg(""))
	ev.mustRecv()
	ev.mustSend(respBodyMsg("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", false))
	ev.mustRecv()
	ev.mustSend(respBodyMsg("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2,\"total_tokens\":32}}\n\ndata: [DONE]\n\n", true))
	ev.mustRecv()
	ev.finish()
	e.settle(t)

	want := map[string]float64{"switchyard_prompt_tokens_total": 42, "switchyard_cached_prompt_tokens_total": 4, "switchyard_completion_tokens_total": 7}
	e.eventually(t, "the token counts", func() bool {
		for name, v := range want {
			if e.counter(t, name, map[string]string{"model": "m"}) != v {
				return false
			}
		}
		return true
	})
}

// TestRouterPickerReportsWorkerOutcomes: a pick the proxy served elsewhere
// (it failed over) is a failed request of the picked worker, a response
// of 500 or more one of the serving worker, and a completed response a
// success that clears the count, as serve reports its own requests. A
// served endpoint that is no worker's counts nothing.
func TestRouterPickerReportsWorkerOutcomes(t *testing.T) {
	e := newRouterEnv(t, 2, "")
	fails := func() int {
		st, ok := e.mgr.StatusOf("w0")
		if !ok {
			t.Fatal("no worker w0")
		}
		return st.RequestFailures
	}
	only := []string{e.eps[0]}
	for i := range 2 {
		ev, _, _ := e.pick(t, t.Context(), fmt.Sprint("elsewhere", i), chatOf("q"), only)
		ev.mustSend(respHeadersMsg(e.eps[1]))
		ev.mustRecv()
		ev.mustSend(respBodyMsg("data: [DONE]\n\n", true))
		ev.mustRecv()
		ev.finish()
	}
	e.settle(t)
	if n := fails(); n != 2 {
		t.Fatalf("w0 has %d consecutive request failures after two picks served elsewhere, want 2", n)
	}
	ev, _, _ := e.pick(t, t.Context(), "ok", chatOf("q"), only)
	ev.complete()
	e.settle(t)
	e.eventually(t, "w0's failures cleared by a completed answer", func() bool { return fails() == 0 })

	// Served endpoints that are no worker's (garbage, or the endpoint
	// spelled otherwise by the proxy) say nothing of the pick: four
	// requests held past such a report count no failure (three in a row
	// would take w0 out).
	var held []*envoy
	for i, served := range []string{"x", strings.Repeat("z", 10_000), "192.0.2.1:1", "localhost:1"} {
		ev, _, _ := e.pick(t, t.Context(), fmt.Sprint("unknown", i), chatOf("q"), only)
		ev.mustSend(respHeadersMsg(served))
		ev.mustRecv()
		held = append(held, ev)
	}
	if n := fails(); n != 0 {
		t.Fatalf("w0 has %d consecutive request failures after unknown served endpoints, want 0", n)
	}
	for _, ev := range held {
		ev.mustSend(respBodyMsg("data: [DONE]\n\n", true))
		ev.mustRecv()
		ev.finish()
	}
	e.settle(t)

	ev, _, _ = e.pick(t, t.Context(), "500", chatOf("q"), only)
	ev.mustSend(respHeadersStatus("", "503"))
	ev.mustRecv()
	ev.mustSend(respBodyMsg(`{"error":"overloaded"}`, true))
	ev.mustRecv()
	ev.finish()
	e.settle(t)
	e.eventually(t, "a 503 answer counted against w0", func() bool { return fails() == 1 })
}
