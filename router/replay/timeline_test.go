package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// The timeline and the distributions agree with the report they come
// with: the flows add up to the report's KV hit and reference, the
// samples cover the simulated duration within the bound, everything has
// left the workers at the end, and the CDF's ends and middle are the
// report's minimum, p50 and maximum. Turning them on changes nothing
// else in the report or the per-request lines.
func TestTimelineAgreesWithTheReport(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	opts := func(timeline bool, per *bytes.Buffer) Options {
		b := loadPolicy(t, seededDefault) // seeded components start from their seed
		return Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: 4,
			Timeline: timeline, PerRequest: per}
	}
	var plainLines, lines bytes.Buffer
	plain, err := Run(context.Background(), opts(false, &plainLines))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), opts(true, &lines))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plainLines.Bytes(), lines.Bytes()) {
		t.Error("per-request lines differ with the timeline on")
	}
	tl := rep.Timeline
	if tl == nil || rep.Distributions == nil {
		t.Fatal("no timeline or distributions with Options.Timeline")
	}
	if plain.Timeline != nil || plain.Distributions != nil {
		t.Error("timeline without Options.Timeline")
	}
	n := len(tl.RouterQueue)
	if n == 0 || n > report.MaxTimelineSamples || len(tl.InFlight) != n || len(tl.EngineQueue) != n || len(tl.PromptTokens) != n ||
		len(tl.ReferenceHitTokens) != n {
		t.Fatalf("%d samples (in flight %d, engine queue %d, prompt %d): want 1 to %d, all the same", n, len(tl.InFlight),
			len(tl.EngineQueue), len(tl.PromptTokens), report.MaxTimelineSamples)
	}
	if covered := float64(n) * tl.IntervalS; covered < rep.SimDurationS || covered-tl.IntervalS > rep.SimDurationS {
		t.Errorf("%d samples of %v s cover %v s; want the simulated %v s, less than one interval over", n, tl.IntervalS, covered, rep.SimDurationS)
	}
	sum := func(xs []int64) (s int64) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	if got := round4(float64(sum(tl.CachedTokens)) / float64(sum(tl.PromptTokens))); got != rep.KVHitRatio {
		t.Errorf("timeline KV hit %v, report %v", got, rep.KVHitRatio)
	}
	if got := round4(float64(sum(tl.ReferenceHitTokens)) / float64(sum(tl.ReferencePromptTokens))); got != rep.KVHitReference {
		t.Errorf("timeline KV reference %v, report %v", got, rep.KVHitReference)
	}
	var maxInFlight int32
	for k, row := range tl.InFlight {
		if len(row) != rep.Workers {
			t.Fatalf("sample %d: %d workers, want %d", k, len(row), rep.Workers)
		}
		for _, v := range row {
			maxInFlight = max(maxInFlight, v)
		}
		if tl.RouterQueue[k] != 0 {
			t.Fatalf("sample %d: %d in the router's queue without a queue block", k, tl.RouterQueue[k])
		}
	}
	for w, v := range tl.InFlight[n-1] {
		if v != 0 || tl.EngineQueue[n-1] != 0 {
			t.Errorf("last sample: worker %d has %d in flight, engines %d waiting; want 0", w, v, tl.EngineQueue[n-1])
		}
	}
	if maxInFlight < 2 {
		t.Errorf("at most %d in flight on a worker; the arXiv sample on 4 workers runs many at once", maxInFlight)
	}
	cdf := rep.Distributions.TTFT
	if len(cdf) != report.DistributionPoints+1 || cdf[report.DistributionPoints/2] != rep.TTFT.P50 || cdf[len(cdf)-1] < rep.TTFT.P99 ||
		cdf[198] != rep.TTFT.P99 {
		t.Errorf("TTFT CDF of %d points: middle %v, 99%% %v, last %v; want 201 points, p50 %v, p99 %v", len(cdf),
			cdf[min(len(cdf)-1, report.DistributionPoints/2)], cdf[min(len(cdf)-1, 198)], cdf[len(cdf)-1], rep.TTFT.P50, rep.TTFT.P99)
	}
	var maxE2E float64
	sc := bufio.NewScanner(&lines)
	for sc.Scan() {
		var o Outcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		maxE2E = math.Max(maxE2E, o.E2EMs)
	}
	if e := rep.Distributions.E2E; e[len(e)-1] != maxE2E {
		t.Errorf("E2E CDF ends at %v, the longest request took %v", e[len(e)-1], maxE2E)
	}
}

