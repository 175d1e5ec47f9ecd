package config

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

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

// MaxPluginFileSize bounds how much of a plugin's file the router reads to
// checksum it (1 GiB): a sha256 or sha256_files pin of a larger file
// refuses the start, the checksums /readyz shows leave it out, and --watch
// does not fingerprint it. Plugin binaries are megabytes to a few hundred
// megabytes (a Go binary, a PyInstaller bundle).
const MaxPluginFileSize = 1 << 30

// Files lists the files the plugin runs, absolute and each once: the
// executable (Path, or Command when Path is empty), then each of Args that
// names an existing regular file (following symlinks) now, in order, then
// the SHA256Files paths not listed yet, sorted. Relative paths are
// relative to the router's working directory, where the plugin runs. An
// argument that is not a path of a file ("-m", "--port=3", a directory)
// is not listed. It is what `--watch` watches for the plugin and what the
// checksums of /readyz cover (docs/policy-file.md, "Upgrading a plugin").
func (p Plugin) Files() []string {
	var out []string
	add := func(path string) {
		if path == "" || strings.ContainsRune(path, 0) {
			return
		}
		abs, err := filepath.Abs(path)
		if err != nil || slices.Contains(out, abs) {
			return
		}
		out = append(out, abs)
	}
	exe := p.Path
	if exe == "" {
		exe = p.Command
	}
	add(exe)
	for _, a := range p.Args {
		if a == "" || strings.ContainsRune(a, 0) {
			continue
		}
		if fi, err := os.Stat(a); err == nil && fi.Mode().IsRegular() {
			add(a)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(p.SHA256Files)) {
		add(path)
	}
	return out
}

// sha256Files decodes a plugin block's sha256_files map (path = "hex")
// into p.SHA256Files. Each error is at the key or value it is about when
// the attribute is a map written out ({ "plugin.py" = "..." }), else at
// the attribute's value.
func (l *loader) sha256Files(attr *hcl.Attribute, p *pluginDecl) {
	const what = `sha256_files maps each file the plugin runs besides its command (a path as in args, relative to the router's working directory) to its SHA-256 in hex, as sha256sum prints it: sha256_files = { "plugin.py" = "9f86d0..." }`
	type entry struct {
		key, val     string
		keyR, valR   hcl.Range
		keyOK, valOK bool
	}
	var entries []entry
	if pairs, diags := hcl.ExprMap(attr.Expr); !diags.HasErrors() {
		for _, kv := range pairs {
			e := entry{keyR: kv.Key.Range(), valR: kv.Value.Range()}
			if k, d := kv.Key.Value(nil); !d.HasErrors() && k.Type() == cty.String && k.IsKnown() && !k.IsNull() {
				e.key, e.keyOK = k.AsString(), true
			}
			if v, d := kv.Value.Value(nil); !d.HasErrors() && v.Type() == cty.String && v.IsKnown() && !v.IsNull() {
				e.val, e.valOK = v.AsString(), true
			}
			entries = append(entries, e)
		}
	} else {
		v, ok := l.decodeAttr(attr, cty.Map(cty.String))
		if !ok || v.IsNull() {
			if ok {
				l.attrErrorf(attr, "Invalid sha256_files", "%s.", what)
			}
			return
		}
		r := attr.Expr.Range()
		for k, e := range v.AsValueMap() {
			entries = append(entries, entry{key: k, keyOK: true, keyR: r, valR: r, val: e.AsString(), valOK: !e.IsNull()})
		}
		slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	}
	seen := map[string]hcl.Range{}
	for _, e := range entries {
		switch {
		case !e.keyOK || strings.TrimSpace(e.key) == "" || strings.ContainsRune(e.key, 0):
			l.errorf(e.keyR, "Invalid sha256_files path", "%s; a key must be a non-empty path without NUL.", what)
			continue
		case !e.valOK:
			l.errorf(e.valR, "Invalid sha256_files checksum", "%s; the value for %q is not a string.", what, e.key)
			continue
		}
		abs, err := filepath.Abs(e.key)
		if err != nil {
			l.errorf(e.keyR, "Invalid sha256_files path", "The path %q cannot be made absolute: %v.", e.key, err)
			continue
		}
		if first, dup := seen[abs]; dup {
			l.errorf(e.keyR, "Duplicate sha256_files path", "%q names the file %s, already pinned at %s; keep one of them.", e.key, abs, pos(first))
			continue
		}
		seen[abs] = e.keyR
		if b, err := hex.DecodeString(e.val); err != nil || len(b) != 32 {
			l.errorf(e.valR, "Invalid sha256_files checksum",
				"The checksum of %q must be the 64 hexadecimal digits of its SHA-256 (as printed by sha256sum), got %d characters.", e.key, len(e.val))
			continue
		}
		if p.SHA256Files == nil {
			p.SHA256Files = make(map[string]string)
		}
		p.SHA256Files[e.key] = strings.ToLower(e.val)
	}
}
