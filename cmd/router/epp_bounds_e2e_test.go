package main

import (
	"bytes"
	"context"
	"fmt"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
	p := startProc(t, routerBin, "epp", "--policy", policy, "--listen", "127.0.0.1:0",
		"--max-body-bytes", strconv.Itoa(bound), "--max-body-bytes-in-flight", strconv.Itoa(budget))
	addr, ok := strings.CutPrefix(p.url, "grpc://")
	if !ok {
		t.Fatalf("listening line gave %q, want grpc://ADDR", p.url)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
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
