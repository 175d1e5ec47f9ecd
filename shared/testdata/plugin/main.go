// Command plugin is the test plugin of package shared's process tests and
// benchmarks: a scorer and a picker served with shared.Serve. With the
// argument "unary" it also serves a test-only unary gRPC method,
// /switchyard.bench.v1.Bench/Decide, that runs the same scorer and picker on
// a DecideBatch, for BenchmarkUnaryGRPC.
package main

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared"
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

// decideUnary runs test-cost + test-lowest on every task, like Decide.
func decideUnary(ctx context.Context, in *pluginv1.DecideBatch) *pluginv1.DecideResults {
	out := &pluginv1.DecideResults{}
	for _, t := range in.GetTasks() {
		cols := t.GetCandidates()
		n := len(cols.GetIds())
		c := &shared.Candidates{IDs: make([]shared.WorkerID, n), ActiveRequests: cols.GetActiveRequests(),
			Load: make([]shared.Load, n), OverlapBlocks: cols.GetOverlapBlocks()}
		for i := range n {
			c.IDs[i] = shared.WorkerID(cols.Ids[i])
			c.Load[i] = shared.Load{Available: cols.LoadAvailable[i], ActivePrefillTokens: cols.LoadActivePrefillTokens[i],
				ActiveDecodeBlocks: cols.LoadActiveDecodeBlocks[i], ActiveRequests: cols.LoadActiveRequests[i]}
		}
		costs := make([]float64, n)
		_ = costScorer{blockSize: 16}.Score(ctx, &shared.Request{}, c, costs)
		c.Costs = costs
		row, _ := lowestPicker{}.Pick(ctx, &shared.Request{}, c)
		out.Results = append(out.Results, &pluginv1.DecideResult{TaskId: t.GetTaskId(), Costs: costs, Picked: int32(row)})
	}
	return out
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
