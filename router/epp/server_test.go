package epp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/switchyard-router/switchyard/shared"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeHandle records what the server reported for one picked request.
type fakeHandle struct {
	mu     sync.Mutex
	served []string
	codes  []int
	first  int
	body   []byte
	ends   []Outcome
}

func (h *fakeHandle) Served(ep string) { h.mu.Lock(); h.served = append(h.served, ep); h.mu.Unlock() }
func (h *fakeHandle) Status(code int)  { h.mu.Lock(); h.codes = append(h.codes, code); h.mu.Unlock() }
func (h *fakeHandle) FirstToken()      { h.mu.Lock(); h.first++; h.mu.Unlock() }
func (h *fakeHandle) Body(b []byte)    { h.mu.Lock(); h.body = append(h.body, b...); h.mu.Unlock() }
func (h *fakeHandle) End(o Outcome)    { h.mu.Lock(); h.ends = append(h.ends, o); h.mu.Unlock() }

func (h *fakeHandle) snapshot() (served []string, first int, ends []Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.served), h.first, slices.Clone(h.ends)
}

// fakePicker answers every request with endpoint and fallbacks, or err;
// it keeps the requests it saw and the handles it gave, by request id
// (the x-request-id header).
type fakePicker struct {
	endpoint  string
	fallbacks []string
	prefill   string
	err       error

	mu      sync.Mutex
	reqs    []Request
	handles map[string]*fakeHandle
}

func (p *fakePicker) Pick(_ context.Context, r *Request) (Pick, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, Request{Headers: r.Headers, Body: slices.Clone(r.Body), Subset: r.Subset})
	if p.err != nil {
		return Pick{}, p.err
	}
	h := &fakeHandle{}
	if p.handles == nil {
		p.handles = map[string]*fakeHandle{}
	}
	p.handles[r.Headers["x-request-id"]] = h
	return Pick{Endpoint: p.endpoint, Fallbacks: p.fallbacks, Prefill: p.prefill, Handle: h}, nil
}

func (p *fakePicker) requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs)
}

func (p *fakePicker) handle(id string) *fakeHandle {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handles[id]
}

// startServer serves s over an in-memory listener and returns a client;
// the server stops (waiting for its handlers) at the test's end.
func startServer(t testing.TB, s *Server) extprocv3.ExternalProcessorClient {
	t.Helper()
	c, _, _ := serveEPP(t, s)
	return c
}

// serveEPP serves s and the health service (Register) over an in-memory
// listener and returns an ext_proc client, the health and the connection.
func serveEPP(t testing.TB, s *Server) (extprocv3.ExternalProcessorClient, *Health, *grpc.ClientConn) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(GRPCServerOptions(s.MaxBodyBytes)...)
	h := Register(gs, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.GracefulStop()
		<-done
	})
	return extprocv3.NewExternalProcessorClient(conn), h, conn
}

// envoy speaks ext_proc on one stream as Envoy's ext_proc filter does: one
// message per phase, waiting for the answer where the mode says so.
type envoy struct {
	t  *testing.T
	st extprocv3.ExternalProcessor_ProcessClient
}

func newEnvoy(t *testing.T, ctx context.Context, c extprocv3.ExternalProcessorClient) *envoy {
	t.Helper()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &envoy{t: t, st: st}
}

func (e *envoy) send(m *extprocv3.ProcessingRequest) error { return e.st.Send(m) }

func (e *envoy) mustSend(m *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if err := e.send(m); err != nil {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *envoy) mustRecv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	r, err := e.st.Recv()
	if err != nil {
		e.t.Fatalf("recv: %v", err)
	}
	return r
}

// finish closes the sending side and expects the server to end the stream.
func (e *envoy) finish() {
	e.t.Helper()
	if err := e.st.CloseSend(); err != nil {
		e.t.Fatal(err)
	}
	if r, err := e.st.Recv(); !errors.Is(err, io.EOF) {
		e.t.Fatalf("after CloseSend: got %v, %v; want EOF", r, err)
	}
}

func headersMsg(id string, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		MetadataContext: md,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")},
				{Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "x-request-id", RawValue: []byte(id)},
			}},
			EndOfStream: eos,
		}},
	}
}

func bodyMsg(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func respHeadersMsg(served string) *extprocv3.ProcessingRequest {
	return respHeadersStatus(served, "200")
}

func respHeadersStatus(served, status string) *extprocv3.ProcessingRequest {
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte(status)}}}}}}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(served)}}}}
	}
	return m
}

func respBodyMsg(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func subsetMD(v *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: v}}}}
}

