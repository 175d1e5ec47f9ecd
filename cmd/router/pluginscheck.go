package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/plugincheck"
	"github.com/switchyard-router/switchyard/shared"
)

func newPluginsCheckCmd() *cobra.Command {
	var (
		src         pluginSource
		callTimeout time.Duration
		configKV    []string
		onlyType    string
		role        string
		asJSON      bool
		replayTrace string
		replayLimit int
	)
	cmd := &cobra.Command{
		Use:   "check (BINARY [ARGS...] | --policy FILE --plugin NAME)",
		Short: "Run a plugin binary through the protocol's conformance checks",
		Long: `Start a plugin binary as the router would, and check it against the plugin
protocol (docs/plugin-protocol.md, section 9 lists every check). BINARY
without a slash is looked up on PATH; it gets only the environment --env and
--pass-env give it. With --policy FILE --plugin NAME the plugin block NAME of
the policy file is started instead, with that block's command, args, env,
pass_env, sha256 and start_timeout. Put "--" before BINARY when its
arguments look like flags: router plugins check -- node x.js --log-level debug.

  handshake        the handshake line first, then a usable Describe
  schema           at least one type; type names the policy loader accepts
                   (letters, digits, '_', '.' and '-', not "default", no
                   built-in type's name), unique; identifier-like parameter
                   names, unique per type; defaults of the declared type; a
                   doc on every type and parameter
  configure        every type (or --type T) with its defaults plus --config
                   (needed for required parameters), for --role; a value of the
                   wrong type, and each parameter at its type's boundaries (int
                   0, -1, 1, min, max; number 0, -1, tiny, +-huge; string
                   empty, 64 KiB, non-ASCII; duration 0, +-1ns, min, max; bool
                   both): accepted, or refused with a diagnostic naming it
  decide           every filter, scorer and picker over 1, 8 and 4,096 rows with
                   worker ids above 2^53, then 32 calls at once, each answer
                   run through the router's own pipeline and supervisor: a
                   FAIL says "the router would fall back on this decision
                   because ..."
  decide batch     one DecideBatch of several tasks of different sizes and an
                   unknown instance: exactly one well-formed result per task,
                   in any order
  decide streams   4 Decide streams at once, each answer on its own stream
  latency          cold and warm (p50, p99, max) call times at 8 and 64 rows,
                   and at 64 rows 16 calls at once (under load); a WARNING,
                   not a failure, when one or the p99 the plugin declares
                   (expected_decide_p99_nanos) is over --call-timeout
  classify/events  classifiers answer sample requests; those wanting events
                   acknowledge every batch in order and honour events_through
  health           5 grpc.health.v1 checks of "plugin" in a row answer SERVING;
                   a WARNING when one takes over the router's 2 s probe deadline
  shutdown         an exit within 1.5 s of being asked to stop
  stdout           nothing on stdout after the handshake, as go-plugin's stdio
                   service relays it (a Go plugin's os.Stdout); SKIP when the
                   plugin serves no such service: its stdout is then unseen
  parent death     a second copy, started under a parent that is then
                   SIGKILLed, exits within 10 s; a socket directory it leaves
                   is a WARNING (the router sweeps such directories)
  replay           with --replay=TRACE (--replay alone: the bundled trace),
                   each filter, scorer and picker in a policy of its own
                   replays the first --replay-limit requests on 8 simulated
                   workers as router replay --fail-on-fallback: any
                   selection decided by the fallback fails, naming the cause

It prints one line per check as it completes, "PASS name (note)" or "FAIL
name: expected X, got Y", plus "WARNING name: ..." after a passing check the
router would still act on; once the plugin process is gone (it exited or
was killed), the first FAIL says how, and the checks needing it print "SKIP
name: not run: ...". With --json it prints one JSON object at the end, with a
"checks" array (or an "error" when the checks could not start). It exits 0
only when no check failed, 1 otherwise (2 on a usage error). Describe and
each Configure get --start-timeout; other calls a minute each: latency is
reported, not failed. In "go test", package plugintest runs the same
checks.`,
		// Arguments are checked in RunE, so that with --json a usage
		// error is a JSON document too.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			stdout := cmd.OutOrStdout()
			// runErr reports an error that kept the checks from running:
			// with --json as a JSON document too.
			runErr := func(err error) error {
				if asJSON {
					if werr := plugincheck.WriteJSON(stdout, plugincheck.Report{Error: err.Error()}); werr != nil {
						return werr
					}
				}
				return err
			}
			if err := src.validate(cmd, args); err != nil {
				return runErr(err)
			}
			cfg, err := plugincheck.ParseConfig(configKV)
			if err != nil {
				return runErr(err)
			}
			if !shared.Role(role).Valid() {
				return runErr(fmt.Errorf("--role %q: want aggregated, prefill or decode", role))
			}
			if callTimeout <= 0 {
				return runErr(fmt.Errorf("--call-timeout %v: want %s", callTimeout, positiveDurationWant))
			}
			if replayLimit < 1 {
				return runErr(fmt.Errorf("--replay-limit %d: want a whole number >= 1", replayLimit))
			}
			if cmd.Flags().Changed("replay-limit") && replayTrace == "" {
				return runErr(errors.New("--replay-limit applies to --replay: give --replay=TRACE (or --replay alone for the bundled trace)"))
			}
			if err := checkReplayFlag(replayTrace, args); err != nil {
				return runErr(err)
			}
			var results []plugincheck.Result
			b, err := src.plugin(cmd, args)
			switch {
			case errors.Is(err, config.ErrCommandNotFound):
				// As a path that does not exist: the handshake fails.
				results = []plugincheck.Result{{Name: "handshake", Expected: "the handshake line, then a usable Describe answer", Got: err.Error()}}
				if !asJSON {
					if err := plugincheck.WriteText(stdout, results[0]); err != nil {
						return err
					}
				}
			case err != nil:
				return runErr(err)
			default:
				o := plugincheck.Options{Plugin: b, Config: cfg, Type: onlyType, Role: shared.Role(role), CallTimeout: callTimeout,
					Logger: pluginLogger(cmd.Context(), cmd.ErrOrStderr()), Replay: replayTrace, ReplayLimit: replayLimit}
				var writeErr error
				if !asJSON {
					// Each line as its check completes.
					o.Report = func(r plugincheck.Result) {
						if writeErr == nil {
							writeErr = plugincheck.WriteText(stdout, r)
						}
					}
				}
				results = plugincheck.Run(cmd.Context(), o)
				if writeErr != nil {
					return writeErr
				}
			}
			if asJSON {
				if err := plugincheck.WriteJSON(stdout, plugincheck.Report{Checks: results}); err != nil {
					return err
				}
			}
			if plugincheck.Failed(results) {
				return &exitError{code: 1, err: errChecksFailed}
			}
			return nil
		},
	}
	f := cmd.Flags()
	src.addFlags(f)
	f.DurationVar(&callTimeout, "call-timeout", config.DefaultCallTimeout, "the plugin block's call_timeout that call latency is compared with (a warning when above)")
	f.StringArrayVar(&configKV, "config", nil, "PARAM=VALUE: a parameter value for every type declaring PARAM, parsed as its declared type (repeatable; needed for required parameters)")
	f.StringVar(&onlyType, "type", "", "check only the component type of this name")
	f.StringVar(&role, "role", string(shared.RoleAggregated), "the worker role instances are configured and decide for: aggregated, prefill or decode")
	f.BoolVar(&asJSON, "json", false, `print one JSON object at the end: {"checks": [{"name", "pass", "skipped", "expected", "got", "note", "warning"}...], "error"}`)
	f.StringVar(&replayTrace, "replay", "", `also replay each filter, scorer and picker type on this trace (a file router replay reads; "default", or the flag alone, for the bundled trace) with router replay's --fail-on-fallback rule`)
	f.Lookup("replay").NoOptDefVal = plugincheck.BundledTrace
	f.IntVar(&replayLimit, "replay-limit", plugincheck.DefaultReplayLimit, "with --replay: how many of the trace's first requests to replay")
	setWant(f, "call-timeout", positiveDurationWant)
	setWant(f, "replay-limit", "a whole number >= 1")
	return cmd
}

