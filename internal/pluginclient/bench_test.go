package pluginclient

// Benchmarks of the plugin path, in one run:
//
//	go test -run='^$' -bench=. -benchmem ./internal/pluginclient/
//
// All three carry the same payload, one decision over 64 candidates with
// ids, ACTIVE_REQUESTS, LOAD and CACHE columns:
//   - BenchmarkPluginDecide: Client.Decide through a real plugin
//     process (testdata/plugin) running a scorer and a picker, serial and
//     with 64 concurrent callers.
//   - BenchmarkUnaryGRPC: the same decision as a plain unary gRPC call, one
//     DecideBatch of one task in, one DecideResults out.
//   - BenchmarkUnixSocketFloor: the marshalled DecideBatch written over a
//     unix socket to an echo server and read back: no gRPC, no work. The
//     in-process case echoes from a goroutine (no process boundary); the
//     cross-process case echoes from the test plugin binary, the floor a
//     plugin call cannot go below on this machine.
//
// What keeps the unary baseline a fair comparison with the plugin path:
//   - Same process: both start testdata/plugin with the argument "unary",
//     so the same binary, the same go-plugin gRPC server and options and the
//     same message-size limits serve both; the unary method is one more
//     service on that server, reached over the same go-plugin connection.
//   - Same payload: each unary call builds its DecideTask with
//     Client.newTask (the conversion Decide does, pooled the same
//     way) under the same 5 s deadline, so the bytes on the wire match a
//     plugin task's, deadline included.
//   - Same work on either end: the unary handler checks the deadline, runs
//     under a context with it, decodes every sent column into pooled
//     Candidates (as the SDK does), runs the same test-cost scorer and
//     test-lowest picker types, and returns a fresh costs slice; the client
//     checks the task id and error and converts the result as Decide does.
//   - Same harness: both go through runBench, so latency is per call
//     including the per-call context, serially and with 64 callers.
// What differs is only the transport use: the plugin path is one long-lived
// bidirectional stream with batching; the unary call is a new HTTP/2
// stream (headers, data, trailers) per decision.
//
// Each reports p50-us and p99-us (per-call latency) and decisions/s, and
// BenchmarkPluginDecide the mean tasks per DecideBatch message (tasks/msg,
// what switchyard_plugin_decide_tasks_per_message averages). Compare
// runs with benchstat (go test ... -count=10 > new.txt; benchstat old.txt
// new.txt).

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

const benchRows = 64

func benchRequest() *shared.Request {
	return &shared.Request{ID: "bench-1", Model: "m", Role: shared.RoleAggregated, PromptTokens: 1000, BlockSize: 16,
		BlockHashes: make([]uint64, 63), SessionID: "s"}
}

// benchCandidates are 64 rows with ids, ACTIVE_REQUESTS, LOAD and CACHE.
func benchCandidates() *shared.Candidates {
	c := &shared.Candidates{
		IDs:            make([]shared.WorkerID, benchRows),
		ActiveRequests: make([]int64, benchRows),
		Load:           make([]shared.Load, benchRows),
		OverlapBlocks:  make([]int32, benchRows),
	}
	for i := range benchRows {
		c.IDs[i] = shared.WorkerID(1000 + i)
		c.ActiveRequests[i] = int64(i*7) % 13
		c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: int64(i * 311 % 4096), ActiveDecodeBlocks: int64(i * 17 % 900),
			ActiveRequests: c.ActiveRequests[i], KVUsage: float64(i%10) / 10, HasKVUsage: i%3 != 0, Waiting: int64(i % 4), HasWaiting: i%2 == 0}
		c.OverlapBlocks[i] = int32(i % 9)
	}
	return c
}

// benchBatch is the DecideBatch the plugin path sends for one decision.
func benchBatch() *pluginv1.DecideBatch {
	rc := &Client{}
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

// runBench runs call serially and with 64 concurrent callers. With rc, it
// also reports the mean tasks per DecideBatch message rc sent (tasks/msg).
func runBench(b *testing.B, rc *Client, call func() error) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		defer perMessage(b, rc)()
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
		defer perMessage(b, rc)()
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

// perMessage returns a func that reports the mean tasks per DecideBatch
// rc sent since perMessage was called; nil rc: nothing.
func perMessage(b *testing.B, rc *Client) func() {
	if rc == nil {
		return func() {}
	}
	tasks, batches := rc.sentTasks.Load(), rc.batches.Load()
	return func() {
		if n := rc.batches.Load() - batches; n > 0 {
			b.ReportMetric(float64(rc.sentTasks.Load()-tasks)/float64(n), "tasks/msg")
		}
	}
}

func BenchmarkPluginDecide(b *testing.B) {
	rc, _ := startPlugin(b, "unary")
	configure(b, rc, "s", "test-cost", nil)
	configure(b, rc, "p", "test-lowest", nil)
	req, c := benchRequest(), benchCandidates()
	stages := []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}
	runBench(b, rc, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := rc.Decide(ctx, &Task{Request: req, Candidates: c, Stages: stages})
		return err
	})
	b.Logf("%d tasks in %d batches (largest %d)", rc.sentTasks.Load(), rc.batches.Load(), rc.maxBatch.Load())
}

