// Command router is the Switchyard request router: it validates policy
// files and replays recorded LLM traffic through a policy on simulated
// workers.
//
//	router validate FILE
//	router replay [flags]
//	router trace generate [flags]
//	router version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
)

// exitError carries an exit code through cobra without printing usage.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "router",
		Short:         "Switchyard routes LLM requests to inference workers by policy",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(flagError)
	addLogLevelFlag(root)
	root.AddCommand(newValidateCmd(), newReplayCmd(), newPluginsCmd(), newVersionCmd())
	root.AddCommand(newMockWorkerCmd())
	root.AddCommand(newServeCmd(), newEPPCmd(), newKVRelayCmd(), newPDSidecarCmd())
	root.AddCommand(newTraceCmd())
	// cobra's completion command, made here rather than at Execute, so
	// that it is a group like the others.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			commandGroup(c)
		}
	}
	return root
}

// commandGroup makes cmd, a command that only holds subcommands, behave
// as every group of the router does: without arguments it prints its
// help on stdout and exits 0 (what cobra does for the root, a command
// with no run function); a first argument that names none of its
// subcommands is a usage error (exit 2) with cobra's suggestions
// (Command.SuggestionsFor), where cobra alone would print the help and
// exit 0 for a group below the root. It returns cmd.
func commandGroup(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.SuggestionsMinimumDistance = 2 // cobra's own for the root
	cmd.DisableFlagsInUseLine = true
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		names := make([]string, 0, len(cmd.Commands()))
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				names = append(names, c.Name())
			}
		}
		hint := ""
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			hint = fmt.Sprintf("; did you mean %q?", s[0])
		}
		return fmt.Errorf("unknown command %q for %q%s (its commands: %s; see '%s --help')",
			args[0], cmd.CommandPath(), hint, strings.Join(names, ", "), cmd.CommandPath())
	}
	return cmd
}

// main runs the command line. The first SIGINT or SIGTERM cancels the
// command's context, so a replay stops at its next check and removes its
// temporary output files; a second one kills the process as usual.
//
// A write to a stdout or stderr whose reader is gone (`router validate
// ... 2>&1 | head -1`) would kill the process with SIGPIPE, skipping
// every cleanup (plugins' socket directories); SIGPIPE is caught for the
// whole run instead (catchBrokenPipe): such a write fails with EPIPE, the
// first one on stdout or stderr cancels the command like SIGTERM, and the
// router exits with status 141 (128 + SIGPIPE, what a shell reports for a
// process killed by it) once the command has cleaned up. A broken
// connection (a client of router serve that left) raises SIGPIPE too
// while it is caught; only the router's own stdout and stderr count.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	ctx, out, brokenPipe := catchBrokenPipe(ctx)
	code := runContext(ctx, os.Args[1:], out(os.Stdout), out(os.Stderr))
	stop()
	if brokenPipe() {
		code = 128 + int(syscall.SIGPIPE)
	}
	os.Exit(code)
}

// catchBrokenPipe catches SIGPIPE until the process exits (Go kills a
// process that writes to a broken pipe on fd 1 or 2 only while SIGPIPE is
// not caught; caught, the write returns EPIPE, and every broken socket's
// write raises it too, so the signal itself says nothing). It returns a
// context cancelled at the first EPIPE of a writer wrapped by out (the
// router's stdout and stderr), out, and a function reporting whether one
// came.
func catchBrokenPipe(parent context.Context) (context.Context, func(io.Writer) io.Writer, func() bool) {
	ctx, cancel := context.WithCancel(parent)
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	go func() {
		for range pipes { // drained: the writes' EPIPE tells whose pipe broke
		}
	}()
	broke := new(atomic.Bool)
	out := func(w io.Writer) io.Writer { return &pipeWriter{w: w, broke: broke, cancel: cancel} }
	return ctx, out, broke.Load
}

// pipeWriter is the router's stdout or stderr: its first write that
// fails with EPIPE (the reader is gone) marks the pipe broken and cancels
// the command.
type pipeWriter struct {
	w      io.Writer
	broke  *atomic.Bool
	cancel context.CancelFunc
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if err != nil && errors.Is(err, syscall.EPIPE) && p.broke.CompareAndSwap(false, true) {
		p.cancel()
	}
	return n, err
}

// run executes the command line and returns the process exit code: 0 on
// success, 1 on a failed validation or run, 2 on a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run with a context that commands observe.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runIO(ctx, args, os.Stdin, stdout, stderr)
}

// runIO is runContext reading standard input (router replay --trace -)
// from stdin.
func runIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Plugins' stderr is logged from go-plugin's goroutines while the
	// command writes its own lines: one lock keeps every write whole.
	stderr = &lockedWriter{w: stderr}
	root := newRootCmd(stdout, stderr)
	root.SetIn(stdin)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ctx.Err() != nil && errors.Is(ee.err, context.Canceled) {
				// SIGINT or SIGTERM: say so, not "context canceled".
				fmt.Fprintln(stderr, "router: interrupted")
			} else if ee.err != nil && ee.err.Error() != "" {
				fmt.Fprintln(stderr, "router:", ee.err)
			}
			return ee.code
		}
		fmt.Fprintln(stderr, "router:", err)
		return 2
	}
	return 0
}

// lockedWriter serialises writes to w, so lines written from several
// goroutines (the command's own, plugin logs) never interleave or race.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
