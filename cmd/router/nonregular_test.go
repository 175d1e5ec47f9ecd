//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/inputfile/inputfiletest"
)

// TestNonRegularInputsAreRefused runs the router binary on policy,
// workers and trace paths that are not regular files (a named pipe with
// no writer, a symbolic link to /dev/zero, a directory) or are over the
// 4 MiB cap, and checks each is refused with a message naming the file.
// Before, validate on the /dev/zero link grew to 23 GB and on the pipe
// hung, deaf to SIGTERM. Each run has a deadline as a safety net (the
// process is killed at it); the test asserts the message, not the time.
func TestNonRegularInputsAreRefused(t *testing.T) {
	bin, _ := e2eBinaries(t)
	dir := t.TempDir()
	fifo := inputfiletest.FIFO(t, dir, "fifo.hcl")
	zero := inputfiletest.DevZero(t, dir, "zero.hcl")
	sub := inputfiletest.Dir(t, dir, "dir.hcl")
	big := inputfiletest.Oversized(t, dir, "big.hcl", inputfile.MaxConfigSize)
	fifoTrace := inputfiletest.FIFO(t, dir, "fifo.jsonl")
	zeroTrace := inputfiletest.DevZero(t, dir, "zero.csv")
	const (
		isFIFO = " is a named pipe (FIFO), not a regular file"
		isZero = " (a symbolic link to /dev/zero) is a character device, not a regular file"
		isDir  = " is a directory, not a regular file"
		isBig  = ": file too large: over the 4 MiB limit"
		stream = "; to replay a stream, pipe it to --trace - (with --trace-format)"
	)
	readPolicy := func(path, why string) string {
		return path + ":1:1: error: Failed to read policy file; " + path + why + ".\n"
	}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"validate fifo", []string{"validate", fifo}, 1, readPolicy(fifo, isFIFO)},
		{"validate dev zero", []string{"validate", zero}, 1, readPolicy(zero, isZero)},
		{"validate directory", []string{"validate", sub}, 1, readPolicy(sub, isDir)},
		{"validate over the cap", []string{"validate", big}, 1, readPolicy(big, isBig)},
		{"replay policy fifo", []string{"replay", "--policy", fifo}, 1,
			readPolicy(fifo, isFIFO) + "router: " + fifo + ": policy file has errors\n"},
		{"replay compare dev zero", []string{"replay", "--compare", rrPolicy + "," + zero}, 1,
			readPolicy(zero, isZero) + "router: " + zero + ": policy file has errors\n"},
		{"replay trace fifo", []string{"replay", "--trace", fifoTrace}, 1, "router: " + fifoTrace + isFIFO + stream + "\n"},
		{"replay trace dev zero", []string{"replay", "--trace", zeroTrace}, 1,
			"router: " + zeroTrace + isZero + stream + "\n"},
		{"serve policy fifo", []string{"serve", "--policy", fifo, "--listen", "127.0.0.1:0"}, 1,
			readPolicy(fifo, isFIFO) + "router: " + fifo + " does not load\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr := runBinary(t, bin, tt.args...)
			if code != tt.code || stderr != tt.stderr {
				t.Errorf("exit %d, stderr\n%s\nwant exit %d, stderr\n%s", code, stderr, tt.code, tt.stderr)
			}
		})
	}

	// serve's workers file is read (and watched) through the same check;
	// a policy without workers is enough, as the workers file fails first.
	t.Run("serve workers-file fifo", func(t *testing.T) {
		code, stderr := runBinary(t, bin, "serve", "--policy", rrPolicy, "--listen", "127.0.0.1:0", "--workers-file", fifo)
		want := fifo + ":1:1: error: Failed to read workers file; " + fifo + isFIFO + ".\n" + "router: " + fifo + " does not load\n"
		if code != 1 || !strings.HasSuffix(stderr, want) {
			t.Errorf("exit %d, stderr\n%s\nwant exit 1 and a stderr ending in\n%s", code, stderr, want)
		}
	})
}

// runBinary runs bin with args and returns its exit status and stderr. A
// run that has not ended after a minute is killed and fails the test: a
// safety net against a hang, not a measure of speed.
func runBinary(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%q did not end; stderr:\n%s", args, stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	default:
		t.Fatalf("%q: %v", args, err)
		return 0, ""
	}
}

// TestOutputToOwnStandardStreamIsRefused runs the router binary with its
// standard input, output or error redirected to a regular file and an
// output flag naming that stream by a /dev or /proc path. The output is
// written by renaming a temporary over the target, which would replace
// the redirected file instead of writing to the stream: an appended log
// lost, the trace read from stdin replaced. Each is refused, pointing to
// `-`, and the file is left as it was.
func TestOutputToOwnStandardStreamIsRefused(t *testing.T) {
	bin, _ := e2eBinaries(t)
	trace, err := os.ReadFile(arxivTrace)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, stream string // stream: the redirected one
		args         []string
	}{
		{"report to /dev/stdout", "stdout", []string{"--report", "/dev/stdout"}},
		{"per-request to /proc/self/fd/1", "stdout", []string{"--per-request", "/proc/self/fd/1"}},
		{"report to /dev/stderr", "stderr", []string{"--report", "/dev/stderr"}},
		{"report to /dev/stdin", "stdin", []string{"--trace", "-", "--trace-format", "jsonl", "--report", "/dev/stdin"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, tt.stream)
			old := []byte("an earlier log line\n")
			if tt.stream == "stdin" {
				old = trace
			}
			if err := os.WriteFile(file, old, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(file, os.O_RDWR|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, append([]string{"replay", "--limit", "5"}, tt.args...)...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			switch tt.stream {
			case "stdin":
				cmd.Stdin = f
			case "stdout":
				cmd.Stdout = f
			case "stderr":
				cmd.Stderr = f
			}
			err = cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("exit: %v, want status 1", err)
			}
			got, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			msg := stderr.String()
			if tt.stream == "stderr" {
				msg = strings.TrimPrefix(string(got), string(old))
				got = got[:min(len(got), len(old))]
			}
			if !bytes.Equal(got, old) {
				t.Errorf("%s's file holds %.200q, want it as it was", tt.stream, got)
			}
			want := "is the router's standard " + map[string]string{"stdin": "input", "stdout": "output", "stderr": "error"}[tt.stream]
			if !strings.Contains(msg, want) || !strings.Contains(msg, "-") {
				t.Errorf("stderr %q, want it to say %q", msg, want)
			}
		})
	}
}
