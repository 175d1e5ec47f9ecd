package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginsDescribeLaunch: `router plugins describe` launches as the
// router does: a name without a slash found on PATH, --env and the policy
// file's block (--policy, --plugin); a plugin's plain stderr line shows at
// info tagged with its name, at the level --log-level or
// SWITCHYARD_LOG_LEVEL sets (warn by default, where only its JSON warn
// line shows).
func TestPluginsDescribeLaunch(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(examplePlugin(t, "faulty"), filepath.Join(dir, "sy-faulty")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	t.Setenv(LogLevelEnv, "")
	policy := writeFile(t, "launch.hcl", `plugin "shout" {
  command = "sy-faulty"
  env     = { SY_TEST_MODE = "stderr" }
}
`)
	const (
		plain = "plain line from the plugin"
		warn  = "[WARN]  router.%s: json warn line"
	)
	tests := []struct {
		name     string
		env      string // SWITCHYARD_LOG_LEVEL
		args     []string
		tag      string // the plugin's name in its log lines
		wantInfo bool
	}{
		{"default level", "", []string{"sy-faulty", "--env", "SY_TEST_MODE=stderr"}, "sy-faulty", false},
		{"--log-level", "", []string{"--log-level", "info", "sy-faulty", "--env", "SY_TEST_MODE=stderr"}, "sy-faulty", true},
		{"environment", "INFO", []string{"sy-faulty", "--env", "SY_TEST_MODE=stderr"}, "sy-faulty", true},
		{"flag over environment", "error", []string{"sy-faulty", "--log-level=info", "--env", "SY_TEST_MODE=stderr"}, "sy-faulty", true},
		{"policy block", "", []string{"--log-level", "info", "--policy", policy, "--plugin", "shout"}, "shout", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(LogLevelEnv, tt.env)
			code, out, errOut := routerRun(t, append([]string{"plugins", "describe"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, "sy-faulty: plugin version test") {
				t.Errorf("stdout lacks the description:\n%s", out)
			}
			info := "[INFO]  router." + tt.tag + ": " + plain
			if got := strings.Contains(errOut, info); got != tt.wantInfo {
				t.Errorf("stderr has %q: %v, want %v:\n%s", info, got, tt.wantInfo, errOut)
			}
			if w := strings.Replace(warn, "%s", tt.tag, 1); !strings.Contains(errOut, w) {
				t.Errorf("stderr lacks %q:\n%s", w, errOut)
			}
		})
	}
}

// TestPluginsDescribeLaunchErrors: what describe refuses, in words.
func TestPluginsDescribeLaunchErrors(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	t.Setenv(LogLevelEnv, "")
	policy := writeFile(t, "launch-errors.hcl", `plugin "a" { command = "./a" }
plugin "b" { command = "./b" }
`)
	tests := []struct {
		name string
		env  string
		args []string
		code int
		want string
	}{
		{"not on PATH", "", []string{"nowhere"}, 1, `"nowhere" has no slash, so it is looked up on the router's PATH, and no executable file of that name is found there (searched PATH: ` + dir + ")"},
		{"bad --env", "", []string{"./x", "--env", "NOEQUALS"}, 2, `--env "NOEQUALS": want NAME=VALUE`},
		{"env and pass-env", "", []string{"./x", "--env", "A=1", "--pass-env", "A"}, 2, "--pass-env A: A is also given by --env; keep one"},
		{"policy without plugin", "", []string{"--policy", policy}, 2, "--policy FILE and --plugin NAME go together"},
		{"policy and binary", "", []string{"--policy", policy, "--plugin", "a", "./x"}, 2, "give no BINARY, --env, --pass-env or --start-timeout"},
		{"unknown block", "", []string{"--policy", policy, "--plugin", "c"}, 1, `--plugin "c": ` + policy + ` has no plugin block of that name (it declares "a", "b")`},
		{"bad --log-level", "", []string{"--log-level", "loud", "./x"}, 2, `--log-level "loud": want trace, debug, info, warn, error or off`},
		{"bad environment level", "loud", []string{"./x"}, 2, `SWITCHYARD_LOG_LEVEL="loud": want trace, debug, info, warn, error or off`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(LogLevelEnv, tt.env)
			code, _, errOut := routerRun(t, append([]string{"plugins", "describe"}, tt.args...)...)
			if code != tt.code || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, tt.code, tt.want)
			}
		})
	}
}

// TestLogLevelOnEveryCommand: --log-level is a flag of every command, in
// its --help.
func TestLogLevelOnEveryCommand(t *testing.T) {
	for _, c := range [][]string{{"validate"}, {"replay"}, {"serve"}, {"mock-worker"}, {"plugins", "describe"}, {"version"}} {
		code, out, errOut := routerRun(t, append(c, "--help")...)
		if code != 0 || !strings.Contains(out, "--log-level string") || !strings.Contains(out, "$SWITCHYARD_LOG_LEVEL") {
			t.Errorf("router %s --help: exit %d, stdout lacks --log-level:\n%s%s", strings.Join(c, " "), code, out, errOut)
		}
	}
}
