package untrusted

import (
	"strings"
	"testing"
	"time"
)

func TestText(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		max  int
		want string
	}{
		{"clean and short", "no worker matched", 64, "no worker matched"},
		{"tab kept", "a\tb", 64, "a\tb"},
		{"escape and newline", "red\x1b[31m\nline", 64, `red\x1b[31m\x0aline`},
		{"bad utf-8", "a\xffb", 64, `a\xffb`},
		{"unprintable rune", "a\u200bb", 64, `a\u200bb`},
		{"beyond the BMP, printable", "a😀", 64, "a😀"},
		{"cut", strings.Repeat("x", 100), 10, "xxxxxxxxxx...(100 bytes)"},
		{"cut at a rune", "ééééé", 5, "éé...(10 bytes)"},
		{"escapes count", "\x00\x00\x00\x00", 9, `\x00\x00...(4 bytes)`},
		{"default max", strings.Repeat("y", MaxLog+1), 0, strings.Repeat("y", MaxLog) + "...(257 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Text(tc.in, tc.max); got != tc.want {
				t.Errorf("Text(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
		})
	}
}

func TestBytesMatchesText(t *testing.T) {
	for _, in := range []string{"", "short", strings.Repeat("\x1b", 5000), strings.Repeat("é", 3000), strings.Repeat("z", 1<<20)} {
		for _, max := range []int{1, 7, 64, 256} {
			if got, want := Bytes([]byte(in), max), Text(in, max); got != want {
				t.Errorf("Bytes(%d bytes, %d) = %q, Text gives %q", len(in), max, got, want)
			}
		}
	}
}

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(10 * time.Second)
	l.now = func() time.Time { return now }
	check := func(cause string, wantOK bool, wantSuppressed uint64) {
		t.Helper()
		ok, n := l.Allow(cause)
		if ok != wantOK || n != wantSuppressed {
			t.Fatalf("Allow(%q) at %v = %v, %d; want %v, %d", cause, now.Unix(), ok, n, wantOK, wantSuppressed)
		}
	}
	check("a", true, 0)
	check("a", false, 0)
	check("a", false, 0)
	check("b", true, 0) // another cause has its own budget
	now = now.Add(9 * time.Second)
	check("a", false, 0)
	now = now.Add(time.Second)
	check("a", true, 3) // the three held back since the last line
	check("a", false, 0)
	now = now.Add(time.Minute)
	check("a", true, 1)
	check("b", true, 0)
}
