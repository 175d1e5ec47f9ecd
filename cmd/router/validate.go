package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
)

func newValidateCmd() *cobra.Command {
	var workersFile string
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Load a policy file and show what each role resolves to",
		Long: `Load a policy file, resolve its bundle, and print per role the policy, its
components (kind, name, type, source) and whether it runs on the hosted fast
path. With --workers-file, also load that workers file as serve and epp do: its
errors, and a warning at each of its workers whose url a policy file's worker
has (one engine counted twice). Warnings go to stderr; on any error the
diagnostics are printed as file:line:col and the exit status is 1.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return fmt.Errorf("%s takes the policy file to check; see '%s --help'", subcommand(cmd), cmd.CommandPath())
			case len(args) > 1:
				return fmt.Errorf("%s takes one policy file, got %d: %q", subcommand(cmd), len(args), args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := loadBundle(cmd.Context(), cmd.ErrOrStderr(), args[0], loader.LoadOptions{})
			if err != nil {
				return &exitError{code: 1, err: errors.New("")}
			}
			defer closeBundle(b)
			var ws []config.Worker
			if workersFile != "" {
				var diags hcl.Diagnostics
				ws, diags = config.LoadWorkers(workersFile)
				if !diags.HasErrors() {
					diags = append(diags, config.SameURLAcross(b.Workers(), ws)...)
				}
				if len(diags) > 0 {
					fmt.Fprint(cmd.ErrOrStderr(), config.FormatDiagnostics(diags))
				}
				if diags.HasErrors() {
					return &exitError{code: 1, err: errors.New("")}
				}
			}
			if err := printBundle(cmd.OutOrStdout(), b.PolicyFile()); err != nil {
				return err
			}
			if workersFile != "" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%s)\n", workersFile, plural(len(ws), "worker"))
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&workersFile, "workers-file", "", "a workers file (serve's and epp's --workers-file) to load beside the policy file")
	return cmd
}

// printBundle writes the per-role resolution of b.
func printBundle(w io.Writer, b *config.PolicyFile) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s: ok (block_size %d", b.Filename, b.BlockSize)
	if b.Seed != nil {
		fmt.Fprintf(&sb, ", seed %d", *b.Seed)
	}
	sb.WriteString(")\n")
	decls := map[string]*config.PolicyDecl{}
	for _, d := range b.Decls {
		decls[d.Name] = d
	}
	for _, role := range config.Roles {
		name := b.RolePolicies[role]
		p := b.Roles[role]
		if p == nil {
			fmt.Fprintf(&sb, "%-10s  (no policy)\n", role)
			continue
		}
		path := "pipeline"
		if _, ok := hosted.IntoHosted(p); ok {
			path = "hosted"
		}
		fmt.Fprintf(&sb, "%-10s  policy %q  [%s, inputs %s]\n", role, name, path, p.Inputs())
		if d := decls[name]; d != nil {
			for _, c := range d.Components {
				where := "in-process"
				switch {
				case c.Unavailable:
					where = "unavailable (" + c.Source + " did not start; the fallback decides)"
				case c.OutOfProcess:
					where = "out-of-process (" + c.Source + ")"
				}
				label := c.Name
				if label == "" {
					label = c.Type
				}
				fmt.Fprintf(&sb, "            %-6s %-12s type %-14s %s", c.Kind, label, c.Type, where)
				if c.Kind.String() == "scorer" {
					fmt.Fprintf(&sb, "  weight %g", c.Weight)
				}
				sb.WriteByte('\n')
			}
			if d.Fallback != "" {
				fmt.Fprintf(&sb, "            fallback %q\n", d.Fallback)
			}
			if d.Shadow != "" {
				fmt.Fprintf(&sb, "            shadow %q\n", d.Shadow)
			}
			if d.Canary != "" {
				fmt.Fprintf(&sb, "            canary %q", d.Canary)
				if d.Policy != nil && d.Policy.Canary != nil {
					c := d.Policy.Canary
					fmt.Fprintf(&sb, " weight %g key %s", c.Weight, c.Key)
				}
				sb.WriteByte('\n')
			}
		}
	}
	if b.Classifier != nil {
		fmt.Fprintf(&sb, "classifier  type %s (%s)\n", b.Classifier.Type, b.Classifier.Source)
	}
	if len(b.Queue.Classes) > 0 {
		fmt.Fprintf(&sb, "queue       %s\n", b.Queue)
	}
	for _, w := range b.Workers {
		models, blocks := strings.Join(w.Models, ","), strconv.FormatInt(w.TotalKVBlocks, 10)
		if w.Models == nil {
			models = "(from the engine)"
		}
		if w.TotalKVBlocks == 0 {
			blocks = "(from the engine)"
		}
		fmt.Fprintf(&sb, "worker      %-10s %-10s %s  models %s  total_kv_blocks %s", w.Name, w.Role, w.URL, models, blocks)
		if w.KVEvents != nil {
			fmt.Fprintf(&sb, "  kv_events %s", w.KVEvents.Endpoint)
		}
		sb.WriteByte('\n')
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// loadBundle loads the policy file at path (the built-in default policy
// when empty) through loader.LoadBundle, the one loader of every command,
// with its plugins' logs on stderr (pluginLogger) unless o sets a logger.
// The diagnostics, warnings included, go to stderr at file:line:col; the
// error (ErrNotLoaded) only says that the file did not load. The caller
// closes the bundle (closeBundle).
func loadBundle(ctx context.Context, stderr io.Writer, path string, o loader.LoadOptions) (*loader.Bundle, error) {
	if o.Logger == nil {
		o.Logger = pluginLogger(ctx, stderr)
	}
	b, diags := loader.LoadBundle(ctx, path, o)
	if len(diags) > 0 {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
	}
	if diags.HasErrors() || b == nil {
		return nil, errNotLoaded
	}
	return b, nil
}

// errNotLoaded is loadBundle's error: the diagnostics went to stderr.
var errNotLoaded = errors.New("policy file has errors")

// closeBundle closes b, stopping its plugins, bounded by shutdownGrace
// whatever context the command had.
func closeBundle(b *loader.Bundle) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	_ = b.Close(ctx)
}
