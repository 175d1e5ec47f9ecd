package shared

// Benchmarks of the plugin path, in one run:
//
//	go test -run='^$' -bench=. -benchmem ./shared/
//
// All three carry the same payload, one decision over 64 candidates with
// ids, ACTIVE_REQUESTS, LOAD and CACHE columns:
//   - BenchmarkPluginDecide: RemoteClient.Decide through a real plugin
//     process (testdata/plugin) running a scorer and a picker, serial and
//     with 64 concurrent callers.
//   - BenchmarkUnaryGRPC: the same DecideBatch as a plain unary gRPC call
//     served by the same kind of go-plugin process, which runs the same
//     scorer and picker (a test-only method of testdata/plugin).
//   - BenchmarkUnixSocketFloor: the marshalled DecideBatch written to a
//     goroutine echo server over a unix socket and read back: no gRPC, no
//     process boundary, no work.
//
// Each reports p50-us and p99-us (per-call latency) and decisions/s. Compare
// runs with benchstat (go test ... -count=10 > new.txt; benchstat old.txt
// new.txt).

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
)

const benchRows = 64

func benchRequest() *Request {
	return &Request{ID: "bench-1", Model: "m", Role: RoleAggregated, PromptTokens: 1000, BlockSize: 16,
		BlockHashes: make([]uint64, 63), SessionID: "s"}
}

// benchCandidates are 64 rows with ids, ACTIVE_REQUESTS, LOAD and CACHE.
func benchCandidates() *Candidates {
	c := &Candidates{
		IDs:            make([]WorkerID, benchRows),
		ActiveRequests: make([]int64, benchRows),
		Load:           make([]Load, benchRows),
		OverlapBlocks:  make([]int32, benchRows),
	}
	for i := range benchRows {
		c.IDs[i] = WorkerID(1000 + i)
		c.ActiveRequests[i] = int64(i*7) % 13
		c.Load[i] = Load{Available: true, ActivePrefillTokens: int64(i * 311 % 4096), ActiveDecodeBlocks: int64(i * 17 % 900),
			ActiveRequests: c.ActiveRequests[i], KVUsage: float64(i%10) / 10, HasKVUsage: i%3 != 0, Waiting: int64(i % 4), HasWaiting: i%2 == 0}
		c.OverlapBlocks[i] = int32(i % 9)
	}
	return c
}

// benchBatch is the DecideBatch the plugin path sends for one decision.
func benchBatch() *pluginv1.DecideBatch {
	rc := &RemoteClient{}
	pt := rc.newTask(context.Background(), &Task{Request: benchRequest(), Candidates: benchCandidates(),
		Stages: []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}})
	return &pluginv1.DecideBatch{Tasks: []*pluginv1.DecideTask{pt}}
}

// latencies collects per-call durations from any number of goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// report adds p50-us, p99-us and decisions/s to b.
func (l *latencies) report(b *testing.B) {
	elapsed := b.Elapsed()
	b.StopTimer()
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	q := func(p float64) float64 {
		return float64(l.d[int(p*float64(len(l.d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(0.50), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "decisions/s")
}

// runBench runs call serially and with 64 concurrent callers.
func runBench(b *testing.B, call func() error) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		lat := &latencies{d: make([]time.Duration, 0, b.N)}
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			if err := call(); err != nil {
				b.Fatal(err)
			}
			lat.d = append(lat.d, time.Since(t0))
		}
		lat.report(b)
	})
	b.Run("concurrent-64", func(b *testing.B) {
		b.ReportAllocs()
		lat := &latencies{}
		b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var d []time.Duration
			for pb.Next() {
				t0 := time.Now()
				if err := call(); err != nil {
					b.Error(err)
					return
				}
				d = append(d, time.Since(t0))
			}
			lat.add(d)
		})
		lat.report(b)
	})
}

func BenchmarkPluginDecide(b *testing.B) {
	rc, _ := startPlugin(b)
	configure(b, rc, "s", "test-cost", nil)
	configure(b, rc, "p", "test-lowest", nil)
	req, c := benchRequest(), benchCandidates()
	stages := []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}
	runBench(b, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := rc.Decide(ctx, &Task{Request: req, Candidates: c, Stages: stages})
		return err
	})
	b.Logf("%d tasks in %d batches (largest %d)", rc.sentTasks.Load(), rc.batches.Load(), rc.maxBatch.Load())
}

func BenchmarkUnaryGRPC(b *testing.B) {
	_, proto := startPlugin(b, "unary")
	conn := proto.(*plugin.GRPCClient).Conn
	batch := benchBatch()
	runBench(b, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out := new(pluginv1.DecideResults)
		return conn.Invoke(ctx, "/switchyard.bench.v1.Bench/Decide", batch, out, callOpts...)
	})
}

func BenchmarkUnixSocketFloor(b *testing.B) {
	payload, err := proto.Marshal(benchBatch())
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "echo.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // echo every length-prefixed frame
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 4+len(payload))
		for {
			if _, err := io.ReadFull(conn, buf[:4]); err != nil {
				return
			}
			n := binary.LittleEndian.Uint32(buf[:4])
			if _, err := io.ReadFull(conn, buf[4:4+n]); err != nil {
				return
			}
			if _, err := conn.Write(buf[:4+n]); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = conn.Close()
		_ = ln.Close()
		wg.Wait()
	})
	out := make([]byte, 4+len(payload))
	binary.LittleEndian.PutUint32(out, uint32(len(payload)))
	copy(out[4:], payload)
	in := make([]byte, len(out))
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	lat := &latencies{d: make([]time.Duration, 0, b.N)}
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := conn.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, in); err != nil {
			b.Fatal(err)
		}
		lat.d = append(lat.d, time.Since(t0))
	}
	lat.report(b)
	b.ReportMetric(float64(len(payload)), "payload-bytes")
}
