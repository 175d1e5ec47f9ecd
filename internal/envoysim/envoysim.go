// Package envoysim stands in for Envoy with its ext_proc HTTP filter in
// front of an Endpoint Picker, so that the endpoint picker can be tested
// end to end without a cluster or an Envoy binary.
//
// Proxy is an http.Handler, a reverse proxy: for each client request it
// opens an ext_proc stream to the endpoint picker, sends the request's
// phases as Envoy's ext_proc filter (envoy.filters.http.ext_proc) sends
// them in the configured body mode, applies the answers (header mutations,
// dynamic metadata, immediate responses), forwards the request over HTTP
// to the endpoint the picker chose (x-gateway-destination-endpoint, the
// first reachable of its list) and streams the response phases back
// through the ext_proc stream and to the client, chunk by chunk. What it
// models of Envoy, and where it differs, is in docs/epp.md ("The test
// harness").
package envoysim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/switchyard-router/switchyard/router/epp"
)

// Mode is the ext_proc filter's processing mode (ProcessingMode in
// envoy.extensions.filters.http.ext_proc.v3).
type Mode int

const (
	// Buffered: request body BUFFERED (the headers, answered, then the
	// whole body in one request_body with end_of_stream), response body
	// STREAMED (each chunk sent and answered before it goes on to the
	// client), trailers SKIP.
	Buffered Mode = iota
	// FullDuplex: request and response bodies FULL_DUPLEX_STREAMED, as
	// the Gateway API Inference Extension configures the filter: chunks
	// are sent as they arrive without waiting for answers, and what goes
	// on (the body upstream, the response body to the client) is what the
	// endpoint picker sends back as streamed body mutations; trailers
	// SEND.
	FullDuplex
)

// String returns "buffered" or "full-duplex".
func (m Mode) String() string {
	if m == FullDuplex {
		return "full-duplex"
	}
	return "buffered"
}

// Defaults of Config's bounds.
const (
	// DefaultMaxBodyBytes bounds a request body (Envoy's per-connection
	// buffer limit plays this part): 8 MiB.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxChunks bounds the body chunks of one response: 1<<16.
	DefaultMaxChunks = 1 << 16
)

// UpstreamHeader is set on every response the proxy forwarded: the
// "ip:port" it connected to. Envoy sets no such header; tests read it to
// see where a request went.
const UpstreamHeader = "x-envoysim-upstream"

// chunkSize is the read size of request and response bodies: a chunk is
// at most this long.
const chunkSize = 32 << 10

// Config configures a Proxy.
type Config struct {
	// EPP is the endpoint picker's ext_proc gRPC address, "host:port".
	// Required.
	EPP string
	// Mode is the body processing mode; the zero value is Buffered.
	Mode Mode
	// FailOpen is the filter's failure_mode_allow: when the stream cannot
	// be opened or fails before the endpoint picker answered with a pick,
	// the request goes to Fallbacks; after the pick, the response goes on
	// without processing. As in Envoy, it does not apply to a
	// FullDuplex stream once a body chunk went to the picker (the picker
	// holds the body): that request fails. Without it such failures are
	// answered 500.
	FailOpen bool
	// Fallbacks are the "ip:port" endpoints a failed-open request goes
	// to, in turn (round robin). Empty: a failed-open request is answered
	// 503.
	Fallbacks []string
	// HealthService, when set, is checked with the gRPC health service
	// before each stream: not SERVING counts as the stream failing to
	// open (Envoy with an actively health-checked ext_proc cluster and
	// no panic routing).
	HealthService string
	// Subset, when set, gives each request's subset hint: the endpoints
	// sent under envoy.lb.subset_hint / x-gateway-destination-endpoint-subset
	// in the metadata context of every message. A nil result sends no
	// hint; an empty non-nil one sends an empty list.
	Subset func(*http.Request) []string
	// ServedAs, when set, maps the endpoint that served (the one
	// connected to) to the one reported to the picker as
	// x-gateway-destination-endpoint-served. Nil reports it as is.
	ServedAs func(used string) string
	// MaxBodyBytes bounds a request body; larger is answered 413 (as
	// Envoy's buffer limit). 0: DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxChunks bounds a response's body chunks; past it the response is
	// cut. 0: DefaultMaxChunks.
	MaxChunks int
	// Transport sends the requests upstream; nil: a new http.Transport.
	Transport http.RoundTripper
}

