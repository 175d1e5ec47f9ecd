package epp

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// split cuts b into n buffers (the last takes the rest), as gRPC hands a
// message over in the frames it arrived in.
func split(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	size := max(len(b)/n, 1)
	for len(b) > size && len(out) < n-1 {
		out = append(out, mem.SliceBuffer(b[:size]))
		b = b[size:]
	}
	return append(out, mem.SliceBuffer(b))
}

// TestCodecDecodesAsProto: the codec decodes every ProcessingRequest as
// proto.Unmarshal does, in any number of buffers: body phases with their
// neighbours (metadata, protocol configuration, attributes, unknown
// fields), a body field twice, a phase field twice or beside another
// phase, other phases, and bytes that do not parse (an error either
// way). The ordinary body messages take the aliasing path (decodeBody).
func TestCodecDecodesAsProto(t *testing.T) {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewStringValue("10.0.0.1:8000,10.0.0.2:8000")}}}}
	big := strings.Repeat("x", 100<<10)
	wire := func(m *extprocv3.ProcessingRequest) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	reqBody := wire(&extprocv3.ProcessingRequest{
		MetadataContext: md,
		ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Attributes:      map[string]*structpb.Struct{"a": {Fields: map[string]*structpb.Value{"k": structpb.NewBoolValue(true)}}},
		Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(big), EndOfStream: true, EndOfStreamWithoutMessage: true, DrainComplete: true}},
	})
	respBody := wire(&extprocv3.ProcessingRequest{MetadataContext: md,
		Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x\n\n")}}})
	emptyBody := wire(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{EndOfStream: true}}})
	headers := wire(headersMsg("r1", false, md))
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	small := wire(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte("abc"), EndOfStream: true}}})
	// The HttpBody with an unknown field of its own, and its body twice.
	hb := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("first"))
	hb = append(hb, unknown...)
	hb = protowire.AppendBytes(protowire.AppendTag(hb, 1, protowire.BytesType), []byte("second"))
	bodyTwice := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), hb)
	phaseTwice := append(append([]byte{}, emptyBody...), reqBody...)
	headersThenBody := append(append([]byte{}, headers...), reqBody...)
	bodyThenHeaders := append(append([]byte{}, reqBody...), headers...)
	for _, tc := range []struct {
		name string
		wire []byte
		fast bool // decodeBody takes it
	}{
		{"request body", reqBody, true},
		{"response body", respBody, true},
		{"empty body", emptyBody, true},
		{"body, unknown field", append(append([]byte{}, reqBody...), unknown...), true},
		{"body with its own unknown field, twice", bodyTwice, true},
		{"small body", small, true},
		{"phase twice", phaseTwice, false},
		{"headers then body", headersThenBody, false},
		{"body then headers", bodyThenHeaders, false},
		{"headers", headers, false},
		{"truncated", reqBody[:len(reqBody)-10], false},
		{"bad tag", []byte{0xff, 0xff, 0xff}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := &extprocv3.ProcessingRequest{}
			wantErr := proto.Unmarshal(tc.wire, want)
			if fast := decodeBody(tc.wire, &extprocv3.ProcessingRequest{}); fast != tc.fast {
				t.Errorf("decodeBody took it: %v, want %v", fast, tc.fast)
			}
			for _, n := range []int{1, 2, 3, 1000} {
				got := &extprocv3.ProcessingRequest{}
				err := newCodec().Unmarshal(split(tc.wire, n), got)
				if (err != nil) != (wantErr != nil) {
					t.Fatalf("%d buffers: error %v, proto's %v", n, err, wantErr)
				}
				if err == nil && !proto.Equal(got, want) {
					t.Fatalf("%d buffers: decoded\n%v\nproto decodes\n%v", n, got, want)
				}
			}
		})
	}
}
