package prefix

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/shared"
)

// TestSubscriberFeedsPrecise: an engine's events travel over real ZeroMQ
// sockets (a vLLM-style publisher with replay, the map layout) into a
// candidate's precise index, and a request cut at the engine's block size
// finds them.
func TestSubscriberFeedsPrecise(t *testing.T) {
	pub, err := kvevents.NewPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	x := New(4)
	_ = x.AddWorker(Candidate{ID: 3, Rank: 1}, 100)
	p := x.Precise(Candidate{ID: 3, Rank: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := kvevents.Subscribe(ctx, kvevents.Options{
		Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + pub.ReplayAddr().String(), Rank: 1, HasRank: true,
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	enc := kvevents.Encoder{Encoding: kvevents.EncodingMap, HashBytes: true}
	ids := []int64{11, 12, 13, 14, 15, 16, 17, 18}
	send := func(b *kvevents.Batch) {
		pl, err := enc.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(slices.Clone(pl)); err != nil {
			t.Fatal(err)
		}
	}
	// A batch of another rank is skipped; until the subscription is up the
	// first batches may be missed and are replayed.
	send(&kvevents.Batch{HasDataParallelRank: true, DataParallelRank: 0, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: ids, BlockSize: 2}}})
	send(&kvevents.Batch{HasDataParallelRank: true, DataParallelRank: 1, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: ids[:6], BlockSize: 2}}})
	key := &Key{IDs: ids}
	out := []int32{0}
	deadline := time.Now().Add(60 * time.Second)
	for {
		fillRows(x, []shared.WorkerID{3}, []uint32{1}, nil, key, out)
		if out[0] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("overlap %d, stats %+v / %+v", out[0], sub.Stats(), p.Stats())
		}
		// Nudge: an empty batch makes a subscriber that missed everything replay.
		send(&kvevents.Batch{HasDataParallelRank: true, DataParallelRank: 1})
		time.Sleep(5 * time.Millisecond)
	}
	if tokens, exact := x.OverlapTokens(Candidate{ID: 3, Rank: 1}, nil, key); tokens != 6 || !exact {
		t.Fatalf("OverlapTokens = %d, %v; want 6 exact", tokens, exact)
	}
	if st := sub.Stats(); st.WrongRank != 1 || st.State != kvevents.StateLive {
		t.Fatalf("subscriber stats %+v", st)
	}
	cancel()
	sub.Wait()
}
