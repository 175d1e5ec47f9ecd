package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/plugincheck"
	"github.com/switchyard-router/switchyard/shared"
)

func newPluginsCheckCmd() *cobra.Command {
	var (
		startTimeout time.Duration
		callTimeout  time.Duration
		env, passEnv []string
		configKV     []string
		onlyType     string
		role         string
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "check BINARY [ARGS...]",
		Short: "Run a plugin binary through the protocol's conformance checks",
		Long: `Start a plugin binary as the router would, and check it against the plugin
protocol (docs/plugin-protocol.md, section 9 lists every check):

  handshake        the handshake line first, then a usable Describe
  schema           unique identifier-like type and parameter names, defaults of
                   the declared type, a doc on every type and parameter
  configure        every type (or --type T) with its defaults plus --config
                   (needed for required parameters), for --role; a value of the
                   wrong type, and each parameter at its type's boundaries (int
                   0, -1, 1, min, max; number 0, -1, tiny, +-huge; string
                   empty, 64 KiB, non-ASCII; duration 0, +-1ns, min, max; bool
                   both): accepted, or refused with a diagnostic naming it
  decide           every filter, scorer and picker over 1, 8 and 4,096 rows with
                   worker ids above 2^53, then 32 calls at once, each answer
                   checked as the router checks it
  decide batch     one DecideBatch of several tasks of different sizes and an
                   unknown instance: exactly one well-formed result per task,
                   in any order
  decide streams   4 Decide streams at once, each answer on its own stream
  latency          cold and warm (p50, p99, max) call times at 8 and 64 rows;
                   a WARNING, not a failure, when over --call-timeout
  classify/events  classifiers answer sample requests; those wanting events
                   acknowledge every batch in order and honour events_through
  health           5 grpc.health.v1 checks of "plugin" in a row answer SERVING;
                   a WARNING when one takes over the router's 2 s probe deadline
  shutdown         an exit within 1.5 s of being asked to stop
  stdout           nothing on stdout after the handshake (a Go plugin's
                   os.Stdout, as go-plugin relays it)
  parent death     a second copy, started under a parent that is then
                   SIGKILLed, exits and removes its socket directory within
                   10 s

It prints one line per check, "PASS name (note)" or "FAIL name: expected X,
got Y", plus "WARNING name: ..." after a passing check the router would
still act on (with --json one JSON object with a "checks" array), and exits
0 only when every check passed, 1 otherwise. Calls get a minute each:
latency is reported, not failed. In "go test", package shared/plugintest
runs the same checks.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("%s takes a plugin binary to start (and its arguments); see '%s --help'", cmd.CommandPath(), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if startTimeout <= 0 {
				return fmt.Errorf("--start-timeout %v: want %s", startTimeout, positiveDurationWant)
			}
			b, err := binaryPlugin(args, env, passEnv, startTimeout)
			if err != nil {
				return err
			}
			cfg, err := plugincheck.ParseConfig(configKV)
			if err != nil {
				return err
			}
			if !shared.Role(role).Valid() {
				return fmt.Errorf("--role %q: want aggregated, prefill or decode", role)
			}
			if callTimeout <= 0 {
				return fmt.Errorf("--call-timeout %v: want %s", callTimeout, positiveDurationWant)
			}
			results := plugincheck.Run(cmd.Context(), plugincheck.Options{Plugin: b, Config: cfg, Type: onlyType,
				Role: shared.Role(role), CallTimeout: callTimeout, Logger: pluginLogger(cmd.Context(), cmd.ErrOrStderr())})
			if err := plugincheck.Print(cmd.OutOrStdout(), results, asJSON); err != nil {
				return err
			}
			if plugincheck.Failed(results) {
				return &exitError{code: 1, err: errChecksFailed}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&startTimeout, "start-timeout", config.DefaultStartTimeout, "bound on the plugin's start and handshake")
	f.DurationVar(&callTimeout, "call-timeout", config.DefaultCallTimeout, "the plugin block's call_timeout that call latency is compared with (a warning when above)")
	f.StringArrayVar(&env, "env", nil, "NAME=VALUE: a variable of the plugin's environment, as in a plugin block's env (repeatable)")
	f.StringArrayVar(&passEnv, "pass-env", nil, "NAME: pass this variable of the router's environment on to the plugin, as a plugin block's pass_env (repeatable)")
	f.StringArrayVar(&configKV, "config", nil, "PARAM=VALUE: a parameter value for every type declaring PARAM, parsed as its declared type (repeatable; needed for required parameters)")
	f.StringVar(&onlyType, "type", "", "check only the component type of this name")
	f.StringVar(&role, "role", string(shared.RoleAggregated), "the worker role instances are configured and decide for: aggregated, prefill or decode")
	f.BoolVar(&asJSON, "json", false, `print one JSON object {"checks": [{"name", "pass", "expected", "got", "note", "warning"}...]}`)
	setWant(f, "start-timeout", positiveDurationWant)
	setWant(f, "call-timeout", positiveDurationWant)
	return cmd
}

// errChecksFailed is the command's error when a check failed: the failures
// are already printed.
var errChecksFailed = errors.New("some plugin checks failed")
