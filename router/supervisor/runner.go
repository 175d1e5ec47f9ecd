package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// cmdRunner runs a plugin process for go-plugin (plugin.ClientConfig's
// RunnerFunc) as go-plugin's own runner for a Cmd does, but for its
// stdout: go-plugin scans a plugin's stdout for the handshake line with a
// bufio.Scanner and, after a line over 64 KiB (bufio.MaxScanTokenSize),
// stops reading it for good, so that once the pipe's buffer fills, every
// later write of the plugin to its stdout (from a library, a child, code
// not built on the SDK) blocks, and with it whatever the plugin was
// doing, decisions included. Here the router reads the stdout pipe itself
// for the whole life of the process (relayStdout): go-plugin is handed the
// first line, then end-of-file; everything after it is read and discarded
// (plugins must not write to stdout), with a rate-limited warning. A
// first line over 64 KiB is reported as go-plugin would have found it
// (proc.stdoutTooLong).
type cmdRunner struct {
	cmd  *exec.Cmd
	path string
	log  hclog.Logger
	// tooLong is called when the first line is over bufio.MaxScanTokenSize.
	tooLong func()

	stdoutR, stdoutW *os.File      // the plugin's stdout pipe
	stderr           io.ReadCloser // the plugin's stderr, for go-plugin
	first            *firstLine    // what go-plugin reads as stdout
	relayed          chan struct{} // closed when relayStdout has returned
	relayOnce        sync.Once
	reports          *untrusted.Limiter
	// stray, when set, is given the lines before the handshake line
	// (Options.StrayStdout), which are then skipped.
	stray func([]byte)

	pid int
}

// maxStrayLines bounds how many lines before the handshake stray skips.
const maxStrayLines = 64

// looksLikeHandshake reports whether line can be go-plugin's handshake
// line, CORE-PROTOCOL-VERSION|APP-PROTOCOL-VERSION|NETWORK-TYPE|
// NETWORK-ADDR[|PROTOCOL...]: a digit first and at least three '|'
// (github.com/hashicorp/go-plugin v1.8.0 client.go, Client.Start, which splits
// the line on '|' and wants at least 4 parts).
func looksLikeHandshake(line []byte) bool {
	return len(line) > 0 && line[0] >= '0' && line[0] <= '9' && bytes.Count(line, []byte{'|'}) >= 3
}

var _ runner.Runner = (*cmdRunner)(nil)

// stdoutReport is how often, at most, the warning about a plugin writing
// to its stdout after the handshake is logged.
const stdoutReport = stderrDropReport

// newCmdRunner prepares cmd's stdout and stderr pipes; env are go-plugin's
// variables for the plugin (the handshake cookie, the protocol versions),
// appended to cmd's environment but for the socket directory, which cmd's
// own environment names (environ). Start starts it.
func newCmdRunner(cmd *exec.Cmd, path string, env []string, log hclog.Logger, tooLong func()) (*cmdRunner, error) {
	for _, kv := range env {
		if !strings.HasPrefix(kv, plugin.EnvUnixSocketDir+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		_ = stderr.Close()
		return nil, fmt.Errorf("creating the stdout pipe: %w", err)
	}
	cmd.Stdout = w
	return &cmdRunner{
		cmd: cmd, path: path, log: log, tooLong: tooLong,
		stdoutR: r, stdoutW: w, stderr: stderr,
		first:   &firstLine{ch: make(chan []byte, 1)},
		relayed: make(chan struct{}),
		reports: untrusted.NewLimiter(stdoutReport),
	}, nil
}

// Start starts the process and the relay of its stdout.
func (r *cmdRunner) Start(context.Context) error {
	err := r.cmd.Start()
	_ = r.stdoutW.Close() // the child holds its own copy
	if err != nil {
		_ = r.stdoutR.Close()
		close(r.first.ch)
		close(r.relayed)
		return err
	}
	r.pid = r.cmd.Process.Pid
	go r.relayStdout()
	return nil
}

// relayStdout hands go-plugin the first line of the plugin's stdout, then
// end-of-file, and reads and discards the rest until the pipe's end (every
// holder closed it) or closeStdout.
func (r *cmdRunner) relayStdout() {
	defer close(r.relayed)
	defer func() { _ = r.stdoutR.Close() }()
	br := bufio.NewReaderSize(r.stdoutR, bufio.MaxScanTokenSize)
	line, err := br.ReadSlice('\n')
	for skipped := 0; r.stray != nil && err == nil && skipped < maxStrayLines && !looksLikeHandshake(line); skipped++ {
		r.stray(append([]byte(nil), line...))
		line, err = br.ReadSlice('\n')
	}
	tooLong := errors.Is(err, bufio.ErrBufferFull)
	if tooLong {
		r.tooLong() // the start fails: no warnings about the rest
		line = nil
	}
	if len(line) > 0 {
		r.first.ch <- append([]byte(nil), line...)
	}
	close(r.first.ch)
	if err != nil && !tooLong {
		return
	}
	var total int64
	buf := make([]byte, 32<<10)
	for {
		n, err := br.Read(buf)
		if n > 0 {
			total += int64(n)
			if ok, _ := r.reports.Allow("stdout"); ok && !tooLong {
				r.log.Warn("the plugin wrote to its stdout after the handshake; discarded (plugins must not write to stdout: log to stderr)",
					"bytes_so_far", total, "start", untrusted.Bytes(buf[:n], untrusted.MaxLog))
			}
		}
		if err != nil {
			return
		}
	}
}

// closeStdout ends the relay, should the pipe outlive the process (a
// descendant holding it); r.relayed is closed once it has.
func (r *cmdRunner) closeStdout() {
	r.relayOnce.Do(func() { _ = r.stdoutR.Close() })
}

// Wait waits for the process to exit (go-plugin calls it once it has read
// stderr to its end).
func (r *cmdRunner) Wait(context.Context) error { return r.cmd.Wait() }

// Kill kills the process; killing it again, or once it exited, is no
// error.
func (r *cmdRunner) Kill(context.Context) error {
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Stdout is what go-plugin scans for the handshake line: the first line,
// then end-of-file.
func (r *cmdRunner) Stdout() io.ReadCloser { return r.first }

// Stderr is the plugin's stderr.
func (r *cmdRunner) Stderr() io.ReadCloser { return r.stderr }

// Name is the command's path; go-plugin names the stderr lines' logger
// after its base name (quietStderr).
func (r *cmdRunner) Name() string { return r.path }

// ID is the process id ("0" before it started).
func (r *cmdRunner) ID() string { return fmt.Sprintf("%d", r.pid) }

// Diagnose adds nothing to go-plugin's error for a handshake line it does
// not recognise: handshakeCause words it.
func (r *cmdRunner) Diagnose(context.Context) string { return "" }

// PluginToHost: the plugin runs on this host, its addresses are ours.
func (r *cmdRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

// HostToPlugin: the plugin runs on this host, our addresses are its.
func (r *cmdRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// firstLine is the stdout go-plugin reads: the line relayStdout sends on
// ch, then end-of-file once ch is closed. Only go-plugin's scanner reads
// it.
type firstLine struct {
	ch  chan []byte // buffered: the relay never blocks on it
	cur []byte
}

func (f *firstLine) Read(b []byte) (int, error) {
	for len(f.cur) == 0 {
		line, ok := <-f.ch
		if !ok {
			return 0, io.EOF
		}
		f.cur = line
	}
	n := copy(b, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// Close does nothing: the relay owns the pipe.
func (f *firstLine) Close() error { return nil }
