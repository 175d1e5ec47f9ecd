package epp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/switchyard-router/switchyard/router/serve"
)

// Server is the ext_proc service: register it with
// extprocv3.RegisterExternalProcessorServer. One stream carries one HTTP
// request; streams run concurrently and share nothing but the Picker.
type Server struct {
	// Picker chooses the endpoints; required.
	Picker Picker
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	// Zero means serve.DefaultMaxBodyBytes (32 MiB), serve's own bound.
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the request body bytes held at once, all
	// streams together, from their first chunk until the Picker has
	// answered: a chunk that would pass it is answered 503 "overloaded",
	// as serve answers. Zero means serve.DefaultMaxBodyBytesInFlight (1
	// GiB); negative, no bound.
	MaxBodyBytesInFlight int64
	// Decisions, when set, observes each pick's decision latency in
	// seconds: from the handler holding the whole request (its last body
	// chunk received, or headers without a body) to the answer carrying
	// the destination handed to gRPC (Send returned). It includes the
	// Picker (parsing, keying, admission, the policy, the booking, and a
	// wait in the queue when every worker is at capacity) and building
	// and sending the answer; not the network. Picks answered with an
	// error are not observed.
	Decisions prometheus.Observer

	held atomic.Int64 // body bytes held, all streams
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// EchoChunkBytes bounds each message of a request body sent back in
// full-duplex mode: 1 MiB, well under gRPC's default 4 MiB message limit
// on the proxy's side.
const EchoChunkBytes = 1 << 20

// GRPCServerOptions are the gRPC server options an endpoint picker with
// body bound maxBody (Server.MaxBodyBytes; 0: serve.DefaultMaxBodyBytes)
// needs: messages up to the bound plus 1 MiB for headers and metadata, as
// a proxy in BUFFERED mode sends a whole body in one message (gRPC's
// default limit is 4 MiB).
func GRPCServerOptions(maxBody int64) []grpc.ServerOption {
	if maxBody <= 0 {
		maxBody = serve.DefaultMaxBodyBytes
	}
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(int(min(maxBody+1<<20, math.MaxInt32)))}
}

// stream is the state of one ext_proc stream.
type stream struct {
	s      *Server
	srv    extprocv3.ExternalProcessor_ProcessServer
	max    int64
	duplex bool // request body in FULL_DUPLEX_STREAMED mode: the headers answer waits for the body
	echo   bool // response body in FULL_DUPLEX_STREAMED mode: each chunk is sent back
	req    Request
	picked bool
	// refused: the request was answered with an immediate response; later
	// request body chunks are dropped, later request headers are an error.
	refused bool
	// subsetErr: the subset hint is not a list of strings (answered 503).
	subsetErr error
	handle    Handle // nil before the pick and after End
	served    bool
	first     bool
	holding   int64 // body bytes this stream counts in Server.held
}

// hold counts n more body bytes of st in the server's bound; false when
// they would pass it (nothing is counted then).
func (st *stream) hold(n int64) bool {
	limit := st.s.MaxBodyBytesInFlight
	if limit == 0 {
		limit = serve.DefaultMaxBodyBytesInFlight
	}
	if limit < 0 {
		return true
	}
	if st.s.held.Add(n) > limit {
		st.s.held.Add(-n)
		return false
	}
	st.holding += n
	return true
}

// release gives back the body bytes st holds.
func (st *stream) release() {
	if st.holding != 0 {
		st.s.held.Add(-st.holding)
		st.holding = 0
	}
}

// Process serves one ext_proc stream: the phases of one HTTP request as
// Envoy's ext_proc filter sends them. It returns nil when the proxy closes
// the stream, a codes.InvalidArgument status when request headers come a
// second time (or after the request was answered), and the stream's error
// otherwise; the Handle of a picked
// request gets End exactly once whatever happens (Aborted unless the
// response reached its end).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv, max: s.MaxBodyBytes}
	if st.max <= 0 {
		st.max = serve.DefaultMaxBodyBytes
	}
	defer st.end(Aborted)
	defer st.release()
	for {
		msg, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := st.handle1(msg); err != nil {
			return err
		}
	}
}

// end calls the handle's End once.
func (st *stream) end(o Outcome) {
	if st.handle != nil {
		h := st.handle
		st.handle = nil
		h.End(o)
	}
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return fmt.Errorf("sending the ext_proc answer: %w", err)
	}
	return nil
}

