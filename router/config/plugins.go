package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// ErrPluginUnavailable is wrapped by every error of an unavailable
// placeholder: a component whose plugin failed to start under
// on_start_failure = "fallback". The pipeline treats it like any component
// error, so the policy's fallback decides.
var ErrPluginUnavailable = errors.New("plugin unavailable")

// UnavailableError is the error every call of an unavailable placeholder
// returns. It wraps ErrPluginUnavailable.
type UnavailableError struct {
	// Type is the component type the policy file names.
	Type string
	// Plugins are the plugins that failed to start, any of which may have
	// provided Type (in file order).
	Plugins []string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%v: type %q may come from %s, which failed to start", ErrPluginUnavailable, e.Type, pluginList(e.Plugins))
}

// Unwrap returns ErrPluginUnavailable.
func (e *UnavailableError) Unwrap() error { return ErrPluginUnavailable }

// unavailable stands in for a component of a plugin that failed to start.
// It fits any slot of a policy and fails every call.
type unavailable struct {
	err error
}

func newUnavailable(plugins []string, typ string) *unavailable {
	return &unavailable{err: &UnavailableError{Type: typ, Plugins: plugins}}
}

func (u *unavailable) Inputs() shared.Inputs { return 0 }

func (u *unavailable) Filter(context.Context, *shared.Request, *shared.Candidates, []bool) error {
	return u.err
}

func (u *unavailable) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return u.err
}

func (u *unavailable) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return -1, u.err
}

// Interface guards.
var (
	_ shared.Filter = (*unavailable)(nil)
	_ shared.Scorer = (*unavailable)(nil)
	_ shared.Picker = (*unavailable)(nil)
)

// ErrCommandNotFound is wrapped by ResolveCommand's error for a command
// that is on none of the PATH's directories.
var ErrCommandNotFound = errors.New("command not found")

// ErrCommandIsDirectory is wrapped by ResolveCommand's error for a command
// that names a directory.
var ErrCommandIsDirectory = errors.New("is a directory")

// ResolveCommand returns the binary a plugin block's command runs: a
// command without a slash ("python3", "my-plugin") is looked up on the
// router's PATH (exec.LookPath) and the absolute path found is returned;
// a command with a slash is returned as written (a relative one is relative
// to the router's working directory). A command on none of PATH's
// directories, or found only through a relative directory on PATH (such as
// "."), which exec.LookPath refuses (exec.ErrDot), is an error wrapping
// ErrCommandNotFound that names the directories searched, or says how to
// write the path found. A command with a slash naming a directory is an
// error wrapping ErrCommandIsDirectory; one naming nothing is not an error
// here (starting it is).
func ResolveCommand(command string) (string, error) {
	if strings.ContainsRune(command, '/') {
		if fi, err := os.Stat(command); err == nil && fi.IsDir() {
			return "", fmt.Errorf("command %q %w, not an executable file", command, ErrCommandIsDirectory)
		}
		return command, nil
	}
	path, err := exec.LookPath(command)
	if err == nil && !filepath.IsAbs(path) {
		err = exec.ErrDot
	}
	if errors.Is(err, exec.ErrDot) && path != "" {
		found := path
		if !strings.ContainsRune(found, '/') {
			found = "./" + found
		}
		return "", fmt.Errorf("%w: %q has no slash, so it is looked up on the router's PATH, where it is found only as %s, through a relative PATH entry: relative PATH entries such as \".\" are ignored (they would make the binary run depend on the working directory); write command = %q", ErrCommandNotFound, command, found, found)
	}
	if err != nil {
		searched := "PATH is empty"
		if env := os.Getenv("PATH"); env != "" {
			var dirs []string
			for _, d := range filepath.SplitList(env) {
				if !slices.Contains(dirs, d) {
					dirs = append(dirs, d)
				}
			}
			searched = "searched PATH: " + strings.Join(dirs, ", ")
		}
		return "", fmt.Errorf("%w: %q has no slash, so it is looked up on the router's PATH, and no executable file of that name is found there (%s)", ErrCommandNotFound, command, searched)
	}
	return path, nil
}

// ValidEnvName reports whether name can name an environment variable of a
// plugin (env, pass_env): non-empty, without '=' or NUL.
func ValidEnvName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "=\x00")
}

// pluginSource is the catalog source of a plugin's types.
func pluginSource(name string) string { return "plugin " + name }