// BenchmarkPluginDecideLabels is BenchmarkPluginDecide with and without
// the LABELS columns in the task: the 64 rows' names and four labels each
// (labels=sent, as for a policy one of whose components declares LABELS),
// or none (labels=none, a policy that declares none: the payload of
// BenchmarkPluginDecide). The plugin's SDK decodes them either way; its
// components do not read them.
//
//	go test -run='^$' -bench=PluginDecideLabels -benchmem ./internal/pluginclient/
func BenchmarkPluginDecideLabels(b *testing.B) {
	rc, _ := startPlugin(b)
	configure(b, rc, "s", "test-cost", nil)
	configure(b, rc, "p", "test-lowest", nil)
	req := benchRequest()
	stages := []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}
	for _, sent := range []bool{false, true} {
		c := benchCandidates()
		name := "none"
		if sent {
			name = "sent"
			c.Names, c.Labels = make([]string, c.Len()), make([]shared.Labels, c.Len())
			for i := range c.Names {
				c.Names[i] = fmt.Sprintf("gpu-%d", i)
				c.Labels[i] = shared.WorkerLabels(map[string]string{"zone": fmt.Sprint("z", i%4), "rack": fmt.Sprint("r", i%16)},
					shared.RoleAggregated, []string{"llama"}, false, 0)
			}
		}
		b.Run("labels="+name, func(b *testing.B) {
			runBench(b, rc, func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := rc.Decide(ctx, &Task{Request: req, Candidates: c, Stages: stages})
				return err
			})
		})
	}
}

func BenchmarkUnaryGRPC(b *testing.B) {
	rc, proto := startPlugin(b, "unary")
	conn := proto.(*plugin.GRPCClient).Conn
	req, c := benchRequest(), benchCandidates()
	stages := []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}
	runBench(b, nil, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// The same conversion (and pooled DecideTask) as Client.Decide.
		pt := rc.newTask(ctx, &Task{Request: req, Candidates: c, Stages: stages})
		batch := &pluginv1.DecideBatch{Tasks: []*pluginv1.DecideTask{pt}}
		out := new(pluginv1.DecideResults)
		err := conn.Invoke(ctx, "/switchyard.bench.v1.Bench/Decide", batch, out, callOpts...)
		id := pt.TaskId
		rc.tasks.Put(pt)
		if err != nil {
			return err
		}
		if len(out.Results) != 1 || out.Results[0].GetError() != "" || out.Results[0].GetTaskId() != id {
			return fmt.Errorf("unexpected results %v", out.Results)
		}
		_ = resultFromProto(out.Results[0], nil)
		return nil
	})
}

func BenchmarkUnixSocketFloor(b *testing.B) {
	payload, err := proto.Marshal(benchBatch())
	if err != nil {
		b.Fatal(err)
	}
	// in-process: a goroutine echo server, no process boundary.
	b.Run("in-process", func(b *testing.B) {
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
		echoRoundTrips(b, conn, payload)
	})
	// cross-process: the echo server is the test plugin binary ("echo"),
	// so each round trip crosses the process boundary as a plugin call
	// does, with no gRPC and no work.
	b.Run("cross-process", func(b *testing.B) {
		sock := filepath.Join(b.TempDir(), "echo.sock")
		cmd := exec.Command(buildPlugin(b), "echo", sock)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		var conn net.Conn
		for deadline := time.Now().Add(5 * time.Second); ; {
			if conn, err = net.Dial("unix", sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("dialing the echo process: %v", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.Cleanup(func() { _ = conn.Close() })
		echoRoundTrips(b, conn, payload)
	})
}

// echoRoundTrips writes the length-prefixed payload to conn and reads it
// back, b.N times, reporting latency.
func echoRoundTrips(b *testing.B, conn net.Conn, payload []byte) {
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
