package prefix

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"github.com/switchyard-router/switchyard/router/kvevents"
)

// listed is an EngineBlock as the tests compare it: the engine's value
// as text (a decimal int or hex bytes), its tier and counts.
type listed struct {
	hash            string
	cpu, held       bool
	copies          uint32
	folded, aliased bool
}

func (l listed) String() string { return fmt.Sprintf("%+v", struct{ listed }{l}) }

func names(bs []EngineBlock) []listed {
	out := make([]listed, 0, len(bs))
	for _, b := range bs {
		l := listed{cpu: b.CPU, held: b.Held, copies: b.Copies, folded: b.Folded, aliased: b.Aliased}
		switch {
		case b.Folded:
			l.hash = fmt.Sprintf("fold %d", b.Hash)
		case b.Form == kvevents.HashNegative:
			l.hash = fmt.Sprint(int64(b.Hash))
		case b.Form == kvevents.HashBytes:
			l.hash = fmt.Sprintf("%x", b.Bytes())
		default:
			l.hash = fmt.Sprint(b.Hash)
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b listed) int {
		if c := bytes.Compare([]byte(a.hash), []byte(b.hash)); c != 0 {
			return c
		}
		if a.cpu != b.cpu {
			if a.cpu {
				return 1
			}
			return -1
		}
		return 0
	})
	return out
}

func listAll(p *Precise) []EngineBlock {
	bs, _ := p.EngineBlocks(0, 0, nil)
	return bs
}

func wantListed(t *testing.T, what string, got []EngineBlock, want ...listed) {
	t.Helper()
	g := names(got)
	w := names(nil)
	w = append(w, want...)
	slices.SortFunc(w, func(a, b listed) int {
		if c := bytes.Compare([]byte(a.hash), []byte(b.hash)); c != 0 {
			return c
		}
		if a.cpu != b.cpu {
			if a.cpu {
				return 1
			}
			return -1
		}
		return 0
	})
	if !slices.Equal(g, w) {
		t.Fatalf("%s: listed\n%v\nwant\n%v", what, g, w)
	}
}

// A precise index lists its blocks by the engine's own hashes, per tier,
// as each engine's events name them:
//   - vLLM's default int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1:
//     the low 64 bits, up to 2^64-1), with a duplicate copy (vLLM does not
//     deduplicate), and an offloading connector's tokenless CPU store of
//     the same block by its 32-byte bytes hash (test_kv_snapshot_bootstrap
//     test_offload_bytes_resolve_integer_gpu_hash): the GPU entry is the
//     int, the CPU one the 32 bytes;
//   - vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 32-byte hashes and
//     parents, listed whole, and a removal by bytes;
//   - SGLang's signed 64-bit page hashes (hash_str_to_int64), one negative;
//   - bytes of 2 and of 40 bytes (no engine sends those: the short kept
//     exactly, the wide one by its fold, marked).
func TestEngineBlocksNames(t *testing.T) {
	raw := sha256.Sum256([]byte("block 1"))
	low := binary.BigEndian.Uint64(raw[24:])
	t.Run("vLLM int GPU, bytes CPU", func(t *testing.T) {
		x := New(4)
		_ = x.AddWorker(cand(1), 100)
		p := x.Precise(cand(1))
		p.MarkLive()
		gpu := vllmStored{hashes: []uint64{1<<64 - 1, low}, tokens: seq(0, 8), blockSize: 4, medium: "GPU"}
		dup := vllmStored{hashes: []uint64{1<<64 - 1}, tokens: seq(0, 4), blockSize: 4, medium: "GPU"}
		cpu := vllmStored{hashBytes: [][]byte{raw[:]}, tokens: []int64{}, blockSize: 0, medium: "CPU"}
		applyWire(t, p, vllmBatch(gpu.encode(nil), dup.encode(nil), cpu.encode(nil)))
		wantListed(t, "stored", listAll(p),
			listed{hash: "18446744073709551615", held: true, copies: 2},
			listed{hash: fmt.Sprint(low), held: true, copies: 1},
			listed{hash: fmt.Sprintf("%x", raw), cpu: true, held: true, copies: 1})
		applyWire(t, p, vllmBatch(vllmRemoved(nil, "GPU", 0, 1<<64-1, low)))
		wantListed(t, "one copy of each GPU block removed", listAll(p),
			listed{hash: "18446744073709551615", held: true, copies: 1},
			listed{hash: fmt.Sprintf("%x", raw), cpu: true, held: true, copies: 1})
		// A replica's snapshot carries folds only.
		c, _ := x.Export(cand(1))
		y := New(4)
		_ = y.AddWorker(cand(1), 100)
		q := y.Precise(cand(1))
		if ok, precise := y.Import(cand(1), c); !ok || !precise {
			t.Fatalf("Import: %v %v", ok, precise)
		}
		wantListed(t, "imported", listAll(q),
			listed{hash: "fold 18446744073709551615", held: true, copies: 1, folded: true},
			listed{hash: fmt.Sprintf("fold %d", low), cpu: true, held: true, copies: 1, folded: true})
		p.Clear()
		if bs, at := p.EngineBlocks(0, 0, nil); len(bs) != 0 || !at.Done || at.Resets != 1 {
			t.Fatalf("after Clear: %v, %+v", names(bs), at)
		}
	})
	t.Run("vLLM bytes", func(t *testing.T) {
		x := New(4)
		_ = x.AddWorker(cand(1), 100)
		p := x.Precise(cand(1))
		p.MarkLive()
		h2 := sha256.Sum256([]byte("block 2"))
		wide := bytes.Repeat([]byte{0xee}, 40)
		first := vllmStored{hashBytes: [][]byte{raw[:]}, tokens: seq(0, 4), blockSize: 4, medium: "GPU"}
		second := vllmStored{hashBytes: [][]byte{h2[:], {0xab, 0xcd}, wide}, parentBytes: raw[:], tokens: seq(4, 12), blockSize: 4, medium: "GPU"}
		applyWire(t, p, vllmBatch(first.encode(nil), second.encode(nil)))
		if got, _ := x.OverlapTokens(cand(1), nil, &Key{IDs: seq(0, 16)}); got != 16 {
			t.Fatalf("overlap %d, want the 4 blocks keyed through the bytes parents", got)
		}
		wantListed(t, "stored", listAll(p),
			listed{hash: fmt.Sprintf("%x", raw), held: true, copies: 1},
			listed{hash: fmt.Sprintf("%x", h2), held: true, copies: 1},
			listed{hash: "abcd", held: true, copies: 1},
			listed{hash: fmt.Sprintf("fold %d", kvevents.FoldHash(wide)), held: true, copies: 1, folded: true})
		applyWire(t, p, vllmBatch(mp{}.arr(4).str("BlockRemoved").arr(1).bin(h2[:]).str("GPU").int(0)))
		wantListed(t, "h2 removed", listAll(p),
			listed{hash: fmt.Sprintf("%x", raw), held: true, copies: 1},
			listed{hash: "abcd", held: true, copies: 1},
			listed{hash: fmt.Sprintf("fold %d", kvevents.FoldHash(wide)), held: true, copies: 1, folded: true})
	})
	t.Run("SGLang signed", func(t *testing.T) {
		x := New(4)
		_ = x.AddWorker(cand(1), 100)
		p := x.Precise(cand(1))
		p.MarkLive()
		// SGLang's positional BlockStored [type, block_hashes,
		// parent_block_hash, token_ids, block_size, lora_id] in its
		// array_like batch [ts, events, attn_dp_rank].
		ev := mp{}.arr(6).str("BlockStored").arr(2).int(-5).int(7).nil().ints(seq(0, 8)).int(4).nil()
		applyWire(t, p, vllmBatch(ev))
		wantListed(t, "stored", listAll(p),
			listed{hash: "-5", held: true, copies: 1},
			listed{hash: "7", held: true, copies: 1})
	})
}

