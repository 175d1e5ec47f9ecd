package cluster

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/admission"
)

// BenchmarkSyncLag is #17 §4's sync lag: from a booking decided on one
// replica (admission.Observer.Booked, in Admit) to its booking on another
// (the record applied to its Router), two replicas over one NATS server
// with JetStream on loopback TCP, in the same process.
//
// serial: one request at a time, the next once the other replica applied
// it (the lag alone). paced: one booking per 500 us tick (at most 2,000 a
// second; records/s says how many were made), each released at once, the
// lag at a steady load.
// Reported: lag-p50-ms, lag-p99-ms, and records/s (bookings applied on
// the other replica per second of wall time).
func BenchmarkSyncLag(b *testing.B) {
	for _, mode := range []string{"serial", "paced"} {
		b.Run(mode, func(b *testing.B) {
			_, url := startNATS(b, 0)
			x := startNode(b, url, "x", 3, 1, nil)
			y := startNode(b, url, "y", 3, 101, nil)
			joined(b, x, y)
			var mu sync.Mutex
			lags := make([]float64, 0, 1<<16)
			applied := make(chan string, 1<<16)
			y.rep.mu.Lock()
			y.rep.applied = func(id string, at int64) {
				mu.Lock()
				lags = append(lags, float64(time.Now().UnixNano()-at)/1e6)
				mu.Unlock()
				if mode == "serial" {
					applied <- id
				}
			}
			y.rep.mu.Unlock()
			var seq sync.Mutex
			n := 0
			next := func() string {
				seq.Lock()
				defer seq.Unlock()
				n++
				return fmt.Sprintf("r%d", n)
			}
			b.ResetTimer()
			start := time.Now()
			if mode == "serial" {
				for i := 0; b.Loop(); i++ {
					h := admitPrompt(b, x, next(), uint64(i%97)*10)
					<-applied
					h.End(admission.Completed(1))
				}
			} else {
				// 2,000 bookings a second, each released at once: two
				// records each way, 4,000 a second on the bus.
				tick := time.NewTicker(500 * time.Microsecond)
				defer tick.Stop()
				for i := 0; b.Loop(); i++ {
					<-tick.C
					h := admitPrompt(b, x, next(), uint64(i%97)*10)
					h.End(admission.Completed(1))
				}
				deadline := time.Now().Add(time.Minute)
				for {
					mu.Lock()
					got := len(lags)
					mu.Unlock()
					if got >= b.N || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			mu.Lock()
			xs := slices.Clone(lags)
			mu.Unlock()
			if len(xs) == 0 {
				b.Fatal("nothing applied")
			}
			slices.Sort(xs)
			b.ReportMetric(xs[len(xs)/2], "lag-p50-ms")
			b.ReportMetric(xs[min(len(xs)-1, len(xs)*99/100)], "lag-p99-ms")
			b.ReportMetric(float64(len(xs))/elapsed.Seconds(), "records/s")
		})
	}
}
