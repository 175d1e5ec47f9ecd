package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// maxStderrLine bounds a plugin's stderr line as the router logs it: a
// longer line is logged in pieces of this many bytes.
const maxStderrLine = 64 << 10

// stderrLog logs what a plugin writes to stderr, line by line, through its
// logger (named after the plugin): an hclog JSON line (`@level`,
// `@message`, other keys as fields) at its level; a plain line at info,
// or at the level of a `[TRACE]`, `[DEBUG]`, `[INFO]`, `[WARN]` or
// `[ERROR]` prefix; a `panic: ` or `fatal error: ` line and every plain
// line after it at error. It is the io.Writer go-plugin copies the
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
	switch {
	case strings.HasPrefix(text, "[TRACE]"):
		s.log.Trace(text)
	case strings.HasPrefix(text, "[DEBUG]"):
		s.log.Debug(text)
	case strings.HasPrefix(text, "[INFO]"):
		s.log.Info(text)
	case strings.HasPrefix(text, "[WARN]"):
		s.log.Warn(text)
	case strings.HasPrefix(text, "[ERROR]"):
		s.log.Error(text)
	case strings.HasPrefix(text, "panic: ") || strings.HasPrefix(text, "fatal error: "):
		s.inPanic = true
		s.log.Error(text)
	case s.inPanic:
		s.log.Error(text)
	default:
		s.log.Info(text)
	}
}

// json logs an hclog JSON line at its `@level` (info when absent or not a
// level), its `@message` as the message (the whole line when absent), and
// its other keys, sorted, as fields; values of any JSON type are shown as
// they are.
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
		case "@message", "@level", "@module":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, strings.TrimPrefix(k, "@"), entry[k])
	}
	s.log.Log(level, fmt.Sprint(msg), args...)
}

// quietStderr is the logger go-plugin gets for a plugin: its own messages
// (start, exit, its stdio client's) go to the plugin's logger, but the
// logger it names for the plugin's stderr lines, after the command's base
// name (stderrName), is off, so it never parses them (stderrLog does).
type quietStderr struct {
	hclog.Logger
	stderrName string
}

// Named returns, for the stderr lines' name, a logger whose level is off
// (go-plugin checks it before it parses a line); else the plugin's logger
// named name.
func (q quietStderr) Named(name string) hclog.Logger {
	if name == q.stderrName {
		return hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})
	}
	return q.Logger.Named(name)
}
