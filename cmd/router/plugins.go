package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/supervisor"
)

func newPluginsCmd() *cobra.Command {
	cmd := commandGroup(&cobra.Command{
		Use:   "plugins",
		Short: "Inspect out-of-process plugin binaries",
	})
	var src pluginSource
	describe := &cobra.Command{
		Use:   "describe (BINARY [ARGS...] | --policy FILE --plugin NAME)",
		Short: "Start a plugin binary and print its component types",
		Long: `Start a plugin binary, complete the handshake, ask it to Describe itself, and
print its version, API versions and, per component type, the kind, declared
inputs and parameters (name, type, required, default, doc). The binary is
stopped afterwards.

It is launched as the router launches a plugin block: BINARY without a slash
is looked up on PATH, and it runs in the router's working directory with
only the environment --env and --pass-env give it. With --policy FILE
--plugin NAME it runs the plugin block NAME of the policy file instead, with
that block's command, args, env, pass_env, sha256 and start_timeout (the
rest of the file is not checked).`,
		Args: func(cmd *cobra.Command, args []string) error { return src.validate(cmd, args) },
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := src.plugin(cmd, args)
			if err != nil {
				return err
			}
			host := supervisor.NewHost(supervisor.Options{Logger: pluginLogger(cmd.Context(), cmd.ErrOrStderr())})
			defer shutdownHost(host)
			d, err := host.Describe(cmd.Context(), b)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			return printDescription(cmd.OutOrStdout(), b.Command, d)
		},
	}
	src.addFlags(describe.Flags())
	cmd.AddCommand(describe, newPluginsCheckCmd())
	return cmd
}

// pluginSource is how `router plugins describe` and `router plugins check`
// are told which plugin to start: BINARY [ARGS...] with --env, --pass-env
// and --start-timeout, or --policy FILE --plugin NAME.
type pluginSource struct {
	startTimeout          time.Duration
	env, passEnv          []string
	policyFile, blockName string
}

// addFlags declares the flags of s on f.
func (s *pluginSource) addFlags(f *pflag.FlagSet) {
	f.DurationVar(&s.startTimeout, "start-timeout", config.DefaultStartTimeout, "bound on the plugin's start and handshake")
	f.StringArrayVar(&s.env, "env", nil, "NAME=VALUE: a variable of the plugin's environment, as in a plugin block's env (repeatable)")
	f.StringArrayVar(&s.passEnv, "pass-env", nil, "NAME: pass this variable of the router's environment on to the plugin, as a plugin block's pass_env (repeatable)")
	f.StringVar(&s.policyFile, "policy", "", "policy file whose plugin block --plugin names to run")
	f.StringVar(&s.blockName, "plugin", "", "name of the plugin block of --policy to run")
	setWant(f, "start-timeout", positiveDurationWant)
}

// validate checks that args and the flags name one plugin, one way: a
// usage error otherwise.
func (s *pluginSource) validate(cmd *cobra.Command, args []string) error {
	if s.policyFile != "" || s.blockName != "" {
		if s.policyFile == "" || s.blockName == "" {
			return fmt.Errorf("--policy FILE and --plugin NAME go together; see '%s --help'", cmd.CommandPath())
		}
		if len(args) > 0 || len(s.env) > 0 || len(s.passEnv) > 0 || cmd.Flags().Changed("start-timeout") {
			return fmt.Errorf("with --policy, the plugin block gives the command, its arguments, environment and start timeout: give no BINARY, --env, --pass-env or --start-timeout; see '%s --help'", cmd.CommandPath())
		}
		return nil
	}
	if len(args) == 0 {
		return fmt.Errorf("%s takes a plugin binary to start (and its arguments), or --policy FILE --plugin NAME; see '%s --help'", subcommand(cmd), cmd.CommandPath())
	}
	if s.startTimeout <= 0 {
		return fmt.Errorf("--start-timeout %v: want %s", s.startTimeout, positiveDurationWant)
	}
	return nil
}

// plugin is the plugin block to start, once validate passed: the --policy
// file's block (an *exitError of code 1 when it cannot be had), or args
// and the flags (an *exitError of code 1 wrapping
// config.ErrCommandNotFound when BINARY is not found on PATH).
func (s *pluginSource) plugin(cmd *cobra.Command, args []string) (config.Plugin, error) {
	if s.policyFile != "" {
		b, err := pluginBlock(cmd.ErrOrStderr(), s.policyFile, s.blockName)
		if err != nil {
			return b, &exitError{code: 1, err: err}
		}
		return b, nil
	}
	return binaryPlugin(args, s.env, s.passEnv, s.startTimeout)
}

