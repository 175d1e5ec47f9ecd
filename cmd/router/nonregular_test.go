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
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile"
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
	fifo := filepath.Join(dir, "fifo.hcl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.hcl")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir.hcl")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.hcl")
	if err := os.WriteFile(big, bytes.Repeat([]byte("\n"), inputfile.MaxConfigSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	fifoTrace := filepath.Join(dir, "fifo.jsonl")
	if err := syscall.Mkfifo(fifoTrace, 0o644); err != nil {
		t.Fatal(err)
	}
	zeroTrace := filepath.Join(dir, "zero.csv")
	if err := os.Symlink("/dev/zero", zeroTrace); err != nil {
		t.Fatal(err)
	}
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
