package mockworker

import (
	"bytes"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/sim"
)

// kvBlocksBody is GET /debug/kv_blocks.
type kvBlocksBody struct {
	Ranks []struct {
		Rank      int `json:"data_parallel_rank"`
		BlockSize int `json:"block_size"`
		Evicted   int `json:"evicted_blocks"`
		Blocks    []struct {
			Hash   uint64 `json:"hash"`
			Medium string `json:"medium"`
			Copies int    `json:"copies"`
		} `json:"blocks"`
	} `json:"ranks"`
}

// kvBlocks reads url's /debug/kv_blocks as hash -> copies per rank,
// checking the fixed fields and the order.
func kvBlocks(t *testing.T, url string) []map[uint64]int {
	l, _ := kvBlocksEvicted(t, url)
	return l
}

// kvBlocksEvicted is kvBlocks and each rank's evicted_blocks.
func kvBlocksEvicted(t *testing.T, url string) ([]map[uint64]int, []int) {
	t.Helper()
	resp, err := http.Get(url + "/debug/kv_blocks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body kvBlocksBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/debug/kv_blocks: %d, %v", resp.StatusCode, err)
	}
	out := make([]map[uint64]int, len(body.Ranks))
	evicted := make([]int, len(body.Ranks))
	for i, r := range body.Ranks {
		evicted[i] = r.Evicted
		if r.Rank != i || r.BlockSize != 16 {
			t.Fatalf("rank entry %d: rank %d block size %d", i, r.Rank, r.BlockSize)
		}
		out[i] = map[uint64]int{}
		for j, b := range r.Blocks {
			if b.Medium != "GPU" || b.Copies < 1 || (j > 0 && b.Hash <= r.Blocks[j-1].Hash) {
				t.Fatalf("rank %d block %d: %+v (after %+v)", i, j, b, r.Blocks[max(j-1, 0)])
			}
			out[i][b.Hash] = b.Copies
		}
	}
	return out, evicted
}

// TestKVBlocks: /debug/kv_blocks lists the engine's cached blocks by the
// hashes its KV events carry, with their copies (a block-aligned prompt
// sent again holds two copies of its last block), per rank; and after
// random traffic that evicts, with LoRA and salted requests, the list
// equals the residency the engine's own KV events add up to (each
// BlockStored hash +1, each BlockRemoved -1).
func TestKVBlocks(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 64
	s, url := startServer(t, Config{Model: testModel, Sim: cfg, HashSeed: "0", DataParallelSize: 2, LoRA: []string{"ad"},
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsEncoding: kvevents.EncodingMap})
	if got := kvBlocks(t, url); len(got) != 2 || len(got[0]) != 0 || len(got[1]) != 0 {
		t.Fatalf("fresh engine: %v, want two empty ranks", got)
	}
	post0 := func(body map[string]any) { postRank(t, url, 0, body) }
	a := ids(1, 65) // 4 full blocks of 16 (seed0Hashes) and one token
	post0(map[string]any{"prompt": a, "max_tokens": 1})
	want := map[uint64]int{seed0Hashes[0]: 1, seed0Hashes[1]: 1, seed0Hashes[2]: 1, seed0Hashes[3]: 1}
	if got := kvBlocks(t, url); !maps.Equal(got[0], want) || len(got[1]) != 0 {
		t.Fatalf("after A on rank 0: %v, want rank 0 %v, rank 1 empty", got, want)
	}
	post0(map[string]any{"prompt": a[:64], "max_tokens": 1})
	want[seed0Hashes[3]] = 2
	if got := kvBlocks(t, url); !maps.Equal(got[0], want) {
		t.Fatalf("after A's 64 tokens again: %v, want rank 0 %v", got[0], want)
	}

	// Rank 1, followed from its start: random prompts sharing prefixes,
	// some on the adapter, some salted, enough to evict many times.
	pub, _ := s.KVEventsAddr(1)
	sub := subscribe(t, pub.String())
	send1 := func(body map[string]any) { postRank(t, url, 1, body) }
	// Probe until the subscription hears rank 1, then count from there:
	// a reset gives a known empty start.
	for i := 0; ; i++ {
		if i == 600 {
			t.Fatal("no KV event after 600 probes")
		}
		send1(map[string]any{"prompt": ids(500_000+17*i, 17), "max_tokens": 1})
		if _, ok := sub.next(100 * time.Millisecond); ok {
			break
		}
	}
	resp, err := http.Post(url+"/reset_prefix_cache", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sub.until("AllBlocksCleared", func(m kvMsg) bool {
		return len(m.events) == 1 && m.events[0].Kind == kvevents.AllBlocksCleared
	})
	_, before := kvBlocksEvicted(t, url)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 120 {
		body := map[string]any{"prompt": ids(1+1000*rng.IntN(6), 16+rng.IntN(300)), "max_tokens": 1 + rng.IntN(4)}
		switch i % 4 {
		case 1:
			body["model"] = "ad"
		case 2:
			body["cache_salt"] = "salt"
		}
		send1(body)
	}
	send1(map[string]any{"prompt": ids(900_000, 17), "max_tokens": 1}) // a marker
	fromEvents := map[uint64]int{}
	evictions := 0
	sub.until("the marker's store", func(m kvMsg) bool {
		marker := false
		for _, ev := range m.events {
			for _, h := range ev.BlockHashes {
				switch ev.Kind {
				case kvevents.BlockStored:
					fromEvents[h]++
				case kvevents.BlockRemoved:
					evictions++
					if fromEvents[h]--; fromEvents[h] == 0 {
						delete(fromEvents, h)
					}
				}
			}
			marker = marker || ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) > 0 && ev.TokenIDs[0] == 900_000
		}
		return marker
	})
	all, evicted := kvBlocksEvicted(t, url)
	got := all[1]
	if evictions < 64 || len(got) == 0 || !maps.Equal(got, fromEvents) {
		t.Fatalf("rank 1 after %d evictions: /debug/kv_blocks %d hashes, the events %d: equal %v",
			evictions, len(got), len(fromEvents), maps.Equal(got, fromEvents))
	}
	// Every BlockRemoved since the reset is an eviction (a reset evicts
	// nothing).
	if evicted[1]-before[1] != evictions || evicted[0] != 0 {
		t.Fatalf("evicted_blocks %v (before the traffic %v), want rank 0 0 and rank 1 %d more (its BlockRemoved since the reset)",
			evicted, before, evictions)
	}
}

// postRank posts body to url's completions endpoint pinned to rank.
func postRank(t *testing.T, url string, rank int, body map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(dpRankHeader, strconv.Itoa(rank))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("rank %d: status %d", rank, resp.StatusCode)
	}
}
