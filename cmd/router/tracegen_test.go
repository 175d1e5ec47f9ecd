package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/trace"
)

const syntheticTrace = "synthetic_sessions.jsonl"

// TestTraceGenerateBundled runs the command testdata/traces/README.md
// documents for checking the bundled synthetic trace, which writes a
// temporary file and compares it with the bundled one (cmp), and requires
// its output to be the bundled file byte for byte, and SHA256SUMS to pin
// that file.
func TestTraceGenerateBundled(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(traceDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^bin/router (trace generate .*)$`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("testdata/traces/README.md documents no `bin/router trace generate` command")
	}
	args := strings.Fields(string(m[1]))
	out := filepath.Join(t.TempDir(), syntheticTrace)
	documented := ""
	for i := range args[:len(args)-1] {
		if args[i] == "--out" {
			documented, args[i+1] = args[i+1], out
		}
	}
	if documented == "" {
		t.Fatalf("documented command %q has no --out", m[1])
	}
	// The documented check compares the written file with the bundled one.
	if cmpLine := "cmp " + documented + " testdata/traces/" + syntheticTrace; !strings.Contains(string(readme), "\n"+cmpLine) {
		t.Fatalf("testdata/traces/README.md lacks a line starting %q after %q", cmpLine, m[1])
	}
	code, stdout, stderr := routerRun(t, args...)
	if code != 0 || stdout != "" {
		t.Fatalf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
	}
	want := "router: wrote 10000 requests of 2350 sessions over 582 s of simulated time (7 bursts) to " + out + "\n"
	if stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	bundled, err := os.ReadFile(filepath.Join(traceDir, syntheticTrace))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bundled) {
		t.Fatalf("the documented command %q gives %d bytes that differ from the bundled %s (%d bytes): "+
			"regenerate it and update SHA256SUMS", m[1], len(got), syntheticTrace, len(bundled))
	}
	sums, err := os.ReadFile(filepath.Join(traceDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bundled)
	if line := hex.EncodeToString(sum[:]) + "  " + syntheticTrace + "\n"; !strings.Contains(string(sums), line) {
		t.Errorf("SHA256SUMS lacks %q", line)
	}
}

// TestTraceGenerateStdout writes a small trace to standard output and
// reads it back; --seed changes it.
func TestTraceGenerateStdout(t *testing.T) {
	code, stdout, stderr := routerRun(t, "trace", "generate", "--requests", "50", "--seed", "3")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.HasPrefix(stderr, "router: wrote 50 requests of ") || !strings.HasSuffix(stderr, " to standard output\n") {
		t.Errorf("stderr %q", stderr)
	}
	recs, err := trace.ReadMooncake(strings.NewReader(stdout), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 50 || recs[0].SessionID != "s0" {
		t.Fatalf("%d records, first session %q; want 50 from s0", len(recs), recs[0].SessionID)
	}
	_, again, _ := routerRun(t, "trace", "generate", "--requests", "50", "--seed", "3", "--out", "-")
	_, other, _ := routerRun(t, "trace", "generate", "--requests", "50", "--seed", "4")
	if again != stdout || other == stdout {
		t.Errorf("seed 3 twice equal: %v (want true); seeds 3 and 4 equal: %v (want false)", again == stdout, other == stdout)
	}
}

// TestTraceGenerateFlags checks that the shape flags reach the generator.
func TestTraceGenerateFlags(t *testing.T) {
	generate := func(args ...string) ([]trace.Record, string) {
		t.Helper()
		code, stdout, stderr := routerRun(t, append([]string{"trace", "generate"}, args...)...)
		if code != 0 {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
		}
		recs, err := trace.ReadMooncake(strings.NewReader(stdout), "stdout")
		if err != nil {
			t.Fatal(err)
		}
		return recs, stderr
	}
	// --mean-turns 1: every session has one turn; 100 sessions per second
	// without bursts: 400 sessions in about 4 s.
	recs, stderr := generate("--requests", "400", "--mean-turns", "1", "--session-rate", "100", "--burst-factor", "1")
	if !strings.HasPrefix(stderr, "router: wrote 400 requests of 400 sessions over ") || !strings.HasSuffix(stderr, " (0 bursts) to standard output\n") {
		t.Errorf("stderr %q", stderr)
	}
	if last := recs[len(recs)-1].Arrival.Seconds(); last < 2 || last > 8 {
		t.Errorf("last arrival %.1f s, want about 4 s", last)
	}
	// Sessions that would go on for 1,000 turns end at the prompt cap.
	recs, _ = generate("--requests", "2000", "--mean-turns", "1000", "--max-prompt-tokens", "20000", "--think-time", "1s")
	longest := 0
	for _, r := range recs {
		longest = max(longest, r.InputLength)
	}
	if longest > 20000 || longest < 15000 {
		t.Errorf("longest prompt %d tokens, want close to --max-prompt-tokens 20000 and not over it", longest)
	}
	// A think time of an hour leaves the first 400 requests nearly all
	// first turns; one of a second, few.
	sessions := func(recs []trace.Record) int {
		ids := map[string]bool{}
		for _, r := range recs {
			ids[r.SessionID] = true
		}
		return len(ids)
	}
	slow, _ := generate("--requests", "400", "--mean-turns", "1000", "--think-time", "1h")
	fast, _ := generate("--requests", "400", "--mean-turns", "1000", "--think-time", "1s")
	if n, m := sessions(slow), sessions(fast); n < 350 || m > 200 {
		t.Errorf("%d sessions with --think-time 1h (want over 350), %d with 1s (want under 200)", n, m)
	}
}

func TestTraceGenerateErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "t.jsonl")
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--requests", "0"}, 2, "router: --requests 0: want 1 to 1000000\n"},
		{[]string{"--session-rate", "0"}, 2, "router: --session-rate 0: want 0.01 to 10000 sessions per second\n"},
		{[]string{"--burst-factor", "0.5"}, 2, "router: --burst-factor 0.5: want 1 (no bursts) to 1000\n"},
		{[]string{"--mean-turns", "0"}, 2, "router: --mean-turns 0: want a mean from 1 to 1000 turns per session\n"},
		{[]string{"--think-time", "-1s"}, 2, "router: --think-time -1s: want 0 to 24h\n"},
		{[]string{"--max-prompt-tokens", "10000"}, 2, "router: --max-prompt-tokens 10000: want 16692 to 1048576 tokens " +
			"(at least the longest system prompt, 8500, plus MaxUserTokens, 8192, so that a first turn fits)\n"},
		{[]string{"--requests", "ten"}, 2, "router: --requests ten: want a whole number from 1 to 1000000\n"},
		{[]string{"--seed", "-1"}, 2, "router: --seed -1: want a whole number from 0 to 18446744073709551615\n"},
		{[]string{"--out", ""}, 2, "router: --out '': want a file name, or - for standard output\n"},
		{[]string{"extra"}, 2, `router: trace generate takes no arguments, got ["extra"]; see 'router trace generate --help'` + "\n"},
		{[]string{"--requests", "5", "--out", missing}, 1, "router: --out " + missing + ": "},
	} {
		code, stdout, stderr := routerRun(t, append([]string{"trace", "generate"}, c.args...)...)
		if code != c.code || stdout != "" || !strings.HasPrefix(stderr, c.msg) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, stderr starting %q", c.args, code, stdout, stderr, c.code, c.msg)
		}
	}
	// router trace alone prints its help, as every group does
	// (TestCommandGroups).
}
