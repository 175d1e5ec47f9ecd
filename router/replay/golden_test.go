package replay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// The per-request output of the default configuration (no queue block, no
// request_classifier: nothing ever queues) is byte-identical to the output
// of the replay driver before it went through the router's admission API
// (Admit, Dispatch, FirstToken, Complete). The hashes were taken from the
// driver that called Router.Select directly; the default policy's were
// retaken when kv-cost began to read the engines' KV usage and waiting
// count (issue #12), which changes its choices, and again when the default
// became kv-affinity + min-cost (issue #14), and when simulated workers
// took shared.WorkerIDOf ids (issue #29): that output is the previous one
// with worker indexes permuted, which TestGoldenAsRows checks against the
// hashes of before.
func TestDefaultConfigOutputUnchanged(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	for _, c := range []struct {
		name, src string
		workers   int
		want      string
	}{
		{"default", seededDefault, 4, "61af6038cd9dd1612db710112e7321a60a069269d70f25800110285cbd776335"},
		{"rr", roundRobin, 4, "9a1bd7dabacf3aec050d63a4201cfd2f4dbc7c9bf32497a8bc1bf3a23986a482"},
		{"p2c", powerOfTwo, 3, "e2cc8f4f01cc8e62fb2beae71861766714bec940ee48dc63bc7060a680ba9932"},
	} {
		var buf bytes.Buffer
		run(t, loadPolicy(t, c.src), c.name, recs, c.workers, &buf)
		sum := sha256.Sum256(buf.Bytes())
		if got := hex.EncodeToString(sum[:]); got != c.want {
			t.Errorf("%s on %d workers: per-request sha256 %s, want %s", c.name, c.workers, got, c.want)
		}
	}
	var buf bytes.Buffer
	runDisagg(t, loadPolicy(t, seededDefault), recs, 3, 5, 1e9, &buf)
	sum := sha256.Sum256(buf.Bytes())
	if got, want := hex.EncodeToString(sum[:]), "a179a3db90469f8c15b827457c6c5772d073f88e235d8cf2bc4ab48287f2b4c7"; got != want {
		t.Errorf("default on 3P+5D: per-request sha256 %s, want %s", got, want)
	}
}

// A replay whose workers reach max_active_requests (so that requests wait
// in the queue and selections run over the narrowed candidates of the
// workers below capacity) repeats byte for byte within one process, where
// pooled scratch columns are reused between selections and runs. Before
// narrowed candidates kept their Slots column (TestNarrowedCandidatesKeep-
// TheirColumns in the router), their CACHE column could be what a pooled
// scratch held, and two such runs were seen to differ in overlap_blocks.
func TestQueuedReplayRepeats(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	src := seededDefault + `
queue {
  max_active_requests = 4
  class "c" {
    weight = 1
  }
}
`
	var first []byte
	for i := range 3 {
		var buf bytes.Buffer
		rep := run(t, loadPolicy(t, src), "default", recs, 4, &buf)
		if rep.Completed != 1000 || rep.Queue.P99 == 0 {
			t.Fatalf("run %d: %d completed, queue p99 %v ms; want 1000 completed and requests that waited", i, rep.Completed, rep.Queue.P99)
		}
		if i == 0 {
			first = buf.Bytes()
			continue
		}
		if !bytes.Equal(buf.Bytes(), first) {
			a, b := bytes.Split(first, []byte("\n")), bytes.Split(buf.Bytes(), []byte("\n"))
			for j := range min(len(a), len(b)) {
				if !bytes.Equal(a[j], b[j]) {
					t.Fatalf("run %d differs from run 0 at line %d:\n%s\n%s", i, j+1, a[j], b[j])
				}
			}
			t.Fatalf("run %d: %d lines, run 0: %d", i, len(b), len(a))
		}
	}
}
