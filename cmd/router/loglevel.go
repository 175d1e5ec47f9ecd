package main

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
)

// LogLevelEnv is the environment variable that sets the router's log
// level when --log-level is not given: trace, debug, info, warn, error or
// off, in any case.
const LogLevelEnv = "SWITCHYARD_LOG_LEVEL"

// logLevelWant words the values --log-level and LogLevelEnv accept.
const logLevelWant = "trace, debug, info, warn, error or off"

// logLevelKey is the context key of the level --log-level or LogLevelEnv
// chose (hclog.NoLevel when neither did).
type logLevelKey struct{}

// addLogLevelFlag adds the persistent --log-level flag to root, and a
// PersistentPreRunE that resolves it (or LogLevelEnv) into the command's
// context, where logLevel reads it. A value that is not a level is a usage
// error naming the flag or the variable.
func addLogLevelFlag(root *cobra.Command) {
	var flag string
	root.PersistentFlags().StringVar(&flag, "log-level", "",
		"log level of the router's stderr, plugins' lines included: "+logLevelWant+
			" (default: $"+LogLevelEnv+", else info for serve and warn for the other commands)")
	setWant(root.PersistentFlags(), "log-level", logLevelWant)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		level := hclog.NoLevel
		switch env, ok := os.LookupEnv(LogLevelEnv); {
		case cmd.Flags().Changed("log-level"):
			if level = hclog.LevelFromString(flag); level == hclog.NoLevel {
				return fmt.Errorf("--log-level %q: want %s", flag, logLevelWant)
			}
		case ok && env != "":
			if level = hclog.LevelFromString(env); level == hclog.NoLevel {
				return fmt.Errorf("%s=%q: want %s", LogLevelEnv, env, logLevelWant)
			}
		}
		cmd.SetContext(context.WithValue(cmd.Context(), logLevelKey{}, level))
		return nil
	}
}

// logLevel returns the level --log-level or LogLevelEnv chose for the
// command whose context is ctx, or def (the command's default) when
// neither did.
func logLevel(ctx context.Context, def hclog.Level) hclog.Level {
	if l, ok := ctx.Value(logLevelKey{}).(hclog.Level); ok && l != hclog.NoLevel {
		return l
	}
	return def
}
