package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// Progress is a display hook: a replay with it writes the same
// per-request bytes and the same report as one without it (but for the
// wall-clock fields, which differ between any two runs), and the hook
// sees counts that only grow, ending at every request retired.
func TestProgressDoesNotChangeOutputs(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	src := seededDefault + `
queue {
  max_active_requests = 4
  class "c" {
    weight = 1
  }
}
`
	replayOnce := func(progress func(Progress)) ([]byte, []byte) {
		b := loadPolicy(t, src) // each run its own: seeded pickers start from their seed
		var perReq bytes.Buffer
		o := Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
			Records: recs, Workers: 4, PerRequest: &perReq, Queue: b.Queue, Progress: progress}
		rep, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		rep.WallS, rep.DecisionsPerS, rep.SimRequestsPerS = 0, 0, 0
		js, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		return perReq.Bytes(), js
	}
	plainReq, plainRep := replayOnce(nil)
	var seen []Progress
	hookReq, hookRep := replayOnce(func(p Progress) { seen = append(seen, p) })
	if !bytes.Equal(plainReq, hookReq) {
		t.Errorf("per-request output differs with Progress set (%d bytes without, %d with)", len(plainReq), len(hookReq))
	}
	if !bytes.Equal(plainRep, hookRep) {
		t.Errorf("report differs with Progress set:\nwithout %s\nwith    %s", plainRep, hookRep)
	}
	if len(seen) < 2 {
		t.Fatalf("Progress called %d times, want the periodic calls and the final one", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		p, q := seen[i-1], seen[i]
		if q.Retired < p.Retired || q.Arrived < p.Arrived || q.SimTime < p.SimTime || q.Retired > q.Arrived {
			t.Errorf("call %d: %+v after %+v: counts and time must only grow, retired <= arrived", i, q, p)
		}
	}
	var rep report.Report
	if err := json.Unmarshal(plainRep, &rep); err != nil {
		t.Fatal(err)
	}
	last := seen[len(seen)-1]
	if last.Retired != len(recs) || last.Arrived != len(recs) || last.Total != len(recs) {
		t.Errorf("final progress %+v, want %d retired, arrived and total", last, len(recs))
	}
	if last.SimTime.Seconds() <= 0 || last.SimTime.Seconds() > rep.SimDurationS+0.001 {
		t.Errorf("final SimTime %v, want in (0, sim_duration_s %.3f s]", last.SimTime, rep.SimDurationS)
	}
}

// BenchmarkReplayProgress is the cost of the Progress hook: the
// conversation trace through the default policy on 16 workers, without
// the hook and with one that reads the wall clock as router replay's
// printer does; "calls/op" is how often the hook ran in one replay.
// Compare the two with -count (BENCHMARKS.md, "Replay progress"). Run:
// go test -run='^$' -bench=ReplayProgress -count=6 ./router/replay/
func BenchmarkReplayProgress(b *testing.B) {
	recs := readTrace(b, "mooncake_conversation_trace.jsonl")
	var last time.Time
	calls := 0
	for _, c := range []struct {
		name string
		hook func(Progress)
	}{{"none", nil}, {"hook", func(Progress) { last = time.Now(); calls++ }}} {
		b.Run(c.name, func(b *testing.B) {
			calls = 0
			for b.Loop() {
				bundle := loadPolicy(b, "")
				o := Options{PolicyName: "default", Roles: bundle.Roles, BlockSize: bundle.BlockSize, TraceName: "t",
					Records: recs, Workers: 16, Progress: c.hook}
				if _, err := Run(context.Background(), o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
		})
	}
	_ = last
}