// Stats counts what the proxy did with the requests it finished.
type Stats struct {
	// Picked: requests the picker chose endpoints for (then forwarded to
	// the first that accepted a connection, or answered 503).
	Picked int64
	// FellBack: picked requests served by a fallback, the endpoints before
	// it in the destination list having refused the connection.
	FellBack int64
	// FailedOpen: requests forwarded to a fallback because the ext_proc
	// stream could not be opened or failed before a pick.
	FailedOpen int64
	// Immediate: immediate responses of the picker written to clients.
	Immediate int64
	// StreamErrors: ext_proc streams that failed (not counting streams
	// ended because the client went away).
	StreamErrors int64
	// LocalReplies: requests the proxy answered with an error of its own
	// (400, 413, 500, 503) or cut.
	LocalReplies int64
}

// Proxy is the stand-in for Envoy: an http.Handler. Create it with New
// and Close it when done.
type Proxy struct {
	cfg    Config
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	health healthpb.HealthClient
	tr     http.RoundTripper
	ownTr  *http.Transport // the Transport New made, closed by Close

	rr                                                                  atomic.Uint64
	picked, fellBack, failedOpen, immediate, streamErrors, localReplies atomic.Int64
}

var _ http.Handler = (*Proxy)(nil)

// New returns a Proxy for cfg. The gRPC connection to cfg.EPP is made
// lazily and remade after failures, backing off up to a second.
func New(cfg Config) (*Proxy, error) {
	if cfg.EPP == "" {
		return nil, errors.New("envoysim: Config.EPP, the endpoint picker's address, is required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxChunks <= 0 {
		cfg.MaxChunks = DefaultMaxChunks
	}
	conn, err := grpc.NewClient("passthrough:///"+cfg.EPP,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("envoysim: connecting to %s: %w", cfg.EPP, err)
	}
	p := &Proxy{cfg: cfg, conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
		health: healthpb.NewHealthClient(conn), tr: cfg.Transport}
	if p.tr == nil {
		p.ownTr = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
		p.tr = p.ownTr
	}
	return p, nil
}

// Close closes the gRPC connection and the idle upstream connections of
// the Transport New made.
func (p *Proxy) Close() error {
	if p.ownTr != nil {
		p.ownTr.CloseIdleConnections()
	}
	return p.conn.Close()
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Picked: p.picked.Load(), FellBack: p.fellBack.Load(), FailedOpen: p.failedOpen.Load(), Immediate: p.immediate.Load(),
		StreamErrors: p.streamErrors.Load(), LocalReplies: p.localReplies.Load()}
}

// errStream marks a failure of the ext_proc stream (or of the picker's
// protocol), as opposed to the client or the upstream failing.
var errStream = errors.New("ext_proc stream failed")

// exchange is one client request on its way through the proxy.
type exchange struct {
	p      *Proxy
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context
	cancel context.CancelFunc // resets the stream, ends the upstream request
	duplex bool

	st      extprocv3.ExternalProcessor_ProcessClient
	answers chan answer
	sentCfg bool // protocol_config went on the first message
	bodyOut bool // a body chunk went to the picker (FullDuplex: no failing open after it)
	done    bool // processing complete: nothing more goes to the picker

	header http.Header                 // the request headers, mutated by the picker
	mu     sync.Mutex                  // guards md: a FullDuplex response is sent while answers arrive
	md     map[string]*structpb.Struct // the request's dynamic metadata, by namespace
	body   []byte                      // the request body as read from the client
}

// answer is one message (or the error) the stream's reader got.
type answer struct {
	m   *extprocv3.ProcessingResponse
	err error
}