// handle1 answers one message of the stream.
func (st *stream) handle1(msg *extprocv3.ProcessingRequest) error {
	if pc := msg.GetProtocolConfig(); pc != nil {
		st.duplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		st.echo = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(msg, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.servedFrom(msg)
		if st.handle != nil {
			if code, ok := status(r.ResponseHeaders); ok {
				st.handle.Status(code)
			}
		}
		if r.ResponseHeaders.GetEndOfStream() {
			st.end(Completed)
		}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(msg, r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.end(Completed)
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	default:
		// A phase this handler does not know (a newer proxy's, or flow
		// control): nothing to answer, the stream goes on.
		return nil
	}
}

func (st *stream) requestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if st.req.Headers != nil || st.picked || st.refused {
		// One stream is one HTTP request: a second request would pick
		// again over the first's pick, whose Handle would never end.
		return grpcstatus.Error(codes.InvalidArgument, "request headers after the request's headers or its answer: an ext_proc stream carries one HTTP request")
	}
	hm := h.GetHeaders().GetHeaders()
	st.req.Headers = make(map[string]string, len(hm))
	for _, hv := range hm {
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		st.req.Headers[strings.ToLower(hv.GetKey())] = v
	}
	st.req.Subset, st.subsetErr = subsetHint(msg.GetMetadataContext())
	if h.GetEndOfStream() {
		return st.pick(true)
	}
	if st.duplex {
		return nil // answered with the pick, once the body is in
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
}

func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if st.refused {
		// Answered already (413, say): a full-duplex proxy may have sent
		// more chunks before the answer reached it. Dropped, unanswered;
		// never picked.
		return nil
	}
	if st.picked {
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
	}
	if int64(len(st.req.Body))+int64(len(b.GetBody())) > st.max {
		return st.immediate(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", st.max))
	}
	if !st.hold(int64(len(b.GetBody()))) {
		return st.immediate(http.StatusServiceUnavailable, "server_error", "overloaded",
			"the endpoint picker holds as many request bodies as it may; retry shortly")
	}
	st.req.Body = append(st.req.Body, b.GetBody()...)
	if b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage() {
		defer st.release() // the Picker has had the body
		return st.pick(false)
	}
	if st.duplex {
		return nil
	}
	// A chunk of a streamed body: let it pass, pick on the last one.
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
}

// pick asks the Picker and answers the phase that completed the request:
// its headers (onHeaders, a request without a body) or its body.
func (st *stream) pick(onHeaders bool) error {
	start := time.Now()
	if err := st.pick1(onHeaders); err != nil || st.s.Decisions == nil || !st.picked {
		return err
	}
	st.s.Decisions.Observe(time.Since(start).Seconds())
	return nil
}

// pick1 is pick without the observation.
func (st *stream) pick1(onHeaders bool) error {
	if st.subsetErr != nil {
		return st.immediateErr(fmt.Errorf("%w: %w", ErrNoEndpoint, st.subsetErr))
	}
	if st.req.Subset != nil && len(st.req.Subset) == 0 {
		return st.immediateErr(fmt.Errorf("%w: the subset hint lists no endpoint", ErrNoEndpoint))
	}
	p, err := st.s.Picker.Pick(st.srv.Context(), &st.req)
	if err != nil {
		return st.immediateErr(err)
	}
	st.picked, st.handle = true, p.Handle
	body := st.req.Body
	st.req.Body = nil // the Picker has had it
	dest := strings.Join(append([]string{p.Endpoint}, p.Fallbacks...), ",")
	common := &extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(dest)},
		}}},
		ClearRouteCache: true,
	}
	md, err := structpb.NewStruct(map[string]any{MetadataNamespace: map[string]any{DestinationHeader: dest}})
	if err != nil {
		return fmt.Errorf("building the dynamic metadata: %w", err)
	}
	if onHeaders {
		return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: common}}})
	}
	if st.duplex {
		// Full duplex: the headers answer carries the pick, then the body
		// goes back as the proxy expects the server to send it, in chunks
		// of at most EchoChunkBytes (the last one ending the stream).
		if err := st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
			return err
		}
		for {
			n := min(len(body), EchoChunkBytes)
			if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
					BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
						StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: n == len(body)}}}}}}}); err != nil {
				return err
			}
			if body = body[n:]; len(body) == 0 {
				return nil
			}
		}
	}
	return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}})
}

