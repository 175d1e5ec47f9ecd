package epp

import (
	"context"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// nopHandle books nothing.
type nopHandle struct{}

func (nopHandle) Served(string) {}
func (nopHandle) Status(int)    {}
func (nopHandle) FirstToken()   {}
func (nopHandle) Body([]byte)   {}
func (nopHandle) End(Outcome)   {}

type constPicker struct{}

func (constPicker) Pick(context.Context, *Request) (Pick, error) {
	return Pick{Endpoint: "10.0.0.1:8000", Fallbacks: []string{"10.0.0.2:8000"}, Handle: nopHandle{}}, nil
}

// BenchmarkBufferedStream runs whole buffered ext_proc streams (request
// headers, body, response headers, one response chunk, each answered) over
// an in-memory gRPC connection with a Picker that answers at once: the
// handler's and gRPC's cost per request, no policy's.
func BenchmarkBufferedStream(b *testing.B) {
	c := startServer(b, &Server{Picker: constPicker{}})
	msgs := []*extprocv3.ProcessingRequest{
		headersMsg("r", false, nil), bodyMsg(chatBody, true), respHeadersMsg("10.0.0.1:8000"), respBodyMsg("data: [DONE]\n\n", true),
	}
	b.ReportAllocs()
	for b.Loop() {
		st, err := c.Process(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if err := st.Send(m); err != nil {
				b.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		if err := st.CloseSend(); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err == nil {
			b.Fatal("stream not ended")
		}
	}
}