// ServeHTTP proxies one request. The ext_proc stream lives in a context
// of the request's: the client going away resets it, as Envoy resets the
// stream when its downstream request is reset.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	x := &exchange{p: p, w: w, r: r, ctx: ctx, cancel: cancel, duplex: p.cfg.Mode == FullDuplex,
		header: r.Header.Clone(), md: map[string]*structpb.Struct{}}
	if x.header.Get("x-request-id") == "" {
		var id [16]byte
		_, _ = rand.Read(id[:])
		x.header.Set("x-request-id", hex.EncodeToString(id[:])) // Envoy generates one
	}
	if p.cfg.Subset != nil {
		if hint := p.cfg.Subset(r); hint != nil {
			vals := make([]any, len(hint))
			for i, e := range hint {
				vals[i] = e
			}
			s, err := structpb.NewStruct(map[string]any{epp.SubsetKey: vals})
			if err != nil {
				x.local(http.StatusInternalServerError, "subset hint: "+err.Error())
				return
			}
			x.md[epp.SubsetNamespace] = s
		}
	}
	x.serve()
}

// serve runs the request phases, the forwarding and the response phases.
func (x *exchange) serve() {
	dests, immediate, err := x.requestPhases()
	switch {
	case x.ctx.Err() != nil:
		return // the client went away
	case immediate != nil:
		x.p.immediate.Add(1)
		x.writeImmediate(immediate)
		return
	case errors.Is(err, errBodyTooLarge):
		x.local(http.StatusRequestEntityTooLarge, err.Error())
		return
	case err != nil && !errors.Is(err, errStream):
		x.local(http.StatusBadRequest, err.Error()) // the client's body could not be read
		return
	case err != nil:
		x.p.streamErrors.Add(1)
		x.done = true
		if !x.failOpenAllowed() {
			x.local(http.StatusInternalServerError, "ext_proc: "+err.Error())
			return
		}
		fb := x.p.cfg.Fallbacks
		if len(fb) == 0 {
			x.local(http.StatusServiceUnavailable, "ext_proc failed and no fallback endpoint is configured")
			return
		}
		if err := x.readRest(); err != nil {
			x.local(http.StatusRequestEntityTooLarge, err.Error())
			return
		}
		x.p.failedOpen.Add(1)
		dests = []string{fb[(x.p.rr.Add(1)-1)%uint64(len(fb))]}
	case len(dests) == 0:
		x.local(http.StatusServiceUnavailable, "the endpoint picker named no "+epp.DestinationHeader)
		return
	default:
		x.p.picked.Add(1)
	}
	resp, used, err := x.forward(dests)
	if err != nil {
		if x.ctx.Err() == nil {
			x.local(http.StatusServiceUnavailable, "upstream connect error: "+err.Error())
		}
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if used != dests[0] {
		x.p.fellBack.Add(1)
	}
	served := used
	if x.p.cfg.ServedAs != nil {
		served = x.p.cfg.ServedAs(used)
	}
	x.setMD(epp.MetadataNamespace, epp.ServedKey, served)
	x.w.Header().Set(UpstreamHeader, used)
	x.responsePhases(resp)
}

// readRest reads what the client has not sent of the body yet (the
// stream failed before it was read), within MaxBodyBytes.
func (x *exchange) readRest() error {
	if x.r.Body == nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(x.r.Body, x.p.cfg.MaxBodyBytes-int64(len(x.body))+1))
	if err != nil {
		return fmt.Errorf("reading the request body: %w", err)
	}
	if int64(len(x.body)+len(b)) > x.p.cfg.MaxBodyBytes {
		return fmt.Errorf("%w: over %d bytes", errBodyTooLarge, x.p.cfg.MaxBodyBytes)
	}
	x.body = append(x.body, b...)
	return nil
}

// failOpenAllowed is Envoy's failureModeAllow: the configuration, but
// never once a FullDuplex body chunk went to the picker.
func (x *exchange) failOpenAllowed() bool {
	return x.p.cfg.FailOpen && !(x.duplex && x.bodyOut)
}

