package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

// stream is recs as an Options.Trace.
func stream(recs []trace.Record) iter.Seq2[*trace.Record, error] {
	return func(yield func(*trace.Record, error) bool) {
		for i := range recs {
			if !yield(&recs[i], nil) {
				return
			}
		}
	}
}

// TestTraceStreamMatchesRecords replays the arXiv sample from Records and
// from a stream of the file (trace.FileRecords), aggregated and
// disaggregated, and checks the per-request lines are the same
// bytes and the reports the same figures; and that every request was
// retired: none is left in the driver.
func TestTraceStreamMatchesRecords(t *testing.T) {
	const file = tracesDir + "mooncake_arxiv_trace_first1000.jsonl"
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	// Not with a queue block: a queued request's overlap_blocks is not
	// repeatable today (it differs between two replays from Records).
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"aggregated", Options{BlockSize: 512, Workers: 4}},
		{"disaggregated", Options{BlockSize: 512, PrefillWorkers: 2, DecodeWorkers: 3}},
	} {
		var lines [2]bytes.Buffer
		var reps [2]*report.Report
		for k := range 2 {
			o := c.o
			o.Roles = loadPolicy(t, seededDefault).Roles // seeded components start from their seed
			o.PerRequest = &lines[k]
			if k == 0 {
				o.Records = recs
			} else {
				o.Trace = trace.FileRecords(file, trace.Mooncake)
			}
			rep, d, err := execute(context.Background(), o)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if len(d.reqs) != 0 || d.lo != len(recs) || d.next != len(recs) {
				t.Errorf("%s: %d requests left in the driver, %d retired, %d arrived; want 0, %d, %d",
					c.name, len(d.reqs), d.lo, d.next, len(recs), len(recs))
			}
			rep.WallS, rep.SimRequestsPerS, rep.DecisionsPerS = 0, 0, 0
			reps[k] = rep
		}
		if n := bytes.Count(lines[0].Bytes(), []byte("\n")); n != len(recs) || !bytes.Equal(lines[0].Bytes(), lines[1].Bytes()) {
			t.Errorf("%s: %d lines from Records; the stream's differ: %v", c.name, n, !bytes.Equal(lines[0].Bytes(), lines[1].Bytes()))
		}
		a, _ := json.Marshal(reps[0])
		b, _ := json.Marshal(reps[1])
		if !bytes.Equal(a, b) {
			t.Errorf("%s: reports differ:\nrecords %s\nstream  %s", c.name, a, b)
		}
		if reps[0].Completed == 0 || reps[0].Requests != len(recs) {
			t.Errorf("%s: %d of %d requests completed, want all requests counted and some completed", c.name, reps[0].Completed, reps[0].Requests)
		}
	}
}

// TestTraceStreamError: a stream's error ends the replay with it, and a
// trace that hashes 512-token blocks is refused for another block size.
func TestTraceStreamError(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	bad := errors.New("t.jsonl:301: broken line")
	pf := loadPolicy(t, seededDefault)
	var taken int
	o := Options{Roles: pf.Roles, BlockSize: 512, TraceName: "t.jsonl", Workers: 2, PerRequest: io.Discard,
		Trace: func(yield func(*trace.Record, error) bool) {
			for i := range 300 {
				taken++
				if !yield(&recs[i], nil) {
					return
				}
			}
			yield(nil, bad)
		}}
	if _, err := Run(context.Background(), o); !errors.Is(err, bad) || taken != 300 {
		t.Errorf("Run = %v after %d records, want %v after 300", err, taken, bad)
	}
	o.Trace, o.BlockSize = stream(recs), 16
	if _, err := Run(context.Background(), o); err == nil || err.Error() != "replay: t.jsonl hashes 512-token blocks; set router.block_size = 512 (have 16)" {
		t.Errorf("block size 16: %v", err)
	}
	o.Records, o.BlockSize = recs, 512
	if _, err := Run(context.Background(), o); err == nil {
		t.Error("both Records and Trace: no error")
	}
}

// BenchmarkReplayMemory replays the conversation trace repeated reps
// times (ids shifted so that repetitions share no block), streamed, with
// per-request lines, and reports the peak live heap (after a collection
// every 10,000 requests) in MB and per request, so that growth with the
// trace's length shows between the sizes (scripts/replay-memory.sh
// measures the whole command's resident memory).
func BenchmarkReplayMemory(b *testing.B) {
	base := readTrace(b, "mooncake_conversation_trace.jsonl")
	span := base[len(base)-1].Arrival - base[0].Arrival
	var maxID uint64
	for _, r := range base {
		for _, id := range r.HashIDs {
			maxID = max(maxID, id)
		}
	}
	pf := loadPolicy(b, seededDefault)
	for _, reps := range []int{1, 8} {
		b.Run(fmt.Sprintf("requests=%d", reps*len(base)), func(b *testing.B) {
			sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			var peak uint64
			long := func(yield func(*trace.Record, error) bool) {
				for k := range reps {
					for i, r := range base {
						if (k*len(base)+i)%10_000 == 0 {
							runtime.GC()
							metrics.Read(sample)
							peak = max(peak, sample[0].Value.Uint64())
						}
						r.Index = k*len(base) + i
						r.Arrival += time.Duration(k) * span
						r.HashIDs = slices.Clone(r.HashIDs)
						for j := range r.HashIDs {
							r.HashIDs[j] += uint64(k) * (maxID + 1)
						}
						if !yield(&r, nil) {
							return
						}
					}
				}
			}
			for b.Loop() {
				o := Options{Roles: pf.Roles, BlockSize: 512, Workers: DefaultWorkers, Trace: long, PerRequest: io.Discard}
				if _, err := Run(context.Background(), o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(peak)/1e6, "peak-live-MB")
			b.ReportMetric(float64(peak)/float64(reps*len(base)), "peak-live-B/req")
		})
	}
}
