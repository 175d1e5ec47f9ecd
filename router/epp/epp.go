// Package epp is Switchyard's side of the Gateway API Inference Extension's
// Endpoint Picker Protocol: an Envoy external-processing
// (envoy.service.ext_proc.v3) stream handler that asks a Picker for an
// endpoint per request, hands it back to the proxy as the
// x-gateway-destination-endpoint header and envoy.lb dynamic metadata, and
// follows the response to book first token and completion.
//
// The protocol is docs/proposals/004-endpoint-picker-protocol in
// kubernetes-sigs/gateway-api-inference-extension (v1.0.0). How the
// endpoint is chosen is the Picker's business; docs/epp.md says what is
// covered and what is still to build.
package epp

import (
	"context"
	"errors"
)

// Names fixed by the Endpoint Picker Protocol (proposal 004, v1.0.0).
const (
	// DestinationHeader carries the picked endpoints, "ip:port" or
	// "ip:port,ip:port,..." with the primary first; the same key and value
	// go in the dynamic metadata under MetadataNamespace.
	DestinationHeader = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic-metadata namespace of the picked
	// endpoints and of the served endpoint.
	MetadataNamespace = "envoy.lb"
	// SubsetNamespace is the filter-metadata namespace of the subset hint.
	SubsetNamespace = "envoy.lb.subset_hint"
	// SubsetKey lists, under SubsetNamespace, the "ip:port" endpoints the
	// picker must choose from.
	SubsetKey = "x-gateway-destination-endpoint-subset"
	// PrefillHeader names, on a disaggregated request sent to its decode
	// endpoint, the prefill endpoint "ip:port" that the decode pod's
	// routing sidecar sends the prefill request to (llm-d's P/D
	// protocol: routing.PrefillEndpointHeader in
	// llm-d/llm-d-inference-scheduler pkg/common/routing/common.go,
	// commit 520af47896e5f06e43d09aca281a1149187b0ffd, set by its
	// disagg profile handler's PreRequest and read by pkg/sidecar/proxy's
	// disaggregatedPrefillHandler). Server sets it from Pick.Prefill, and
	// removes one the client sent when the pick names none.
	PrefillHeader = "x-prefiller-host-port"
	// ServedKey names, under MetadataNamespace in the metadata context of
	// a response phase, the "ip:port" endpoint that really served.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// Errors a Picker returns; Server maps each to an immediate response in
// the OpenAI error shape. Wrap them with %w to add detail: the wrapped
// error's text becomes the answer's message (bound and escape what came
// from the request: internal/untrusted).
var (
	// ErrNoEndpoint: no endpoint ready (or none eligible in the subset
	// hint). Answered 503.
	ErrNoEndpoint = errors.New("no ready endpoint")
	// ErrShed: the request was shed, the queue being full. Answered 429.
	ErrShed = errors.New("every endpoint is at capacity and the queue is full")
	// ErrPastDue: the request's due time passed while it waited. Answered
	// 429.
	ErrPastDue = errors.New("the request's due time passed while it waited for an endpoint")
	// ErrBadRequest: the request body could not be parsed, or its path
	// is not one the Picker routes. Answered 400.
	ErrBadRequest = errors.New("invalid request")
	// ErrMethodNotAllowed: the request's method is not one the Picker
	// routes on its path (an inference request is a POST). Answered 405,
	// with the header "allow: POST" (or the methods a *MethodError
	// names).
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrNotFound: the request's path is not one the Picker routes (nor
	// passes through). Answered 404 not_found, as serve answers a path it
	// does not know.
	ErrNotFound = errors.New("not found")
)

// MethodError is an ErrMethodNotAllowed naming the methods the path
// takes, which the answer's "allow" header lists.
type MethodError struct {
	// Allow is the allow header's value, e.g. "GET" or "POST".
	Allow string
	// Err is the error's words; it wraps ErrMethodNotAllowed.
	Err error
}

func (e *MethodError) Error() string { return e.Err.Error() }
func (e *MethodError) Unwrap() error { return e.Err }

// Request is what the Picker sees of one HTTP request.
type Request struct {
	// Headers are the request headers, names lower-cased as Envoy sends
	// them (":path", ":method", "content-type", ...). A repeated header
	// keeps its last value.
	Headers map[string]string
	// Body is the whole request body (empty for a request without one),
	// at most Server.MaxBodyBytes long.
	Body []byte
	// Subset lists the "ip:port" endpoints of the proxy's subset hint, in
	// the proxy's order; nil when the proxy sent no hint (then any
	// endpoint of the pool may be picked). Never empty when non-nil: an
	// empty hint is answered 503 without calling the Picker.
	Subset []string
}

// Pick is a Picker's answer.
type Pick struct {
	// Endpoint is the primary endpoint, "ip:port".
	Endpoint string
	// Fallbacks are the next-best endpoints, "ip:port", best first; the
	// proxy tries them in order if it retries. May be empty.
	Fallbacks []string
	// Prefill is, for a disaggregated request, the prefill endpoint,
	// "ip:port", sent to the decode endpoint (Endpoint) in PrefillHeader;
	// "" for an aggregated request.
	Prefill string
	// Handle follows the request; it must not be nil.
	Handle Handle
}

// Outcome is how a picked request ended.
type Outcome int

const (
	// Completed: the proxy streamed the whole response.
	Completed Outcome = iota
	// Aborted: the stream closed or was cancelled before the response's
	// end (client reset, proxy gone, EPP shutting down).
	Aborted
)

// String returns "completed" or "aborted".
func (o Outcome) String() string {
	if o == Completed {
		return "completed"
	}
	return "aborted"
}

// Handle books one picked request. Server calls its methods from the
// stream's goroutine, in order: Served at most once, Status at most once
// (at the response headers), FirstToken at most once, then Body for each
// response body chunk (the first included), End exactly once. They must
// not block.
type Handle interface {
	// Served reports the endpoint, "ip:port", that the proxy says really
	// served the request (it may be a fallback).
	Served(endpoint string)
	// Status reports the response's HTTP status code (its ":status"
	// header), when the proxy sends response headers.
	Status(code int)
	// FirstToken reports the first non-empty chunk of the response body.
	FirstToken()
	// Body reports a non-empty chunk of the response body, when the proxy
	// sends the response body (a body processing mode other than NONE);
	// the chunk is only valid during the call.
	Body(chunk []byte)
	// End reports the end of the request.
	End(Outcome)
}

// Picker chooses the endpoint of one request. Pick may block (waiting in a
// queue) until ctx, the ext_proc stream's context, is done. Its errors are
// ErrNoEndpoint, ErrShed, ErrPastDue, ErrBadRequest, ErrMethodNotAllowed,
// ErrNotFound (wrapped or not), and *live.ResponseNotFoundError (answered
// 404 in vLLM's shape); any other error is answered 503.
type Picker interface {
	Pick(ctx context.Context, req *Request) (Pick, error)
}