// open opens the ext_proc stream (after the health check, if any) and
// starts its reader.
func (x *exchange) open() error {
	if svc := x.p.cfg.HealthService; svc != "" {
		hr, err := x.p.health.Check(x.ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return fmt.Errorf("%w: health check: %w", errStream, err)
		}
		if hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("%w: health check of %q: %s", errStream, svc, hr.GetStatus())
		}
	}
	st, err := x.p.client.Process(x.ctx)
	if err != nil {
		return fmt.Errorf("%w: opening: %w", errStream, err)
	}
	x.st = st
	x.answers = make(chan answer, 4)
	go func() {
		for {
			m, err := st.Recv()
			select {
			case x.answers <- answer{m, err}:
			case <-x.ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return nil
}

// send sends one message with the metadata context (and, on the stream's
// first message, the protocol configuration) Envoy attaches.
func (x *exchange) send(m *extprocv3.ProcessingRequest) error {
	m.MetadataContext = x.metadataContext()
	if !x.sentCfg {
		x.sentCfg = true
		reqMode, respMode := filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED
		if x.duplex {
			reqMode, respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: reqMode, ResponseBodyMode: respMode}
	}
	if err := x.st.Send(m); err != nil {
		return fmt.Errorf("%w: sending: %w", errStream, err)
	}
	return nil
}

// recv waits for the next answer.
func (x *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	select {
	case a := <-x.answers:
		if a.err != nil {
			if errors.Is(a.err, io.EOF) {
				return nil, fmt.Errorf("%w: closed by the endpoint picker before its answer", errStream)
			}
			return nil, fmt.Errorf("%w: %w", errStream, a.err)
		}
		return a.m, nil
	case <-x.ctx.Done():
		return nil, x.ctx.Err()
	}
}

// metadataContext is the forwarded dynamic metadata: the envoy.lb and
// envoy.lb.subset_hint namespaces, when set.
func (x *exchange) metadataContext() *corev3.Metadata {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.md) == 0 {
		return nil
	}
	fm := make(map[string]*structpb.Struct, len(x.md))
	for ns, s := range x.md {
		fm[ns] = &structpb.Struct{Fields: make(map[string]*structpb.Value, len(s.Fields))}
		for k, v := range s.Fields {
			fm[ns].Fields[k] = v
		}
	}
	return &corev3.Metadata{FilterMetadata: fm}
}

// setMD sets one key of a dynamic-metadata namespace.
func (x *exchange) setMD(ns, key, val string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.md[ns]
	if s == nil {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		x.md[ns] = s
	}
	s.Fields[key] = structpb.NewStringValue(val)
}

// applyMD merges an answer's dynamic metadata of the receiving
// namespace, envoy.lb (the inference extension's filter setting); other
// namespaces are dropped, as the filter drops them.
func (x *exchange) applyMD(dm *structpb.Struct) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for ns, v := range dm.GetFields() {
		s := v.GetStructValue()
		if s == nil || ns != epp.MetadataNamespace {
			continue
		}
		for k, fv := range s.GetFields() {
			if x.md[ns] == nil {
				x.md[ns] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			x.md[ns].Fields[k] = fv
		}
	}
}

var errBodyTooLarge = errors.New("request body too large")

// requestPhases sends the request's phases and returns the destination
// list, or the picker's immediate response, or the failure.
func (x *exchange) requestPhases() (dests []string, immediate *extprocv3.ImmediateResponse, err error) {
	if err := x.open(); err != nil {
		return nil, nil, err
	}
	hasBody := x.r.ContentLength != 0 && x.r.Body != nil && x.r.Body != http.NoBody
	if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: x.requestHeaderMap(), EndOfStream: !hasBody}}}); err != nil {
		return nil, nil, err
	}
	if !hasBody {
		if immediate, err := x.awaitHeaders(); immediate != nil || err != nil {
			return nil, immediate, err
		}
		return x.destinations(), nil, nil
	}
	if x.duplex {
		return x.requestDuplex()
	}
	// Buffered: the headers are answered first, then the whole body goes
	// in one message.
	if immediate, err := x.awaitHeaders(); immediate != nil || err != nil {
		return nil, immediate, err
	}
	b, err := io.ReadAll(io.LimitReader(x.r.Body, x.p.cfg.MaxBodyBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the request body: %w", err)
	}
	if int64(len(b)) > x.p.cfg.MaxBodyBytes {
		return nil, nil, fmt.Errorf("%w: over %d bytes", errBodyTooLarge, x.p.cfg.MaxBodyBytes)
	}
	x.body = b
	if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: true}}}); err != nil {
		return nil, nil, err
	}
	m, err := x.next()
	if err != nil || m.GetImmediateResponse() != nil {
		return nil, m.GetImmediateResponse(), err
	}
	rb := m.GetRequestBody()
	if rb == nil {
		return nil, nil, fmt.Errorf("%w: answered %T to the request body", errStream, m.GetResponse())
	}
	x.applyCommon(rb.GetResponse(), x.header)
	x.applyMD(m.GetDynamicMetadata())
	if bm := rb.GetResponse().GetBodyMutation(); bm != nil {
		if bm.GetClearBody() {
			x.body = nil
		} else if bm.GetBody() != nil {
			x.body = bm.GetBody()
		}
	}
	return x.destinations(), nil, nil
}

