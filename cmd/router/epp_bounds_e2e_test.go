package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/switchyard-router/switchyard/router/epp"
)

// vmHWM returns the peak resident set size of process pid, in bytes
// (VmHWM in /proc/PID/status).
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// bufferedBody sends, on a new stream, a chat request's headers and then
// its whole body in one message, as a proxy in BUFFERED mode does, and
// returns the answer to the body (or to the headers, when they were
// answered with an immediate response).
func bufferedBody(ctx context.Context, c extprocv3.ExternalProcessorClient, body []byte) (*extprocv3.ProcessingResponse, error) {
	st, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.CloseSend() }()
	if err := st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")},
				{Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
			}}}}}); err != nil {
		return nil, err
	}
	r, err := st.Recv()
	if err != nil || r.GetImmediateResponse() != nil {
		return r, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return nil, err
	}
	return st.Recv()
}

// TestEPPMemoryBoundedByBodyBudget starts `router epp` with an 8 MiB body
// bound and a 24 MiB budget of body bytes in flight, and sends 24 large
// bodies at once, each whole in one message as a BUFFERED proxy sends
// it: three of four just over the bound, one of four just under it. The
// process's peak resident memory (VmHWM) grows by at most
// epp.MemoryMultiple times the budget, where each stream's message used
// to be taken in by gRPC (and copied) before the budget was looked at;
// every body over the bound is answered 413 body_too_large (not a stream
// error), every one under it reaches the Picker (400: it is no JSON).
func TestEPPMemoryBoundedByBodyBudget(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	const (
		bound   = 8 << 20
		budget  = 24 << 20
		streams = 24
	)
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, workerBlocks([]string{"w"}, map[string]string{"w": closedPort(t)}))
	p, conn := startEPP(t, routerBin, "--policy", policy,
		"--max-body-bytes", strconv.Itoa(bound), "--max-body-bytes-in-flight", strconv.Itoa(budget))
	c := extprocv3.NewExternalProcessorClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	// One small request first: the process has served a stream when the
	// baseline is read.
	if r, err := bufferedBody(ctx, c, []byte("x")); err != nil || r.GetImmediateResponse().GetStatus().GetCode() != 400 {
		t.Fatalf("a small bad body: %v, %v; want 400\n%s", r, err, p.stderr.String())
	}
	pid := p.cmd.Process.Pid
	before := vmHWM(t, pid)

	over := bytes.Repeat([]byte("x"), bound+256<<10) // within the message bound, over the body bound
	under := over[:bound-4<<10]
	answers := make([]*extprocv3.ProcessingResponse, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range streams {
		body := over
		if i%4 == 0 {
			body = under
		}
		wg.Go(func() { answers[i], errs[i] = bufferedBody(ctx, c, body) })
	}
	wg.Wait()
	after := vmHWM(t, pid)
	grew := after - before
	t.Logf("%d bodies in %v; VmHWM %d MiB before, %d MiB after: grew %d MiB, %.1f times the %d MiB budget (at most %d)",
		streams, time.Since(start).Round(time.Millisecond), before>>20, after>>20, grew>>20, float64(grew)/budget, budget>>20, epp.MemoryMultiple)

	for i := range streams {
		want, code := 413, "body_too_large"
		if i%4 == 0 {
			want, code = 400, "invalid_request"
		}
		ir := answers[i].GetImmediateResponse()
		if errs[i] != nil || int(ir.GetStatus().GetCode()) != want || ir.GetDetails() != code {
			t.Errorf("stream %d: %v, %v; want an immediate %d %s", i, ir, errs[i], want, code)
		}
	}
	if grew > epp.MemoryMultiple*budget {
		t.Errorf("peak resident memory grew by %d MiB for a budget of %d MiB: over %d times the budget", grew>>20, budget>>20, epp.MemoryMultiple)
	}
}

// TestEPPRefusesWhatIsNoInferenceRequest starts `router epp` over one
// `router mock-worker` and checks, through ext_proc as a proxy speaks it,
// that what is no inference request is not picked and that what an
// upstream puts in ":status" is counted under a bounded set of codes: a
// stream whose first message is a body (no request headers) is answered
// 400; a GET with a body on /v1/chat/completions 405 with "allow: POST";
// a response whose ":status" is 999 is counted as 502 in
// switchyard_requests_total, not under a code of its own.
func TestEPPRefusesWhatIsNoInferenceRequest(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mock := startMocks(t, routerBin, 1, "50")[0]
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, workerBlocks([]string{"w"}, map[string]string{"w": mock.url}))
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := hl.Addr().String()
	_ = hl.Close()
	p, conn := startEPP(t, routerBin, "--policy", policy, "--http-listen", httpAddr)
	c := extprocv3.NewExternalProcessorClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	body := []byte(`{"model":"mock","messages":[{"role":"user","content":"hello"}]}`)

	// A first pick, once the worker is probed ready, to know the EPP
	// picks; its response says :status 999.
	deadline := time.Now().Add(time.Minute)
	var st extprocv3.ExternalProcessor_ProcessClient
	for {
		var r *extprocv3.ProcessingResponse
		st, r, err = eppPick(ctx, c, string(body))
		if err != nil {
			t.Fatal(err)
		}
		if r.GetRequestBody().GetResponse() != nil {
			break
		}
		if code := r.GetImmediateResponse().GetStatus().GetCode(); code != 503 || time.Now().After(deadline) {
			t.Fatalf("answer %v, want a pick (or 503 while the worker is not ready, for a minute at most)\n%s", r, p.stderr.String())
		}
		_ = st.CloseSend()
		time.Sleep(50 * time.Millisecond)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("999")}}}}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"x":1}`), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	_ = st.CloseSend()

	// A body with no request headers before it.
	st, err = c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if ir := r.GetImmediateResponse(); err != nil || ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), "request body without request headers") {
		t.Errorf("a body without request headers: %v, %v; want an immediate 400", r, err)
	}
	_ = st.CloseSend()

	// A GET with a body.
	st, err = c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("GET")},
			{Key: ":path", RawValue: []byte("/v1/chat/completions")},
		}}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	r, err = st.Recv()
	ir := r.GetImmediateResponse()
	var allow string
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "allow" {
			allow = string(h.GetHeader().GetRawValue())
		}
	}
	if err != nil || ir.GetStatus().GetCode() != 405 || ir.GetDetails() != "method_not_allowed" || allow != "POST" {
		t.Errorf("a GET with a body: %v, %v; want an immediate 405 method_not_allowed, allow: POST", r, err)
	}
	_ = st.CloseSend()

	// The 999 is counted as 502; the refusals are not counted (refused
	// before placement, as docs/epp.md says).
	want := `switchyard_requests_total{code="502",model="mock"} 1` + "\n"
	deadline = time.Now().Add(time.Minute)
	for {
		metrics := httpGet(t, "http://"+httpAddr+"/metrics")
		if strings.Contains(metrics, `code="999"`) {
			t.Fatalf("/metrics counts a code 999:\n%s", metrics)
		}
		if strings.Contains(metrics, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics has no %q a minute later:\n%s", want, metrics)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
