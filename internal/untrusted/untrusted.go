// Package untrusted bounds what comes from outside the router before it
// reaches a log line, a metric label, an error or a client's answer: a
// plugin's answers and stderr, an engine's events and answers, a peer
// replica's messages, a client's request. Text is cut to a stated number
// of bytes and its control bytes are escaped, so one 12 MiB string or a
// terminal escape cannot flood or rewrite a log; Limiter rate-limits log
// lines per cause, counting the lines it held back.
//
// Every function costs time linear in the bytes it keeps (at most max),
// never in the length of its input.
package untrusted

import (
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Default bounds, in bytes.
const (
	// MaxLog bounds a string from outside quoted in a log line or an error
	// (256 bytes: an error message or a name, not a payload).
	MaxLog = 256
	// MaxClient bounds a string from outside quoted in a client's answer
	// (a plugin's filtered_by reason in a 503, say).
	MaxClient = 256
	// MaxLabel bounds a string from outside used as a metric label value.
	MaxLabel = 64
)

// Text returns s for quoting: at most max bytes of it (cut at a rune
// boundary), with control characters (but tab), other unprintable
// characters and bytes that are not UTF-8 escaped as `\xHH` (below U+0080,
// and bad bytes), `\uHHHH` or `\UHHHHHHHH`, the way hclog escapes a quoted value. A cut
// string ends in "...(N bytes)", N being len(s). The escapes count toward
// max, so the result is at most max bytes plus the marker. max <= 0 means
// MaxLog.
func Text(s string, max int) string {
	if max <= 0 {
		max = MaxLog
	}
	if len(s) <= max && clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), max) + 24)
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		var esc string
		switch {
		case r == utf8.RuneError && size == 1:
			esc = `\x` + hex2(s[i])
		case r == '\t' || unicode.IsPrint(r):
			esc = s[i : i+size]
		case r < 0x80:
			esc = `\x` + hex2(byte(r))
		case r > 0xffff:
			esc = `\U` + hex4(r>>16) + hex4(r&0xffff)
		default:
			esc = `\u` + hex4(r)
		}
		if b.Len()+len(esc) > max {
			break
		}
		b.WriteString(esc)
		i += size
	}
	if i < len(s) {
		b.WriteString("...(")
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteString(" bytes)")
	}
	return b.String()
}

// Bytes is Text of b, without copying more of b than it keeps.
func Bytes(b []byte, max int) string {
	if max <= 0 {
		max = MaxLog
	}
	// Text reads at most about max bytes of its input (each kept rune is
	// at least one byte of it) and len(s) for the marker: pass it a
	// prefix and add the true length.
	if len(b) <= 4*max {
		return Text(string(b), max)
	}
	t := Text(string(b[:4*max]), max)
	if i := strings.LastIndex(t, "...("); i >= 0 {
		t = t[:i]
	}
	return t + "...(" + strconv.Itoa(len(b)) + " bytes)"
}

// clean reports whether s has nothing Text escapes.
func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c >= 0x7f {
			return false
		}
	}
	return true
}

const hexDigits = "0123456789abcdef"

func hex2(c byte) string { return string([]byte{hexDigits[c>>4], hexDigits[c&15]}) }

func hex4(r rune) string {
	return string([]byte{hexDigits[r>>12&15], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15]})
}

// Limiter rate-limits log lines per cause: at most one line per cause per
// interval; the lines held back are counted and handed to the next line
// allowed, so a flood costs one line per interval and loses no count.
// Causes are the caller's own constants (a bounded set), never strings
// from outside. Safe for concurrent use; the zero value is not usable.
type Limiter struct {
	interval time.Duration
	now      func() time.Time

	mu     sync.Mutex
	causes map[string]*limit
}

type limit struct {
	next       time.Time
	suppressed uint64
}

// NewLimiter returns a Limiter allowing one line per cause per interval
// (interval <= 0: 10 s).
func NewLimiter(interval time.Duration) *Limiter {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &Limiter{interval: interval, now: time.Now, causes: map[string]*limit{}}
}

// Allow reports whether a line for cause may be logged now and, when it
// may, how many lines for cause were held back since the last one allowed
// (log it as "suppressed"). It never blocks for long: one short critical
// section, no allocation after a cause's first line.
func (l *Limiter) Allow(cause string) (ok bool, suppressed uint64) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.causes[cause]
	if c == nil {
		c = &limit{}
		l.causes[cause] = c
	}
	if now.Before(c.next) {
		c.suppressed++
		return false, 0
	}
	c.next = now.Add(l.interval)
	suppressed, c.suppressed = c.suppressed, 0
	return true, suppressed
}
