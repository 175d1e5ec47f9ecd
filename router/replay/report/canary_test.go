package report

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestWriteCanaryNoneCompleted: a side whose requests were all rejected
// has no latency (null in the JSON report); its stderr line says so
// rather than 0 ms, while the other side's figures are printed.
func TestWriteCanaryNoneCompleted(t *testing.T) {
	rep := &Report{Policy: "live", Canary: &CanaryReport{
		Canaries: map[string]CanaryConfig{"aggregated": {Policy: "live", Candidate: "trial", Weight: 0.1, Key: "session"}},
		Live: CanarySide{Requests: 9, Completed: 9, TTFT: Summary{P50: 120.5, P90: 300.25, N: 9},
			E2E: Summary{P50: 900, P90: 1500.04, N: 9}},
		Candidate: CanarySide{Requests: 1, Rejected: 1, Fallbacks: 1},
	}}
	var buf bytes.Buffer
	if err := WriteCanary(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := `router: live: canary "trial" for "live" (aggregated, weight 10.0%, key session)
router: live: canary live: 9 requests (0 rejected), TTFT p50/p90 120.5/300.2 ms, E2E p50/p90 900.0/1500.0 ms, fallbacks 0.0%
router: live: canary candidate: 1 requests (1 rejected), TTFT p50/p90 n/a (none completed), E2E p50/p90 n/a (none completed), fallbacks 100.0%
router: live: canary rollback would not fire
`
	if got := buf.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// The JSON report says null for the same side.
	b, err := json.Marshal(rep.Canary.Candidate)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"requests":1,"completed":0,"rejected":1,"fallbacks":1,"ttft_ms":null,"e2e_ms":null}`; string(b) != want {
		t.Errorf("JSON %s, want %s", b, want)
	}
}
