package supervisor

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

// A component written for builtin/ serves out of process unchanged: the
// router's own kv-cost, min-cost and busy types, served by a plugin binary
// through shared.Serve, answer exactly as the in-process instances do.
func TestBuiltinTypesServeUnchanged(t *testing.T) {
	h := newHost(t)
	types, err := h.Start(context.Background(), block("builtins", "builtin"))
	if err != nil {
		t.Fatal(err)
	}
	info := func(block string) shared.InstanceInfo {
		return shared.InstanceInfo{Name: "aggregated/p/" + block, Role: shared.RoleAggregated, BlockSize: 16}
	}
	kvParams := shared.Params{builtin.ParamOverlapCredit: 0.5, builtin.ParamPrefillLoadScale: 2.0, builtin.ParamDecodeRequestWeight: 0.25}
	remoteKV, err := typeByName(t, types, builtin.TypeKVCost).New(info("cost"), kvParams)
	if err != nil {
		t.Fatal(err)
	}
	localKV, err := builtin.NewKVCost(kvParams)
	if err != nil {
		t.Fatal(err)
	}
	busyParams := shared.Params{builtin.ParamMaxActiveRequests: int64(6), builtin.ParamMaxKVUsage: 0.8}
	remoteBusy, err := typeByName(t, types, builtin.TypeBusy).New(info("busy"), busyParams)
	if err != nil {
		t.Fatal(err)
	}
	localBusy, err := builtin.NewBusy(busyParams)
	if err != nil {
		t.Fatal(err)
	}
	remotePick, err := typeByName(t, types, builtin.TypeMinCost).New(info("pick"), shared.Params{builtin.ParamTemperature: 0.0})
	if err != nil {
		t.Fatal(err)
	}
	localPick, err := builtin.NewMinCost(shared.Params{builtin.ParamTemperature: 0.0})
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(7, 11))
	ctx := context.Background()
	for round := range 50 {
		n := 1 + rng.IntN(40)
		c := &shared.Candidates{IDs: make([]shared.WorkerID, n), ActiveRequests: make([]int64, n),
			Load: make([]shared.Load, n), OverlapBlocks: make([]int32, n), TotalKVBlocks: make([]int64, n)}
		for i := range n {
			c.IDs[i] = shared.WorkerID(10 * (i + 1))
			c.ActiveRequests[i] = rng.Int64N(10)
			c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: rng.Int64N(5000), ActiveDecodeBlocks: rng.Int64N(300),
				ActiveRequests: c.ActiveRequests[i], KVUsage: rng.Float64(), HasKVUsage: rng.IntN(2) == 0,
				Waiting: rng.Int64N(15), HasWaiting: rng.IntN(2) == 0}
			c.OverlapBlocks[i] = int32(rng.IntN(20))
			c.TotalKVBlocks[i] = rng.Int64N(3) * 500 // 0 (unknown), 500 or 1000
		}
		req := &shared.Request{PromptTokens: rng.IntN(4000), BlockSize: 16}

		want, got := make([]float64, n), make([]float64, n)
		if err := localKV.Score(ctx, req, c, want); err != nil {
			t.Fatal(err)
		}
		if err := remoteKV.(shared.Scorer).Score(ctx, req, c, got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: kv-cost (-in-process +out-of-process):\n%s", round, diff)
		}

		wantKeep, gotKeep := make([]bool, n), make([]bool, n)
		for i := range n {
			wantKeep[i], gotKeep[i] = true, true
		}
		if err := localBusy.Filter(ctx, req, c, wantKeep); err != nil {
			t.Fatal(err)
		}
		if err := remoteBusy.(shared.Filter).Filter(ctx, req, c, gotKeep); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantKeep, gotKeep); diff != "" {
			t.Fatalf("round %d: busy (-in-process +out-of-process):\n%s", round, diff)
		}

		// Distinct costs, so temperature 0 has one answer.
		c.Costs = make([]float64, n)
		for i, p := range rng.Perm(n) {
			c.Costs[i] = float64(p) + want[i]*1e-9
		}
		wantRow, err := localPick.Pick(ctx, req, c)
		if err != nil {
			t.Fatal(err)
		}
		gotRow, err := remotePick.(shared.Picker).Pick(ctx, req, c)
		if err != nil {
			t.Fatal(err)
		}
		if wantRow != gotRow {
			t.Fatalf("round %d: min-cost picked %d in process, %d out of process", round, wantRow, gotRow)
		}
	}
}
