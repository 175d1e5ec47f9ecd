package epp

import (
	"context"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
