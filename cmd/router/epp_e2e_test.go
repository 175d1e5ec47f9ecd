package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-router/switchyard/router/epp"
)

// eppPick sends one buffered chat request on a new ext_proc stream and
// returns the stream and the answer to its body.
func eppPick(ctx context.Context, c extprocv3.ExternalProcessorClient, body string) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse, error) {
	st, err := c.Process(ctx)
	if err != nil {
		return nil, nil, err
	}
	hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte("/v1/chat/completions")},
		}}}}}
	if err := st.Send(hdrs); err != nil {
		return nil, nil, err
	}
	if _, err := st.Recv(); err != nil {
		return nil, nil, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}); err != nil {
		return nil, nil, err
	}
	r, err := st.Recv()
	return st, r, err
}

// TestEPPServesPicks starts `router epp` as a process over a policy file
// with one `router mock-worker` engine, checks its readiness over gRPC
// health, and sends a request through ext_proc as Envoy would: it is
// picked onto the worker's host:port (once the worker is probed ready),
// its response runs to the end, and SIGTERM stops the process (exit 0).
// Readiness turns SERVING once the worker's first probe answered.
func TestEPPServesPicks(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, workerBlocks([]string{"w"}, map[string]string{"w": mock.url}))
	// The HTTP API on a port picked here (the process prints only its
	// gRPC address as its listening line).
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := hl.Addr().String()
	_ = hl.Close()
	p, conn := startEPP(t, routerBin, "--policy", policy, "--http-listen", httpAddr)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Readiness comes once the worker's first probe has answered: watch
	// it turn SERVING.
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		hr, err := watch.Recv()
		if err != nil {
			t.Fatalf("readiness never SERVING: %v", err)
		}
		if hr.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	want, err := epp.Endpoint(mock.url)
	if err != nil {
		t.Fatal(err)
	}

	c := extprocv3.NewExternalProcessorClient(conn)
	body := `{"model":"mock","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	deadline := time.Now().Add(time.Minute)
	var st extprocv3.ExternalProcessor_ProcessClient
	for {
		var r *extprocv3.ProcessingResponse
		st, r, err = eppPick(ctx, c, body)
		if err != nil {
			t.Fatal(err)
		}
		if rb := r.GetRequestBody().GetResponse(); rb != nil {
			var got string
			for _, h := range rb.GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == epp.DestinationHeader {
					got = string(h.GetHeader().GetRawValue())
				}
			}
			if got != want {
				t.Fatalf("picked %q, want the worker's %q", got, want)
			}
			break
		}
		// 503 no_worker until the worker is probed ready.
		if code := r.GetImmediateResponse().GetStatus().GetCode(); code != 503 || time.Now().After(deadline) {
			t.Fatalf("answer %v, want a pick (or 503 while the worker is not ready, for a minute at most)\n%s", r, p.stderr.String())
		}
		_ = st.CloseSend()
		time.Sleep(50 * time.Millisecond)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x\n\n"), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, want EOF", err)
	}
	// serve's families and the EPP's own count the request: one decision,
	// one request answered 200.
	for _, want := range []string{"switchyard_epp_decision_duration_seconds_count 1\n", `switchyard_requests_total{code="200",model="mock"} 1` + "\n"} {
		deadline := time.Now().Add(time.Minute)
		for {
			metrics := httpGet(t, "http://"+httpAddr+"/metrics")
			if strings.Contains(metrics, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/metrics has no %q a minute later:\n%s", want, metrics)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	p.stop(t)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("router epp exited %d after SIGTERM, want 0\n%s", code, p.stderr.String())
	}
}

// httpGet returns url's body; any error or a status other than 200 fails
// the test.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// startEPP starts `router epp --listen 127.0.0.1:0` with args and returns
// the process and a gRPC client connection to it (closed at the test's
// end).
func startEPP(t *testing.T, routerBin string, args ...string) (*e2eProc, *grpc.ClientConn) {
	t.Helper()
	p := startProc(t, routerBin, append([]string{"epp", "--listen", "127.0.0.1:0"}, args...)...)
	addr, ok := strings.CutPrefix(p.url, "grpc://")
	if !ok {
		t.Fatalf("listening line gave %q, want grpc://ADDR", p.url)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return p, conn
}

// TestEPPE2EDebugListen: `router epp --debug-listen` serves Go's profiler
// and the router's view of its workers on their own address, as serve's
// does (the runtime's flag), and not on the HTTP API's.
func TestEPPE2EDebugListen(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, workerBlocks([]string{"w"}, map[string]string{"w": mock.url}))
	debug, api := closedPort(t), closedPort(t)
	startEPP(t, routerBin, "--policy", policy, "--http-listen", strings.TrimPrefix(api, "http://"),
		"--debug-listen", strings.TrimPrefix(debug, "http://"))
	c := e2eClient(t)
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(debug + "/debug/pprof/cmdline"); code != http.StatusOK || !strings.Contains(body, "--debug-listen") {
		t.Fatalf("profiler cmdline: %d %q, want 200 naming the router's flags", code, body)
	}
	if code, body := get(debug + "/debug/workers"); code != http.StatusOK || !strings.Contains(body, `"w"`) {
		t.Fatalf("/debug/workers: %d %.300q, want 200 naming worker w", code, body)
	}
	if code, _ := get(api + "/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("the HTTP API address answers /debug/pprof/ with %d, want 404", code)
	}
}
