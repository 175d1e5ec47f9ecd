package supervisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
)

// loadPlugins loads a policy file of plugin blocks with h as its plugin
// host and returns its plugins. One of the blocks must run the test plugin
// in builtin mode, which provides the default policy's types.
func loadPlugins(t *testing.T, h *Host, src string) []config.Plugin {
	t.Helper()
	b, diags := config.LoadWith("t.hcl", []byte(src), catalog.New(), config.Options{Plugins: h})
	if diags.HasErrors() {
		t.Fatalf("load:\n%s", config.FormatDiagnostics(diags))
	}
	return b.Plugins
}

// TestLaunchByPathAndInterpreter: a command without a slash is found on
// the router's PATH at load and runs; an interpreter found so runs its
// script (relative arguments are the plugin's, as written): both plugins
// start, handshake and describe themselves.
func TestLaunchByPathAndInterpreter(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(testBin, filepath.Join(dir, "sy-test-plugin")); err != nil {
		t.Fatal(err)
	}
	// The interpreter's script execs the plugin binary its argument names.
	if err := os.WriteFile(filepath.Join(dir, "plugin.sh"), []byte("exec \"$1\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("no sh on PATH: %v", err)
	}
	t.Setenv("PATH", dir+string(filepath.ListSeparator)+filepath.Dir(sh))
	markers := []string{filepath.Join(dir, "by-path.ran"), filepath.Join(dir, "by-sh.ran")}

	h := newHost(t)
	plugins := loadPlugins(t, h, `
plugin "by-path" {
  command       = "sy-test-plugin"
  env           = { SY_MARKER = "`+markers[0]+`", SY_TEST_MODE = "builtin" }
  start_timeout = "30s"
}
plugin "by-sh" {
  command       = "sh"
  args          = ["`+filepath.Join(dir, "plugin.sh")+`", "`+testBin+`"]
  env           = { SY_MARKER = "`+markers[1]+`" }
  start_timeout = "30s"
}
`)
	if got, want := []string{plugins[0].Path, plugins[1].Path}, []string{filepath.Join(dir, "sy-test-plugin"), filepath.Join(filepath.Dir(sh), "sh")}; !slices.Equal(got, want) {
		t.Errorf("Paths = %q, want %q", got, want)
	}
	for i, p := range plugins {
		if p.Failed != nil {
			t.Errorf("plugin %q failed to start: %v", p.Name, p.Failed)
		}
		if _, err := os.Stat(markers[i]); err != nil {
			t.Errorf("plugin %q did not run: %v", p.Name, err)
		}
		if st := h.Status(p.Name); st != StatusUp {
			t.Errorf("plugin %q status = %v, want up", p.Name, st)
		}
	}
}

// TestPassEnv: the plugin's environment is env, the pass_env variables the
// router has (one it lacks stays unset) and go-plugin's socket directory:
// nothing else of the router's.
func TestPassEnv(t *testing.T) {
	out := filepath.Join(t.TempDir(), "env")
	t.Setenv("SY_PASSED", "from the router")
	t.Setenv("SY_NOT_PASSED", "secret")
	if err := os.Unsetenv("SY_UNSET"); err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	loadPlugins(t, h, `
plugin "env" {
  command       = "`+testBin+`"
  env           = { SY_ENV_OUT = "`+out+`", SY_TEST_MODE = "builtin" }
  pass_env      = ["SY_PASSED", "SY_UNSET"]
  start_timeout = "30s"
}
`)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// go-plugin adds its own variables (the handshake cookie, PLUGIN_*):
	// the rest is the block's.
	var got []string
	for _, kv := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(kv, "SWITCHYARD_PLUGIN=") && !strings.HasPrefix(kv, "PLUGIN_") {
			got = append(got, kv)
		}
	}
	slices.Sort(got)
	want := []string{"SY_ENV_OUT=" + out, "SY_PASSED=from the router", "SY_TEST_MODE=builtin"}
	if !slices.Equal(got, want) {
		t.Errorf("plugin environment = %q, want %q", got, want)
	}
}

// TestPluginStderrLevels: a plugin's plain stderr line is logged at info
// tagged with the plugin's name; hclog JSON lines keep their level (warn
// shown, debug not at info).
func TestPluginStderrLevels(t *testing.T) {
	var logs syncBuffer
	h := NewHost(Options{Logger: hclog.New(&hclog.LoggerOptions{Name: "router", Output: &logs, Level: hclog.Info})})
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		assertNoLeftovers(t)
	})
	b := block("shout", "stderr")
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatalf("Start: %v", err)
	}
	want := []string{"[INFO]  router.shout: plain line from the plugin", "[WARN]  router.shout: json warn line"}
	if !testkit.Poll(60*time.Second, func() bool {
		s := logs.String()
		return strings.Contains(s, want[0]) && strings.Contains(s, want[1])
	}) {
		t.Fatalf("logs lack %q:\n%s", want, logs.String())
	}
	if s := logs.String(); strings.Contains(s, "json debug line") {
		t.Errorf("a JSON debug line was logged at info:\n%s", s)
	}
}
