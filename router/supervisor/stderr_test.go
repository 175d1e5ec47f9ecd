package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
)

// syncBuf is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stderrLog logs each stderr line at its level: hclog JSON at its
// @level (any other JSON value as the message rendered as JSON, no
// panic; no @timestamp field), plain text at info, hclog's plain
// [LEVEL] prefixes (after a timestamp or not) at theirs and stripped, a
// panic and what follows at error; control characters are escaped;
// lines may arrive in any pieces, and a line over the bound is cut.
func TestStderrLogLevels(t *testing.T) {
	var out syncBuf
	log := hclog.New(&hclog.LoggerOptions{Name: "router.p", Level: hclog.Trace, Output: &out, DisableTime: true})
	s := newStderrLog(log)
	input := strings.Join([]string{
		`{"@level":"warn","@message":"disk low","free":3}`,
		`{"@level":"info","@message":1}`,
		`{"@level":17,"@message":{"a":[1,2]}}`,
		`{"@level":"info","@message":"stamped","@timestamp":"2026-01-01T00:00:00.000000Z","n":{"k":"v"}}`,
		`{"@level":"error","@message":"esc \u001b[31mred\u0000 nul\nnewline","k\u001bk":"v\u001b"}`,
		"plain \x1b[2Jclear\x00nul \xff bad",
		`plain words`,
		`[DEBUG] tagged debug`,
		`[ERROR] tagged error`,
		`2026-12-01T19:56:41.608Z [WARN]  stamped warn`,
		`2026/12/01 19:56:41 [TRACE] log package trace`,
		`[warn] lower case is plain`,
		`{not json`,
		`panic: boom`,
		`goroutine 1 [running]:`,
		``,
	}, "\n")
	// Written in pieces of 7 bytes, as a pipe may deliver them.
	for b := []byte(input); len(b) > 0; b = b[min(7, len(b)):] {
		if _, err := s.Write(b[:min(7, len(b))]); err != nil {
			t.Fatal(err)
		}
	}
	got := out.String()
	for _, bad := range []string{"\x1b", "\x00", "\xff", "timestamp", "map["} {
		if strings.Contains(got, bad) {
			t.Errorf("log holds %q:\n%s", bad, got)
		}
	}
	for _, want := range []string{
		`[WARN]  router.p: disk low: free=3`,
		`[INFO]  router.p: 1`,
		`[INFO]  router.p: {"a":[1,2]}` + "\n",
		`[INFO]  router.p: stamped: n="{\"k\":\"v\"}"` + "\n",
		`[ERROR] router.p: esc \x1b[31mred\x00 nul\x0anewline: k\x1bk=v\x1b` + "\n",
		`[INFO]  router.p: plain \x1b[2Jclear\x00nul \xff bad` + "\n",
		`[INFO]  router.p: plain words`,
		`[DEBUG] router.p: tagged debug` + "\n",
		`[ERROR] router.p: tagged error` + "\n",
		`[WARN]  router.p: stamped warn` + "\n",
		`[TRACE] router.p: log package trace` + "\n",
		`[INFO]  router.p: [warn] lower case is plain` + "\n",
		`[INFO]  router.p: {not json`,
		`[ERROR] router.p: panic: boom`,
		`[ERROR] router.p: goroutine 1 [running]:`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}

	out = syncBuf{}
	s = newStderrLog(log)
	_, _ = s.Write([]byte(strings.Repeat("x", 2*maxStderrLine+5) + "\nafter\n"))
	want := "[INFO]  router.p: " + strings.Repeat("x", maxStderrLine) + fmt.Sprintf("...(%d bytes)\n", 2*maxStderrLine+5) +
		"[INFO]  router.p: after\n"
	if got := out.String(); got != want {
		t.Errorf("a line of 2*%d+5 bytes, then a short one: logged\n%q\nwant\n%q", maxStderrLine, got, want)
	}
}

// A plugin whose stderr carries a JSON log line with a non-string
// @message (go-plugin v1.8.0's own parser panics on it, in a goroutine
// that would end the router) fails to start like any plugin that exits
// before its handshake, and the line is logged.
func TestHostileStderrLineDoesNotCrash(t *testing.T) {
	var out syncBuf
	h := NewHost(Options{Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: &out})})
	t.Cleanup(func() { _ = h.Shutdown(context.Background()) })
	script := filepath.Join(t.TempDir(), "hostile.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho '{\"@level\":\"info\",\"@message\":1}' >&2\necho '{\"@level\":\"error\",\"@message\":[1]}' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := config.Plugin{Name: "hostile", Command: script, Env: map[string]string{}, StartTimeout: 30 * time.Second, CallTimeout: 30 * time.Second}
	_, err := h.Start(context.Background(), b)
	var se *StartError
	if !errors.As(err, &se) {
		t.Fatalf("Start = %v; want a *StartError", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "[1]") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := out.String(); !strings.Contains(got, "hostile") || !strings.Contains(got, "[1]") {
		t.Errorf("the plugin's stderr lines were not logged under its name:\n%s", got)
	}
}