// requestDuplex streams the body chunks as they arrive, then reads the
// answers: the headers answer (with the pick), then the body as the
// picker sends it back.
func (x *exchange) requestDuplex() ([]string, *extprocv3.ImmediateResponse, error) {
	buf := make([]byte, chunkSize)
	for {
		n, rerr := x.r.Body.Read(buf)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return nil, nil, fmt.Errorf("reading the request body: %w", rerr)
		}
		if int64(len(x.body)+n) > x.p.cfg.MaxBodyBytes {
			return nil, nil, fmt.Errorf("%w: over %d bytes", errBodyTooLarge, x.p.cfg.MaxBodyBytes)
		}
		eos := errors.Is(rerr, io.EOF)
		if n == 0 && !eos {
			continue
		}
		x.body = append(x.body, buf[:n]...)
		x.bodyOut = true
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...), EndOfStream: eos}}}); err != nil {
			break // the picker may have answered already (an immediate response): read it
		}
		if eos {
			break
		}
	}
	if immediate, err := x.awaitHeaders(); immediate != nil || err != nil {
		return nil, immediate, err
	}
	// The body goes upstream as the picker streams it back.
	var body []byte
	for {
		m, err := x.next()
		if err != nil || m.GetImmediateResponse() != nil {
			return nil, m.GetImmediateResponse(), err
		}
		rb := m.GetRequestBody()
		if rb == nil {
			return nil, nil, fmt.Errorf("%w: answered %T while the request body was due", errStream, m.GetResponse())
		}
		x.applyMD(m.GetDynamicMetadata())
		sr := rb.GetResponse().GetBodyMutation().GetStreamedResponse()
		if int64(len(body)+len(sr.GetBody())) > x.p.cfg.MaxBodyBytes {
			return nil, nil, fmt.Errorf("%w: the body sent back is over %d bytes", errStream, x.p.cfg.MaxBodyBytes)
		}
		body = append(body, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	x.body = body
	return x.destinations(), nil, nil
}

// next returns the next answer that is not a bare flow-control or timeout
// message.
func (x *exchange) next() (*extprocv3.ProcessingResponse, error) {
	for {
		m, err := x.recv()
		if err != nil {
			return nil, err
		}
		if m.GetResponse() != nil {
			return m, nil
		}
	}
}

// awaitHeaders reads the request headers' answer and applies it.
func (x *exchange) awaitHeaders() (*extprocv3.ImmediateResponse, error) {
	m, err := x.next()
	if err != nil {
		return nil, err
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		return ir, nil
	}
	h := m.GetRequestHeaders()
	if h == nil {
		return nil, fmt.Errorf("%w: answered %T while the request headers' answer was due", errStream, m.GetResponse())
	}
	x.applyCommon(h.GetResponse(), x.header)
	x.applyMD(m.GetDynamicMetadata())
	return nil, nil
}

// destinations is the picked list: envoy.lb's x-gateway-destination-endpoint,
// else the header of that name.
func (x *exchange) destinations() []string {
	x.mu.Lock()
	v := x.md[epp.MetadataNamespace].GetFields()[epp.DestinationHeader].GetStringValue()
	x.mu.Unlock()
	if v == "" {
		v = x.header.Get(epp.DestinationHeader)
	}
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// requestHeaderMap is the request's headers as Envoy sends them: the
// pseudo-headers first, names lower-cased, values as raw_value.
func (x *exchange) requestHeaderMap() *corev3.HeaderMap {
	scheme := "http"
	if x.r.TLS != nil {
		scheme = "https"
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(x.r.Method)},
		{Key: ":path", RawValue: []byte(x.r.URL.RequestURI())},
		{Key: ":authority", RawValue: []byte(x.r.Host)},
		{Key: ":scheme", RawValue: []byte(scheme)},
	}}
	return appendHeaders(hm, x.header)
}

