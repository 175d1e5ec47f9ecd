package main

import (
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// TestBuildVersionFormat: router version's output from build information
// as the go command records it (the keys of runtime/debug.BuildSetting):
// a release, a pseudo-version of a dirty tree, a development build with
// a commit, and one with no version-control information at all.
func TestBuildVersionFormat(t *testing.T) {
	const rev = "e633d9d1a2b3c4d5e6f708192a3b4c5d6e7f8091"
	settings := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{
			{Key: "-buildmode", Value: "exe"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-12-07T10:56:22Z"},
			{Key: "vcs.modified", Value: modified},
		}
	}
	info := func(v string, s []debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/switchyard-router/switchyard", Version: v}, Settings: s}
	}
	for _, tc := range []struct {
		name     string
		bi       *debug.BuildInfo
		override string
		want     string
		short    string
	}{
		{"release", info("v1.2.3", settings("false")), "",
			"switchyard router v1.2.3 (plugin API switchyard.plugin.v1)\n" +
				"commit " + rev + " (2026-12-07T10:56:22Z, clean)\nbuilt with go1.26.8\n", "v1.2.3"},
		{"pseudo-version, dirty", info("v0.0.0-20261207105622-e633d9d1a2b3+dirty", settings("true")), "",
			"switchyard router v0.0.0-20261207105622-e633d9d1a2b3+dirty (plugin API switchyard.plugin.v1)\n" +
				"commit " + rev + " (2026-12-07T10:56:22Z, dirty: uncommitted changes)\nbuilt with go1.26.8\n",
			"v0.0.0-20261207105622-e633d9d1a2b3+dirty"},
		{"devel with commit", info("(devel)", settings("true")), "",
			"switchyard router (devel) (plugin API switchyard.plugin.v1)\n" +
				"commit " + rev + " (2026-12-07T10:56:22Z, dirty: uncommitted changes)\nbuilt with go1.26.8\n",
			"(devel) e633d9d1a2b3-dirty"},
		{"no vcs", info("", []debug.BuildSetting{{Key: "-buildvcs", Value: "false"}}), "",
			"switchyard router (devel) (plugin API switchyard.plugin.v1)\n" +
				"commit unknown: no version-control information in this build (go run, go test, -buildvcs=false, " +
				"a build outside a git checkout or in a linked git worktree, golang/go#58218)\nbuilt with go1.26.8\n",
			"(devel)"},
		{"no build information", nil, "",
			"switchyard router (devel) (plugin API switchyard.plugin.v1)\n" +
				"commit unknown: no version-control information in this build (go run, go test, -buildvcs=false, " +
				"a build outside a git checkout or in a linked git worktree, golang/go#58218)\n",
			"(devel)"},
		{"ldflags override", info("(devel)", settings("false")), "v2.0.0-rc1",
			"switchyard router v2.0.0-rc1 (plugin API switchyard.plugin.v1)\n" +
				"commit " + rev + " (2026-12-07T10:56:22Z, clean)\nbuilt with go1.26.8\n", "v2.0.0-rc1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := readBuildVersion(tc.bi, tc.override)
			if got := v.format(); got != tc.want {
				t.Errorf("format:\n%s\nwant:\n%s", got, tc.want)
			}
			if got := v.short(); got != tc.short {
				t.Errorf("short %q, want %q", got, tc.short)
			}
		})
	}
}

// TestVersion: in a test binary, which go test builds without
// version-control information, router version says so.
func TestVersion(t *testing.T) {
	code, out, errOut := routerRun(t, "version")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if want := "switchyard router (devel) (plugin API switchyard.plugin.v1)"; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	if len(lines) < 2 || !strings.HasPrefix(lines[1], "commit unknown: no version-control information") {
		t.Errorf("second line of %q does not say the commit is unknown", out)
	}
}

// TestVersionBinaryAgreesWithGo runs `router version` on the built router
// binary and checks it against what the go command itself reads from the
// same binary (`go version -m`): the same main-module version, the same
// commit and dirty flag, or "commit unknown" exactly when the build
// carries none (go build in a linked worktree or with -buildvcs=false).
func TestVersionBinaryAgreesWithGo(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	out, err := exec.Command(routerBin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("router version: %v\n%s", err, out)
	}
	m, err := exec.Command("go", "version", "-m", routerBin).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, m)
	}
	modVersion := regexp.MustCompile(`(?m)^\tmod\t\S+\t(\S+)`).FindSubmatch(m)
	if modVersion == nil {
		t.Fatalf("go version -m names no main module:\n%s", m)
	}
	setting := func(key string) string {
		s := regexp.MustCompile(`(?m)^\tbuild\t` + regexp.QuoteMeta(key) + `=(.*)$`).FindSubmatch(m)
		if s == nil {
			return ""
		}
		return string(s[1])
	}
	want := "switchyard router " + string(modVersion[1]) + " (plugin API switchyard.plugin.v1)\n"
	if rev := setting("vcs.revision"); rev != "" {
		state := "clean"
		if setting("vcs.modified") == "true" {
			state = "dirty: uncommitted changes"
		}
		want += "commit " + rev + " (" + setting("vcs.time") + ", " + state + ")\n"
	} else {
		want += "commit unknown: no version-control information in this build (go run, go test, -buildvcs=false, " +
			"a build outside a git checkout or in a linked git worktree, golang/go#58218)\n"
	}
	goVersion := regexp.MustCompile(`^\S+: (go\S+)`).FindSubmatch(m)
	if goVersion == nil {
		t.Fatalf("go version -m names no toolchain:\n%s", m)
	}
	want += "built with " + string(goVersion[1]) + "\n"
	if string(out) != want {
		t.Errorf("router version:\n%s\nwant (from go version -m):\n%s", out, want)
	}
}
