package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// signalSink is a precise index that says when it applied a batch.
type signalSink struct {
	*prefix.Precise
	applied chan struct{}
}

func (s *signalSink) Apply(b *kvevents.Batch) {
	s.Precise.Apply(b)
	select {
	case s.applied <- struct{}{}:
	default:
	}
}

// BenchmarkRelayLag is the lag of an engine's KV events batch (16 blocks
// of 4 tokens, one event) from the engine's Publish to its Apply on a precise
// index, one batch at a time: direct, a subscriber of the router's own
// (kvevents.Subscribe, what a router without a cluster block does);
// relay, through the relay of another replica (the lease holder), the
// JetStream stream and this replica's consumer, on loopback TCP in one
// process. Reported: lag-p50-ms, lag-p99-ms.
func BenchmarkRelayLag(b *testing.B) {
	for _, mode := range []string{"direct", "relay"} {
		b.Run(mode, func(b *testing.B) {
			e := startEngine(b)
			_, url := startNATS(b, 0)
			y := startNode(b, url, "y", 1, 101, nil)
			sink := &signalSink{Precise: y.r.Prefix().Precise(prefix.Candidate{ID: y.ids["w0"]}), applied: make(chan struct{}, 1)}
			if mode == "direct" {
				ctx, cancel := context.WithCancel(context.Background())
				sub, err := kvevents.Subscribe(ctx, kvevents.Options{Endpoint: e.kvEvents().Endpoint, ReplayEndpoint: e.kvEvents().ReplayEndpoint}, sink)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { cancel(); sub.Wait() })
			} else {
				x := startNode(b, url, "x", 1, 1, nil)
				x.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
				y.rep.FollowKV("w0", 0, sink)
			}
			// Warm up: until a batch reaches the index.
			testkit.Eventually(b, "a batch reaches the index", func() bool {
				e.publishBlocks(b, 16)
				select {
				case <-sink.applied:
					return true
				case <-time.After(50 * time.Millisecond):
					return false
				}
			})
			time.Sleep(100 * time.Millisecond)
			for len(sink.applied) > 0 {
				<-sink.applied
			}
			lags := make([]float64, 0, 1<<14)
			for b.Loop() {
				start := time.Now()
				e.publishBlocks(b, 16)
				<-sink.applied
				lags = append(lags, float64(time.Since(start).Nanoseconds())/1e6)
			}
			slices.Sort(lags)
			b.ReportMetric(lags[len(lags)/2], "lag-p50-ms")
			b.ReportMetric(lags[min(len(lags)-1, len(lags)*99/100)], "lag-p99-ms")
		})
	}
}
