package replay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"testing"
)

// asRows rewrites per-request output so that each worker index becomes
// the worker's candidate row (its position in ascending fleet id order,
// indexesByID), the index the replay gave workers when fleet ids were
// 0..N-1. Simulated workers are identical, so a replay that differs only
// in its workers' ids gives the same output once so rewritten: this is
// how the golden hashes below were carried over from the 0..N-1 ids to
// shared.WorkerIDOf ids without being merely retaken.
func asRows(t *testing.T, out []byte, first, decode []int) []byte {
	t.Helper()
	rowOf := func(order []int, x int) int {
		if x < 0 {
			return x
		}
		i := slices.Index(order, x)
		if i < 0 {
			t.Fatalf("worker %d is in none of %v", x, order)
		}
		if decode != nil && order[0] == decode[0] {
			return len(first) + i
		}
		return i
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var o Outcome
		if err := dec.Decode(&o); err != nil {
			t.Fatal(err)
		}
		o.Worker = rowOf(first, o.Worker)
		if decode != nil && o.DecodeWorker >= 0 {
			o.DecodeWorker = rowOf(decode, o.DecodeWorker)
		}
		if o.ShadowWorker != nil {
			w := rowOf(first, *o.ShadowWorker)
			o.ShadowWorker = &w
		}
		if err := enc.Encode(&o); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestGoldenAsRows: the outputs of TestDefaultConfigOutputUnchanged, with
// worker indexes rewritten as candidate rows, hash to the golden values
// the replay had when a worker's fleet id was its index.
func TestGoldenAsRows(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	for _, c := range []struct {
		name, src string
		workers   int
		old       string
	}{
		{"default", seededDefault, 4, "2f25e6f14ba0697f6ddbc40fcd49564f053e46d04f3c43493d63e9bbc20b1c92"},
		{"rr", roundRobin, 4, "3bcb69fea63679042bf867bad9b94b64b63515c45bf23c6fa16dfc833af9512f"},
		{"p2c", powerOfTwo, 3, "d4f4d1c268ec83d5b2702c719aba52ad8c852a40fec2208ca76ced348f907f7b"},
	} {
		var buf bytes.Buffer
		run(t, loadPolicy(t, c.src), c.name, recs, c.workers, &buf)
		if got := sha(asRows(t, buf.Bytes(), indexesByID("sim-", 0, c.workers), nil)); got != c.old {
			t.Errorf("%s on %d workers, as rows: per-request sha256 %s, want %s", c.name, c.workers, got, c.old)
		}
	}
	var buf bytes.Buffer
	runDisagg(t, loadPolicy(t, seededDefault), recs, 3, 5, 1e9, &buf)
	got := sha(asRows(t, buf.Bytes(), indexesByID("prefill-", 0, 3), indexesByID("decode-", 3, 5)))
	if want := "5e04bc35b20b7dc8547b2f910003dfbfe87b12fc6080df1d5597b7ad3f4c5611"; got != want {
		t.Errorf("default on 3P+5D, as rows: per-request sha256 %s, want %s", got, want)
	}
}