func appendHeaders(hm *corev3.HeaderMap, h http.Header) *corev3.HeaderMap {
	for k, vs := range h {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	return hm
}

// applyCommon applies a CommonResponse's header mutation to h as
// Envoy's ext_proc filter does (mutation_utils.cc): removed headers go,
// set headers replace the value, or are added when the deprecated
// `append` is true (the filter ignores append_action); the value is
// raw_value (value when raw_value is empty). Pseudo-headers are left
// alone.
func (x *exchange) applyCommon(c *extprocv3.CommonResponse, h http.Header) {
	hm := c.GetHeaderMutation()
	for _, k := range hm.GetRemoveHeaders() {
		if !strings.HasPrefix(k, ":") {
			h.Del(k)
		}
	}
	for _, o := range hm.GetSetHeaders() {
		k := o.GetHeader().GetKey()
		if k == "" || strings.HasPrefix(k, ":") {
			continue
		}
		v := o.GetHeader().GetValue()
		if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		//lint:ignore SA1019 the filter honours the deprecated append, not append_action
		if o.GetAppend().GetValue() {
			h.Add(k, v)
		} else {
			h.Set(k, v)
		}
	}
}

// forward sends the request to the first of dests that accepts a
// connection, trying the next when connecting fails (Envoy's retry on
// connect-failure over the destination list).
func (x *exchange) forward(dests []string) (*http.Response, string, error) {
	var lastErr error
	for _, ep := range dests {
		req, err := http.NewRequestWithContext(x.ctx, x.r.Method, "http://"+ep+x.r.URL.RequestURI(), bytes.NewReader(x.body))
		if err != nil {
			return nil, "", err
		}
		req.Header = x.header.Clone()
		for _, h := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length"} {
			req.Header.Del(h)
		}
		req.ContentLength = int64(len(x.body))
		resp, err := x.p.tr.RoundTrip(req)
		if err == nil {
			return resp, ep, nil
		}
		lastErr = fmt.Errorf("%s: %w", ep, err)
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return nil, "", lastErr
		}
	}
	return nil, "", lastErr
}

// responsePhases sends the response's phases to the picker and the
// response to the client.
func (x *exchange) responsePhases(resp *http.Response) {
	for _, h := range []string{"Connection", "Keep-Alive", "Transfer-Encoding", "Trailer", "Content-Length"} {
		resp.Header.Del(h)
	}
	if x.done {
		x.writeHeader(resp.StatusCode, resp.Header)
		x.copyRest(resp)
		return
	}
	hm := appendHeaders(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}}}, resp.Header)
	if x.duplex {
		x.responseDuplex(resp, hm)
		return
	}
	// STREAMED response body: the headers answered first, then each chunk
	// sent and answered before it goes on.
	err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm}}})
	var m *extprocv3.ProcessingResponse
	if err == nil {
		m, err = x.next()
	}
	if err == nil && m.GetImmediateResponse() == nil && m.GetResponseHeaders() == nil {
		err = fmt.Errorf("%w: answered %T to the response headers", errStream, m.GetResponse())
	}
	switch {
	case err != nil:
		if !x.streamFailed() {
			x.local(http.StatusInternalServerError, "ext_proc: "+err.Error())
			return
		}
		x.writeHeader(resp.StatusCode, resp.Header)
		x.copyRest(resp)
		return
	case m.GetImmediateResponse() != nil:
		x.p.immediate.Add(1)
		x.writeImmediate(m.GetImmediateResponse())
		return
	}
	x.applyCommon(m.GetResponseHeaders().GetResponse(), resp.Header)
	x.applyMD(m.GetDynamicMetadata())
	x.writeHeader(resp.StatusCode, resp.Header)
	buf := make([]byte, chunkSize)
	for chunks := 0; !x.done; chunks++ {
		if chunks > x.p.cfg.MaxChunks {
			x.cut()
		}
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			x.cut()
		}
		if n == 0 && !eos {
			continue
		}
		chunk := x.streamedChunk(buf[:n], eos)
		if len(chunk) > 0 && !x.write(chunk) {
			return
		}
		if eos {
			x.trailers(resp)
			return
		}
	}
	x.copyRest(resp) // the stream failed open
}

