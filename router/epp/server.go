package epp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/live"
)

// Server is the ext_proc service: register it with
// extprocv3.RegisterExternalProcessorServer, on a gRPC server built with
// GRPCServerOptions(MaxBodyBytes). One stream carries one HTTP request;
// streams run concurrently and share nothing but the Picker and the body
// budget (MaxBodyBytesInFlight).
//
// Memory. gRPC takes in a whole message before the handler sees it, up to
// the message bound (MaxMessageBytes), on every stream whose handler
// waits in Recv. So a stream in its request phase (from its start until
// its request is whole: headers without a body, or the body's last
// chunk) first reserves a message's worth of the budget, and only then
// receives; its body is held within that reservation, which shrinks to
// the body once the request is whole and is given back once the Picker
// has answered. A stream that cannot reserve waits, in order of arrival.
// The request bodies in memory, all streams together, thus stay within
// MemoryMultiple times max(MaxBodyBytesInFlight, MaxMessageBytes) (see
// MemoryMultiple for its derivation); docs/epp.md states the defaults.
// After the pick a stream receives without a reservation: the response's
// phases, one message of at most MaxMessageBytes at a time per stream,
// which a proxy sizes by its own buffers (Envoy streams a response in the
// chunks it reads); and a stream not receiving holds at most
// StreamWindowBytes of what was sent to it.
type Server struct {
	// Picker chooses the endpoints; required.
	Picker Picker
	// MaxBodyBytes bounds a request body; a larger one is answered 413,
	// also when it comes whole in one message (up to MaxMessageBytes; a
	// larger message is refused by gRPC with RESOURCE_EXHAUSTED). Zero
	// means live.DefaultMaxBodyBytes (32 MiB), the runtime intake's own bound.
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes reserved for requests being
	// received (MaxMessageBytes each, or the whole bound when it is
	// smaller) and the bodies held until the Picker has answered, all
	// streams together. A stream waits for its reservation up to
	// BodyTimeout from its start; past it, it is answered 503
	// "overloaded", as serve answers. A body that would pass its
	// reservation (only when the bound is below MaxMessageBytes) is
	// answered 503 too when the rest cannot be had at once. Zero means
	// live.DefaultMaxBodyBytesInFlight (1 GiB: 31 streams receiving at
	// once at the default body bound); negative, no bound and no
	// reservation.
	MaxBodyBytesInFlight int64
	// BodyTimeout bounds a request's arrival: from the stream's start to
	// its request headers' end of stream or its body's last chunk. Past it
	// a stream still receiving is answered 408 "body_timeout" (one still
	// waiting for its reservation, 503 "overloaded"), and its reservation
	// is given back when the stream ends. Zero means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// Decisions, when set, observes each pick's decision latency in
	// seconds: from the handler holding the whole request (its last body
	// chunk received, or headers without a body) to the answer carrying
	// the destination handed to gRPC (Send returned). It includes the
	// Picker (parsing, keying, admission, the policy, the booking, and a
	// wait in the queue when every worker is at capacity) and building
	// and sending the answer; not the network. Picks answered with an
	// error are not observed.
	Decisions prometheus.Observer

	once    sync.Once
	budget  *semaphore.Weighted // MaxBodyBytesInFlight; nil: no bound
	reserve int64               // a receiving stream's reservation
	held    atomic.Int64        // bytes counted in budget, all streams
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// EchoChunkBytes bounds each message of a request body sent back in
// full-duplex mode: 1 MiB, well under gRPC's default 4 MiB message limit
// on the proxy's side.
const EchoChunkBytes = 1 << 20

// DefaultBodyTimeout is Server.BodyTimeout's default: a minute, serve's
// bound on reading a request body.
const DefaultBodyTimeout = time.Minute

// MessageOverheadBytes is what one ext_proc message may carry beside a
// body of the bound: the request headers (Envoy's default limit is 60
// KiB), the metadata context (a subset hint of many endpoints), the
// protocol configuration and the attributes. 1 MiB.
const MessageOverheadBytes = 1 << 20

// Flow-control windows of GRPCServerOptions. Both are static: gRPC's
// default window grows with the estimated bandwidth-delay product up to
// 16 MiB a stream, which a stream not receiving (one waiting for its
// reservation) would then hold.
const (
	// StreamWindowBytes is each stream's window, gRPC's least: what a
	// stream whose handler is not in Recv may hold of data not asked for.
	// A stream that reads a message is granted the message's length.
	StreamWindowBytes = 64 << 10
	// ConnWindowBytes is each connection's window, the most gRPC's own
	// estimate would reach. It costs no memory of its own: gRPC passes a
	// connection's data to its streams as it arrives, each within its
	// stream's window.
	ConnWindowBytes = 16 << 20
)

// MemoryMultiple bounds the memory the request bodies being received and
// held take, all streams together, as a multiple of
// max(Server.MaxBodyBytesInFlight, MaxMessageBytes). Within a
// reservation of one message's bound a stream holds, at worst, its body
// so far (less than the bound) and the message it is receiving twice: the
// frames as they arrived and the one copy decoded from them (the codec of
// GRPCServerOptions; gRPC's own makes two), which becomes the body. Go's
// collector (GOGC 100) lets the heap grow to twice what is live before it
// collects: 3 x 2 = 6. A body that comes in one message (a BUFFERED
// proxy's) takes 2 x 2 = 4. TestEPPMemoryBoundedByBodyBudget (cmd/router)
// measures the process's peak resident memory against it.
const MemoryMultiple = 6

// MaxMessageBytes returns the bound on one ext_proc message the handler
// receives for body bound maxBody (0: live.DefaultMaxBodyBytes): the
// bound plus MessageOverheadBytes, at most math.MaxInt32 (gRPC's own
// limit). A body over the bound in one message within it is answered 413.
func MaxMessageBytes(maxBody int64) int64 {
	if maxBody <= 0 {
		maxBody = live.DefaultMaxBodyBytes
	}
	return min(maxBody+MessageOverheadBytes, math.MaxInt32)
}

// GRPCServerOptions are the gRPC server options an endpoint picker with
// body bound maxBody (Server.MaxBodyBytes; 0: live.DefaultMaxBodyBytes)
// needs: messages up to MaxMessageBytes(maxBody), as a proxy in BUFFERED
// mode sends a whole body in one message (gRPC's default limit is 4
// MiB), the static windows StreamWindowBytes and ConnWindowBytes, and a
// codec that decodes a large body from one copy of its message, not two.
// The Server's MaxBodyBytes must be the same maxBody: its reservations
// are of the message bound.
func GRPCServerOptions(maxBody int64) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(MaxMessageBytes(maxBody))),
		grpc.StaticStreamWindowSize(StreamWindowBytes),
		grpc.StaticConnWindowSize(ConnWindowBytes),
		grpc.ForceServerCodecV2(newCodec()),
	}
}

