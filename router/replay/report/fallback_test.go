package report

import (
	"bytes"
	"testing"
)

// A cause's breakdown within one plugin: most first, then by name.
func TestWriteFallbacksCauseOrder(t *testing.T) {
	rep := &Report{Policy: "p", Selections: 12031, Fallbacks: 12, FallbackSources: []FallbackSource{{Plugin: "x", Fallbacks: 12,
		Causes: map[string]int64{"restarting": 5, "panic": 1, "error": 5, "breaker_open": 1}, FirstError: "boom"}}}
	var buf bytes.Buffer
	if err := WriteFallbacks(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := "router: p: plugin \"x\" made 12 of 12031 selections fall back (0.1%): error 5, restarting 5, breaker_open 1, panic 1; first error: boom\n"
	if got := buf.String(); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestShare(t *testing.T) {
	for _, c := range []struct {
		n, total int64
		want     string
	}{
		{0, 0, "0.0%"}, {0, 10, "0.0%"}, {1, 12031, "<0.1%"}, {6, 12031, "<0.1%"}, {7, 12031, "0.1%"},
		{12, 12031, "0.1%"}, {1, 3, "33.3%"}, {200, 200, "100.0%"},
	} {
		if got := share(c.n, c.total); got != c.want {
			t.Errorf("share(%d, %d) = %q, want %q", c.n, c.total, got, c.want)
		}
	}
}
