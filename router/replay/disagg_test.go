package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
)

const seededDefault = "router { seed = 7 }\n"

// seededKVCost is the default policy before issue #14 (kv-cost +
// min-cost), for the tests measured with it: the prefix modes' belief
// accuracy, whose subject is not the policy.
const seededKVCost = `router { seed = 7 }
policy "kv-cost" {
  scorer "cost" { type = "kv-cost" }
  picker "pick" { type = "min-cost" }
}
worker_selection {
  aggregated = "kv-cost"
  prefill    = "kv-cost"
  decode     = "kv-cost"
}
`

// runDisagg replays recs on prefill + decode workers and returns the report
// and the driver's final state.
func runDisagg(t testing.TB, b *config.PolicyFile, recs []trace.Record, prefill, decode int, bandwidth float64, perReq *bytes.Buffer) (*report.Report, *driver) {
	t.Helper()
	o := Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs,
		PrefillWorkers: prefill, DecodeWorkers: decode, KVTransferBandwidth: bandwidth}
	if perReq != nil {
		o.PerRequest = perReq
	}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return rep, d
}

// checkBookingsReleased asserts that every worker's booked requests,
// prefill tokens and decode blocks are back to 0 in every replica (their
// own bookings and the others' mirrored ones) and no transfer is left.
func checkBookingsReleased(t *testing.T, d *driver) {
	t.Helper()
	for k, rep := range d.reps {
		for id, w := range rep.workers {
			if l := w.Load(true); l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 0 {
				t.Errorf("replica %d, worker %d (%s) still booked: %+v", k, id, w.Role, l)
			}
		}
	}
	if d.transfers.Len() != 0 {
		t.Errorf("%d KV transfers never submitted", d.transfers.Len())
	}
}

// TestDisaggArxivSample replays the arXiv sample on 4 prefill + 4 decode
// workers: every request completes through a prefill worker (ids 0–3) and,
// when it generates more than one token, a decode worker (ids 4–7); the
// bookings all return to 0; the first request's transfer is its 6,755
// prompt tokens × 131,072 B / 50 GB/s = 17.7078272 ms. A 1 GB/s link, with
// transfers of up to ≈1.3 s overlapping many later prefill events, must
// also complete everything.
func TestDisaggArxivSample(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	b := loadPolicy(t, seededDefault)
	for _, bw := range []float64{0, 1e9} {
		var buf bytes.Buffer
		rep, d := runDisagg(t, b, recs, 4, 4, bw, &buf)
		if rep.Requests != 1000 || rep.Completed != 1000 || rep.Rejected != 0 {
			t.Fatalf("bandwidth %g: requests %d completed %d rejected %d; want 1000/1000/0", bw, rep.Requests, rep.Completed, rep.Rejected)
		}
		if rep.Workers != 8 || rep.PrefillWorkers != 4 || rep.DecodeWorkers != 4 || len(rep.RequestsPerWorker) != 8 {
			t.Fatalf("workers %d (%d+%d), per worker %v", rep.Workers, rep.PrefillWorkers, rep.DecodeWorkers, rep.RequestsPerWorker)
		}
		checkBookingsReleased(t, d)

		var outs []Outcome
		for line := range strings.Lines(buf.String()) {
			var o Outcome
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, o)
		}
		if len(outs) != 1000 {
			t.Fatalf("%d per-request lines, want 1000", len(outs))
		}
		var prefill, decode [8]int
		for i, o := range outs {
			if o.Status != "ok" || o.Worker < 0 || o.Worker > 3 || o.TTFTMs <= 0 || o.E2EMs < o.TTFTMs {
				t.Fatalf("outcome %d: %+v", i, o)
			}
			prefill[o.Worker]++
			if recs[i].OutputLength <= 1 {
				if o.DecodeWorker != -1 || o.KVTransferMs != 0 {
					t.Fatalf("outcome %d (output %d) went to decode: %+v", i, recs[i].OutputLength, o)
				}
				continue
			}
			if o.DecodeWorker < 4 || o.DecodeWorker > 7 || o.E2EMs <= o.TTFTMs+o.KVTransferMs {
				t.Fatalf("outcome %d: %+v", i, o)
			}
			if bw == 0 {
				if want := report.Millis(KVTransferTime(recs[i].InputLength, DefaultKVTransferBandwidth)); o.KVTransferMs != want {
					t.Fatalf("outcome %d: kv_transfer_ms %v, want %v", i, o.KVTransferMs, want)
				}
			}
			decode[o.DecodeWorker]++
		}
		for id := range 8 {
			if n := prefill[id] + decode[id]; n != rep.RequestsPerWorker[id] {
				t.Errorf("worker %d: requests_per_worker %d, outcomes name it %d times", id, rep.RequestsPerWorker[id], n)
			}
		}
		if bw == 0 {
			if outs[0].InputLength != 6755 || outs[0].KVTransferMs != 17.708 {
				t.Errorf("first request: %d tokens, kv_transfer_ms %v; want 6755 and 17.708", outs[0].InputLength, outs[0].KVTransferMs)
			}
			t.Logf("4P+4D: TTFT p50 %.0f p99 %.0f ms, E2E p50 %.0f p99 %.0f ms, KV hit %.4f, transfer p50 %.1f ms",
				rep.TTFT.P50, rep.TTFT.P99, rep.E2E.P50, rep.E2E.P99, rep.KVHitRatio, rep.KVTransfer.P50)
		}
	}
	if got := KVTransferTime(6755, DefaultKVTransferBandwidth); got != 17707827*time.Nanosecond {
		t.Errorf("KVTransferTime(6755) = %v, want 17.707827ms", got)
	}
}

