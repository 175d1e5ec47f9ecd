package main

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/replay"
)

// setProgressTiming makes progress show at once and print a line at
// every update, for the test, restoring the defaults after it.
func setProgressTiming(t *testing.T, delay, every time.Duration) {
	t.Helper()
	saved := progressTiming
	progressTiming.delay, progressTiming.every = delay, every
	t.Cleanup(func() { progressTiming = saved })
}

var progressLine = regexp.MustCompile(`(?m)^router: replay: run (\d) of 2 \(([^)]+)\): (\d+) of 600 requests \(([\d.]+)%\), simulated \S+, ETA \S+$`)

// On a stderr that is not a terminal, router replay prints plain progress
// lines: each names its run of the command's runs, and the requests done
// count over all of them, up to every request of both runs; --quiet
// prints none; the table is on standard output either way.
func TestReplayProgressLines(t *testing.T) {
	setProgressTiming(t, 0, 0)
	args := []string{"replay", "--trace", arxivTrace, "--limit", "300", "--workers", "4", "--compare", rrPolicy + "," + rrPolicy}
	code, out, errOut := routerRun(t, args...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := progressLine.FindAllStringSubmatch(errOut, -1)
	if len(lines) < 2 {
		t.Fatalf("%d progress lines in stderr, want one or more per run:\n%s", len(lines), errOut)
	}
	runsSeen := map[string]bool{}
	prev := -1
	for _, l := range lines {
		runsSeen[l[1]] = true
		if l[2] != "round-robin" {
			t.Errorf("line %q: run label %q, want round-robin", l[0], l[2])
		}
		done, err := strconv.Atoi(l[3])
		if err != nil {
			t.Fatal(err)
		}
		if done < prev {
			t.Errorf("line %q: %d requests done after %d", l[0], done, prev)
		}
		prev = done
	}
	if !runsSeen["1"] || !runsSeen["2"] {
		t.Errorf("progress lines name runs %v, want 1 and 2", runsSeen)
	}
	if last := lines[len(lines)-1]; last[3] != "600" || last[4] != "100.0" {
		t.Errorf("last progress line %q, want 600 of 600 requests (100.0%%)", last[0])
	}

	code, quietOut, quietErr := routerRun(t, append(args, "--quiet")...)
	if code != 0 {
		t.Fatalf("--quiet: exit %d, stderr %q", code, quietErr)
	}
	if strings.Contains(quietErr, "router: replay:") {
		t.Errorf("--quiet: stderr has progress:\n%s", quietErr)
	}
	for _, o := range []string{out, quietOut} {
		if !strings.Contains(o, "trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 4 simulated workers") {
			t.Errorf("standard output lacks the table's heading:\n%s", o)
		}
	}
}

// A replay that ends before the delay shows no progress at all.
func TestReplayProgressWaitsForDelay(t *testing.T) {
	setProgressTiming(t, time.Hour, 0)
	code, _, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "100", "--workers", "4")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if strings.Contains(errOut, "router: replay:") {
		t.Errorf("progress shown before its delay:\n%s", errOut)
	}
}

// BenchmarkProgressUpdate is the cost of one call of the printer's
// replay.Options.Progress hook once shown: on a stderr that is not a
// terminal between two lines (what every call but one in ten seconds
// costs), and with the terminal's bar (its output discarded), which
// redraws at most every 200 ms (BENCHMARKS.md, "Replay progress").
func BenchmarkProgressUpdate(b *testing.B) {
	saved := progressTiming
	defer func() { progressTiming = saved }()
	progressTiming.delay, progressTiming.every = 0, time.Hour
	for _, bar := range []bool{false, true} {
		name := "lines"
		if bar {
			name = "bar"
		}
		b.Run(name, func(b *testing.B) {
			p := newProgress(io.Discard, false, 2, 1_000_000)
			if bar {
				p.bar = newBar(p)
			}
			p.startRun(1, "default")
			p.update(replay.Progress{Retired: 1, Arrived: 2, Total: 1_000_000}) // shown from here
			i := 0
			for b.Loop() {
				i++
				p.update(replay.Progress{Retired: i % 1_000_000, Arrived: i % 1_000_000, Total: 1_000_000, SimTime: time.Duration(i)})
			}
		})
	}
}

// The bar's description is cut to leave the bar its room on a narrow
// terminal, and dropped on one too narrow for it.
func TestFitDescription(t *testing.T) {
	desc := "run 3 of 8 (least-loaded on 4 workers seed +0), simulated 55m24s"
	if got := fitDescription(desc, 0); got != desc {
		t.Errorf("unknown width: %q, want it whole", got)
	}
	if got := fitDescription(desc, 200); got != desc {
		t.Errorf("200 columns: %q, want it whole", got)
	}
	got := fitDescription(desc, 80)
	if n := len([]rune(got)); n != 80-barRest || !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, "run 3 of 8") {
		t.Errorf("80 columns: %q (%d runes), want the first %d runes ending in …", got, n, 80-barRest)
	}
	if got := fitDescription(desc, barRest+7); got != "" {
		t.Errorf("%d columns: %q, want no description", barRest+7, got)
	}
}