// init sets the budget up, once.
func (s *Server) init() {
	s.once.Do(func() {
		limit := s.MaxBodyBytesInFlight
		if limit == 0 {
			limit = live.DefaultMaxBodyBytesInFlight
		}
		if limit > 0 {
			s.budget = semaphore.NewWeighted(limit)
			s.reserve = min(MaxMessageBytes(s.MaxBodyBytes), limit)
		}
	})
}

// stream is the state of one ext_proc stream.
type stream struct {
	s      *Server
	srv    extprocv3.ExternalProcessor_ProcessServer
	max    int64
	duplex bool // request body in FULL_DUPLEX_STREAMED mode: the headers answer waits for the body
	echo   bool // response body in FULL_DUPLEX_STREAMED mode: each chunk is sent back
	req    Request
	// headers: the request headers came (the Picker may have dropped
	// req.Headers since).
	headers bool
	picked  bool
	// refused: the request was answered with an immediate response; the
	// stream ends.
	refused bool
	// subsetErr: the subset hint is not a list of strings (answered 503).
	subsetErr error
	handle    Handle // nil before the pick and after End
	served    bool
	first     bool
	holding   int64         // bytes this stream counts in Server.budget
	limit     time.Duration // BodyTimeout
	deadline  time.Time     // the request's arrival's: the stream's start + limit
	timer     *time.Timer

	// mu guards the request phase's state the timer reads and sets.
	mu       sync.Mutex
	whole    bool          // the request phase is over (whole, refused or the stream ending)
	inRecv   bool          // the handler waits in Recv during the request phase
	expired  bool          // the deadline passed during the request phase
	timedOut chan struct{} // the timer is answering 408; closed once it has
}

// acquire reserves n bytes of the budget for st, waiting up to ctx.
func (st *stream) acquire(ctx context.Context, n int64) error {
	if st.s.budget == nil || n <= 0 {
		return nil
	}
	if err := st.s.budget.Acquire(ctx, n); err != nil {
		return err
	}
	st.s.held.Add(n)
	st.holding += n
	return nil
}

