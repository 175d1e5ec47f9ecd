package epp

import (
	"context"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/workers"
)

// Health services of the Endpoint Picker Protocol (proposal 004, "Health
// Checking"), answered by the standard gRPC health service.
const (
	// LivenessService is SERVING while the process answers gRPC at all.
	LivenessService = "liveness"
	// ReadinessService is SERVING while the endpoint picker can pick:
	// Health.SetReady.
	ReadinessService = "readiness"
	// ExtProcService, the ext_proc service's name, follows readiness.
	ExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Health is the endpoint picker's gRPC health: liveness always SERVING,
// readiness and the ext_proc service as SetReady says (NOT_SERVING until
// it is called), the empty service name, the server as a whole, with
// them.
type Health struct {
	srv *health.Server
}

// Register registers s as the ext_proc service and the gRPC health
// service on gs, and returns the health, not ready yet.
func Register(gs *grpc.Server, s *Server) *Health {
	extprocv3.RegisterExternalProcessorServer(gs, s)
	h := &Health{srv: health.NewServer()}
	healthpb.RegisterHealthServer(gs, h.srv)
	h.srv.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	h.SetReady(false)
	return h
}

// SetReady sets readiness, the ext_proc service's status and the
// server's ("") to SERVING or NOT_SERVING: ready means the picker has its
// workers and can pick.
func (h *Health) SetReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{ReadinessService, ExtProcService, ""} {
		h.srv.SetServingStatus(name, st)
	}
}

// Shutdown sets every service NOT_SERVING for good (liveness included),
// so that the proxy stops sending new streams while the server drains.
func (h *Health) Shutdown() { h.srv.Shutdown() }

// Probed reports whether every worker of ws has had its first probe
// answered, ready or failed: the endpoint picker's datastore has synced
// (proposal 004's readiness). No workers at all is synced: an empty pool
// answers 503 per request, which is the protocol's answer, not
// unreadiness.
func Probed(ws []workers.Status) bool {
	for _, st := range ws {
		if !st.Ready && st.LastError == nil {
			return false
		}
	}
	return true
}

// ReadyWhenProbed sets h ready once every worker of ws has been probed
// (Probed), looking every poll, or once wait has passed (a probe is
// bounded by its timeout, so wait is a guard: with the default scrape
// interval of 1 s, every first probe has an outcome within about 2 s). It
// returns whether the workers were probed, or ctx's error when ctx ends
// first (h is not set then).
func ReadyWhenProbed(ctx context.Context, h *Health, ws live.Workers, poll, wait time.Duration) (bool, error) {
	t := time.NewTicker(poll)
	defer t.Stop()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for !Probed(ws.Status()) {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-timeout.C:
			h.SetReady(true)
			return false, nil
		case <-t.C:
		}
	}
	h.SetReady(true)
	return true, nil
}
