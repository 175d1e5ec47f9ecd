package router

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// costTap is min-cost at temperature 0 (seeded) that also keeps the
// candidates' summed costs of the last selection, by worker id.
type costTap struct {
	mc    *builtin.MinCost
	mu    sync.Mutex
	costs map[shared.WorkerID]float64
}

func (*costTap) Inputs() shared.Inputs { return 0 }

func (p *costTap) Pick(ctx context.Context, req *shared.Request, c *shared.Candidates) (int, error) {
	p.mu.Lock()
	p.costs = make(map[shared.WorkerID]float64, c.Len())
	for i, id := range c.IDs {
		p.costs[id] = c.Costs[i]
	}
	p.mu.Unlock()
	return p.mc.Pick(ctx, req, c)
}

func (p *costTap) last() map[shared.WorkerID]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.costs
}

// cpuTierRouter is a router under kv-cost (params) over three idle
// workers whose engines have 16-token blocks and whose KV events are
// live: worker 1's engine holds tokens 0-207 of ids (13 blocks) on its
// CPU tier only (stored on GPU, offloaded, evicted from GPU, as vLLM's
// offloading connector reports it), worker 2's holds them on GPU, worker
// 3's holds nothing.
func cpuTierRouter(t *testing.T, params shared.Params, ids []int64) (*Router, *costTap) {
	t.Helper()
	kv, err := builtin.NewKVCost(params)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	tap := &costTap{mc: mc}
	pol := &policy.Policy{Name: "kv", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: tap}
	r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: pol}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	hashes := make([]uint64, 13)
	for i := range hashes {
		hashes[i] = uint64(1000 + i) // the engine's own hashes
	}
	for id := 1; id <= 3; id++ {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(id), Role: shared.RoleAggregated, TotalKVBlocks: 1000, EngineBlockSize: 16}); err != nil {
			t.Fatal(err)
		}
		p := r.Prefix().Precise(prefix.Candidate{ID: shared.WorkerID(id)})
		p.MarkLive()
		var evs []kvevents.Event
		switch id {
		case 1:
			evs = []kvevents.Event{
				{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: ids[:208], BlockSize: 16},
				{Kind: kvevents.BlockStored, BlockHashes: hashes, Medium: []byte("CPU")}, // tokenless, as offloads are
				{Kind: kvevents.BlockRemoved, BlockHashes: hashes, Medium: []byte("GPU")},
			}
		case 2:
			evs = []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: ids[:208], BlockSize: 16}}
		}
		p.Apply(&kvevents.Batch{Events: evs})
	}
	return r, tap
}

// TestCPUTierCredit: kv-cost credits a block the worker's engine holds
// on its CPU tier 0.8 of a GPU hit, so a worker holding the prompt's
// blocks on CPU only beats an empty one and loses to one holding them on
// GPU. By hand: a 300-token prompt at 16 tokens a block is 18.75 blocks
// of prefill; worker 2 (13 GPU blocks) costs 18.75 - 13 = 5.75, worker 1
// (13 CPU-tier blocks) 18.75 - 0.8*13 = 8.35, worker 3 18.75. With
// cpu_weight 0 worker 1 costs what worker 3 does, as before the CPU tier
// was counted.
func TestCPUTierCredit(t *testing.T) {
	ids := seq(300)
	req := func() *shared.Request {
		return &shared.Request{Role: shared.RoleAggregated, PromptTokens: 300, BlockSize: 16,
			BlockHashes: prefix.TokenBlocks(ids, 16), Prompt: &prefix.Key{IDs: ids}}
	}
	w := 0.8 // float64 arithmetic, as the scorer's
	for _, c := range []struct {
		name   string
		params shared.Params
		want   map[shared.WorkerID]float64
		placed shared.WorkerID
	}{
		{"default", nil, map[shared.WorkerID]float64{1: 18.75 - w*13, 2: 5.75, 3: 18.75}, 2},
		{"cpu_weight 0", shared.Params{builtin.ParamCPUWeight: 0.0}, map[shared.WorkerID]float64{1: 18.75, 2: 5.75, 3: 18.75}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, tap := cpuTierRouter(t, c.params, ids)
			d, err := r.Place(context.Background(), req(), Placement{})
			if err != nil {
				t.Fatal(err)
			}
			d.Booking.Release()
			if got := tap.last(); !mapsEqual(got, c.want) {
				t.Errorf("costs %v, want %v", got, c.want)
			}
			if d.Worker.ID != c.placed || d.OverlapBlocks != 13 {
				t.Errorf("placed on worker %d with overlap %d, want worker %d with 13 GPU blocks", d.Worker.ID, d.OverlapBlocks, c.placed)
			}
		})
	}
	// Without the GPU holder, the CPU-tier holder wins over the empty
	// worker: it is excluded, not removed, so the costs are those above.
	r, tap := cpuTierRouter(t, nil, ids)
	d, err := r.Place(context.Background(), req(), Placement{Exclude: []shared.WorkerID{2}})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	if d.Worker.ID != 1 || d.OverlapBlocks != 0 {
		t.Errorf("placed on worker %d with overlap %d, want worker 1 (CPU tier) with no GPU blocks", d.Worker.ID, d.OverlapBlocks)
	}
	if got, want := tap.last(), map[shared.WorkerID]float64{1: 18.75 - w*13, 3: 18.75}; !mapsEqual(got, want) {
		t.Errorf("costs %v, want %v", got, want)
	}
}

func mapsEqual(a, b map[shared.WorkerID]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// The CPU-tier column follows the request's block size when it is not the
// engine's: 13 CPU-tier engine blocks of 16 after 2 GPU ones (tokens
// 32-239) are, at 64 tokens a block, floor(240/64) - floor(32/64) = 3
// blocks after 0 GPU blocks.
func TestCPUTierColumnAtRequestBlockSize(t *testing.T) {
	ids := seq(300)
	r, err := New(Options{BlockSize: 64, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	if _, err := r.AddWorker(fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 1000, EngineBlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	p := r.Prefix().Precise(prefix.Candidate{ID: 1})
	p.MarkLive()
	hashes := make([]uint64, 15)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	p.Apply(&kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: ids[:240], BlockSize: 16},
		{Kind: kvevents.BlockStored, BlockHashes: hashes[2:], Medium: []byte("CPU")},
		{Kind: kvevents.BlockRemoved, BlockHashes: hashes[2:], Medium: []byte("GPU")},
	}})
	req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 300, BlockSize: 64,
		BlockHashes: prefix.TokenBlocks(ids, 64), Prompt: &prefix.Key{IDs: ids}}
	part := r.fleet.Snapshot().ModelPartition(req.Model, req.Role)
	c := &shared.Candidates{IDs: make([]shared.WorkerID, 1), OverlapBlocks: make([]int32, 1), CPUOverlapBlocks: make([]int32, 1)}
	r.fill(c, shared.InputCache, req, part)
	if !slices.Equal(c.OverlapBlocks, []int32{0}) || !slices.Equal(c.CPUOverlapBlocks, []int32{3}) {
		t.Errorf("overlap %v, CPU tier %v; want [0] and [3]", c.OverlapBlocks, c.CPUOverlapBlocks)
	}
}