// grow counts st's holding up to n bytes, taking the difference at once
// if it is not held yet; false when the budget has not that much free.
func (st *stream) grow(n int64) bool {
	if st.s.budget == nil || n <= st.holding {
		return true
	}
	if !st.s.budget.TryAcquire(n - st.holding) {
		return false
	}
	st.s.held.Add(n - st.holding)
	st.holding = n
	return true
}

// shrink gives back what st holds over n bytes.
func (st *stream) shrink(n int64) {
	if st.holding > n {
		st.s.budget.Release(st.holding - n)
		st.s.held.Add(n - st.holding)
		st.holding = n
	}
}

// release gives back all st holds.
func (st *stream) release() { st.shrink(0) }

// Process serves one ext_proc stream: the phases of one HTTP request as
// Envoy's ext_proc filter sends them. It returns nil when the proxy closes
// the stream or once the request was answered with an immediate
// response, a codes.InvalidArgument status when request headers come a
// second time, and the stream's error otherwise; the Handle of a picked
// request gets End exactly once whatever happens (Aborted unless the
// response reached its end). Until the request is whole it receives only
// within a reservation of the body budget (Server).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s.init()
	st := &stream{s: s, srv: srv, max: s.MaxBodyBytes}
	if st.max <= 0 {
		st.max = live.DefaultMaxBodyBytes
	}
	timeout := s.BodyTimeout
	if timeout <= 0 {
		timeout = DefaultBodyTimeout
	}
	st.limit, st.deadline = timeout, time.Now().Add(timeout)
	st.timer = time.AfterFunc(timeout, st.expire)
	defer st.end(Aborted)
	defer st.release()
	defer st.requestOver()
	for {
		receiving := !st.picked && !st.refused
		if receiving {
			ok, err := st.beforeRecv()
			if err != nil || !ok {
				return err
			}
		}
		msg, err := srv.Recv()
		if receiving && st.afterRecv() {
			return nil // answered 408 meanwhile
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := st.handle1(msg); err != nil {
			return err
		}
		if st.refused {
			return nil // answered: the proxy ends its side too
		}
	}
}

// beforeRecv readies a receive of the request phase: the stream's
// reservation (the first time), unless the request's deadline passed.
// False when the request was answered instead (408 or 503), or the
// stream ended while it waited.
func (st *stream) beforeRecv() (bool, error) {
	if st.holding < st.s.reserve {
		ctx, cancel := context.WithDeadline(st.srv.Context(), st.deadline)
		err := st.acquire(ctx, st.s.reserve-st.holding)
		cancel()
		if err != nil {
			if st.srv.Context().Err() != nil {
				return false, nil // the proxy left
			}
			return false, st.overloaded()
		}
	}
	st.mu.Lock()
	expired := st.expired
	st.inRecv = !expired
	st.mu.Unlock()
	if expired {
		return false, st.timeout()
	}
	return true, nil
}

// afterRecv ends a receive of the request phase: true when the timer
// answered the request meanwhile (408), once its answer is sent.
func (st *stream) afterRecv() bool {
	st.mu.Lock()
	st.inRecv = false
	ch := st.timedOut
	st.mu.Unlock()
	if ch == nil {
		return false
	}
	<-ch
	return true
}