// Merging keeps flows whole and states at their interval's end.
func TestTimelineMerges(t *testing.T) {
	tl := newTimeline(1)
	const steps = 3 * report.MaxTimelineSamples
	for k := range steps {
		at := time.Duration(k) * firstTimelineInterval
		tl.arrival(at, 10, 1)
		tl.worker(at, 0, k, 0)
	}
	end := time.Duration(steps-1) * firstTimelineInterval
	res := tl.result(end)
	if len(res.ReferencePromptTokens) > report.MaxTimelineSamples || res.IntervalS != 4*firstTimelineInterval.Seconds() {
		t.Fatalf("%d samples of %v s; want at most %d of 0.4 s", len(res.ReferencePromptTokens), res.IntervalS, report.MaxTimelineSamples)
	}
	var prompt, hit int64
	for k := range res.ReferencePromptTokens {
		prompt += res.ReferencePromptTokens[k]
		hit += res.ReferenceHitTokens[k]
		if k < len(res.ReferencePromptTokens)-1 && res.ReferencePromptTokens[k] != 40 {
			t.Fatalf("sample %d: %d prompt tokens, want 4 arrivals of 10", k, res.ReferencePromptTokens[k])
		}
		// The state at the end of sample k: the last arrival before it
		// set the worker's count to its index.
		if want := int32(min(4*k+3, steps-1)); res.InFlight[k][0] != want {
			t.Fatalf("sample %d: %d in flight, want %d", k, res.InFlight[k][0], want)
		}
	}
	if prompt != 10*steps || hit != steps {
		t.Errorf("flows %d prompt, %d hit after merging; want %d and %d", prompt, hit, 10*steps, steps)
	}
}

// Goodput counts the completed requests that met every target, over all
// requests; TPOT is (E2E − TTFT) / (output − 1) per request.
func TestGoodputAndTPOT(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:300]
	b := loadPolicy(t, seededDefault)
	slo := report.SLO{TTFT: 400 * time.Millisecond, TPOT: 20 * time.Millisecond}
	var lines bytes.Buffer
	rep, err := Run(context.Background(), Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: recs, Workers: 4, SLO: slo, PerRequest: &lines})
	if err != nil {
		t.Fatal(err)
	}
	met, failed := 0, 0
	var tpots []float64
	sc := bufio.NewScanner(&lines)
	for sc.Scan() {
		var o Outcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		tpot := 0.0
		if o.OutputLength > 1 {
			tpot = (o.E2EMs - o.TTFTMs) / float64(o.OutputLength-1)
			tpots = append(tpots, round3(tpot))
		}
		if o.Status == "ok" && o.TTFTMs <= 400 && tpot <= 20 {
			met++
		} else {
			failed++
		}
	}
	if met == 0 || failed == 0 {
		t.Fatalf("%d met, %d failed: pick targets that split the requests", met, failed)
	}
	want := &report.Goodput{SLO: "ttft=400ms,tpot=20ms", Met: met, Share: round4(float64(met) / 300), PerS: round3(float64(met) / rep.SimDurationS)}
	if *rep.Goodput != *want {
		t.Errorf("goodput %+v, want %+v", *rep.Goodput, *want)
	}
	if got := summarize(tpots); got != rep.TPOT {
		t.Errorf("TPOT %+v, want %+v from the per-request lines", rep.TPOT, got)
	}
	if rep.ITL.P50 <= 0 || rep.ITL.P99 < rep.ITL.P50 || rep.OutputTokensPerS <= 0 {
		t.Errorf("ITL %+v, output %v tok/s: want positive, ordered", rep.ITL, rep.OutputTokensPerS)
	}
}

// After the last arrival the replay runs its workers until they are idle;
// the requests still on them are in flight until they complete, so the
// timeline's samples after the last arrival count them. An overloaded
// single worker (the arXiv sample's 1,000 requests arrive in under 3
// minutes, the last completes minutes later) shows each sample's count
// of requests that arrived before its end and completed at or after it.
func TestTimelineInFlightAfterTheLastArrival(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	b := loadPolicy(t, seededDefault)
	var lines bytes.Buffer
	rep, err := Run(context.Background(), Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: recs, Workers: 1, Timeline: true, PerRequest: &lines})
	if err != nil {
		t.Fatal(err)
	}
	var outs []Outcome
	var lastArrival float64
	sc := bufio.NewScanner(&lines)
	for sc.Scan() {
		var o Outcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o)
		lastArrival = math.Max(lastArrival, o.ArrivalMs)
	}
	tl := rep.Timeline
	checked := 0
	for k, row := range tl.InFlight {
		end := float64(k+1) * tl.IntervalS * 1000 // ms since the first arrival
		if end <= lastArrival {
			continue
		}
		want := 0
		for _, o := range outs {
			if o.Status == "ok" && o.ArrivalMs < end && o.ArrivalMs+o.E2EMs >= end {
				want++
			}
		}
		if int(row[0]) != want {
			t.Errorf("sample %d (ends %.0f ms, after the last arrival at %.0f ms): %d in flight, want %d", k, end, lastArrival, row[0], want)
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("only %d samples after the last arrival; want an overloaded worker that runs long after it", checked)
	}
}