// A block the engine stores under a second hash that the router keys as
// the same block (equal tokens and extra keys) is listed once, under the
// latest hash, marked aliased.
func TestEngineBlocksAliased(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 100)
	p := x.Precise(cand(1))
	p.MarkLive()
	a := vllmStored{hashes: []uint64{10}, tokens: seq(0, 4), blockSize: 4, medium: "GPU"}
	b := vllmStored{hashes: []uint64{11}, tokens: seq(0, 4), blockSize: 4, medium: "GPU"}
	applyWire(t, p, vllmBatch(a.encode(nil)))
	wantListed(t, "one name", listAll(p), listed{hash: "10", held: true, copies: 1})
	applyWire(t, p, vllmBatch(b.encode(nil)))
	wantListed(t, "two names", listAll(p), listed{hash: "11", held: true, copies: 2, aliased: true})
}

// A listing in calls of n slots sees every block once, each call holding
// the lock for its n slots only, and ends Done.
func TestEngineBlocksChunked(t *testing.T) {
	x := New(4)
	_ = x.AddWorker(cand(1), 1000)
	p := x.Precise(cand(1))
	p.MarkLive()
	var hashes []uint64
	for i := range 100 {
		hashes = append(hashes, uint64(1000+i))
	}
	applyWire(t, p, vllmBatch(vllmStored{hashes: hashes, tokens: seq(0, 400), blockSize: 4, medium: "GPU"}.encode(nil)))
	applyWire(t, p, vllmBatch(vllmRemoved(nil, "GPU", 0, hashes[10:20]...)))
	all := listAll(p)
	if len(all) != 90 {
		t.Fatalf("%d blocks listed, want 90", len(all))
	}
	for _, n := range []int{1, 7, 64} {
		var got []EngineBlock
		at := EngineListing{}
		calls := 0
		for !at.Done {
			got, at = p.EngineBlocks(at.Next, n, got)
			calls++
			if calls > 1000 {
				t.Fatal("the listing does not end")
			}
		}
		if !slices.Equal(names(got), names(all)) {
			t.Errorf("n=%d: the chunked listing differs from the whole one", n)
		}
		if want := (100 + n - 1) / n; calls != want {
			t.Errorf("n=%d: %d calls, want %d (100 slots)", n, calls, want)
		}
	}
}

// The per-tier names fit in the slot's padding: a slot stays 64 bytes.
func TestSlotStateSize(t *testing.T) {
	if n := unsafe.Sizeof(slotState{}); n != 64 {
		t.Fatalf("slotState is %d bytes, want 64", n)
	}
}
