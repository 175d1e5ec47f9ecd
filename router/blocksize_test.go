package router

import (
	"context"
	"testing"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// seq returns the ids 0, 1, ..., n-1.
func seq(n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i)
	}
	return ids
}

// sixteenTokenRouter is a router of the default 512-token block (a policy
// file without router.block_size) over two workers whose engines have
// 16-token blocks, under kv-cost + min-cost.
func sixteenTokenRouter(t *testing.T) *Router {
	t.Helper()
	r, err := New(Options{BlockSize: 512, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for id := 1; id <= 2; id++ {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(id), Role: shared.RoleAggregated, TotalKVBlocks: 1000, EngineBlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// A request keyed at its engine's 16-token block is placed whatever the
// router's default size, and its overlap, prefill charge and decode
// blocks are in 16-token blocks: a 208-token cached prefix on a 16-token
// engine is 13 blocks of overlap (at 512 it was floor(208/512) = 0). By
// hand: a 300-token prompt; worker 2's engine reports 13 blocks of 16
// (tokens 0-207); overlap 13, prefill 300 - 13*16 = 92 tokens, decode
// blocks ceil(300/16) = 19. (Before per-request block sizes, Place
// refused the request with ErrBlockSize: 16 is not the router's 512.)
func TestPlaceAtTheRequestsBlockSize(t *testing.T) {
	r := sixteenTokenRouter(t)
	p := r.Prefix().Precise(prefix.Candidate{ID: 2})
	p.MarkLive()
	ids := seq(300)
	hashes := make([]uint64, 13)
	for i := range hashes {
		hashes[i] = uint64(1000 + i) // the engine's own hashes: opaque to the router
	}
	p.Apply(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: ids[:208], BlockSize: 16}}})

	req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 300, BlockSize: 16,
		BlockHashes: prefix.TokenBlocks(ids, 16), Prompt: &prefix.Key{IDs: ids}}
	if got := r.UncachedTokens(req); got != 92 {
		t.Errorf("UncachedTokens = %d, want 300 - 13*16 = 92", got)
	}
	d, err := r.Place(context.Background(), req, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != 2 || d.OverlapBlocks != 13 {
		t.Fatalf("placed on worker %d with overlap %d; want worker 2 (the holder), 13 blocks of 16", d.Worker.ID, d.OverlapBlocks)
	}
	if !d.Belief.Precise || d.Belief.PreciseTokens != 208 || d.Belief.EngineBlockSize != 16 {
		t.Errorf("belief %+v; want precise 208 tokens at E=16", d.Belief)
	}
	if l := d.Worker.Load(true); l.ActivePrefillTokens != 92 || l.ActiveDecodeBlocks != 19 {
		t.Errorf("booked prefill %d tokens, %d decode blocks; want 92 and 19", l.ActivePrefillTokens, l.ActiveDecodeBlocks)
	}
	d.Booking.Release()
}

// Requests of one prompt keyed at two block sizes are two chains in the
// approximate index: a 1100-token prompt sent at 16 tokens a block (68
// full blocks recorded) is found again at 16 (1100 - 68*16 = 12 tokens
// uncached) and not at all at 512 (its 2 blocks of 512 were never sent).
func TestBlockSizesAreSeparateChains(t *testing.T) {
	r := sixteenTokenRouter(t)
	if err := r.RemoveWorker(2, 0); err != nil {
		t.Fatal(err)
	}
	ids := seq(1100)
	at := func(bs int) *shared.Request {
		return &shared.Request{Role: shared.RoleAggregated, PromptTokens: len(ids), BlockSize: bs, BlockHashes: prefix.TokenBlocks(ids, bs)}
	}
	d, err := r.Place(context.Background(), at(16), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	if got := r.UncachedTokens(at(16)); got != 12 {
		t.Errorf("repeat at 16: UncachedTokens = %d, want 1100 - 68*16 = 12", got)
	}
	if got := r.UncachedTokens(at(512)); got != 1100 {
		t.Errorf("same prompt at 512: UncachedTokens = %d, want 1100 (another chain)", got)
	}
	d, err = r.Place(context.Background(), at(512), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if d.OverlapBlocks != 0 {
		t.Errorf("first request at 512: overlap %d, want 0", d.OverlapBlocks)
	}
	d.Booking.Release()
	if n := r.Prefix().Len(prefix.Candidate{ID: 1}); n != 68+2 {
		t.Errorf("worker 1's approximate list holds %d blocks, want 68 + 2", n)
	}
}

// A worker's capacity is in its own blocks: the file's override when set,
// else its engine's, else the router's default.
func TestCapacityBlockSize(t *testing.T) {
	r := sixteenTokenRouter(t)
	for _, c := range []struct {
		override int
		engine   int64
		want     int
	}{{0, 16, 16}, {0, 0, 512}, {64, 16, 64}, {64, 0, 64}} {
		r.override = c.override
		if got := r.CapacityBlockSize(fleet.Spec{EngineBlockSize: c.engine}); got != c.want {
			t.Errorf("override %d, engine %d: CapacityBlockSize %d, want %d", c.override, c.engine, got, c.want)
		}
	}
}