// destination returns the header mutation's x-gateway-destination-endpoint
// and the envoy.lb dynamic-metadata entry of the same key.
func destination(t *testing.T, r *extprocv3.ProcessingResponse, c *extprocv3.CommonResponse) (header, meta string) {
	t.Helper()
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == DestinationHeader {
			header = string(h.GetHeader().GetRawValue())
		}
	}
	meta = r.GetDynamicMetadata().GetFields()[MetadataNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	return header, meta
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`

func TestBufferedBodyPicksAndFollowsResponse(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000", fallbacks: []string{"10.0.0.2:8000", "10.0.0.3:8000"}}
	obs := &samples{}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p, Decisions: obs}))

	e.mustSend(headersMsg("r1", false, nil))
	r := e.mustRecv()
	if r.GetRequestHeaders() == nil || r.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("headers answer = %v, want a plain CONTINUE", r)
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picked on headers with a body to come: %d picks", n)
	}

	e.mustSend(bodyMsg(chatBody, true))
	r = e.mustRecv()
	c := r.GetRequestBody().GetResponse()
	if c == nil {
		t.Fatalf("body answer = %v, want a request-body answer", r)
	}
	hdr, meta := destination(t, r, c)
	const want = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
	if hdr != want || meta != want {
		t.Fatalf("destination header %q, metadata %q; want both %q", hdr, meta, want)
	}
	if !c.GetClearRouteCache() {
		t.Error("the pick does not clear the route cache")
	}
	reqs := p.requests()
	if len(reqs) != 1 || string(reqs[0].Body) != chatBody || reqs[0].Headers[":path"] != "/v1/chat/completions" || reqs[0].Subset != nil {
		t.Fatalf("picker saw %+v", reqs)
	}

	e.mustSend(respHeadersStatus("10.0.0.2:8000", "201"))
	if r = e.mustRecv(); r.GetResponseHeaders() == nil {
		t.Fatalf("response headers answer = %v", r)
	}
	h := p.handle("r1")
	h.mu.Lock()
	codes := slices.Clone(h.codes)
	h.mu.Unlock()
	if !slices.Equal(codes, []int{201}) {
		t.Fatalf("Status calls %v, want [201] (the :status header)", codes)
	}
	for i, chunk := range []string{"data: a\n\n", "data: b\n\n"} {
		e.mustSend(respBodyMsg(chunk, false))
		if r = e.mustRecv(); r.GetResponseBody() == nil {
			t.Fatalf("response body answer %d = %v", i, r)
		}
		if _, first, ends := h.snapshot(); first != 1 || len(ends) != 0 {
			t.Fatalf("after chunk %d: FirstToken %d times, ends %v; want 1, none", i, first, ends)
		}
	}
	e.mustSend(respBodyMsg("data: [DONE]\n\n", true))
	if r = e.mustRecv(); r.GetResponseBody() == nil {
		t.Fatalf("last response body answer = %v", r)
	}
	e.finish()
	served, first, ends := h.snapshot()
	if !slices.Equal(served, []string{"10.0.0.2:8000"}) || first != 1 || !slices.Equal(ends, []Outcome{Completed}) {
		t.Fatalf("handle saw served %v, first %d, ends %v", served, first, ends)
	}
	h.mu.Lock()
	body := string(h.body)
	h.mu.Unlock()
	if body != "data: a\n\ndata: b\n\ndata: [DONE]\n\n" {
		t.Fatalf("Body saw %q, want every chunk in order", body)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.v) != 1 || obs.v[0] <= 0 {
		t.Fatalf("decisions observed %v, want one positive duration", obs.v)
	}
}

func TestStreamedBodyChunksAccumulate(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.9:80"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	chunks := []string{chatBody[:10], chatBody[10:30], chatBody[30:]}
	for i, ch := range chunks {
		e.mustSend(bodyMsg(ch, i == len(chunks)-1))
		r := e.mustRecv()
		c := r.GetRequestBody().GetResponse()
		if c == nil {
			t.Fatalf("chunk %d answer = %v", i, r)
		}
		hdr, meta := destination(t, r, c)
		if i < len(chunks)-1 && (hdr != "" || meta != "") {
			t.Fatalf("chunk %d answered with a pick before the body ended", i)
		}
		if i == len(chunks)-1 && (hdr != "10.0.0.9:80" || meta != "10.0.0.9:80") {
			t.Fatalf("last chunk: header %q, metadata %q", hdr, meta)
		}
	}
	if reqs := p.requests(); len(reqs) != 1 || string(reqs[0].Body) != chatBody {
		t.Fatalf("picker saw %+v", reqs)
	}
	e.finish()
	if _, _, ends := p.handle("r1").snapshot(); !slices.Equal(ends, []Outcome{Aborted}) {
		t.Fatalf("stream closed before the response: ends %v, want [aborted]", ends)
	}
}

func TestFullDuplexDefersHeadersAnswerAndEchoesBodies(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000", fallbacks: []string{"10.0.0.2:8000"}}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	first := headersMsg("r1", false, nil)
	first.ProtocolConfig = &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
	// Full duplex: Envoy sends headers and every chunk without waiting.
	e.mustSend(first)
	e.mustSend(bodyMsg(chatBody[:20], false))
	e.mustSend(bodyMsg(chatBody[20:], true))
	r := e.mustRecv()
	c := r.GetRequestHeaders().GetResponse()
	if c == nil {
		t.Fatalf("first answer = %v, want the request headers answer", r)
	}
	if hdr, meta := destination(t, r, c); hdr != "10.0.0.1:8000,10.0.0.2:8000" || meta != hdr {
		t.Fatalf("header %q, metadata %q", hdr, meta)
	}
	r = e.mustRecv()
	sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != chatBody || !sr.GetEndOfStream() {
		t.Fatalf("body echo = %v", r)
	}
	e.mustSend(respHeadersMsg(""))
	e.mustRecv()
	e.mustSend(respBodyMsg("data: a\n\n", true))
	sr = e.mustRecv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != "data: a\n\n" || !sr.GetEndOfStream() {
		t.Fatalf("response body echo = %v", sr)
	}
	e.finish()
	if served, first, ends := p.handle("r1").snapshot(); len(served) != 0 || first != 1 || !slices.Equal(ends, []Outcome{Completed}) {
		t.Fatalf("handle saw served %v, first %d, ends %v", served, first, ends)
	}
}

func TestRequestWithoutBodyPicksOnHeaders(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	e.mustSend(headersMsg("r1", true, nil))
	r := e.mustRecv()
	c := r.GetRequestHeaders().GetResponse()
	if hdr, meta := destination(t, r, c); hdr != "10.0.0.1:8000" || meta != hdr {
		t.Fatalf("header %q, metadata %q", hdr, meta)
	}
	if reqs := p.requests(); len(reqs) != 1 || len(reqs[0].Body) != 0 {
		t.Fatalf("picker saw %+v", reqs)
	}
	// A response without a body ends on its headers.
	m := respHeadersMsg("")
	m.GetResponseHeaders().EndOfStream = true
	e.mustSend(m)
	e.mustRecv()
	e.finish()
	if _, first, ends := p.handle("r1").snapshot(); first != 0 || !slices.Equal(ends, []Outcome{Completed}) {
		t.Fatalf("first %d, ends %v", first, ends)
	}
}

func TestSubsetHintPassedToPicker(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   *corev3.Metadata
		want []string
	}{
		{"absent", nil, nil},
		{"list", subsetMD(structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewStringValue("10.0.0.3:8000"), structpb.NewStringValue("10.0.0.1:8000")}})),
			[]string{"10.0.0.3:8000", "10.0.0.1:8000"}},
		{"comma string", subsetMD(structpb.NewStringValue("10.0.0.3:8000, 10.0.0.4:8000")),
			[]string{"10.0.0.3:8000", "10.0.0.4:8000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePicker{endpoint: "10.0.0.3:8000"}
			e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
			e.mustSend(headersMsg("r1", true, tc.md))
			e.mustRecv()
			e.finish()
			reqs := p.requests()
			if len(reqs) != 1 || !slices.Equal(reqs[0].Subset, tc.want) || (tc.want == nil) != (reqs[0].Subset == nil) {
				t.Fatalf("picker saw subset %#v, want %#v", reqs[0].Subset, tc.want)
			}
		})
	}
}

// immediateOf decodes an immediate response's status and OpenAI error body.
func immediateOf(t *testing.T, r *extprocv3.ProcessingResponse) (int, map[string]any) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("answer = %v, want an immediate response", r)
	}
	var ct string
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-type" {
			ct = string(h.GetHeader().GetRawValue())
		}
	}
	if ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		t.Fatalf("body %q: %v", ir.GetBody(), err)
	}
	return int(ir.GetStatus().GetCode()), body.Error
}

func TestPickerErrorsAnswerImmediately(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		typ, code  string
		wantPrefix string
	}{
		{ErrNoEndpoint, 503, "server_error", "no_worker", "no ready endpoint"},
		{fmt.Errorf("%w for model %q", ErrNoEndpoint, "m"), 503, "server_error", "no_worker", `no ready endpoint for model "m"`},
		{ErrShed, 429, "rate_limit_error", "queue_full", "every endpoint is at capacity"},
		{ErrPastDue, 429, "rate_limit_error", "due_time_passed", "the request's due time passed"},
		{fmt.Errorf("%w: no model field", ErrBadRequest), 400, "invalid_request_error", "invalid_request", "invalid request: no model field"},
		{fmt.Errorf("%w: GET is not allowed on /v1/completions", ErrMethodNotAllowed), 405, "invalid_request_error", "method_not_allowed", "method not allowed: GET is not allowed"},
		{errors.New("scorer exploded"), 503, "server_error", "selection_failed", "no endpoint could be selected: scorer exploded"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			p := &fakePicker{err: tc.err}
			obs := &samples{}
			e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p, Decisions: obs}))
			e.mustSend(headersMsg("r1", false, nil))
			e.mustRecv()
			e.mustSend(bodyMsg(chatBody, true))
			r := e.mustRecv()
			status, body := immediateOf(t, r)
			if status != tc.status || body["type"] != tc.typ || body["code"] != tc.code ||
				!strings.HasPrefix(body["message"].(string), tc.wantPrefix) {
				t.Fatalf("got %d %v; want %d %s %s %q...", status, body, tc.status, tc.typ, tc.code, tc.wantPrefix)
			}
			var allow []string
			for _, h := range r.GetImmediateResponse().GetHeaders().GetSetHeaders() {
				if h.GetHeader().GetKey() == "allow" {
					allow = append(allow, string(h.GetHeader().GetRawValue()))
				}
			}
			if want := map[bool][]string{true: {"POST"}}[status == 405]; !slices.Equal(allow, want) {
				t.Errorf("allow headers %q, want %q", allow, want)
			}
			if v, ok := body["param"]; !ok || v != nil {
				t.Errorf("param = %v (present %v), want null as serve sends", v, ok)
			}
			e.finish()
			if StatusOf(tc.err) != tc.status {
				t.Errorf("StatusOf = %d, want %d", StatusOf(tc.err), tc.status)
			}
			if len(obs.v) != 0 {
				t.Errorf("a refused pick observed as a decision: %v", obs.v)
			}
		})
	}
}

// TestNoHeadroomAnswers429RetryAfter: a Picker's *shared.NoHeadroomError
// (the runtime's, through RouterPicker: no worker is predicted to meet
// the request's latency targets) is a 429 slo_no_headroom with a
// retry-after header of its RetryAfter in whole seconds, rounded up, in
// the OpenAI error shape, its own words the message.
func TestNoHeadroomAnswers429RetryAfter(t *testing.T) {
	nh := &shared.NoHeadroomError{RetryAfter: 4100 * time.Millisecond, TTFT: 1.5, TPOT: 0.02}
	p := &fakePicker{err: fmt.Errorf("request %q: %w", "r1#0", nh)}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(chatBody, true))
	r := e.mustRecv()
	status, body := immediateOf(t, r)
	if status != 429 || body["type"] != "rate_limit_error" || body["code"] != "slo_no_headroom" || body["message"] != nh.Error() {
		t.Fatalf("got %d %v; want 429 rate_limit_error slo_no_headroom %q", status, body, nh.Error())
	}
	var retry []string
	for _, h := range r.GetImmediateResponse().GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = append(retry, string(h.GetHeader().GetRawValue()))
		}
	}
	if !slices.Equal(retry, []string{"5"}) {
		t.Errorf("retry-after headers %q, want [5]", retry)
	}
	e.finish()
	if StatusOf(p.err) != 429 {
		t.Errorf("StatusOf = %d, want 429", StatusOf(p.err))
	}
}

// TestUpstreamStatusBounded: the response's ":status" reaches
// Handle.Status as its code when it is a valid HTTP status (100 to 599),
// as 502 when it is anything else, and not at all when it is absent; the
// codes an upstream can make the picker count are thus bounded.
func TestUpstreamStatusBounded(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	c := startServer(t, &Server{Picker: p})
	for i, tc := range []struct {
		status string // "-": no :status header
		want   []int
	}{
		{"200", []int{200}}, {"100", []int{100}}, {"599", []int{599}}, {"404", []int{404}},
		{"999", []int{502}}, {"600", []int{502}}, {"099", []int{502}}, {"42", []int{502}}, {"1000", []int{502}},
		{"+20", []int{502}}, {"abc", []int{502}}, {"", []int{502}}, {"-", nil},
	} {
		id := fmt.Sprint("r", i)
		e := newEnvoy(t, t.Context(), c)
		e.mustSend(headersMsg(id, true, nil))
		e.mustRecv()
		m := respHeadersStatus("", tc.status)
		if tc.status == "-" {
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}
		}
		e.mustSend(m)
		e.mustRecv()
		e.finish()
		h := p.handle(id)
		h.mu.Lock()
		got := slices.Clone(h.codes)
		h.mu.Unlock()
		if !slices.Equal(got, tc.want) {
			t.Errorf(":status %q: Status calls %v, want %v", tc.status, got, tc.want)
		}
	}
}

func TestEmptySubsetHintIs503WithoutPicking(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	e.mustSend(headersMsg("r1", false, subsetMD(structpb.NewListValue(&structpb.ListValue{}))))
	e.mustRecv()
	e.mustSend(bodyMsg(chatBody, true))
	status, body := immediateOf(t, e.mustRecv())
	if status != 503 || body["code"] != "no_worker" || !strings.Contains(body["message"].(string), "subset hint lists no endpoint") {
		t.Fatalf("got %d %v", status, body)
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times", n)
	}
	e.finish()
}

func TestBodyOverBoundIs413(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p, MaxBodyBytes: 16}))
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 10), false))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 7), false)) // 17 > 16
	status, body := immediateOf(t, e.mustRecv())
	if status != 413 || body["type"] != "invalid_request_error" || body["code"] != "body_too_large" ||
		body["message"] != "request body exceeds 16 bytes" {
		t.Fatalf("got %d %v", status, body)
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times", n)
	}
	e.finish()
}

func TestUnknownPhasesDoNotBreakTheStream(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
	e.mustSend(&extprocv3.ProcessingRequest{}) // no phase set: a newer proxy's message
	e.mustSend(headersMsg("r1", false, nil))
	if r := e.mustRecv(); r.GetRequestHeaders() == nil {
		t.Fatalf("answer = %v, want the headers answer", r)
	}
	e.mustSend(bodyMsg(chatBody, true))
	e.mustRecv()
	e.mustSend(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	if r := e.mustRecv(); r.GetRequestTrailers() == nil {
		t.Fatalf("answer = %v, want the request trailers answer", r)
	}
	e.mustSend(respHeadersMsg(""))
	e.mustRecv()
	e.mustSend(respBodyMsg("data: a\n\n", false))
	e.mustRecv()
	e.mustSend(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if r := e.mustRecv(); r.GetResponseTrailers() == nil {
		t.Fatalf("answer = %v, want the response trailers answer", r)
	}
	e.finish()
	if _, first, ends := p.handle("r1").snapshot(); first != 1 || !slices.Equal(ends, []Outcome{Completed}) {
		t.Fatalf("first %d, ends %v", first, ends)
	}
}

// TestEndExactlyOnceUnderResets runs 200 streams; a fifth are reset by the
// client at a random point. Every picked request gets End exactly once:
// Completed when its response ended, Aborted otherwise.
func TestEndExactlyOnceUnderResets(t *testing.T) {
	const streams = 200
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	c := startServer(t, &Server{Picker: p})
	rng := rand.New(rand.NewPCG(16, 1))
	// resetAt[i] < 0: runs to the end; else the step after which it resets.
	resetAt := make([]int, streams)
	for i := range resetAt {
		resetAt[i] = -1
		if i%5 == 0 {
			resetAt[i] = rng.IntN(5)
		}
	}
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st, err := c.Process(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			id := fmt.Sprint(i)
			steps := []*extprocv3.ProcessingRequest{
				headersMsg(id, false, nil), bodyMsg(chatBody, true), respHeadersMsg(""),
				respBodyMsg("data: a\n\n", false), respBodyMsg("data: [DONE]\n\n", true),
			}
			for k, m := range steps {
				if err := st.Send(m); err != nil {
					t.Errorf("stream %d step %d send: %v", i, k, err)
					return
				}
				if _, err := st.Recv(); err != nil {
					t.Errorf("stream %d step %d recv: %v", i, k, err)
					return
				}
				if k == resetAt[i] {
					cancel() // the client resets the stream mid-way
					return
				}
			}
			_ = st.CloseSend()
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("stream %d: end %v", i, err)
			}
		})
	}
	wg.Wait()
	// Reset streams end on the server after the client returns: wait for
	// every handle's End, generously.
	deadline := time.Now().Add(60 * time.Second)
	for {
		pending := 0
		for i := range streams {
			if resetAt[i] == 0 {
				continue // reset before the pick
			}
			h := p.handle(fmt.Sprint(i))
			if h == nil {
				t.Fatalf("stream %d never picked", i)
			}
			if _, _, ends := h.snapshot(); len(ends) == 0 {
				pending++
			}
		}
		if pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var completed, aborted int
	for i := range streams {
		h := p.handle(fmt.Sprint(i))
		if resetAt[i] == 0 {
			if h != nil {
				t.Errorf("stream %d reset after its headers was picked", i)
			}
			continue
		}
		_, _, ends := h.snapshot()
		want := Completed
		if resetAt[i] > 0 && resetAt[i] < 4 {
			want = Aborted
		}
		if !slices.Equal(ends, []Outcome{want}) {
			t.Errorf("stream %d (reset at %d): ends %v, want [%v]", i, resetAt[i], ends, want)
			continue
		}
		if ends[0] == Completed {
			completed++
		} else {
			aborted++
		}
	}
	if n := len(p.requests()); n != completed+aborted {
		t.Errorf("%d picks, %d ends", n, completed+aborted)
	}
	t.Logf("%d completed, %d aborted", completed, aborted)
}

// TestLargeBodies: a buffered body over gRPC's default 4 MiB message
// limit is picked (GRPCServerOptions), and a full-duplex body is sent
// back in chunks of at most EchoChunkBytes, the last ending the stream.
func TestLargeBodies(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	c := startServer(t, &Server{Picker: p})
	big := strings.Repeat("x", 6<<20)
	e := newEnvoy(t, t.Context(), c)
	e.mustSend(headersMsg("buffered", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(big, true))
	if r := e.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("6 MiB buffered body: %v, want a pick", r.GetImmediateResponse())
	}
	e.finish()

	e = newEnvoy(t, t.Context(), c)
	first := headersMsg("duplex", false, nil)
	first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	e.mustSend(first)
	body := big[:EchoChunkBytes*5/2]
	for i := 0; i < len(body); i += 256 << 10 {
		e.mustSend(bodyMsg(body[i:i+256<<10], i+256<<10 >= len(body)))
	}
	if r := e.mustRecv(); r.GetRequestHeaders().GetResponse() == nil {
		t.Fatalf("first answer %v, want the headers answer with the pick", r)
	}
	var sizes []int
	var eos []bool
	var got strings.Builder
	for !slices.Contains(eos, true) {
		sr := e.mustRecv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		sizes, eos = append(sizes, len(sr.GetBody())), append(eos, sr.GetEndOfStream())
		got.Write(sr.GetBody())
	}
	if !slices.Equal(sizes, []int{EchoChunkBytes, EchoChunkBytes, EchoChunkBytes / 2}) || !slices.Equal(eos, []bool{false, false, true}) || got.String() != body {
		t.Fatalf("echoed chunks of %v bytes, end of stream %v, same body %v; want 1 MiB, 1 MiB, 512 KiB, the last ending it", sizes, eos, got.String() == body)
	}
	e.finish()
}

// TestBodyOverBoundInOneMessage: a body over the bound that comes whole
// in one message (a BUFFERED proxy's) is answered 413 when the message
// is within MaxMessageBytes; a larger message is refused by gRPC itself,
// RESOURCE_EXHAUSTED, before the handler sees it.
func TestBodyOverBoundInOneMessage(t *testing.T) {
	const bound = 1 << 20
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	s := &Server{Picker: p, MaxBodyBytes: bound}
	c := startServer(t, s)
	e := newEnvoy(t, t.Context(), c)
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", bound+bound/2), true))
	st, body := immediateOf(t, e.mustRecv())
	if st != 413 || body["code"] != "body_too_large" || body["message"] != fmt.Sprintf("request body exceeds %d bytes", bound) {
		t.Fatalf("1.5 MiB in one message: got %d %v, want 413 body_too_large", st, body)
	}
	if r, err := e.st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 413: %v, %v; want the stream's end", r, err)
	}
	e = newEnvoy(t, t.Context(), c)
	e.mustSend(headersMsg("r2", false, nil))
	e.mustRecv()
	_ = e.send(bodyMsg(strings.Repeat("x", int(MaxMessageBytes(bound))), true))
	if r, err := e.st.Recv(); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a message over MaxMessageBytes: %v, %v; want RESOURCE_EXHAUSTED", r, err)
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times", n)
	}
	settled(t, s)
}

// TestRepeatedRequestHeadersEndTheStream: a second request's headers on a
// stream (a hostile or broken proxy) are refused with InvalidArgument
// instead of picking again over the first pick, whose Handle ends once,
// aborted.
func TestRepeatedRequestHeadersEndTheStream(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	c := startServer(t, &Server{Picker: p})
	e := newEnvoy(t, t.Context(), c)
	e.mustSend(headersMsg("r1", true, nil))
	if r := e.mustRecv(); r.GetRequestHeaders() == nil {
		t.Fatalf("first request's headers: got %v, want the pick", r)
	}
	e.mustSend(headersMsg("r2", true, nil))
	if r, err := e.st.Recv(); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Fatalf("second request headers: got %v, %v; want InvalidArgument", r, err)
	}
	if n := len(p.requests()); n != 1 {
		t.Fatalf("picker called %d times, want 1", n)
	}
	// The first pick's End comes as the handler returns.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, ends := p.handle("r1").snapshot()
		if slices.Equal(ends, []Outcome{Aborted}) {
			break
		}
		if len(ends) > 1 || time.Now().After(deadline) {
			t.Fatalf("first pick's ends %v, want [aborted]", ends)
		}
		time.Sleep(10 * time.Millisecond)
	}

}

// TestStreamEndsAfterImmediateAnswer: once a request is answered with an
// immediate response (a 413, a Picker's 429), the handler ends the stream
// (as llm-d's does): chunks a full-duplex proxy sent before the answer
// reached it, and anything else, are never read, never picked, and hold
// nothing of the budget.
func TestStreamEndsAfterImmediateAnswer(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	s := &Server{Picker: p, MaxBodyBytes: 16}
	e := newEnvoy(t, t.Context(), startServer(t, s))
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 10), false))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 7), false)) // 17 > 16
	if st, _ := immediateOf(t, e.mustRecv()); st != 413 {
		t.Fatalf("status %d, want 413", st)
	}
	_ = e.send(bodyMsg("xxxxx", true)) // 15 would fit; the stream may be gone already
	if r, err := e.st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 413: %v, %v; want the stream's end", r, err)
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times after the 413", n)
	}
	settled(t, s)

	pe := &fakePicker{err: ErrShed}
	e = newEnvoy(t, t.Context(), startServer(t, &Server{Picker: pe}))
	e.mustSend(headersMsg("r1", true, nil))
	if st, _ := immediateOf(t, e.mustRecv()); st != 429 {
		t.Fatalf("status %d, want 429", st)
	}
	_ = e.send(headersMsg("r2", true, nil))
	if r, err := e.st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 429: %v, %v; want the stream's end", r, err)
	}
	if n := len(pe.requests()); n != 1 {
		t.Fatalf("picker called %d times, want 1", n)
	}
}

// settled waits (a minute at most) for s's budget to hold nothing.
func settled(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.held.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("budget holds %d bytes a minute on, want 0", s.held.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBodyWithoutHeadersIs400: a stream whose request body comes before
// any request headers (a proxy skipping them, or a broken one) is
// answered 400 and never picked: the Picker routes by method and path.
func TestBodyWithoutHeadersIs400(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	for _, eos := range []bool{true, false} {
		e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
		e.mustSend(bodyMsg(chatBody, eos))
		st, body := immediateOf(t, e.mustRecv())
		if st != 400 || body["type"] != "invalid_request_error" || body["code"] != "invalid_request" ||
			!strings.Contains(body["message"].(string), "request body without request headers") {
			t.Fatalf("end of stream %v: got %d %v, want 400 invalid_request", eos, st, body)
		}
		if r, err := e.st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the 400: %v, %v; want the stream's end", r, err)
		}
	}
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times", n)
	}
}

// TestSubsetHintOfWrongTypeIs503 names the wrong type in the 503's
// message instead of calling it an empty hint, and does not pick.
func TestSubsetHintOfWrongTypeIs503(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    *structpb.Value
		want string
	}{
		{"number", structpb.NewNumberValue(42), "the subset hint is a number, want a list of \"ip:port\" strings or one comma-separated string"},
		{"bool", structpb.NewBoolValue(true), "the subset hint is a boolean, want a list of \"ip:port\" strings or one comma-separated string"},
		{"null", structpb.NewNullValue(), "the subset hint is null, want a list of \"ip:port\" strings or one comma-separated string"},
		{"struct", structpb.NewStructValue(&structpb.Struct{}), "the subset hint is a struct, want a list of \"ip:port\" strings or one comma-separated string"},
		{"nested list", structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewStringValue("10.0.0.1:8000"),
			structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.1:8000")}})}}),
			`the subset hint's entry 1 is a list, want an "ip:port" string`},
		{"number entry", structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1)}}),
			`the subset hint's entry 0 is a number, want an "ip:port" string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePicker{endpoint: "10.0.0.1:8000"}
			e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
			e.mustSend(headersMsg("r1", true, subsetMD(tc.v)))
			st, body := immediateOf(t, e.mustRecv())
			if st != 503 || body["code"] != "no_worker" || body["message"] != "no ready endpoint: "+tc.want {
				t.Fatalf("got %d %v", st, body)
			}
			if n := len(p.requests()); n != 0 {
				t.Fatalf("picker called %d times", n)
			}
			e.finish()
		})
	}
}

// TestBodiesInFlightBound: a stream receives its request only within a
// reservation of MaxMessageBytes from the budget, which shrinks to the
// body for the pick and is given back after it; a stream that finds the
// budget taken waits for it, and is picked once it is free.
func TestBodiesInFlightBound(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	reserve := MaxMessageBytes(1000)
	s := &Server{Picker: p, MaxBodyBytes: 1000, MaxBodyBytesInFlight: reserve}
	c := startServer(t, s)
	a := newEnvoy(t, t.Context(), c)
	a.mustSend(headersMsg("a", false, nil))
	a.mustRecv()
	a.mustSend(bodyMsg(strings.Repeat("a", 600), false))
	a.mustRecv()
	if got := s.held.Load(); got != reserve {
		t.Fatalf("a receiving: the budget holds %d bytes, want its reservation %d", got, reserve)
	}
	// b waits for the budget: its headers are not read until a's pick.
	b := newEnvoy(t, t.Context(), c)
	b.mustSend(headersMsg("b", false, nil))
	bAnswer := make(chan *extprocv3.ProcessingResponse, 1)
	go func() {
		r, _ := b.st.Recv()
		bAnswer <- r
	}()
	a.mustSend(bodyMsg(strings.Repeat("a", 300), true))
	if r := a.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("a's last chunk: %v, want the pick", r)
	}
	if r := <-bAnswer; r.GetRequestHeaders() == nil {
		t.Fatalf("b's headers: %v, want their answer once a was picked", r)
	}
	if reqs := p.requests(); len(reqs) != 1 || len(reqs[0].Body) != 900 {
		t.Fatalf("picked %d requests, want a's 900 bytes", len(reqs))
	}
	b.mustSend(bodyMsg(chatBody, true))
	if r := b.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("b's body: %v, want the pick", r)
	}
	a.finish()
	b.finish()
	settled(t, s)
}

// gatedPicker is a fakePicker whose picks wait for a value on gate.
type gatedPicker struct {
	fakePicker
	gate chan struct{}
}

func (p *gatedPicker) Pick(ctx context.Context, r *Request) (Pick, error) {
	select {
	case <-p.gate:
	case <-ctx.Done():
		return Pick{}, ctx.Err()
	}
	return p.fakePicker.Pick(ctx, r)
}

// TestBodyTimeout: past BodyTimeout, a stream waiting for a reservation
// is answered 503 overloaded, and one still receiving its request 408
// body_timeout. The budget is one reservation; a's body is held while its
// pick waits.
func TestBodyTimeout(t *testing.T) {
	p := &gatedPicker{fakePicker: fakePicker{endpoint: "10.0.0.1:8000"}, gate: make(chan struct{})}
	s := &Server{Picker: p, MaxBodyBytes: 1000, MaxBodyBytesInFlight: MaxMessageBytes(1000), BodyTimeout: 2 * time.Second}
	c := startServer(t, s)
	a := newEnvoy(t, t.Context(), c)
	a.mustSend(headersMsg("a", false, nil))
	a.mustRecv()
	a.mustSend(bodyMsg(strings.Repeat("a", 900), true)) // picked once the gate opens
	deadline := time.Now().Add(time.Minute)
	for s.held.Load() != 900 {
		if time.Now().After(deadline) {
			t.Fatalf("the budget holds %d bytes a minute on, want a's body's 900 while it is picked", s.held.Load())
		}
		time.Sleep(time.Millisecond)
	}
	b := newEnvoy(t, t.Context(), c)
	b.mustSend(headersMsg("b", false, nil))
	if st, body := immediateOf(t, b.mustRecv()); st != 503 || body["code"] != "overloaded" {
		t.Fatalf("b, waiting for the budget: got %d %v, want 503 overloaded", st, body)
	}
	p.gate <- struct{}{}
	if r := a.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("a: %v, want the pick", r)
	}
	a.finish()
	b.finish()
	settled(t, s)
	// A request whose body does not come in time.
	d := newEnvoy(t, t.Context(), c)
	d.mustSend(headersMsg("d", false, nil))
	d.mustRecv()
	st, body := immediateOf(t, d.mustRecv())
	if st != 408 || body["code"] != "body_timeout" || body["message"] != "the request did not arrive within 2s" {
		t.Fatalf("d, no body: got %d %v, want 408 body_timeout", st, body)
	}
	d.finish()
	settled(t, s)
	if n := len(p.requests()); n != 1 {
		t.Fatalf("picker called %d times, want a's once", n)
	}
}

// TestSmallBudget: a budget below MaxMessageBytes is one stream's whole
// reservation; a body that would pass it is answered 503 overloaded.
func TestSmallBudget(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	s := &Server{Picker: p, MaxBodyBytesInFlight: 100}
	e := newEnvoy(t, t.Context(), startServer(t, s))
	e.mustSend(headersMsg("a", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("a", 60), false))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("a", 50), true))
	if st, body := immediateOf(t, e.mustRecv()); st != 503 || body["code"] != "overloaded" {
		t.Fatalf("110 bytes within a budget of 100: got %d %v, want 503 overloaded", st, body)
	}
	settled(t, s)
	e = newEnvoy(t, t.Context(), startServer(t, s))
	e.mustSend(headersMsg("b", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("b", 90), true))
	if r := e.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("90 bytes within a budget of 100: %v, want the pick", r)
	}
	e.finish()
	settled(t, s)
}

// TestPrefillHeader: a pick naming a prefill endpoint sets
// x-prefiller-host-port on the request (over a client's); a pick naming
// none removes one the client sent, and touches nothing otherwise.
func TestPrefillHeader(t *testing.T) {
	for _, tc := range []struct {
		name, prefill, sent string
		set                 string // the header set, "" none
		removed             bool
	}{
		{"picked", "10.0.0.9:8000", "", "10.0.0.9:8000", false},
		{"picked over the client's", "10.0.0.9:8000", "169.254.169.254:80", "10.0.0.9:8000", false},
		{"forged", "", "169.254.169.254:80", "", true},
		{"aggregated", "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePicker{endpoint: "10.0.0.1:8000", prefill: tc.prefill}
			e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p}))
			m := headersMsg("r1", false, nil)
			if tc.sent != "" {
				hs := m.GetRequestHeaders().GetHeaders()
				hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: PrefillHeader, RawValue: []byte(tc.sent)})
			}
			e.mustSend(m)
			e.mustRecv()
			e.mustSend(bodyMsg(chatBody, true))
			mut := e.mustRecv().GetRequestBody().GetResponse().GetHeaderMutation()
			var set []string
			for _, h := range mut.GetSetHeaders() {
				if h.GetHeader().GetKey() == PrefillHeader {
					set = append(set, string(h.GetHeader().GetRawValue()))
					//lint:ignore SA1019 Envoy's ext_proc filter honours the deprecated append, not append_action
					if h.GetAppend().GetValue() {
						t.Error("the prefill header is appended, not set")
					}
				}
			}
			if want := []string{tc.set}; (tc.set == "" && len(set) != 0) || (tc.set != "" && !slices.Equal(set, want)) {
				t.Errorf("set %q, want %q", set, tc.set)
			}
			if removed := slices.Contains(mut.GetRemoveHeaders(), PrefillHeader); removed != tc.removed {
				t.Errorf("removed %v (%q), want %v", removed, mut.GetRemoveHeaders(), tc.removed)
			}
		})
	}
}
