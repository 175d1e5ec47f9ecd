package supervisor

// A plugin process that answers wrongly, floods its stderr or its stdout,
// or sends huge strings (issue #25, items 8, 9 and 11): each is seen,
// counted and bounded, and never stops the router from deciding.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/pipeline"
)

// loggedHost returns a host with metrics on a fresh registry whose log
// (at info) goes to out, shut down and checked for leftovers at the end of
// the test.
func loggedHost(t *testing.T, out *syncBuffer, o Options) (*Host, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Logger = hclog.New(&hclog.LoggerOptions{Name: "host", Output: out, Level: hclog.Info})
	o.Registerer = reg
	h := NewHost(o)
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		assertNoLeftovers(t)
	})
	return h, reg
}

// TestInvalidAnswerIsACallFailure: a plugin whose every answer does not
// fit its task (a cost short, a NaN cost, a picked row out of range, a
// kept row out of range, a filtered_by naming no filter) fails each call
// with cause invalid_answer and the reason: it is logged, counted by
// reason, falls back, and opens the circuit breaker after
// DefaultBreakerConsecutiveFailures calls, like a plugin whose calls
// fail; a filtered_by of 1 MiB is quoted bounded and escaped.
func TestInvalidAnswerIsACallFailure(t *testing.T) {
	for _, tc := range []struct{ how, reason, detail string }{
		{"costs", "row_count", "2 costs for 3 rows"},
		{"nan", "non_finite_cost", "cost NaN for row 0"},
		{"picked", "picked_out_of_range", "picked row 1048576, not in [0, 4)"},
		{"kept", "kept_out_of_range", "kept rows [0 1 3 1048576] not strictly ascending in [0, 4)"},
		{"filtered-by", "filtered_by", `filtered_by "\x1b[2Jxxxx`},
	} {
		t.Run(tc.how, func(t *testing.T) {
			var logs syncBuffer
			// The breaker's window and open time are an hour, so that a
			// starved machine's slow calls change nothing.
			h, reg := loggedHost(t, &logs, Options{Breaker: BreakerPolicy{Window: time.Hour, OpenTimeout: time.Hour}})
			b := block("wrong", "invalid")
			b.Env["SY_INVALID"] = tc.how
			cp := startPolicy(t, h, b)
			want := fmt.Sprintf(`plugin "wrong": plugin decide: invalid answer (%s): %s`, tc.reason, tc.detail)
			for call := 1; call <= DefaultBreakerConsecutiveFailures; call++ {
				_, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
				var ce *CallError
				if !errors.As(err, &ce) || ce.Cause != "invalid_answer" || !strings.Contains(err.Error(), want) || !fallbackable(err) {
					t.Fatalf("call %d: %v; want a CallError of cause invalid_answer saying %s", call, err, want)
				}
				if n := len(err.Error()); n > 1024 {
					t.Fatalf("call %d: an error of %d bytes", call, n)
				}
			}
			if !h.BreakerOpen("wrong") {
				t.Errorf("the breaker is closed after %d invalid answers in a row", DefaultBreakerConsecutiveFailures)
			}
			_, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
			if !errors.Is(err, ErrBreakerOpen) {
				t.Errorf("the call after the breaker opened: %v, want ErrBreakerOpen", err)
			}
			n := float64(DefaultBreakerConsecutiveFailures)
			for _, c := range []struct{ metric, label, value string }{
				{"switchyard_plugin_call_errors_total", "code", "invalid_answer"},
				{"switchyard_plugin_fallbacks_total", "reason", "invalid_answer"},
				{"switchyard_plugin_invalid_answers_total", "reason", tc.reason},
			} {
				if v := counterValue(t, reg, c.metric, "plugin", "wrong", c.label, c.value); v != n {
					t.Errorf("%s{%s=%q} = %v, want %v", c.metric, c.label, c.value, v, n)
				}
			}
			got := logs.String()
			if !strings.Contains(got, "plugin call failed: call=decide cause=invalid_answer failures=1 ") || !strings.Contains(got, "invalid answer ("+tc.reason+")") {
				t.Errorf("no warning of the first invalid answer:\n%s", got)
			}
			if strings.Contains(got, "\x1b") || len(got) > 64<<10 {
				t.Errorf("the log holds a raw escape or is %d bytes long", len(got))
			}
		})
	}
}