// streamedChunk sends one response chunk in STREAMED mode and returns
// what goes on to the client: the chunk, or the picker's replacement.
// When the stream fails it fails open (the chunk goes on, processing is
// done) or cuts the response.
func (x *exchange) streamedChunk(chunk []byte, eos bool) []byte {
	err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), chunk...), EndOfStream: eos}}})
	var m *extprocv3.ProcessingResponse
	if err == nil {
		m, err = x.next()
	}
	if err == nil && m.GetResponseBody() == nil {
		err = fmt.Errorf("%w: answered %T to a response body chunk", errStream, m.GetResponse())
	}
	if err != nil {
		if !x.streamFailed() {
			x.cut()
		}
		return chunk
	}
	x.applyMD(m.GetDynamicMetadata())
	bm := m.GetResponseBody().GetResponse().GetBodyMutation()
	switch {
	case bm.GetClearBody():
		return nil
	case bm.GetBody() != nil:
		return bm.GetBody()
	}
	return chunk
}

// streamFailed records the stream failing after the pick and says whether
// the response may go on without processing (fail open). A failure
// because the client went away aborts the handler.
func (x *exchange) streamFailed() bool {
	if x.ctx.Err() != nil {
		panic(http.ErrAbortHandler)
	}
	x.p.streamErrors.Add(1)
	x.done = true
	return x.failOpenAllowed()
}

// responseDuplex sends the headers and the chunks as they come from
// upstream, without waiting, while the answers (the headers' mutation,
// the body sent back) go to the client. The picker holds the body: a
// failure of the stream fails the request (500 before the headers went
// out, a cut response after).
func (x *exchange) responseDuplex(resp *http.Response, hm *corev3.HeaderMap) {
	if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		x.duplexFailed(err, false)
		return
	}
	pumped := make(chan error, 1)
	go func() { pumped <- x.pumpDuplex(resp) }()
	defer func() {
		if pumped != nil { // still sending: stop it before the handler returns
			x.cancel()
			_ = resp.Body.Close()
			<-pumped
		}
	}()
	wrote := false
	for {
		var m *extprocv3.ProcessingResponse
		select {
		case perr := <-pumped:
			pumped = nil // sent all, or failed
			if perr != nil && !errors.Is(perr, errStream) && x.ctx.Err() == nil {
				x.duplexFailed(perr, wrote) // the upstream failed or was over the bounds
				return
			}
			continue // a failed send shows as the stream's error
		case a := <-x.answers:
			if a.err != nil {
				x.duplexFailed(a.err, wrote)
				return
			}
			m = a.m
		case <-x.ctx.Done():
			return
		}
		x.applyMD(m.GetDynamicMetadata())
		switch {
		case m.GetResponse() == nil:
			// flow control or a timeout override: nothing to do
		case m.GetImmediateResponse() != nil && !wrote:
			x.p.immediate.Add(1)
			x.writeImmediate(m.GetImmediateResponse())
			return
		case m.GetResponseHeaders() != nil && !wrote:
			x.applyCommon(m.GetResponseHeaders().GetResponse(), resp.Header)
			x.writeHeader(resp.StatusCode, resp.Header)
			wrote = true
		case m.GetResponseBody() != nil && wrote:
			sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if len(sr.GetBody()) > 0 && !x.write(sr.GetBody()) {
				return
			}
			if sr.GetEndOfStream() {
				x.done = true
				return
			}
		case m.GetResponseTrailers() != nil && wrote:
			x.done = true
			x.trailers(resp)
			return
		default:
			x.duplexFailed(fmt.Errorf("%w: answered %T out of order", errStream, m.GetResponse()), wrote)
			return
		}
	}
}

