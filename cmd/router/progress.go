package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/switchyard-router/switchyard/router/replay"
)

// progressTiming holds when router replay's progress appears and, on a
// stderr that is not a terminal, how often it prints a line: a replay
// shorter than delay shows nothing. Tests shorten both.
var progressTiming = struct{ delay, every time.Duration }{delay: 2 * time.Second, every: 10 * time.Second}

// progress shows the progress of router replay's runs on stderr (issue
// #15 §3): requests retired of the total over every run, the current
// run's simulated time, and an ETA. It shows nothing until
// progressTiming.delay of wall time has passed since it was made. On a
// terminal it draws a bar that updates in place (schollz/progressbar);
// elsewhere it prints a plain line every progressTiming.every and one at
// the end. Only the display reads the wall clock; the replays it follows
// are simulated time, and the progress they report is theirs.
type progress struct {
	w      io.Writer
	start  time.Time
	shown  bool      // past the delay: the bar draws, the lines print
	last   time.Time // the last plain line
	lastAt int       // done when the last plain line was printed
	runs   int       // runs of the command
	perRun int       // requests replayed by each run
	run    int       // the current run, 0-based
	label  string    // the current run's table label
	done   int       // requests retired over every run so far
	sim    time.Duration
	bar    *progressbar.ProgressBar // on a terminal only
	cols   int                      // the terminal's width, 0 when unknown
}

// newProgress returns the progress of runs replays of perRun requests
// each, shown on w (a terminal, see isTerminal); nil when
// quiet, and every method of a nil *progress does nothing.
func newProgress(w io.Writer, quiet bool, runs, perRun int) *progress {
	if quiet {
		return nil
	}
	p := &progress{w: w, start: time.Now(), runs: runs, perRun: perRun}
	if isTerminal(w) {
		p.bar = newBar(p)
		if cols, _, err := term.GetSize(int(terminalFile(w).Fd())); err == nil {
			p.cols = cols
		}
	}
	return p
}

// newBar returns p's bar, which writes through gate to p.w.
func newBar(p *progress) *progressbar.ProgressBar {
	return progressbar.NewOptions64(int64(p.runs)*int64(p.perRun),
		progressbar.OptionSetWriter(gate{p}),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetWidth(20))
}

// isTerminal reports whether w is a terminal: an *os.File on one, as
// such or wrapped as the router's stderr is (a *lockedWriter over a
// *pipeWriter).
func isTerminal(w io.Writer) bool {
	f := terminalFile(w)
	return f != nil && term.IsTerminal(int(f.Fd()))
}

// terminalFile is the *os.File under w, unwrapped as isTerminal says, or
// nil.
func terminalFile(w io.Writer) *os.File {
	if lw, ok := w.(*lockedWriter); ok {
		w = lw.w
	}
	if pw, ok := w.(*pipeWriter); ok {
		w = pw.w
	}
	f, _ := w.(*os.File)
	return f
}

// barRest is how many columns the bar takes besides its description: the
// percentage, the 20-column bar, the count, elapsed time and ETA
// ("  58% |███████████         | (28116/48124) [2s:1s]", 50 columns),
// with room for a larger fleet's counts and longer times.
const barRest = 58

// fitDescription cuts the bar's description so that the line fits a
// terminal of cols columns (the bar cannot see the terminal's width
// through gate); cols <= 0 leaves it whole.
func fitDescription(desc string, cols int) string {
	if cols <= 0 {
		return desc
	}
	room := cols - barRest
	r := []rune(desc)
	switch {
	case room < 8:
		return ""
	case len(r) > room:
		return string(r[:room-1]) + "…"
	}
	return desc
}

// gate passes the bar's output to the terminal once the delay is over.
type gate struct{ p *progress }

func (g gate) Write(b []byte) (int, error) {
	if !g.p.shown {
		return len(b), nil
	}
	return g.p.w.Write(b)
}

// startRun begins run i (0-based) of the command, labelled as in the
// table.
func (p *progress) startRun(i int, label string) {
	if p == nil {
		return
	}
	p.run, p.label, p.sim = i, label, 0
	p.done = i * p.perRun
}

// update is replay.Options.Progress for the current run.
func (p *progress) update(rp replay.Progress) {
	if p == nil {
		return
	}
	p.done = p.run*p.perRun + rp.Retired
	p.sim = rp.SimTime
	now := time.Now()
	show := p.shown || now.Sub(p.start) >= progressTiming.delay
	if p.bar != nil {
		// Set before it shows too (its writes gated), so that its ETA's
		// rate counts from the start. A display: a failed write to stderr
		// is not the replay's failure.
		_ = p.bar.Set64(int64(p.done))
		if p.shown = show; p.shown {
			desc := fmt.Sprintf("run %d of %d (%s), simulated %s", p.run+1, p.runs, p.label, p.sim.Truncate(time.Second))
			p.bar.Describe(fitDescription(desc, p.cols))
		}
		return
	}
	if p.shown = show; !p.shown {
		return
	}
	if p.last.IsZero() || now.Sub(p.last) >= progressTiming.every {
		p.line(now)
	}
}

// line prints the plain progress line.
func (p *progress) line(now time.Time) {
	p.last, p.lastAt = now, p.done
	total := p.runs * p.perRun
	eta := "unknown"
	if p.done > 0 {
		elapsed := now.Sub(p.start)
		eta = (time.Duration(float64(elapsed) * float64(total-p.done) / float64(p.done))).Round(time.Second).String()
	}
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(p.done) / float64(total)
	}
	fmt.Fprintf(p.w, "router: replay: run %d of %d (%s): %d of %d requests (%.1f%%), simulated %s, ETA %s\n",
		p.run+1, p.runs, p.label, p.done, total, pct, p.sim.Truncate(time.Second), eta)
}

// finish ends the display before the table is printed: it clears the bar
// from the terminal, or prints a last plain line when lines were printed.
func (p *progress) finish() {
	if p == nil || !p.shown {
		return
	}
	if p.bar != nil {
		_ = p.bar.Finish() // clears the line (OptionClearOnFinish)
		return
	}
	if p.lastAt != p.done {
		p.line(time.Now())
	}
}