// TestHugePluginErrorIsBounded: a plugin answering a 12 MiB error that
// starts with a terminal escape fails the call (cause error) with an error
// of at most about untrusted.MaxLog bytes, escaped, and so is its warning.
func TestHugePluginErrorIsBounded(t *testing.T) {
	var logs syncBuffer
	h, _ := loggedHost(t, &logs, Options{})
	b := block("loud", "invalid")
	b.Env["SY_INVALID"] = "error"
	cp := startPolicy(t, h, b)
	for call := 1; call <= 3; call++ {
		_, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
		var ce *CallError
		if !errors.As(err, &ce) || ce.Cause != "error" {
			t.Fatalf("call %d: %v, want a CallError of cause error", call, err)
		}
		msg := err.Error()
		if len(msg) > 1024 || strings.Contains(msg, "\x1b") || !strings.Contains(msg, `\x1b[31mredeee`) || !strings.Contains(msg, "bytes)") {
			t.Fatalf("call %d: an error of %d bytes, starting %.300q; want it cut to about 256 bytes of the plugin's, escaped, its length said", call, len(msg), msg)
		}
	}
	if got := logs.String(); len(got) > 64<<10 || strings.Contains(got, "\x1b") || !strings.Contains(got, `cause=error failures=1`) {
		t.Errorf("log of %d bytes (want the warning, bounded and escaped), starting %.600q", len(got), got)
	}
}

// countingWriter counts what is written to it and keeps the writes that
// contain keep.
type countingWriter struct {
	keep string
	n    atomic.Int64
	mu   sync.Mutex
	kept []string
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.n.Add(int64(len(b)))
	if strings.Contains(string(b), w.keep) {
		w.mu.Lock()
		w.kept = append(w.kept, string(b))
		w.mu.Unlock()
	}
	return len(b), nil
}

func (w *countingWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.kept...)
}

// TestStderrFloodIsRateLimited: a plugin that writes 32 MiB to stderr
// gets at most a few MiB of it into the router's log (StderrBurst, then
// StderrRate), with a warning counting what was dropped, and serves.
func TestStderrFloodIsRateLimited(t *testing.T) {
	out := &countingWriter{keep: "dropped plugin stderr"}
	h := NewHost(Options{Logger: hclog.New(&hclog.LoggerOptions{Name: "host", Output: out, Level: hclog.Info})})
	b := block("flood", "stderr-flood")
	b.Env["SY_STDERR_MB"] = "32"
	b.StartTimeout = time.Minute // the flood comes before the handshake
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cp, err := pipeline.Compile(testPolicy(t, types, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{}); err != nil {
		t.Errorf("a decision after the flood: %v", err)
	}
	// Once shut down, every byte of stderr has been read (go-plugin's
	// Kill waits for its stderr reader).
	if err := h.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	assertNoLeftovers(t)
	// 512 KiB at once, then 64 KiB/s: 8 MiB would take two minutes.
	if n := out.n.Load(); n > 8<<20 {
		t.Errorf("%d MiB of log for 32 MiB of plugin stderr", n>>20)
	}
	if d := out.lines(); len(d) == 0 || !strings.Contains(d[0], "dropped_bytes=") {
		t.Errorf("no warning about the stderr dropped: %q", d)
	}
}

// TestStdoutLongLineKeepsDeciding: a plugin that, after its handshake,
// writes a 100 KiB line to its raw stdout and then a 4 KiB line at every
// decision keeps deciding: the router keeps reading (and discarding) its
// stdout, so its writes never block. (go-plugin's own reader stops at a
// line over 64 KiB, and the plugin's next writes would fill the pipe.)
func TestStdoutLongLineKeepsDeciding(t *testing.T) {
	var logs syncBuffer
	h, _ := loggedHost(t, &logs, Options{})
	cp := startPolicy(t, h, block("chatty", "stdout-flood"))
	// 200 decisions write 800 KiB after the long line: far more than a
	// pipe holds.
	for call := 1; call <= 200; call++ {
		if _, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{}); err != nil {
			t.Fatalf("decision %d: %v", call, err)
		}
	}
	if s := h.Stats("chatty"); s.Restarts != 0 || s.Errors != 0 || s.Timeouts != 0 {
		t.Errorf("Stats %+v, want no failure", s)
	}
	if got := logs.String(); !strings.Contains(got, "wrote to its stdout after the handshake") || strings.Contains(got, strings.Repeat("L", 1024)) {
		t.Errorf("want one bounded warning about stdout, got:\n%.2000s", got)
	}
}