// pluginName names the plugin `router plugins check|describe ARGS...`
// runs in its messages: the script's base name when args[0] is an
// interpreter given a script (`python3 my/prefer.py` is "prefer.py",
// `node plugin.js` "plugin.js"), else args[0]'s base name. An interpreter
// is told by name only: python, node, ruby, perl, sh, bash, with any
// version suffix.
func pluginName(args []string) string {
	name := filepath.Base(args[0])
	interp := strings.TrimRight(name, "0123456789.")
	switch interp {
	case "python", "node", "nodejs", "ruby", "perl", "sh", "bash":
		if len(args) > 1 && args[1] != "" && !strings.HasPrefix(args[1], "-") {
			return filepath.Base(args[1])
		}
	}
	return name
}

// binaryPlugin is the plugin block `router plugins describe BINARY ARGS...`
// runs: args[0] looked up on PATH when it has no slash, the environment
// env ("NAME=VALUE" each) gives plus the passEnv variables. A malformed,
// repeated or doubly given variable is a usage error, as in a policy file.
func binaryPlugin(args, env, passEnv []string, startTimeout time.Duration) (config.Plugin, error) {
	b := config.Plugin{Name: pluginName(args), Command: args[0], Args: args[1:], StartTimeout: startTimeout}
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !config.ValidEnvName(name) || strings.ContainsRune(value, 0) {
			return b, fmt.Errorf("--env %q: want NAME=VALUE, NAME non-empty and without '=' or NUL", kv)
		}
		if _, dup := b.Env[name]; dup {
			return b, fmt.Errorf("--env %q: %s is given twice", kv, name)
		}
		if b.Env == nil {
			b.Env = make(map[string]string)
		}
		b.Env[name] = value
	}
	for _, name := range passEnv {
		switch _, inEnv := b.Env[name]; {
		case !config.ValidEnvName(name):
			return b, fmt.Errorf("--pass-env %q: want a variable name, non-empty and without '=' or NUL", name)
		case inEnv:
			return b, fmt.Errorf("--pass-env %s: %s is also given by --env; keep one", name, name)
		case slices.Contains(b.PassEnv, name):
			return b, fmt.Errorf("--pass-env %s is given twice", name)
		}
		b.PassEnv = append(b.PassEnv, name)
	}
	path, err := config.ResolveCommand(args[0])
	if err != nil {
		return b, &exitError{code: 1, err: err}
	}
	b.Path = path
	return b, nil
}

// pluginBlock returns the plugin block name of the policy file at path;
// the blocks' diagnostics go to stderr at file:line:col.
func pluginBlock(stderr io.Writer, path, name string) (config.Plugin, error) {
	blocks, diags := config.LoadPluginBlocks(path)
	if len(diags) > 0 {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
	}
	names := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if b.Name == name {
			return b, nil
		}
		names = append(names, strconv.Quote(b.Name))
	}
	if diags.HasErrors() {
		return config.Plugin{}, errNotLoaded
	}
	declared := "it declares no plugin"
	if len(names) > 0 {
		declared = "it declares " + strings.Join(names, ", ")
	}
	return config.Plugin{}, fmt.Errorf("--plugin %q: %s has no plugin block of that name (%s)", name, path, declared)
}

// printDescription writes what a plugin binary declares.
func printDescription(w io.Writer, binary string, d *pluginclient.Description) error {
	var sb strings.Builder
	apis := make([]string, len(d.APIVersions))
	for i, v := range d.APIVersions {
		apis[i] = fmt.Sprintf("v%d", v)
	}
	fmt.Fprintf(&sb, "%s: plugin version %s, API %s, component types: %d\n", binary, d.PluginVersion, strings.Join(apis, ", "), len(d.Types))
	for _, t := range d.Types {
		fmt.Fprintf(&sb, "\n%s %q  inputs %s\n", t.Kind, t.Name, t.Inputs)
		if t.Doc != "" {
			fmt.Fprintf(&sb, "  %s\n", t.Doc)
		}
		if len(t.Params) == 0 {
			sb.WriteString("  no parameters\n")
			continue
		}
		tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  parameter\ttype\trequired\tdefault\tdoc")
		for _, p := range t.Params {
			def := "-"
			if p.Default != nil {
				def = fmt.Sprint(p.Default)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%v\t%s\t%s\n", p.Name, p.Type, p.Required, def, p.Doc)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// pluginLogger is the logger plugin processes' stderr and the host's own
// lines go to: the router's stderr, like its own messages, at the level
// --log-level or SWITCHYARD_LOG_LEVEL sets (warn by default).
func pluginLogger(ctx context.Context, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "router", Output: w, Level: logLevel(ctx, hclog.Warn)})
}

// shutdownGrace bounds how long the CLI waits for plugins to stop.
const shutdownGrace = 5 * time.Second

// shutdownHost stops every plugin the host started, bounded by
// shutdownGrace, whatever context the command had.
func shutdownHost(h *supervisor.Host) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	_ = h.Shutdown(ctx)
}
