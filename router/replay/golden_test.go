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
// driver that called Router.Select directly.
func TestDefaultConfigOutputUnchanged(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	for _, c := range []struct {
		name, src string
		workers   int
		want      string
	}{
		{"default", seededDefault, 4, "b301ee90155993ee3f030373ff9592200a5c680e6ed97cfd74a96e1b9d53749b"},
		{"rr", roundRobin, 4, "3bcb69fea63679042bf867bad9b94b64b63515c45bf23c6fa16dfc833af9512f"},
		{"p2c", powerOfTwo, 3, "d4f4d1c268ec83d5b2702c719aba52ad8c852a40fec2208ca76ced348f907f7b"},
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
	if got, want := hex.EncodeToString(sum[:]), "f08a9374152f6ffbbdc3e680e305e969dd37cdbee0715a71e899b5a83817e4e9"; got != want {
		t.Errorf("default on 3P+5D: per-request sha256 %s, want %s", got, want)
	}
}
