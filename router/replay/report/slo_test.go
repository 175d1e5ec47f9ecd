package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	s, err := ParseSLO("ttft=500ms, TPOT=50ms,e2e=2s")
	if err != nil || s != (SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: 2 * time.Second}) || s.String() != "ttft=500ms,tpot=50ms,e2e=2s" {
		t.Errorf("ParseSLO: %+v %q, %v", s, s.String(), err)
	}
	// The bound is the one a header's and a class's targets have; an E2E
	// target is replay's goodput alone, not a request's, and has none.
	if s, err := ParseSLO("ttft=1h,tpot=1h,e2e=3h"); err != nil || s.TTFT != time.Hour || s.E2E != 3*time.Hour {
		t.Errorf("ParseSLO at the bound: %+v, %v", s, err)
	}
	for in, want := range map[string]string{
		"":                    "want targets such as",
		"ttft":                "want NAME=DURATION",
		"ttft=0s":             "want a duration > 0",
		"ttft=fast":           "want a duration > 0",
		"itl=5ms":             `unknown target "itl"`,
		"ttft=1s,ttft=2s":     "ttft given twice",
		"ttft=1s,,tpot=200ms": "want NAME=DURATION",
		"ttft=2h":             "ttft is at most 1h0m0s",
		"tpot=61m":            "tpot is at most 1h0m0s",
	} {
		if _, err := ParseSLO(in); err == nil || !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("ParseSLO(%q): %v, want %q", in, err, want)
		}
	}
}

func TestWritePredictor(t *testing.T) {
	var b strings.Builder
	r := &Report{Policy: "slo", Workers: 8}
	if err := WritePredictor(&b, r); err != nil || b.Len() != 0 {
		t.Fatalf("without accuracy: %q, %v; want nothing", b.String(), err)
	}
	r.Predictor = &PredictorAccuracy{TTFTN: 10, TPOTN: 9, TTFTP50: 0.089, TTFTP90: 0.5, TPOTP50: 0.1, TPOTP90: 0.2}
	if err := WritePredictor(&b, r); err != nil || b.Len() != 0 {
		t.Fatalf("for a policy that does not read them: %q, %v; want nothing", b.String(), err)
	}
	r.Predictor.Read = true
	if err := WritePredictor(&b, r); err != nil {
		t.Fatal(err)
	}
	const want = "router: slo, 8 workers: latency predictor, relative error p50/p90: TTFT 8.9%/50.0% (10 compared), TPOT 10.0%/20.0% (9 compared)\n"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}
