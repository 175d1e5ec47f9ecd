package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/supervisor"
)

func newPluginsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "Inspect out-of-process plugin binaries",
		Args:  noArgs,
	}
	var startTimeout time.Duration
	describe := &cobra.Command{
		Use:   "describe BINARY [ARGS...]",
		Short: "Start a plugin binary and print its component types",
		Long: `Start a plugin binary, complete the handshake, ask it to Describe itself, and
print its version, API versions and, per component type, the kind, declared
inputs and parameters (name, type, required, default, doc). The binary is
stopped afterwards. It runs with an empty environment, as the router runs it.`,
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
			host := supervisor.NewHost(supervisor.Options{Logger: pluginLogger(cmd.ErrOrStderr())})
			defer shutdownHost(host)
			d, err := host.Describe(cmd.Context(), args[0], args[1:], startTimeout)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			return printDescription(cmd.OutOrStdout(), args[0], d)
		},
	}
	describe.Flags().DurationVar(&startTimeout, "start-timeout", config.DefaultStartTimeout, "bound on the plugin's start and handshake")
	setWant(describe.Flags(), "start-timeout", positiveDurationWant)
	cmd.AddCommand(describe)
	return cmd
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
// lines go to: warnings and errors on the router's stderr, like its own
// messages. SWITCHYARD_LOG_LEVEL (trace, debug, info, warn, error) raises
// or lowers it.
func pluginLogger(w io.Writer) hclog.Logger {
	level := hclog.LevelFromString(os.Getenv("SWITCHYARD_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Warn
	}
	return hclog.New(&hclog.LoggerOptions{Name: "router", Output: w, Level: level})
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
