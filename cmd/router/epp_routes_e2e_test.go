package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/switchyard-router/switchyard/router/epp"
)

// eppSend sends one buffered POST of body to path on a new ext_proc
// stream and returns the answer to its body (the stream is closed).
func eppSend(ctx context.Context, c extprocv3.ExternalProcessorClient, path, body string) (*extprocv3.ProcessingResponse, error) {
	st, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.CloseSend() }()
	hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte(path)},
		}}}}}
	if err := st.Send(hdrs); err != nil {
		return nil, err
	}
	if _, err := st.Recv(); err != nil {
		return nil, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}); err != nil {
		return nil, err
	}
	return st.Recv()
}

// TestEPPPassThroughFlag: `router epp` passes a POST under /v1/ that it
// does not route by its schema, naming a model, through to an engine
// serving it (picked onto the mock engine's host:port), unless
// --pass-through=false (the runtime's flag, as for serve), when it is
// answered 404 not_found; embeddings are picked either way.
func TestEPPPassThroughFlag(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	want, err := epp.Endpoint(mock.url)
	if err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, workerBlocks([]string{"w"}, map[string]string{"w": mock.url}))
	for _, tc := range []struct {
		flag string
		pass bool
	}{{"--pass-through=true", true}, {"--pass-through=false", false}} {
		p, conn := startEPP(t, routerBin, "--policy", policy, tc.flag)
		c := extprocv3.NewExternalProcessorClient(conn)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		// pick returns the destination of path's request, or the
		// immediate answer's status and body; 503 (the worker not probed
		// ready yet) is retried for a minute.
		pick := func(path, body string) (string, int32, []byte) {
			deadline := time.Now().Add(time.Minute)
			for {
				r, err := eppSend(ctx, c, path, body)
				if err != nil {
					t.Fatal(err)
				}
				if rb := r.GetRequestBody().GetResponse(); rb != nil {
					for _, h := range rb.GetHeaderMutation().GetSetHeaders() {
						if h.GetHeader().GetKey() == epp.DestinationHeader {
							return string(h.GetHeader().GetRawValue()), 0, nil
						}
					}
					t.Fatalf("%s %s: a pick without a destination: %v", tc.flag, path, r)
				}
				ir := r.GetImmediateResponse()
				if code := ir.GetStatus().GetCode(); code != 503 || time.Now().After(deadline) {
					return "", int32(code), ir.GetBody()
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		if got, code, body := pick("/v1/embeddings", `{"model":"mock","input":"hi"}`); got != want {
			t.Fatalf("%s: embeddings picked %q (%d %s), want %s\n%s", tc.flag, got, code, body, want, p.stderr.String())
		}
		got, code, body := pick("/v1/images/generations", `{"model":"mock","prompt":"say"}`)
		var e struct{ Error struct{ Code string } }
		switch {
		case tc.pass && got != want:
			t.Errorf("%s: the unknown path picked %q (%d %s), want %s", tc.flag, got, code, body, want)
		case !tc.pass && (got != "" || code != 404 || json.Unmarshal(body, &e) != nil || e.Error.Code != "not_found"):
			t.Errorf("%s: the unknown path picked %q, answered %d %s; want 404 not_found", tc.flag, got, code, body)
		}
		cancel()
		p.stop(t)
	}
}
