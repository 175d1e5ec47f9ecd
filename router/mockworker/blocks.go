package mockworker

import (
	"bufio"
	"net/http"
	"slices"
	"strconv"
)

// cachedBlock is one hash the engine's prefix cache holds and its cached
// copies (sim.Worker.CachedBlocks).
type cachedBlock struct {
	hash   uint64
	copies int
}

// blockList is a rank's cache as GET /debug/kv_blocks shows it.
type blockList struct {
	blocks []cachedBlock // sorted by hash
	// evicted counts the cached blocks evicted since the engine started
	// (sim.Stats.EvictedBlocks).
	evicted int64
}

// cachedBlocks asks the engine goroutine for the blocks its cache holds
// now: the state after every change it has published (it publishes each
// change's KV events before taking another command). Empty once the
// engine stopped.
func (e *engine) cachedBlocks() blockList {
	reply := make(chan blockList, 1)
	select {
	case e.lists <- reply:
	case <-e.done:
		return blockList{}
	}
	select {
	case l := <-reply:
		return l
	case <-e.done:
		return blockList{}
	}
}

// listBlocks is cachedBlocks' work, on the engine goroutine.
func (e *engine) listBlocks() blockList {
	var l []cachedBlock
	e.w.CachedBlocks(func(h uint64, n int) { l = append(l, cachedBlock{h, n}) })
	slices.SortFunc(l, func(a, b cachedBlock) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	return blockList{blocks: l, evicted: e.w.Stats().EvictedBlocks}
}

// handleKVBlocks serves GET /debug/kv_blocks, the mock's own view of its
// prefix cache (no engine has this endpoint): per data-parallel rank, by
// rank, every block hash the cache holds, taken from the simulated
// engine's cache itself, not from its KV events, so that a consumer of
// the events (a router's belief) can be checked against what the engine
// holds:
//
//	{"ranks": [{"data_parallel_rank": 0, "block_size": 16, "evicted_blocks": 5,
//	            "blocks": [{"hash": 1234, "medium": "GPU", "copies": 1}, ...]}, ...]}
//
// hash is the value the KV events carry for the block (vLLM: the low 64
// bits of its hash, unsigned; SGLang: signed), medium is always "GPU"
// (the mock has no CPU tier), copies the cached copies of the hash (vLLM
// does not deduplicate; always 1 with SGLang), blocks sorted by hash;
// evicted_blocks counts the cached blocks the rank has evicted since it
// started.
// Each rank's list is taken between two of its engine steps, after the
// KV events of every change so far were published. The body is linear in
// the cache's size (at most Sim.TotalKVBlocks blocks per rank).
func (s *Server) handleKVBlocks(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"ranks":[`)
	var buf []byte
	for i, e := range s.engines {
		if i > 0 {
			bw.WriteByte(',')
		}
		l := e.cachedBlocks()
		buf = append(buf[:0], `{"data_parallel_rank":`...)
		buf = strconv.AppendInt(buf, int64(e.rank), 10)
		buf = append(buf, `,"block_size":`...)
		buf = strconv.AppendInt(buf, int64(s.cfg.Sim.BlockSize), 10)
		buf = append(buf, `,"evicted_blocks":`...)
		buf = strconv.AppendInt(buf, l.evicted, 10)
		buf = append(buf, `,"blocks":[`...)
		bw.Write(buf)
		for j, b := range l.blocks {
			buf = buf[:0]
			if j > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"hash":`...)
			if s.cfg.Engine == EngineSGLang {
				buf = strconv.AppendInt(buf, int64(b.hash), 10)
			} else {
				buf = strconv.AppendUint(buf, b.hash, 10)
			}
			buf = append(buf, `,"medium":"GPU","copies":`...)
			buf = strconv.AppendInt(buf, int64(b.copies), 10)
			buf = append(buf, '}')
			bw.Write(buf)
		}
		bw.WriteString(`]}`)
	}
	bw.WriteString("]}\n")
	_ = bw.Flush()
}