// pumpDuplex reads the upstream body and sends its chunks, the last with
// end_of_stream (or the trailers after it, when there are any). It is the
// only sender while it runs.
func (x *exchange) pumpDuplex(resp *http.Response) error {
	buf := make([]byte, chunkSize)
	for chunks := 0; ; chunks++ {
		if chunks > x.p.cfg.MaxChunks {
			return fmt.Errorf("the response has over %d chunks", x.p.cfg.MaxChunks)
		}
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			return fmt.Errorf("reading the upstream response: %w", rerr)
		}
		if n == 0 && !eos {
			continue
		}
		trailers := eos && len(resp.Trailer) > 0
		if n > 0 || !trailers {
			if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...), EndOfStream: eos && !trailers}}}); err != nil {
				return err
			}
		}
		if trailers {
			return x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
				ResponseTrailers: &extprocv3.HttpTrailers{Trailers: appendHeaders(&corev3.HeaderMap{}, resp.Trailer)}}})
		}
		if eos {
			return nil
		}
	}
}

// duplexFailed ends a FullDuplex response whose stream (or upstream)
// failed: 500 before the headers went out, a cut response after.
func (x *exchange) duplexFailed(err error, wrote bool) {
	if x.ctx.Err() != nil {
		return
	}
	x.p.streamErrors.Add(1)
	x.done = true
	if wrote {
		x.cut()
	}
	x.local(http.StatusInternalServerError, "ext_proc: "+err.Error())
}

// copyRest copies the rest of the upstream body to the client unprocessed.
func (x *exchange) copyRest(resp *http.Response) {
	buf := make([]byte, chunkSize)
	for chunks := 0; ; chunks++ {
		if chunks > x.p.cfg.MaxChunks {
			x.cut()
		}
		n, err := resp.Body.Read(buf)
		if n > 0 && !x.write(buf[:n]) {
			return
		}
		if errors.Is(err, io.EOF) {
			x.trailers(resp)
			return
		}
		if err != nil {
			x.cut()
		}
	}
}

// trailers copies the upstream's trailers to the client.
func (x *exchange) trailers(resp *http.Response) {
	for k, vs := range resp.Trailer {
		for _, v := range vs {
			x.w.Header().Add(http.TrailerPrefix+k, v)
		}
	}
}

// writeHeader writes the response status and headers to the client.
func (x *exchange) writeHeader(status int, h http.Header) {
	for k, vs := range h {
		x.w.Header()[k] = vs
	}
	x.w.WriteHeader(status)
	_ = http.NewResponseController(x.w).Flush()
}

// write writes and flushes one chunk to the client; false when the client
// is gone.
func (x *exchange) write(b []byte) bool {
	if _, err := x.w.Write(b); err != nil {
		return false
	}
	return http.NewResponseController(x.w).Flush() == nil
}

// cut aborts the response: the client sees the connection close. It is
// counted as a local reply unless the client had gone already.
func (x *exchange) cut() {
	if x.ctx.Err() == nil {
		x.p.localReplies.Add(1)
	}
	panic(http.ErrAbortHandler)
}

// writeImmediate writes the picker's immediate response as it is: status
// (200 when unset or invalid, as Envoy), header mutation, body.
func (x *exchange) writeImmediate(ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if code < 200 || code > 599 {
		code = http.StatusOK
	}
	h := x.w.Header()
	for k := range h {
		if k != UpstreamHeader {
			h.Del(k)
		}
	}
	x.applyCommon(&extprocv3.CommonResponse{HeaderMutation: ir.GetHeaders()}, h)
	x.w.WriteHeader(code)
	_, _ = x.w.Write(ir.GetBody())
}

// local answers the client with an error of the proxy's own, in plain
// text as Envoy's local replies.
func (x *exchange) local(code int, msg string) {
	x.p.localReplies.Add(1)
	x.w.Header().Set("Content-Type", "text/plain")
	x.w.WriteHeader(code)
	_, _ = io.WriteString(x.w, msg+"\n")
}
