package epp

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// codec is the endpoint picker's gRPC codec (GRPCServerOptions): gRPC's
// proto codec, except that a ProcessingRequest that came in more than one
// buffer (a large body, in the frames it arrived in) is decoded from one
// copy of it, its body aliasing that copy. gRPC's own codec copies such a
// message twice (into one buffer of its pool, then the body out of it by
// proto.Unmarshal), so that while a message is decoded it is held three
// times; here twice, and the copy is the body the handler keeps.
type codec struct{ encoding.CodecV2 }

// newCodec returns the codec over gRPC's registered proto codec.
func newCodec() codec { return codec{encoding.GetCodecV2(grpcproto.Name)} }

// Unmarshal decodes data into v as gRPC's proto codec does, a
// ProcessingRequest in more than one buffer with decodeBody when it can.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*extprocv3.ProcessingRequest)
	if !ok || len(data) < 2 {
		return c.CodecV2.Unmarshal(data, v) // one buffer: only the body is copied
	}
	buf := data.Materialize()
	if decodeBody(buf, m) {
		return nil
	}
	proto.Reset(m)
	return proto.Unmarshal(buf, m)
}

// The fields decodeBody treats itself.
var (
	requestFields   = (&extprocv3.ProcessingRequest{}).ProtoReflect().Descriptor().Fields()
	requestBodyNum  = requestFields.ByName("request_body").Number()
	responseBodyNum = requestFields.ByName("response_body").Number()
	phaseOneof      = requestFields.ByName("request_body").ContainingOneof()
	bodyNum         = (&extprocv3.HttpBody{}).ProtoReflect().Descriptor().Fields().ByName("body").Number()
)

// decodeBody decodes buf, a ProcessingRequest's wire form, into m (empty)
// when its phase is a request or response body: the body's bytes alias
// buf, the other fields are decoded by proto.Unmarshal from a copy of
// their own. False (m then undefined) when buf does not parse, its phase
// is not a body, or the phase's field comes more than once or beside
// another phase's (proto's merging rules apply then: the caller decodes
// buf whole).
func decodeBody(buf []byte, m *extprocv3.ProcessingRequest) bool {
	var (
		phase    protowire.Number
		bodyWire []byte // the HttpBody's wire form
		rest     []byte // the other fields' wire form
	)
	for b := buf; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return false
		}
		if fd := requestFields.ByNumber(num); fd != nil && fd.ContainingOneof() == phaseOneof {
			if phase != 0 || (num != requestBodyNum && num != responseBodyNum) || typ != protowire.BytesType {
				return false
			}
			phase = num
			bodyWire, _ = protowire.ConsumeBytes(b[n:])
		} else {
			rest = append(rest, b[:n+vn]...)
		}
		b = b[n+vn:]
	}
	if phase == 0 {
		return false
	}
	hb, ok := decodeHTTPBody(bodyWire)
	if !ok || proto.Unmarshal(rest, m) != nil {
		return false
	}
	if phase == requestBodyNum {
		m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
	} else {
		m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
	}
	return true
}

// decodeHTTPBody decodes an HttpBody's wire form, its body aliasing b
// (the last one when it comes more than once, as proto decodes it).
func decodeHTTPBody(b []byte) (*extprocv3.HttpBody, bool) {
	var body, rest []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return nil, false
		}
		if num == bodyNum {
			if typ != protowire.BytesType {
				return nil, false
			}
			v, _ := protowire.ConsumeBytes(b[n:])
			body = v[:len(v):len(v)] // an append copies instead of writing over buf
		} else {
			rest = append(rest, b[:n+vn]...)
		}
		b = b[n+vn:]
	}
	hb := &extprocv3.HttpBody{}
	if err := proto.Unmarshal(rest, hb); err != nil {
		return nil, false
	}
	hb.Body = body
	return hb, true
}
