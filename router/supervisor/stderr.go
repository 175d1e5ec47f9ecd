package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
)

// maxStderrLine bounds a plugin's stderr line as the router logs it: a
// longer line is logged in pieces of this many bytes.
const maxStderrLine = 64 << 10

// stderrLog logs what a plugin writes to stderr, line by line, through its
// logger (named after the plugin): an hclog JSON line (`@level`,
// `@message`, other keys as fields) at its level; a plain line at info,
// or, without it, at the level of a `[TRACE]`, `[DEBUG]`, `[INFO]`,
// `[WARN]` or `[ERROR]` prefix (hclog's plain format, after an optional
// timestamp: plainLevel); a `panic: ` or `fatal error: ` line and every
// plain line after it at error. Control characters are escaped
// (escapeControl), so a plugin cannot write terminal escapes or binary
// into the router's log. It is the io.Writer go-plugin copies the
// plugin's stderr to.
//
// go-plugin v1.8.0 parses the lines itself when its logger is enabled, and
// panics, taking the router down, on a JSON line whose `@message` or
// `@level` is not a string (`{"@level":"info","@message":1}`); the
// supervisor gives it a disabled logger for the lines (quietStderr) and
// parses them here, where any JSON is safe.
type stderrLog struct {
	log hclog.Logger

	mu      sync.Mutex
	cur     []byte
	inPanic bool
}

// Write takes the next bytes of stderr; complete lines are logged.
func (s *stderrLog) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.cur = append(s.cur, b...)
			for len(s.cur) >= maxStderrLine {
				s.line(s.cur[:maxStderrLine])
				s.cur = append(s.cur[:0], s.cur[maxStderrLine:]...)
			}
			break
		}
		s.cur = append(s.cur, b[:i]...)
		for len(s.cur) > maxStderrLine {
			s.line(s.cur[:maxStderrLine])
			s.cur = append(s.cur[:0], s.cur[maxStderrLine:]...)
		}
		s.line(s.cur)
		s.cur = s.cur[:0]
		b = b[i+1:]
	}
	return n, nil
}

// line logs one line. s.mu is held.
func (s *stderrLog) line(b []byte) {
	text := strings.TrimRight(string(b), "\r")
	if strings.TrimSpace(text) == "" {
		return
	}
	if text[0] == '{' {
		var entry map[string]any
		if json.Unmarshal(b, &entry) == nil {
			s.json(entry, text)
			return
		}
	}
	text = escapeControl(text)
	if m := plainLevel.FindStringSubmatch(text); m != nil {
		s.log.Log(hclog.LevelFromString(m[1]), m[2])
		return
	}
	switch {
	case strings.HasPrefix(text, "panic: ") || strings.HasPrefix(text, "fatal error: "):
		s.inPanic = true
		s.log.Error(text)
	case s.inPanic:
		s.log.Error(text)
	default:
		s.log.Info(text)
	}
}

// plainLevel matches a line in hclog's plain format: an optional
// timestamp of one or two words starting with a digit (hclog's
// `2026-12-01T19:56:41.608Z`, the log package's `2026/12/01 19:56:41`),
// then `[TRACE]`, `[DEBUG]`, `[INFO]`, `[WARN]` or `[ERROR]`; submatch 1 is
// the level, 2 the rest of the line.
var plainLevel = regexp.MustCompile(`^\s*(?:\d\S*(?: \d\S*)? +)?\[(TRACE|DEBUG|INFO|WARN|ERROR)\] *(.*)$`)

// json logs an hclog JSON line at its `@level` (info when absent or not a
// level), its `@message` as the message (the whole line when absent), and
// its other keys but `@module` and `@timestamp` (the router's log has its
// own time), sorted, as fields. A string is shown as it is, a number or a
// boolean as text, an object or an array as JSON; control characters are
// escaped.
func (s *stderrLog) json(entry map[string]any, text string) {
	msg, ok := entry["@message"]
	if !ok {
		msg = text
	}
	level := hclog.Info
	if l, ok := entry["@level"].(string); ok {
		if lv := hclog.LevelFromString(l); lv != hclog.NoLevel {
			level = lv
		}
	}
	keys := make([]string, 0, len(entry))
	for k := range entry {
		switch k {
		case "@message", "@level", "@module", "@timestamp":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, escapeControl(strings.TrimPrefix(k, "@")), jsonText(entry[k]))
	}
	s.log.Log(level, jsonText(msg), args...)
}

// jsonText renders a decoded JSON value as text: a string as it is, any
// other value as JSON (a number, true, null, an object); control
// characters are escaped.
func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return escapeControl(s)
	}
	b, err := json.Marshal(v)
	if err != nil { // cannot happen for a decoded value
		return escapeControl(fmt.Sprint(v))
	}
	return escapeControl(string(b))
}

// escapeControl escapes what a plugin must not write into the router's
// log as it is: control characters (ESC, NUL, newlines; a tab is kept),
// other unprintable characters, and bytes that are not UTF-8, as `\xHH`
// (below U+0080 and bad bytes) or `\uHHHH`, the way hclog escapes a
// quoted value.
func escapeControl(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t' || unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

// quietStderr is the logger go-plugin gets for a plugin: its own messages
// (start, exit, its stdio client's) go to the plugin's logger, but the
// logger it names for the plugin's stderr lines, after the command's base
// name (stderrName), is off, so it never parses them (stderrLog does).
// It also reads two of go-plugin's messages about p: a failed scan of
// stdout for a line too long (recorded in p.stdoutTooLong), and its
// warning that the plugin failed to exit gracefully, which is logged at
// debug when no graceful exit was tried (the handshake did not complete
// or was refused) or the process had already exited.
type quietStderr struct {
	hclog.Logger
	stderrName string
	p          *proc
}

// Named returns, for the stderr lines' name, a logger whose level is off
// (go-plugin checks it before it parses a line), and so it does for its
// stdio client made while killing a plugin whose address was never
// accepted (it only warns that it cannot connect); else the plugin's
// logger named name.
func (q quietStderr) Named(name string) hclog.Logger {
	if name == q.stderrName || name == "stdio" && q.p.addr.Load() == nil {
		return hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})
	}
	return q.Logger.Named(name)
}

// go-plugin v1.8.0's messages that quietStderr reads.
const (
	msgScanStdout  = "error encountered while scanning stdout"
	msgNotGraceful = "plugin failed to exit gracefully"
	msgKillClient  = "client" // Kill could not connect to close the client
)

// Error logs msg; go-plugin's failed stdout scan is recorded, and its
// failure to connect while killing a plugin whose address was never
// accepted is only a debug line.
func (q quietStderr) Error(msg string, args ...any) {
	switch msg {
	case msgScanStdout:
		for _, a := range args {
			if err, ok := a.(error); ok && errors.Is(err, bufio.ErrTooLong) {
				q.p.stdoutTooLong.Store(true)
			}
		}
	case msgKillClient:
		if q.p.addr.Load() == nil {
			q.Logger.Debug(msg, args...)
			return
		}
	}
	q.Logger.Error(msg, args...)
}

// Warn logs msg, but go-plugin's "plugin failed to exit gracefully" only
// at debug when no graceful exit was tried or the process is gone.
func (q quietStderr) Warn(msg string, args ...any) {
	if msg == msgNotGraceful && (q.p.addr.Load() == nil || q.p.hasExited()) {
		q.Logger.Debug(msg, args...)
		return
	}
	q.Logger.Warn(msg, args...)
}
