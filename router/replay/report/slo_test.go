package report

import (
	"bytes"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	s, err := ParseSLO("ttft=500ms, TPOT=50ms,e2e=2s")
	if err != nil || s != (SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: 2 * time.Second}) || s.String() != "ttft=500ms,tpot=50ms,e2e=2s" {
		t.Errorf("ParseSLO: %+v %q, %v", s, s.String(), err)
	}
	for in, want := range map[string]string{
		"":                    "want targets such as",
		"ttft":                "want NAME=DURATION",
		"ttft=0s":             "want a duration > 0",
		"ttft=fast":           "want a duration > 0",
		"itl=5ms":             `unknown target "itl"`,
		"ttft=1s,ttft=2s":     "ttft given twice",
		"ttft=1s,,tpot=200ms": "want NAME=DURATION",
	} {
		if _, err := ParseSLO(in); err == nil || !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("ParseSLO(%q): %v, want %q", in, err, want)
		}
	}
}