// TestDisaggSameSeedSameBytes: the disaggregated replay is as
// deterministic as the aggregated one.
func TestDisaggSameSeedSameBytes(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:400]
	var a, b bytes.Buffer
	runDisagg(t, loadPolicy(t, powerOfTwo), recs, 2, 3, 0, &a)
	runDisagg(t, loadPolicy(t, powerOfTwo), recs, 2, 3, 0, &b)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two runs with the same seed differ")
	}
	if n := bytes.Count(a.Bytes(), []byte(`"decode_worker":`)); n != 400 {
		t.Fatalf("%d lines with decode_worker, want 400", n)
	}
}

// TestDisaggOneRequest follows one 1000-token request with 3 output tokens
// and no prefix hashes through 1 prefill + 1 decode worker, by hand:
//
//	prefill, one 1000-token chunk: 0.5 + 0.005 + max(6.0, 1.5 + 0.021·1000)
//	         + 1.05e-6·1000·500 = 23.53 ms                      → TTFT 23.53 ms
//	transfer: 1000 × 131,072 B / 50 GB/s = 2.62144 ms           → at 26.15144 ms
//	decode:   two steps over 1001 and 1002 tokens,
//	         6.581076 + 6.581152 = 13.162228 ms                 → E2E 39.313668 ms
//
// A second request with one output token completes at its prefill and
// never reaches the decode worker.
func TestDisaggOneRequest(t *testing.T) {
	recs := []trace.Record{
		{Index: 0, InputLength: 1000, OutputLength: 3},
		{Index: 1, Arrival: time.Second, InputLength: 1000, OutputLength: 1},
	}
	var buf bytes.Buffer
	rep, d := runDisagg(t, loadPolicy(t, "router {\n  block_size = 16\n}\n"), recs, 1, 1, 0, &buf)
	checkBookingsReleased(t, d)
	want := `{"index":0,"arrival_ms":0,"worker":0,"decode_worker":1,"input_length":1000,"output_length":3,"overlap_blocks":0,"cached_tokens":0,"queue_ms":0,"ttft_ms":23.53,"kv_transfer_ms":2.621,"e2e_ms":39.314,"status":"ok"}
{"index":1,"arrival_ms":1000,"worker":0,"decode_worker":-1,"input_length":1000,"output_length":1,"overlap_blocks":0,"cached_tokens":0,"queue_ms":0,"ttft_ms":23.53,"e2e_ms":23.53,"status":"ok"}
`
	if buf.String() != want {
		t.Fatalf("per-request output\n%s\nwant\n%s", buf.String(), want)
	}
	if rep.RequestsPerWorker[0] != 2 || rep.RequestsPerWorker[1] != 1 || rep.KVTransfer.P50 != 2.621 {
		t.Fatalf("report %+v", rep)
	}
	if got := d.decode.Worker(0).Stats(); got.TransferredTokens != 1000 || got.PrefillTokens != 0 || got.DecodeTokens != 2 {
		t.Fatalf("decode worker stats %+v", got)
	}
}

