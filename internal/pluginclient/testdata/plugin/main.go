// Command plugin is the test plugin of package pluginclient's process tests and
// benchmarks: a scorer and a picker served with shared.Serve. With the
// argument "unary" it also serves a test-only unary gRPC method,
// /switchyard.bench.v1.Bench/Decide, that runs the same scorer and picker on
// a DecideBatch, for BenchmarkUnaryGRPC.
package main

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// costScorer: active requests + decode blocks / block size - overlap.
type costScorer struct{ blockSize float64 }

func (costScorer) Inputs() shared.Inputs {
	return shared.InputActiveRequests | shared.InputLoad | shared.InputCache
}

func (s costScorer) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	for i := range costs {
		costs[i] = float64(c.ActiveRequests[i]) + float64(c.Load[i].ActiveDecodeBlocks)/s.blockSize - float64(c.OverlapBlocks[i])
	}
	return nil
}

// lowestPicker picks the lowest cost, ties to the lowest row.
type lowestPicker struct{}

func (lowestPicker) Inputs() shared.Inputs { return 0 }

func (lowestPicker) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	best := 0
	for i := range c.Costs {
		if c.Costs[i] < c.Costs[best] {
			best = i
		}
	}
	return best, nil
}

var types = []shared.TypeInfo{
	{
		Name: "test-cost", Kind: shared.KindScorer,
		Inputs: shared.InputActiveRequests | shared.InputLoad | shared.InputCache,
		Doc:    "Active requests plus decode blocks per block size minus overlap.",
		Params: []shared.ParamSpec{{Name: "block_size", Type: shared.Number, Default: 16.0, Doc: "Divides decode blocks."}},
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			bs := p.Float("block_size", 16)
			if bs <= 0 {
				return nil, &shared.ParamError{Param: "block_size", Err: errPositive}
			}
			return costScorer{blockSize: bs}, nil
		},
	},
	{
		Name: "test-lowest", Kind: shared.KindPicker, Doc: "Lowest cost.",
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return lowestPicker{}, nil },
	},
}

type constError string

func (e constError) Error() string { return string(e) }

const errPositive = constError("must be > 0")

func main() {
	if len(os.Args) > 2 && os.Args[1] == "echo" {
		echo(os.Args[2])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "unary" {
		serveWithUnary()
		return
	}
	shared.Serve(shared.ServeOpts{Version: "0.0.1-test", Types: types})
}

// benchPlugin adds the unary benchmark service to the Switchyard plugin.
type benchPlugin struct{ shared.GRPCPlugin }

func (p *benchPlugin) GRPCServer(b *plugin.GRPCBroker, s *grpc.Server) error {
	if err := p.GRPCPlugin.GRPCServer(b, s); err != nil {
		return err
	}
	s.RegisterService(&benchDesc, struct{}{})
	return nil
}

var benchDesc = grpc.ServiceDesc{
	ServiceName: "switchyard.bench.v1.Bench",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Decide",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(pluginv1.DecideBatch)
			if err := dec(in); err != nil {
				return nil, err
			}
			return decideUnary(ctx, in), nil
		},
	}},
	Metadata: "bench",
}

// unaryScratch is decideUnary's per-call buffers, pooled as the SDK pools
// its task scratch.
type unaryScratch struct {
	c     shared.Candidates
	costs []float64
}

var unaryPool = sync.Pool{New: func() any { return new(unaryScratch) }}

// decideUnary does, per task, the work the SDK's Decide does for a
// test-cost + test-lowest task: the deadline check and a context with the
// task's deadline, every sent column decoded into pooled Candidates
// (including the LOAD kv_usage and waiting sentinels), the scorer, the
// picker, and a fresh costs slice in the result.
func decideUnary(ctx context.Context, in *pluginv1.DecideBatch) *pluginv1.DecideResults {
	out := &pluginv1.DecideResults{Results: make([]*pluginv1.DecideResult, 0, len(in.GetTasks()))}
	for _, t := range in.GetTasks() {
		out.Results = append(out.Results, decideOne(ctx, t))
	}
	return out
}

func decideOne(ctx context.Context, t *pluginv1.DecideTask) *pluginv1.DecideResult {
	res := &pluginv1.DecideResult{TaskId: t.GetTaskId(), Picked: -1}
	if dl := t.GetDeadlineUnixNano(); dl != 0 {
		deadline := time.Unix(0, dl)
		if !time.Now().Before(deadline) {
			res.Error = "deadline passed before the task ran"
			return res
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	sc := unaryPool.Get().(*unaryScratch)
	defer unaryPool.Put(sc)
	cols := t.GetCandidates()
	n := len(cols.GetIds())
	c := &sc.c
	c.IDs = grow(c.IDs, n)
	for i, id := range cols.GetIds() {
		c.IDs[i] = shared.WorkerID(id)
	}
	c.ActiveRequests = append(c.ActiveRequests[:0], cols.GetActiveRequests()...)
	c.OverlapBlocks = append(c.OverlapBlocks[:0], cols.GetOverlapBlocks()...)
	c.Load = grow(c.Load, n)
	for i := range c.Load {
		kv, w := cols.LoadKvUsage[i], cols.LoadWaiting[i]
		c.Load[i] = shared.Load{Available: cols.LoadAvailable[i], ActivePrefillTokens: cols.LoadActivePrefillTokens[i],
			ActiveDecodeBlocks: cols.LoadActiveDecodeBlocks[i], ActiveRequests: cols.LoadActiveRequests[i],
			KVUsage: kv, HasKVUsage: !math.IsNaN(kv), Waiting: w, HasWaiting: w >= 0}
	}
	sc.costs = grow(sc.costs, n)
	clear(sc.costs)
	req := &shared.Request{ID: t.GetRequest().GetId(), Model: t.GetRequest().GetModel(), BlockHashes: t.GetRequest().GetBlockHashes()}
	if err := (costScorer{blockSize: 16}).Score(ctx, req, c, sc.costs); err != nil {
		res.Error = err.Error()
		return res
	}
	c.Costs = sc.costs
	row, err := lowestPicker{}.Pick(ctx, req, c)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.Picked, res.Costs = int32(row), append([]float64(nil), sc.costs...)
	return res
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func serveWithUnary() {
	log := hclog.New(&hclog.LoggerOptions{Name: "bench-plugin", Output: os.Stderr, JSONFormat: true, Level: hclog.Warn})
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: shared.Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{
			shared.APIVersion: {shared.PluginSetKey: &benchPlugin{shared.GRPCPlugin{Version: "0.0.1-test", Types: types, Logger: log}}},
		},
		GRPCServer: func(o []grpc.ServerOption) *grpc.Server {
			o = append(o, grpc.MaxRecvMsgSize(shared.MaxMessageBytes), grpc.MaxSendMsgSize(shared.MaxMessageBytes))
			return plugin.DefaultGRPCServer(o)
		},
		Logger: log,
	})
}

// echo serves BenchmarkUnixSocketFloor's cross-process case: it listens on
// the unix socket path, accepts one connection and writes back every
// length-prefixed frame it reads, until the connection closes.
func echo(path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.Exit(1)
	}
	defer ln.Close()
	conn, err := ln.Accept()
	if err != nil {
		os.Exit(1)
	}
	defer conn.Close()
	var hdr [4]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(hdr[:]))
		if cap(buf) < 4+n {
			buf = make([]byte, 4+n)
		}
		buf = buf[:4+n]
		copy(buf, hdr[:])
		if _, err := io.ReadFull(conn, buf[4:]); err != nil {
			return
		}
		if _, err := conn.Write(buf); err != nil {
			return
		}
	}
}
