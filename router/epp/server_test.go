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
	return Pick{Endpoint: p.endpoint, Fallbacks: p.fallbacks, Handle: h}, nil
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
		{errors.New("scorer exploded"), 503, "server_error", "selection_failed", "no endpoint could be selected: scorer exploded"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			p := &fakePicker{err: tc.err}
			obs := &samples{}
			e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p, Decisions: obs}))
			e.mustSend(headersMsg("r1", false, nil))
			e.mustRecv()
			e.mustSend(bodyMsg(chatBody, true))
			status, body := immediateOf(t, e.mustRecv())
			if status != tc.status || body["type"] != tc.typ || body["code"] != tc.code ||
				!strings.HasPrefix(body["message"].(string), tc.wantPrefix) {
				t.Fatalf("got %d %v; want %d %s %s %q...", status, body, tc.status, tc.typ, tc.code, tc.wantPrefix)
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

// TestRepeatedRequestHeadersEndTheStream: a second request's headers on a
// stream (a hostile or broken proxy) are refused with InvalidArgument
// instead of picking again over the first pick, whose Handle ends once,
// aborted; a request's headers after its immediate answer likewise.
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

	// After an immediate answer: request headers are refused too.
	pe := &fakePicker{err: ErrShed}
	e = newEnvoy(t, t.Context(), startServer(t, &Server{Picker: pe}))
	e.mustSend(headersMsg("r1", true, nil))
	if st, _ := immediateOf(t, e.mustRecv()); st != 429 {
		t.Fatalf("status %d, want 429", st)
	}
	e.mustSend(headersMsg("r2", true, nil))
	if r, err := e.st.Recv(); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Fatalf("headers after the answer: got %v, %v; want InvalidArgument", r, err)
	}
	if n := len(pe.requests()); n != 1 {
		t.Fatalf("picker called %d times, want 1", n)
	}
}

// TestBodyAfter413IsDropped: chunks after the 413 (a full-duplex proxy
// sends them before the answer reaches it) are dropped unanswered and
// never picked, even when the request's end would fit the bound.
func TestBodyAfter413IsDropped(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	e := newEnvoy(t, t.Context(), startServer(t, &Server{Picker: p, MaxBodyBytes: 16}))
	e.mustSend(headersMsg("r1", false, nil))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 10), false))
	e.mustRecv()
	e.mustSend(bodyMsg(strings.Repeat("x", 7), false)) // 17 > 16
	if st, _ := immediateOf(t, e.mustRecv()); st != 413 {
		t.Fatalf("status %d, want 413", st)
	}
	e.mustSend(bodyMsg("xxxxx", true)) // 15 would fit
	e.finish()                         // nothing more was answered
	if n := len(p.requests()); n != 0 {
		t.Fatalf("picker called %d times after the 413", n)
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

// TestBodiesInFlightBound: the request bodies held at once, all streams
// together, are bounded: a chunk that would pass the bound is answered
// 503 overloaded; bytes are given back once a body was picked, answered,
// or its stream ended, so later requests fit again.
func TestBodiesInFlightBound(t *testing.T) {
	p := &fakePicker{endpoint: "10.0.0.1:8000"}
	s := &Server{Picker: p, MaxBodyBytesInFlight: 100}
	c := startServer(t, s)
	open := func(id string) *envoy {
		e := newEnvoy(t, t.Context(), c)
		e.mustSend(headersMsg(id, false, nil))
		e.mustRecv()
		return e
	}
	a := open("a")
	a.mustSend(bodyMsg(strings.Repeat("a", 60), false))
	a.mustRecv()
	b := open("b")
	b.mustSend(bodyMsg(strings.Repeat("b", 50), false))
	status, body := immediateOf(t, b.mustRecv())
	if status != 503 || body["code"] != "overloaded" {
		t.Fatalf("a body over the bound: %d %v, want 503 overloaded", status, body)
	}
	b.finish()
	if got := s.held.Load(); got != 60 {
		t.Fatalf("held %d bytes, want a's 60 (b's refused chunk given back)", got)
	}
	a.mustSend(bodyMsg(strings.Repeat("a", 30), true))
	if r := a.mustRecv(); r.GetRequestBody().GetResponse() == nil {
		t.Fatalf("a's last chunk (90 bytes in all): %v, want the pick", r)
	}
	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for s.held.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("held %d bytes a minute after %s, want 0", s.held.Load(), what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	settled("a's pick")
	a.finish()
	// A stream that ends mid-body gives its bytes back too.
	d := open("d")
	d.mustSend(bodyMsg(strings.Repeat("d", 80), false))
	d.mustRecv()
	d.finish()
	settled("d's stream ended")
}
