package epp

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-router/switchyard/router/workers"
)

// The protocol's three health services over the standard gRPC health
// service: liveness SERVING from the start; readiness, the ext_proc
// service and the server as a whole NOT_SERVING until SetReady(true),
// and again after SetReady(false); everything NOT_SERVING after Shutdown.
func TestHealthServices(t *testing.T) {
	_, h, conn := serveEPP(t, &Server{Picker: &fakePicker{}})
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := func(when string, want map[string]healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for svc, st := range want {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("%s: Check(%q): %v", when, svc, err)
			}
			if r.GetStatus() != st {
				t.Errorf("%s: %q is %v, want %v", when, svc, r.GetStatus(), st)
			}
		}
	}
	serving, not := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	check("before SetReady", map[string]healthpb.HealthCheckResponse_ServingStatus{
		LivenessService: serving, ReadinessService: not, ExtProcService: not, "": not})
	h.SetReady(true)
	check("ready", map[string]healthpb.HealthCheckResponse_ServingStatus{
		LivenessService: serving, ReadinessService: serving, ExtProcService: serving, "": serving})
	h.SetReady(false)
	check("not ready again", map[string]healthpb.HealthCheckResponse_ServingStatus{
		LivenessService: serving, ReadinessService: not, ExtProcService: not})
	h.Shutdown()
	check("shut down", map[string]healthpb.HealthCheckResponse_ServingStatus{
		LivenessService: not, ReadinessService: not, ExtProcService: not})
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); err == nil {
		t.Error("an unknown service answered; want NotFound")
	}
}

// scriptedWorkers is a live.Workers whose Status the test sets.
type scriptedWorkers struct {
	mu sync.Mutex
	st []workers.Status
}

func (w *scriptedWorkers) URL(string) (string, bool) { return "", false }
func (w *scriptedWorkers) ReportFailure(string)      {}
func (w *scriptedWorkers) ReportSuccess(string)      {}
func (w *scriptedWorkers) Status() []workers.Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.st)
}
func (w *scriptedWorkers) set(st ...workers.Status) { w.mu.Lock(); w.st = st; w.mu.Unlock() }

func TestProbed(t *testing.T) {
	failed := workers.Status{LastError: errors.New("connection refused")}
	for _, tc := range []struct {
		st   []workers.Status
		want bool
	}{
		{nil, true},
		{[]workers.Status{{Ready: true}, failed}, true},
		{[]workers.Status{{Ready: true}, {}}, false},
	} {
		if got := Probed(tc.st); got != tc.want {
			t.Errorf("Probed(%+v) = %v, want %v", tc.st, got, tc.want)
		}
	}
}

// ReadyWhenProbed: readiness waits for every worker's first probe; the
// guard makes it ready anyway; a cancelled context leaves it unready.
func TestReadyWhenProbed(t *testing.T) {
	_, h, conn := serveEPP(t, &Server{Picker: &fakePicker{}})
	hc := healthpb.NewHealthClient(conn)
	ready := func() bool {
		r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: ReadinessService})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	ws := &scriptedWorkers{}
	ws.set(workers.Status{Ready: true}, workers.Status{})
	type result struct {
		probed bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		p, err := ReadyWhenProbed(t.Context(), h, ws, time.Millisecond, time.Hour)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("returned %+v with a worker not probed", r)
	case <-time.After(20 * time.Millisecond):
	}
	if ready() {
		t.Fatal("ready with a worker not probed")
	}
	ws.set(workers.Status{Ready: true}, workers.Status{LastError: errors.New("refused")})
	if r := <-done; !r.probed || r.err != nil || !ready() {
		t.Fatalf("after every probe: %+v, ready %v; want probed and ready", r, ready())
	}

	h.SetReady(false)
	ws.set(workers.Status{})
	if p, err := ReadyWhenProbed(t.Context(), h, ws, time.Millisecond, 10*time.Millisecond); p || err != nil || !ready() {
		t.Fatalf("guard passed: probed %v, %v, ready %v; want false, nil, ready", p, err, ready())
	}

	h.SetReady(false)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := ReadyWhenProbed(ctx, h, ws, time.Millisecond, time.Hour); !errors.Is(err, context.Canceled) || ready() {
		t.Fatalf("cancelled: %v, ready %v; want context.Canceled, not ready", err, ready())
	}
}