func (st *stream) responseBody(msg *extprocv3.ProcessingRequest, b *extprocv3.HttpBody) error {
	st.servedFrom(msg)
	if len(b.GetBody()) > 0 && st.handle != nil {
		if !st.first {
			st.first = true
			st.handle.FirstToken()
		}
		st.handle.Body(b.GetBody())
	}
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	if eos {
		st.end(Completed)
	}
	common := &extprocv3.CommonResponse{}
	if st.echo {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: eos}}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: common}}})
}

// servedFrom passes the served endpoint of the metadata context, the first
// time one is present, to the handle.
func (st *stream) servedFrom(msg *extprocv3.ProcessingRequest) {
	if st.served || st.handle == nil {
		return
	}
	v := msg.GetMetadataContext().GetFilterMetadata()[MetadataNamespace].GetFields()[ServedKey]
	if ep := v.GetStringValue(); ep != "" {
		st.served = true
		st.handle.Served(ep)
	}
}

// subsetHint reads the subset hint of the filter metadata: nil when absent,
// else its endpoints (a list of strings, or one comma-separated string),
// empty entries dropped. A hint of another type, or a list with an entry
// that is not a string, is an error naming it.
func subsetHint(md *corev3.Metadata) ([]string, error) {
	v, ok := md.GetFilterMetadata()[SubsetNamespace].GetFields()[SubsetKey]
	if !ok {
		return nil, nil
	}
	out := []string{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	if l, isList := v.GetKind().(*structpb.Value_ListValue); isList {
		for i, e := range l.ListValue.GetValues() {
			s, isStr := e.GetKind().(*structpb.Value_StringValue)
			if !isStr {
				return out, fmt.Errorf("the subset hint's entry %d is %s, want an \"ip:port\" string", i, kindOf(e))
			}
			add(s.StringValue)
		}
		return out, nil
	}
	s, isStr := v.GetKind().(*structpb.Value_StringValue)
	if !isStr {
		return out, fmt.Errorf("the subset hint is %s, want a list of \"ip:port\" strings or one comma-separated string", kindOf(v))
	}
	add(s.StringValue)
	return out, nil
}

// kindOf words a metadata value's type.
func kindOf(v *structpb.Value) string {
	switch v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		return "a number"
	case *structpb.Value_BoolValue:
		return "a boolean"
	case *structpb.Value_StructValue:
		return "a struct"
	case *structpb.Value_ListValue:
		return "a list"
	case *structpb.Value_StringValue:
		return "a string"
	}
	return "null"
}

// status reads a response's ":status" header.
func status(h *extprocv3.HttpHeaders) (int, bool) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() != ":status" {
			continue
		}
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		code, err := strconv.Atoi(v)
		return code, err == nil && code >= 100 && code <= 999
	}
	return 0, false
}

// answer is how Server answers a Picker error: the HTTP status and the
// OpenAI error's type and code.
type answer struct {
	status    int
	typ, code string
	msgPrefix string
}

// answerOf returns the answer to a Picker error.
func answerOf(err error) answer {
	switch {
	case errors.Is(err, ErrNoEndpoint):
		return answer{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_worker"}
	case errors.Is(err, ErrShed):
		return answer{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full"}
	case errors.Is(err, ErrPastDue):
		return answer{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "due_time_passed"}
	case errors.Is(err, ErrBadRequest):
		return answer{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_request"}
	}
	return answer{status: http.StatusServiceUnavailable, typ: "server_error", code: "selection_failed", msgPrefix: "no endpoint could be selected: "}
}

// StatusOf returns the HTTP status code Server answers a Picker error
// with: 503 for ErrNoEndpoint and errors it does not know, 429 for
// ErrShed and ErrPastDue, 400 for ErrBadRequest.
func StatusOf(err error) int { return answerOf(err).status }

// immediateErr answers a Picker error (or an empty subset hint).
func (st *stream) immediateErr(err error) error {
	a := answerOf(err)
	return st.immediate(a.status, a.typ, a.code, a.msgPrefix+err.Error())
}

// apiError is the OpenAI error body, the shape router/serve sends
// (serve's own type is unexported): {"error":{"message","type","param":null,"code"}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// immediate ends the request with an immediate response of the given HTTP
// status and an OpenAI error body.
func (st *stream) immediate(status int, typ, code, message string) error {
	st.refused, st.req.Body = true, nil
	st.release()
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = message, typ, code
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encoding the error answer: %w", err)
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
			}}},
			Body:    append(b, '\n'),
			Details: code,
		}}})
}