// pluginList renders plugin names as `plugin "a"` or `plugins "a", "b"`.
func pluginList(names []string) string {
	if len(names) == 1 {
		return fmt.Sprintf("plugin %q", names[0])
	}
	return "plugins " + strings.Join(quoteAll(names), ", ")
}

// startPlugins has the host start every plugin whose block decoded without
// errors, in file order, and registers the types each returns in a clone
// of the catalog. Without a host it does nothing: unknown types are then
// reported as unavailable plugin types.
func (l *loader) startPlugins() {
	if l.opts.Plugins == nil || len(l.plugins) == 0 {
		return
	}
	l.cat = l.cat.Clone()
	l.started = true
	for _, p := range l.plugins {
		if p.blockErrors {
			continue
		}
		types, err := l.opts.Plugins.Start(l.opts.Context, p.Plugin)
		if err != nil {
			p.Failed = err
			if p.OnStartFailure == OnStartFailureFallback {
				l.warnf(p.Range, "Plugin failed to start",
					"Plugin %q (command %q) failed to start: %v. on_start_failure = %q: the router starts without it, and policies using its types decide by their fallbacks.",
					p.Name, p.Command, err, OnStartFailureFallback)
			} else {
				l.errorf(p.Range, "Plugin failed to start",
					"Plugin %q (command %q) failed to start: %v. Fix the plugin, or set on_start_failure = %q in its block to start the router without it.",
					p.Name, p.Command, err, OnStartFailureFallback)
			}
			continue
		}
		for _, t := range types {
			err := l.cat.Register(pluginSource(p.Name), t)
			var dup *catalog.DuplicateError
			switch {
			case err == nil:
			case errors.As(err, &dup):
				where := ""
				if other := l.pluginNamed(strings.TrimPrefix(dup.Existing, "plugin ")); other != nil && dup.Existing != catalog.SourceBuiltin {
					where = fmt.Sprintf(" (declared at %s)", pos(other.Range))
				}
				l.errorf(p.Range, "Duplicate component type",
					"Plugin %q provides type %q, which %s%s already provides. Type names are shared by the built-in types and every plugin: rename the type in one of them, or remove one plugin block.",
					p.Name, t.Name, sourceText(dup.Existing), where)
			default:
				l.errorf(p.Range, "Invalid plugin type",
					"Plugin %q: %v. This is a bug in the plugin; report it to its author.", p.Name, err)
			}
		}
	}
}

// sourceText renders a catalog source for a sentence.
func sourceText(source string) string {
	if source == catalog.SourceBuiltin {
		return "the built-in catalog"
	}
	if name, ok := strings.CutPrefix(source, "plugin "); ok {
		return fmt.Sprintf("plugin %q", name)
	}
	return source
}

func (l *loader) pluginNamed(name string) *pluginDecl {
	for _, p := range l.plugins {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// failedFallback returns the names of the plugins that failed to start
// under on_start_failure = "fallback".
func (l *loader) failedFallback() []string {
	var out []string
	for _, p := range l.plugins {
		if p.Failed != nil && p.OnStartFailure == OnStartFailureFallback {
			out = append(out, p.Name)
		}
	}
	return out
}

// notStarted returns the plugins that a host was given but that did not
// start, or never were started because their block has errors, except
// those failing under on_start_failure = "fallback".
func (l *loader) notStarted() []*pluginDecl {
	var out []*pluginDecl
	for _, p := range l.plugins {
		if p.blockErrors || (p.Failed != nil && p.OnStartFailure != OnStartFailureFallback) {
			out = append(out, p)
		}
	}
	return out
}

// dedupe drops repeated diagnostics: the same severity, subject, summary
// and detail. A policy instantiated for several roles reports a problem
// once.
func dedupe(diags hcl.Diagnostics) hcl.Diagnostics {
	type key struct {
		sev             hcl.DiagnosticSeverity
		subject         hcl.Range
		hasSubject      bool
		summary, detail string
	}
	seen := make(map[key]bool, len(diags))
	out := diags[:0:0]
	for _, d := range diags {
		if d == nil {
			continue
		}
		k := key{sev: d.Severity, summary: d.Summary, detail: d.Detail}
		if d.Subject != nil {
			k.subject, k.hasSubject = *d.Subject, true
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, d)
	}
	return out
}
