package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
)

// writeExecutable writes a shell script named name into dir with mode.
func writeExecutable(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPluginCommandOnPath: a command without a slash is looked up on the
// router's PATH at load, and Path holds what was found; one with a slash
// is kept as written.
func TestPluginCommandOnPath(t *testing.T) {
	dir := t.TempDir()
	script := writeExecutable(t, dir, "my-plugin", 0o755)
	t.Setenv("PATH", filepath.Join(dir, "missing")+string(filepath.ListSeparator)+dir)

	b, diags := Load("t.hcl", []byte(`
plugin "a" { command = "my-plugin" }
plugin "b" { command = "./my-plugin" }
`), testCatalog(t))
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
	}
	got := []string{b.Plugins[0].Path, b.Plugins[0].Command, b.Plugins[1].Path, b.Plugins[1].Command}
	want := []string{script, "my-plugin", "./my-plugin", "./my-plugin"}
	if !slices.Equal(got, want) {
		t.Errorf("Path, Command of a and b = %q, want %q", got, want)
	}
}

// TestPluginCommandNotFound: a command found on none of PATH's
// directories (absent, not executable, or only through a relative
// directory such as ".") is an error at the command's file:line:col that
// names the directories searched, or, for a relative directory, says that
// such entries are ignored and how to write the command.
func TestPluginCommandNotFound(t *testing.T) {
	dir := t.TempDir()
	writeExecutable(t, dir, "not-executable", 0o644)
	writeExecutable(t, dir, "dot-plugin", 0o755)
	tests := []struct {
		name, path, command, detail string
	}{
		{"absent", dir, "nowhere", `"nowhere" has no slash, so it is looked up on the router's PATH, and no executable file of that name is found there (searched PATH: ` + dir + ")"},
		{"not executable", dir + string(filepath.ListSeparator) + dir, "not-executable", "(searched PATH: " + dir + ")"},
		{"empty PATH", "", "nowhere", "(PATH is empty)"},
		{"relative PATH entry", ".", "dot-plugin", `where it is found only as ./dot-plugin, through a relative PATH entry: relative PATH entries such as "." are ignored (they would make the binary run depend on the working directory); write command = "./dot-plugin"`},
		{"relative PATH entry first", "." + string(filepath.ListSeparator) + "/nonexistent", "dot-plugin", `write command = "./dot-plugin"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", tt.path)
			t.Chdir(dir)
			src := "plugin \"p\" {\n  command = \"" + tt.command + "\"\n}\n"
			_, diags := Load("t.hcl", []byte(src), testCatalog(t))
			if got := short(diags, hcl.DiagError); !slices.Equal(got, []string{"t.hcl:2:13: Plugin command not found"}) {
				t.Fatalf("errors = %q, want the command at t.hcl:2:13\n%s", got, FormatDiagnostics(diags))
			}
			if d := diags.Errs()[0].(*hcl.Diagnostic).Detail; !strings.Contains(d, tt.detail) {
				t.Errorf("detail %q does not contain %q", d, tt.detail)
			}
		})
	}
}

// TestPluginCommandIsDirectory: a command naming a directory is an error
// at the command's file:line:col saying so, not a failed exec later.
func TestPluginCommandIsDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("plugins", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, command := range []string{dir, "./plugins", "plugins/"} {
		src := "plugin \"p\" {\n  command = \"" + command + "\"\n}\n"
		_, diags := Load("t.hcl", []byte(src), testCatalog(t))
		if got := short(diags, hcl.DiagError); !slices.Equal(got, []string{"t.hcl:2:13: Plugin command is a directory"}) {
			t.Fatalf("command %q: errors = %q, want the command at t.hcl:2:13\n%s", command, got, FormatDiagnostics(diags))
		}
		want := fmt.Sprintf("%q is a directory, not an executable file", command)
		if d := diags.Errs()[0].(*hcl.Diagnostic).Detail; !strings.Contains(d, want) {
			t.Errorf("detail %q does not contain %q", d, want)
		}
		if _, err := ResolveCommand(command); !errors.Is(err, ErrCommandIsDirectory) {
			t.Errorf("ResolveCommand(%q) = %v, want ErrCommandIsDirectory", command, err)
		}
	}
}

// TestPluginPassEnv: pass_env names must be names, listed once, and not
// also set in env; each error is at the pass_env value's file:line:col.
func TestPluginPassEnv(t *testing.T) {
	src := `plugin "p" {
  command  = "./p"
  env      = { K = "v" }
  pass_env = ["HOME", "A=B", "", "HOME", "K"]
}
plugin "q" {
  command = "./q"
  env     = { PYTHONPATH = "sdk/python", PYTHONPATH = "nope" }
}
`
	_, diags := Load("t.hcl", []byte(src), testCatalog(t))
	want := []string{
		"t.hcl:4:14: Invalid environment variable name",
		"t.hcl:4:14: Invalid environment variable name",
		"t.hcl:4:14: Duplicate environment variable",
		"t.hcl:4:14: Environment variable set twice",
		"t.hcl:8:42: Duplicate environment variable",
	}
	if got := short(diags, hcl.DiagError); !slices.Equal(got, want) {
		t.Fatalf("errors = %q, want %q\n%s", got, want, FormatDiagnostics(diags))
	}
	text := FormatDiagnostics(diags)
	for _, s := range []string{`"A=B" is not a name`, `"" is not a name`, `lists "HOME" more than once`, `"K" is in both env and pass_env`} {
		if !strings.Contains(text, s) {
			t.Errorf("diagnostics do not say %q:\n%s", s, text)
		}
	}

	b, diags := Load("t.hcl", []byte(`plugin "p" {
  command  = "./p"
  pass_env = ["PATH", "HOME"]
}
`), testCatalog(t))
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
	}
	if got := b.Plugins[0].PassEnv; !slices.Equal(got, []string{"PATH", "HOME"}) {
		t.Errorf("PassEnv = %q, want [PATH HOME]", got)
	}
}