// expire is the deadline's timer: a stream waiting in Recv for its
// request is answered 408 from here (its reservation stays until Recv
// returns); any other stream in its request phase is answered before its
// next receive.
func (st *stream) expire() {
	st.mu.Lock()
	if st.whole {
		st.mu.Unlock()
		return
	}
	st.expired = true
	if !st.inRecv {
		st.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	st.timedOut = ch
	st.mu.Unlock()
	defer close(ch)
	_ = st.timeout() // an error: the stream is gone; Recv returns then
}

// requestOver ends the request phase: the timer has nothing more to do.
func (st *stream) requestOver() {
	st.mu.Lock()
	st.whole = true
	st.mu.Unlock()
	st.timer.Stop()
}

// timeout answers a request that did not arrive within BodyTimeout.
func (st *stream) timeout() error {
	return st.immediate(http.StatusRequestTimeout, "invalid_request_error", "body_timeout",
		fmt.Sprintf("the request did not arrive within %v", st.limit))
}

// overloaded answers a request the budget has no room for.
func (st *stream) overloaded() error {
	return st.immediate(http.StatusServiceUnavailable, "server_error", "overloaded",
		"the endpoint picker holds as many request bodies as it may; retry shortly")
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
	if st.headers || st.picked {
		// One stream is one HTTP request: a second request would pick
		// again over the first's pick, whose Handle would never end.
		return grpcstatus.Error(codes.InvalidArgument, "request headers after the request's headers: an ext_proc stream carries one HTTP request")
	}
	st.headers = true
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
	if st.picked {
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
	}
	if !st.headers {
		// The picker routes by the request's method and path: a proxy
		// configured to skip the request headers (request_header_mode
		// SKIP), or a broken one, gets no pick.
		return st.immediate(http.StatusBadRequest, "invalid_request_error", "invalid_request",
			"request body without request headers: the endpoint picker needs the request headers (the ext_proc filter's request_header_mode SEND)")
	}
	chunk := b.GetBody()
	n := int64(len(st.req.Body)) + int64(len(chunk))
	if n > st.max {
		return st.immediate(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", st.max))
	}
	if !st.grow(n) {
		return st.overloaded()
	}
	if st.req.Body == nil {
		st.req.Body = chunk // the message is this stream's alone: no copy
	} else {
		st.req.Body = append(st.req.Body, chunk...)
	}
	if b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage() {
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
	// The request is whole: no more receiving within the reservation,
	// which shrinks to the body until the Picker has had it.
	st.requestOver()
	st.shrink(int64(len(st.req.Body)))
	defer st.release()
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
	_, sentPrefill := st.req.Headers[PrefillHeader]
	st.req.Body, st.req.Headers = nil, nil // the Picker has had them
	dest := strings.Join(append([]string{p.Endpoint}, p.Fallbacks...), ",")
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(dest)},
	}}}
	switch {
	case p.Prefill != "":
		// Replaces any the client sent (append false: overwrite).
		mut.SetHeaders = append(mut.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: PrefillHeader, RawValue: []byte(p.Prefill)}})
	case sentPrefill:
		// Only the picker names a prefill endpoint: a client's would
		// make the decode side's sidecar send its prompt anywhere.
		mut.RemoveHeaders = []string{PrefillHeader}
	}
	common := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}
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

