package synth

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/trace"
)

// generate runs Generate and returns its requests and summary.
func generate(t *testing.T, p Params) ([]Request, Summary) {
	t.Helper()
	var reqs []Request
	sum, err := Generate(p, func(r Request) error {
		reqs = append(reqs, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return reqs, sum
}

// jsonl runs WriteJSONL and returns its output.
func jsonl(t *testing.T, p Params) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := WriteJSONL(&b, p); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDeterministic(t *testing.T) {
	p := DefaultParams()
	p.Requests = 3000
	a, b := jsonl(t, p), jsonl(t, p)
	if !bytes.Equal(a, b) {
		t.Fatal("two runs with the same parameters differ")
	}
	p.Seed = 2
	c := jsonl(t, p)
	if bytes.Equal(a, c) {
		t.Fatal("seeds 1 and 2 give the same trace")
	}
	if n := bytes.Count(c, []byte("\n")); n != 3000 {
		t.Fatalf("seed 2: %d lines, want 3000", n)
	}
}

// TestLinesParse reads the JSON lines back with package trace: every line
// parses, and each record is the request Generate made.
func TestLinesParse(t *testing.T) {
	p := DefaultParams()
	reqs, sum := generate(t, p)
	recs, err := trace.ReadMooncake(bytes.NewReader(jsonl(t, p)), "synthetic.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != p.Requests || len(reqs) != p.Requests || sum.Requests != p.Requests {
		t.Fatalf("%d records, %d requests, summary %d; want %d", len(recs), len(reqs), sum.Requests, p.Requests)
	}
	first := reqs[0].Arrival
	for i, rec := range recs {
		r := reqs[i]
		if rec.Arrival != r.Arrival-first || rec.InputLength != r.InputLength || rec.OutputLength != r.OutputLength ||
			!slices.Equal(rec.HashIDs, r.HashIDs) || rec.SessionID != r.SessionID {
			t.Fatalf("line %d: record %+v, generated %+v", rec.Line, rec, r)
		}
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("line %d: arrival %v before the previous line's %v", rec.Line, r.Arrival, reqs[i-1].Arrival)
		}
		if r.Arrival%time.Millisecond != 0 {
			t.Fatalf("line %d: arrival %v is not whole milliseconds", rec.Line, r.Arrival)
		}
		if r.InputLength > p.MaxPromptTokens || r.OutputLength > p.MaxOutputTokens || r.OutputLength < 1 {
			t.Fatalf("line %d: input %d, output %d out of bounds", rec.Line, r.InputLength, r.OutputLength)
		}
	}
	if sum.Last != reqs[len(reqs)-1].Arrival {
		t.Errorf("summary Last %v, last arrival %v", sum.Last, reqs[len(reqs)-1].Arrival)
	}
	// The defaults' documented span: about 10 minutes.
	if sum.Last < 8*time.Minute || sum.Last > 20*time.Minute {
		t.Errorf("the default trace spans %v, want about 10 minutes", sum.Last)
	}
	sessions := map[string]bool{}
	for _, r := range reqs {
		sessions[r.SessionID] = true
	}
	if len(sessions) != sum.Sessions {
		t.Errorf("%d session ids, summary says %d sessions", len(sessions), sum.Sessions)
	}
	if avg := float64(len(reqs)) / float64(sum.Sessions); avg < 2.5 {
		t.Errorf("%.2f requests per session: the sessions are hardly multi-turn", avg)
	}
}

// TestLine pins the line format: Mooncake's field order and spacing plus
// session_id.
func TestLine(t *testing.T) {
	got := string(appendLine(nil, Request{Arrival: 1203 * time.Millisecond, InputLength: 1100, OutputLength: 310,
		HashIDs: []uint64{0, 1, 17}, SessionID: "s4"}))
	want := `{"timestamp": 1203, "input_length": 1100, "output_length": 310, "hash_ids": [0, 1, 17], "session_id": "s4"}` + "\n"
	if got != want {
		t.Errorf("line\n%s want\n%s", got, want)
	}
}

// TestSystemPromptShares checks that every request starts with its system
// prompt's full blocks, that no other block has their ids, and that the
// prompts' shares of sessions follow the Zipf weights.
func TestSystemPromptShares(t *testing.T) {
	p := DefaultParams()
	p.Requests = 20_000
	reqs, sum := generate(t, p)
	systemID := map[uint64]bool{}
	for i, ids := range sum.SystemPromptIDs {
		if want := p.SystemPromptTokens[i] / 512; len(ids) != want {
			t.Fatalf("system prompt %d: %d ids, want %d full blocks", i, len(ids), want)
		}
		for _, id := range ids {
			if systemID[id] {
				t.Fatalf("id %d is in two system prompts", id)
			}
			systemID[id] = true
		}
	}
	count := make([]int, len(p.SystemPromptTokens))
	for _, r := range reqs {
		sys := sum.SystemPromptIDs[r.SystemPrompt]
		if !slices.Equal(r.HashIDs[:len(sys)], sys) {
			t.Fatalf("session %s turn %d: leading ids %v, want its system prompt's %v", r.SessionID, r.Turn, r.HashIDs[:len(sys)], sys)
		}
		for _, id := range r.HashIDs[len(sys):] {
			if systemID[id] {
				t.Fatalf("session %s turn %d: system prompt id %d past the system prompt", r.SessionID, r.Turn, id)
			}
		}
		if r.Turn == 0 {
			count[r.SystemPrompt]++
		}
	}
	var total float64
	for i := range count {
		total += 1 / float64(i+1)
	}
	for i, n := range count {
		share, want := float64(n)/float64(sum.Sessions), 1/float64(i+1)/total
		// About 4,700 sessions: the binomial standard deviation of a share
		// is under 0.8 points.
		if math.Abs(share-want) > 0.03 {
			t.Errorf("system prompt %d (%d tokens): %.1f%% of sessions, want %.1f%% (Zipf s=1)",
				i, p.SystemPromptTokens[i], 100*share, 100*want)
		}
	}
	if count[0] <= count[1] || count[1] <= count[len(count)-1] {
		t.Errorf("session counts per system prompt %v: not skewed towards the first", count)
	}
}

// TestTurnsExtendPreviousTurn checks, on the parsed trace, that every
// turn's prompt holds the previous prompt and answer and shares exactly
// the previous turn's full blocks with it, and that a session's own blocks
// appear in no other session.
func TestTurnsExtendPreviousTurn(t *testing.T) {
	p := DefaultParams()
	recs, err := trace.ReadMooncake(bytes.NewReader(jsonl(t, p)), "synthetic.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	_, sum := generate(t, p)
	systemID := map[uint64]bool{}
	for _, ids := range sum.SystemPromptIDs {
		for _, id := range ids {
			systemID[id] = true
		}
	}
	last := map[string]trace.Record{}
	owner := map[uint64]string{} // a non-system id's session
	var followUps, partial int
	for _, rec := range recs {
		prev, ok := last[rec.SessionID]
		if ok {
			followUps++
			if rec.InputLength <= prev.InputLength+prev.OutputLength {
				t.Fatalf("line %d: prompt %d tokens, not longer than the previous turn's prompt %d + answer %d",
					rec.Line, rec.InputLength, prev.InputLength, prev.OutputLength)
			}
			full := prev.InputLength / 512
			if !slices.Equal(rec.HashIDs[:full], prev.HashIDs[:full]) {
				t.Fatalf("line %d: leading %d ids %v, want the previous turn's full blocks %v",
					rec.Line, full, rec.HashIDs[:full], prev.HashIDs[:full])
			}
			if full < len(prev.HashIDs) {
				partial++
			}
			for _, id := range rec.HashIDs[full:] {
				if slices.Contains(prev.HashIDs, id) {
					t.Fatalf("line %d: id %d of block %d reuses a block of the previous turn that was partial or another block",
						rec.Line, id, slices.Index(rec.HashIDs, id))
				}
			}
		}
		for _, id := range rec.HashIDs {
			if systemID[id] {
				continue
			}
			if s, ok := owner[id]; ok && s != rec.SessionID {
				t.Fatalf("line %d: id %d of session %s is also in session %s", rec.Line, id, rec.SessionID, s)
			}
			owner[id] = rec.SessionID
		}
		last[rec.SessionID] = rec
	}
	if followUps < p.Requests/2 {
		t.Errorf("%d of %d requests are follow-up turns", followUps, p.Requests)
	}
	if partial < followUps*9/10 {
		t.Errorf("only %d of %d follow-ups came after a prompt with a partial last block: the check above tested little", partial, followUps)
	}
}

// TestBursts checks that sessions start BurstFactor times as often in the
// bursts as in calm periods, and that more requests arrive per second in
// bursts.
func TestBursts(t *testing.T) {
	p := DefaultParams()
	p.Requests = 30_000
	reqs, sum := generate(t, p)
	if len(sum.Bursts) < 10 {
		t.Fatalf("%d bursts in %v", len(sum.Bursts), sum.Last)
	}
	inBurst := func(at time.Duration) bool {
		for _, b := range sum.Bursts {
			if at >= b.Start && at < b.End {
				return true
			}
		}
		return false
	}
	var burstTime time.Duration
	for i, b := range sum.Bursts {
		if b.End <= b.Start || (i > 0 && b.Start < sum.Bursts[i-1].End) {
			t.Fatalf("bursts %d: %+v: empty or overlapping the previous one", i, b)
		}
		burstTime += min(b.End, sum.Last) - b.Start
	}
	calmTime := sum.Last - burstTime
	var startsBurst, startsCalm, reqsBurst, reqsCalm float64
	for _, r := range reqs {
		b := inBurst(r.Arrival)
		switch {
		case b && r.Turn == 0:
			startsBurst++
		case r.Turn == 0:
			startsCalm++
		}
		if b {
			reqsBurst++
		} else {
			reqsCalm++
		}
	}
	startRatio := (startsBurst / burstTime.Seconds()) / (startsCalm / calmTime.Seconds())
	if startRatio < 3 || startRatio > 5 {
		t.Errorf("sessions start %.2f times as often in bursts as in calm periods, want about %g", startRatio, p.BurstFactor)
	}
	calmRate := startsCalm / calmTime.Seconds()
	if math.Abs(calmRate-p.SessionRate) > 0.25 {
		t.Errorf("calm session rate %.2f/s, want about %g/s", calmRate, p.SessionRate)
	}
	if reqRatio := (reqsBurst / burstTime.Seconds()) / (reqsCalm / calmTime.Seconds()); reqRatio < 1.5 {
		t.Errorf("requests arrive %.2f times as often in bursts as in calm periods, want clearly more", reqRatio)
	}
}

// TestPromptCap checks that sessions end rather than exceed
// MaxPromptTokens.
func TestPromptCap(t *testing.T) {
	p := DefaultParams()
	p.MaxPromptTokens, p.MaxUserTokens, p.MeanTurns = 12_000, 2000, 1000
	p.Requests = 3000
	reqs, sum := generate(t, p)
	longest := 0
	for _, r := range reqs {
		if r.InputLength > p.MaxPromptTokens {
			t.Fatalf("session %s turn %d: prompt %d tokens over the cap %d", r.SessionID, r.Turn, r.InputLength, p.MaxPromptTokens)
		}
		longest = max(longest, r.InputLength)
	}
	// With 1,000 turns on average, the cap ends nearly every session.
	if longest < p.MaxPromptTokens*3/4 {
		t.Errorf("longest prompt %d tokens: the cap of %d was never approached", longest, p.MaxPromptTokens)
	}
	if sum.Sessions < 100 {
		t.Errorf("%d sessions: the cap did not end sessions", sum.Sessions)
	}
}

func TestEmitError(t *testing.T) {
	stop := errors.New("full")
	calls := 0
	_, err := Generate(DefaultParams(), func(Request) error {
		calls++
		if calls == 7 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 7 {
		t.Errorf("error %v after %d calls, want %v after 7", err, calls, stop)
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultParams().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		field string
		set   func(*Params)
		msg   string
	}{
		{"Requests", func(p *Params) { p.Requests = 0 }, "synth: Requests = 0: want 1 to 1000000"},
		{"Requests", func(p *Params) { p.Requests = MaxRequests + 1 }, "want 1 to 1000000"},
		{"SystemPromptTokens", func(p *Params) { p.SystemPromptTokens = nil }, "want 1 to 64 system prompt lengths"},
		{"SystemPromptTokens[1]", func(p *Params) { p.SystemPromptTokens = []int{100, 0} }, "synth: SystemPromptTokens[1] = 0: want 1 to 1048575 tokens"},
		{"MaxPromptTokens", func(p *Params) { p.SystemPromptTokens = []int{30000} },
			"synth: MaxPromptTokens = 32768: want 38192 to 1048576 tokens (at least the longest system prompt, 30000, plus MaxUserTokens, 8192, so that a first turn fits)"},
		{"SystemPromptZipf", func(p *Params) { p.SystemPromptZipf = math.NaN() }, "synth: SystemPromptZipf = NaN: want an exponent from 0 (uniform) to 10"},
		{"MeanTurns", func(p *Params) { p.MeanTurns = 0.5 }, "want a mean from 1 to 1000 turns per session"},
		{"MaxPromptTokens", func(p *Params) { p.MaxPromptTokens = 1 << 21 }, "want 16692 to 1048576 tokens"},
		{"MaxUserTokens", func(p *Params) { p.MaxUserTokens = 0 }, "synth: MaxUserTokens = 0: want 1 to 1048575 tokens"},
		{"MaxPromptTokens", func(p *Params) { p.MaxUserTokens = 30000 }, "want 38500 to 1048576 tokens"},
		{"MaxOutputTokens", func(p *Params) { p.MaxOutputTokens = 0 }, "want 1 to"},
		{"UserTokensMedian", func(p *Params) { p.UserTokensMedian = 10_000 }, "want 1 to 8192 tokens (MaxUserTokens)"},
		{"UserTokensSigma", func(p *Params) { p.UserTokensSigma = -1 }, "want 0 to 5"},
		{"OutputTokensMedian", func(p *Params) { p.OutputTokensMedian = 0 }, "want 1 to 4096 tokens (MaxOutputTokens)"},
		{"OutputTokensSigma", func(p *Params) { p.OutputTokensSigma = math.Inf(1) }, "want 0 to 5"},
		{"ThinkTime", func(p *Params) { p.ThinkTime = -time.Second }, "synth: ThinkTime = -1s: want 0 to 24h"},
		{"AnswerTimePerToken", func(p *Params) { p.AnswerTimePerToken = 2 * time.Second }, "want 0 to 1s per token"},
		{"SessionRate", func(p *Params) { p.SessionRate = 0 }, "synth: SessionRate = 0: want 0.01 to 10000 sessions per second"},
		{"BurstFactor", func(p *Params) { p.BurstFactor = 0.5 }, "want 1 (no bursts) to 1000"},
		{"CalmMean", func(p *Params) { p.CalmMean = time.Millisecond }, "synth: CalmMean = 1ms: want 1s to 24h"},
		{"BurstMean", func(p *Params) { p.BurstMean = 25 * time.Hour }, "want 1s to 24h"},
	} {
		p := DefaultParams()
		c.set(&p)
		err := p.Validate()
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Field != c.field || !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %v, want a *ParamError for %s containing %q", c.field, err, c.field, c.msg)
		}
		if _, gerr := Generate(p, func(Request) error { return nil }); !errors.Is(gerr, ErrInvalidParams) {
			t.Errorf("%s: Generate error %v, want the validation error", c.field, gerr)
		}
	}
}

// BenchmarkWriteJSONL generates the default trace (10,000 requests) into
// io.Discard.
func BenchmarkWriteJSONL(b *testing.B) {
	p := DefaultParams()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := WriteJSONL(io.Discard, p); err != nil {
			b.Fatal(err)
		}
	}
}
