package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// Bounds of what a plugin's stderr puts in the router's log (stderrLog).
const (
	// maxStderrLine bounds a plugin's stderr line as the router logs it:
	// its first 4 KiB, escaped and marked "...(N bytes)" when cut; the
	// rest of the line is read and dropped. A log line, a stack frame or
	// a JSON log entry with a few fields fits.
	maxStderrLine = 4 << 10
	// StderrRate is how many bytes of a plugin process's stderr per second
	// the router logs, on average (64 KiB/s: hundreds of ordinary log lines
	// a second); StderrBurst how many it logs at once before the rate
	// applies (512 KiB: a panic's stack trace with a hundred goroutines).
	// Lines beyond are dropped and counted, and a warning says how many
	// (stderrDropReport). Every line costs at least stderrLineCost bytes,
	// so a flood of short lines is held to 256 lines a second.
	StderrRate  = 64 << 10
	StderrBurst = 512 << 10
	// stderrLineCost is the least a logged line costs of the budget: the
	// log line around it is about that long.
	stderrLineCost = 256
	// stderrDropReport is how often, at most, the warning about dropped
	// stderr lines is logged (with the count since the last one).
	stderrDropReport = 10 * time.Second
)

// stderrLog logs what a plugin writes to stderr, line by line, through its
// logger (named after the plugin): an hclog JSON line (`@level`,
// `@message`, other keys as fields) at its level; a plain line at info,
// or, without it, at the level of a `[TRACE]`, `[DEBUG]`, `[INFO]`,
// `[WARN]` or `[ERROR]` prefix (hclog's plain format, after an optional
// timestamp: plainLevel); a `panic: ` or `fatal error: ` line and every
// plain line after it at error. Control characters are escaped
// (untrusted.Text), so a plugin cannot write terminal escapes or binary
// into the router's log, and a line is cut to maxStderrLine bytes. What it
// logs is rate-limited per process by bytes (StderrRate, StderrBurst);
// the lines over the limit are dropped and counted, and a warning says
// how many, at most every stderrDropReport. It is the io.Writer
// go-plugin copies the plugin's stderr to; it never blocks on the plugin.
//
// go-plugin v1.8.0 parses the lines itself when its logger is enabled, and
// panics, taking the router down, on a JSON line whose `@message` or
// `@level` is not a string (`{"@level":"info","@message":1}`); the
// supervisor gives it a disabled logger for the lines (quietStderr) and
// parses them here, where any JSON is safe.
type stderrLog struct {
	log     hclog.Logger
	limit   *rate.Limiter      // bytes of stderr logged
	reports *untrusted.Limiter // the dropped-lines warning

	mu      sync.Mutex
	lines   lineSplitter // maxStderrLine
	inPanic bool
	// dropped: lines (and their bytes) over the rate limit since the
	// last warning about them.
	droppedLines, droppedBytes int64
}

// newStderrLog returns the stderr log of one plugin process, logging
// through log.
func newStderrLog(log hclog.Logger) *stderrLog {
	return &stderrLog{
		log:     log,
		lines:   lineSplitter{max: maxStderrLine},
		limit:   rate.NewLimiter(rate.Limit(StderrRate), StderrBurst),
		reports: untrusted.NewLimiter(stderrDropReport),
	}
}

// Write takes the next bytes of stderr; complete lines are logged.
func (s *stderrLog) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines.write(b, s.line)
	return len(b), nil
}