// errChecksFailed is the command's error when a check failed: the failures
// are already printed.
var errChecksFailed = errors.New("some plugin checks failed")

// checkReplayFlag catches a --replay trace that will not be read before
// the checks run: a named trace that does not open (a usage error now, not
// a failed check a minute later), and `--replay TRACE` written with a
// space, which gives --replay no value (the bundled trace) and makes
// TRACE the plugin or one of its arguments: when --replay is alone and a
// positional argument is an existing file named like a trace (.jsonl,
// .csv, either gzipped), say to write --replay=TRACE.
func checkReplayFlag(replay string, args []string) error {
	switch replay {
	case "":
		return nil
	case plugincheck.BundledTrace:
		for _, a := range args {
			if !traceName(a) {
				continue
			}
			if st, err := os.Stat(a); err == nil && st.Mode().IsRegular() {
				return fmt.Errorf("--replay takes its trace after '=': write --replay=%s (with a space, %q is taken for the plugin or one of its arguments, and the bundled trace is replayed)", a, a)
			}
		}
		return nil
	}
	f, err := os.Open(replay)
	if err != nil {
		return fmt.Errorf("--replay=%s: %w", replay, err)
	}
	return f.Close()
}

// traceName reports whether name ends like a trace file router replay reads.
func traceName(name string) bool {
	name = strings.TrimSuffix(name, ".gz")
	return strings.HasSuffix(name, ".jsonl") || strings.HasSuffix(name, ".csv")
}
