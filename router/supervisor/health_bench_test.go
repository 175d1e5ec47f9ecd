package supervisor

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// BenchmarkHealthCheck measures the round trip of the host's gRPC health
// check of a plugin, the delay HealthPolicy.ProbeTimeout must cover: with
// the host idle, and with goroutines spinning in the host's own process
// (hogs=4 is the CPU denial of service: four requests pinning the
// router's cores). Run it on a busy machine too (stress-ng --cpu 4) and
// with -benchtime=300x for meaningful percentiles; it reports p50, p99 and
// the maximum in ms.
func BenchmarkHealthCheck(b *testing.B) {
	for _, hogs := range []int{0, 4} {
		b.Run(fmt.Sprintf("hogs=%d", hogs), func(b *testing.B) {
			h := NewHost(Options{Logger: testLogger(), Health: HealthPolicy{ProbeInterval: -1}})
			b.Cleanup(func() {
				if err := h.Shutdown(context.Background()); err != nil {
					b.Errorf("Shutdown: %v", err)
				}
			})
			if _, err := h.Start(context.Background(), block("probed", "")); err != nil {
				b.Fatalf("Start: %v", err)
			}
			hc := healthpb.NewHealthClient(runningProc(h, "probed").conn)
			stop := make(chan struct{})
			defer close(stop)
			for range hogs {
				go func() {
					for i := 0; ; i++ {
						if i%(1<<20) == 0 {
							select {
							case <-stop:
								return
							default:
							}
						}
					}
				}()
			}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					b.Fatalf("health check: %v, %v", resp.GetStatus(), err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			ms := func(q float64) float64 { return lat[int(q*float64(len(lat)-1))].Seconds() * 1e3 }
			b.ReportMetric(ms(0.5), "p50-ms")
			b.ReportMetric(ms(0.99), "p99-ms")
			b.ReportMetric(ms(1), "max-ms")
		})
	}
}