// status reads a response's ":status" header: its code when it is a
// valid HTTP status (three digits, 100 to 599); 502 when it is present
// but not one (RFC 9110 section 15: a client processes a response with
// an invalid status as a 5xx; 502 is a gateway's answer to an invalid
// response), so that what an upstream sends there counts under a bounded
// set of codes; false when absent.
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
		if err != nil || len(v) != 3 || v[0] < '1' || v[0] > '5' || code < 100 || code > 599 {
			return http.StatusBadGateway, true
		}
		return code, true
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
	var rnf *live.ResponseNotFoundError
	if _, _, ok := live.NoHeadroom(err); ok {
		return answer{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: live.CodeSLONoHeadroom}
	}
	switch {
	case errors.As(err, &rnf):
		return answer{status: http.StatusNotFound, typ: "invalid_request_error", code: "response_not_found"}
	case errors.As(err, new(*live.ModelNotFoundError)):
		return answer{status: http.StatusNotFound, typ: live.TypeInvalidRequest, code: live.CodeModelNotFound}
	case errors.Is(err, ErrNotFound):
		return answer{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found"}
	case errors.Is(err, ErrNoEndpoint):
		return answer{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_worker"}
	case errors.Is(err, ErrShed):
		return answer{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full"}
	case errors.Is(err, ErrPastDue):
		return answer{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "due_time_passed"}
	case errors.Is(err, ErrBadRequest):
		return answer{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_request"}
	case errors.Is(err, ErrMethodNotAllowed):
		return answer{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed"}
	}
	return answer{status: http.StatusServiceUnavailable, typ: "server_error", code: "selection_failed", msgPrefix: "no endpoint could be selected: "}
}

// StatusOf returns the HTTP status code Server answers a Picker error
// with: 503 for ErrNoEndpoint and errors it does not know, 429 for
// ErrShed, ErrPastDue and a *shared.NoHeadroomError (slo_no_headroom,
// with a Retry-After header: live.NoHeadroom), 400 for ErrBadRequest, 405 for
// ErrMethodNotAllowed, 404 for ErrNotFound, *live.ResponseNotFoundError
// and *live.ModelNotFoundError (model_not_found: no configured worker
// serves or lists the model).
func StatusOf(err error) int { return answerOf(err).status }

// immediateErr answers a Picker error (or an empty subset hint): a
// *live.ResponseNotFoundError in vLLM's shape (responseNotFoundBody), a
// 405 with the allow header of its *MethodError (else POST), the others
// in the error shape of the request's path (immediate).
func (st *stream) immediateErr(err error) error {
	var rnf *live.ResponseNotFoundError
	if errors.As(err, &rnf) {
		b, jerr := responseNotFoundBody(rnf.ID)
		if jerr != nil {
			return jerr
		}
		return st.respond(http.StatusNotFound, "response_not_found", b, "")
	}
	a := answerOf(err)
	allow := ""
	if a.status == http.StatusMethodNotAllowed {
		allow = http.MethodPost
		var me *MethodError
		if errors.As(err, &me) && me.Allow != "" {
			allow = me.Allow
		}
	}
	msg := a.msgPrefix + err.Error()
	var extra []*corev3.HeaderValueOption
	if nh, retryAfter, ok := live.NoHeadroom(err); ok {
		msg = nh.Error()
		extra = append(extra, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(retryAfter)}})
	}
	b, jerr := st.errorBody(a.typ, a.code, msg)
	if jerr != nil {
		return jerr
	}
	return st.respond(a.status, a.code, b, allow, extra...)
}

// vllmError is vLLM's error body (vllm/entrypoints/openai/protocol.py,
// ErrorResponse and ErrorInfo), whose code is the HTTP status as a
// number: the shape vLLM answers a stored response it does not hold in,
// and serve with it.
type vllmError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   string `json:"param"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// responseNotFoundBody is vLLM's answer to a response id it does not
// hold (vllm/entrypoints/openai/serving_responses.py,
// _make_not_found_error; serve answers the same):
// {"error":{"message":"Response with id '<id>' not found.",
// "type":"invalid_request_error","param":"response_id","code":404}}. An
// id longer than live.MaxResponseIDBytes (which no binding has) is cut
// and escaped (internal/untrusted), so the answer stays bounded.
func responseNotFoundBody(id string) ([]byte, error) {
	if len(id) > live.MaxResponseIDBytes {
		id = untrusted.Text(id, untrusted.MaxClient)
	}
	var e vllmError
	e.Error.Message = (&live.ResponseNotFoundError{ID: id}).Error()
	e.Error.Type, e.Error.Param, e.Error.Code = "invalid_request_error", "response_id", http.StatusNotFound
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encoding the error answer: %w", err)
	}
	return append(b, '\n'), nil
}

// anthropicError is Anthropic's error body, which vLLM's Messages front
// end answers in (vllm/entrypoints/anthropic/protocol.py,
// AnthropicErrorResponse) and serve answers on /v1/messages:
// {"type":"error","error":{"type":...,"message":...}}, error.type keeping
// the OpenAI error type as vLLM does.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// errorBody is the error answer's body in the shape of the request's
// API: Anthropic's on /v1/messages and the paths under it (as serve's
// writeError), OpenAI's elsewhere and before the request headers came.
func (st *stream) errorBody(typ, code, message string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	if p, _, _ := strings.Cut(st.req.Headers[":path"], "?"); p == "/v1/messages" || strings.HasPrefix(p, "/v1/messages/") {
		var e anthropicError
		e.Type, e.Error.Type, e.Error.Message = "error", typ, message
		b, err = json.Marshal(e)
	} else {
		var e apiError
		e.Error.Message, e.Error.Type, e.Error.Code = message, typ, code
		b, err = json.Marshal(e)
	}
	if err != nil {
		return nil, fmt.Errorf("encoding the error answer: %w", err)
	}
	return append(b, '\n'), nil
}

// apiError is the OpenAI error body, the shape live.WriteError writes
// (its type is unexported): {"error":{"message","type","param":null,"code"}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// immediate ends the request with an immediate response of the given HTTP
// status and an error body in the shape of the request's API (errorBody:
// OpenAI's, or Anthropic's on /v1/messages; a 405 with "allow: POST").
// The stream ends after it (Process returns), which gives its
// reservation back.
func (st *stream) immediate(status int, typ, code, message string) error {
	b, err := st.errorBody(typ, code, message)
	if err != nil {
		return err
	}
	allow := ""
	if status == http.StatusMethodNotAllowed {
		allow = http.MethodPost
	}
	return st.respond(status, code, b, allow)
}

// respond ends the request with an immediate response of status and the
// JSON body, details naming it for the proxy's logs, an allow header
// when allow is not "", and the extra headers.
func (st *stream) respond(status int, details string, body []byte, allow string, extra ...*corev3.HeaderValueOption) error {
	st.refused, st.req.Body = true, nil
	headers := []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
	}}
	if allow != "" {
		headers = append(headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "allow", RawValue: []byte(allow)}})
	}
	headers = append(headers, extra...)
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    body,
			Details: details,
		}}})
}