// TestAggregatedLinesUnchanged: aggregated lines carry no disaggregated
// fields.
func TestAggregatedLinesUnchanged(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:50]
	var buf bytes.Buffer
	rep := run(t, loadPolicy(t, roundRobin), "rr", recs, 2, &buf)
	if s := buf.String(); strings.Contains(s, "decode_worker") || strings.Contains(s, "kv_transfer_ms") {
		t.Fatalf("aggregated output has disaggregated fields:\n%s", s)
	}
	if rep.PrefillWorkers != 0 || rep.DecodeWorkers != 0 || (rep.KVTransfer != report.Summary{}) {
		t.Fatalf("report %+v", rep)
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"prefill_workers", "decode_workers", "kv_transfer_ms"} {
		if bytes.Contains(raw, []byte(k)) {
			t.Errorf("aggregated report has %q: %s", k, raw)
		}
	}
}

func TestDisaggOptionErrors(t *testing.T) {
	b := loadPolicy(t, "")
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:3]
	for _, tt := range []struct {
		name string
		o    Options
		want string
	}{
		{"prefill only", Options{PrefillWorkers: 2}, "2 prefill and 0 decode workers"},
		{"decode only", Options{DecodeWorkers: 2}, "0 prefill and 2 decode workers"},
		{"with aggregated", Options{PrefillWorkers: 1, DecodeWorkers: 1, Workers: 8}, "8 aggregated workers"},
		{"negative bandwidth", Options{PrefillWorkers: 1, DecodeWorkers: 1, KVTransferBandwidth: -1}, "bandwidth -1"},
		{"fleet too large", Options{PrefillWorkers: 4000, DecodeWorkers: 97}, "4000 prefill and 97 decode workers, want at most 4096 together"},
		{"prefill too large", Options{PrefillWorkers: MaxWorkers + 1, DecodeWorkers: 1}, "4097 prefill and 1 decode workers"},
		{"sum overflows int", Options{PrefillWorkers: math.MaxInt, DecodeWorkers: math.MaxInt}, "want at most 4096 together"},
		{"aggregated too large", Options{Workers: MaxWorkers + 1}, "4097 workers, want 1 to 4096"},
		{"aggregated none", Options{Workers: 0}, "0 workers, want 1 to 4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.Roles, o.BlockSize, o.Records = b.Roles, b.BlockSize, recs
			_, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// BenchmarkReplayDisaggLatency times a whole replay of the arXiv sample
// (1,000 requests) on 4 prefill + 4 decode workers with a 2 ms decision
// latency for every policy: each first hop waits in the driver's start
// heap and each decode hop in its transfer heap.
func BenchmarkReplayDisaggLatency(b *testing.B) {
	recs := readTrace(b, "mooncake_arxiv_trace_first1000.jsonl")
	for b.Loop() {
		pf := loadPolicy(b, seededDefault)
		lat := make(map[string]time.Duration)
		for _, p := range pf.Roles {
			lat[p.Name] = 2 * time.Millisecond
		}
		o := Options{Roles: pf.Roles, BlockSize: pf.BlockSize, Records: recs, PrefillWorkers: 4, DecodeWorkers: 4,
			DecisionLatency: DecisionLatency{Policies: lat}}
		if _, err := Run(context.Background(), o); err != nil {
			b.Fatal(err)
		}
	}
}