// line logs a line (its first maxStderrLine bytes, curLen its whole
// length), unless the rate limit drops it. s.mu is held.
func (s *stderrLog) line(b []byte, curLen int) {
	text := strings.TrimRight(string(b), "\r")
	if strings.TrimSpace(text) == "" && curLen == len(b) {
		return
	}
	now := time.Now()
	if !s.limit.AllowN(now, min(max(curLen+1, stderrLineCost), StderrBurst)) {
		s.droppedLines++
		s.droppedBytes += int64(curLen) + 1
		if strings.HasPrefix(text, "panic: ") || strings.HasPrefix(text, "fatal error: ") {
			s.inPanic = true
		}
		s.reportDropped()
		return
	}
	s.reportDropped()
	cut := curLen > len(b)
	if !cut && text[0] == '{' {
		var entry map[string]any
		if json.Unmarshal(b, &entry) == nil {
			s.json(entry, text)
			return
		}
	}
	if cut {
		// Marked with the whole line's length, not the part read.
		text = strings.TrimSuffix(untrusted.Text(text, maxStderrLine), "...("+strconv.Itoa(len(text))+" bytes)") +
			"...(" + strconv.Itoa(curLen) + " bytes)"
	} else {
		text = untrusted.Text(text, maxStderrLine)
	}
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

// reportDropped logs how many lines the rate limit dropped since the last
// such warning, at most every stderrDropReport. s.mu is held.
func (s *stderrLog) reportDropped() {
	if s.droppedLines == 0 {
		return
	}
	if ok, _ := s.reports.Allow("dropped"); !ok {
		return
	}
	s.log.Warn("dropped plugin stderr over its rate limit", "dropped_bytes", s.droppedBytes, "dropped_lines", s.droppedLines,
		"limit", fmt.Sprintf("%d KiB/s, bursts of %d KiB", StderrRate>>10, StderrBurst>>10))
	s.droppedLines, s.droppedBytes = 0, 0
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
		args = append(args, untrusted.Text(strings.TrimPrefix(k, "@"), maxStderrLine), jsonText(entry[k]))
	}
	s.log.Log(level, jsonText(msg), args...)
}

// jsonText renders a decoded JSON value as text: a string as it is, any
// other value as JSON (a number, true, null, an object); control
// characters are escaped (untrusted.Text, at most maxStderrLine bytes:
// the line it came from was no longer).
func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return untrusted.Text(s, maxStderrLine)
	}
	b, err := json.Marshal(v)
	if err != nil { // cannot happen for a decoded value
		return untrusted.Text(fmt.Sprint(v), maxStderrLine)
	}
	return untrusted.Bytes(b, maxStderrLine)
}

// quietStderr is the logger go-plugin gets for a plugin: its own messages
// (start, exit, its stdio client's) go to the plugin's logger, but the
// logger it names for the plugin's stderr lines, after the command's base
// name (stderrName), is off, so it never parses them (stderrLog does).
// It also reads two of go-plugin's messages about p: its failure to
// connect while killing a plugin whose address was never accepted, and
// its warning that the plugin failed to exit gracefully, which are logged
// at debug when no graceful exit was tried (the handshake did not
// complete or was refused) or the process had already exited. (The
// plugin's stdout is read by cmdRunner, not by go-plugin's scanner.)
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
	msgNotGraceful = "plugin failed to exit gracefully"
	msgKillClient  = "client" // Kill could not connect to close the client
)

// Error logs msg; go-plugin's failure to connect while killing a plugin
// whose address was never accepted is only a debug line.
func (q quietStderr) Error(msg string, args ...any) {
	if msg == msgKillClient && q.p.addr.Load() == nil {
		q.Logger.Debug(msg, args...)
		return
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

// lineSplitter cuts a byte stream into lines, keeping at most max bytes
// of each (memory is bounded whatever a line's length) and counting its
// whole length. Not safe for concurrent use.
type lineSplitter struct {
	max    int
	cur    []byte // the current line's first max bytes
	curLen int    // the current line's length so far
}

// write takes the next bytes of the stream and calls emit for each line
// they complete (its kept bytes, without the newline, and its whole
// length); the bytes of emit's line are valid until it returns.
func (l *lineSplitter) write(b []byte, emit func(line []byte, length int)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		seg := b
		if i >= 0 {
			seg = b[:i]
		}
		if room := l.max - len(l.cur); room > 0 {
			l.cur = append(l.cur, seg[:min(room, len(seg))]...)
		}
		l.curLen += len(seg)
		if i < 0 {
			return
		}
		emit(l.cur, l.curLen)
		l.cur, l.curLen = l.cur[:0], 0
		b = b[i+1:]
	}
}
