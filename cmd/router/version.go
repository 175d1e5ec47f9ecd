package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version, when set at build time (-ldflags "-X main.version=v1.2.3"),
// is the router's version and wins over the build information's. Empty
// otherwise.
var version string

// buildVersion is what `router version` prints and GET /version of
// router serve reports, read from the binary's build information
// (runtime/debug.ReadBuildInfo; the keys are those `go version -m`
// shows, documented in runtime/debug.BuildSetting).
type buildVersion struct {
	// Version is the main module's version: a release tag ("v1.2.3"), a
	// pseudo-version the go command derives from the commit
	// ("v0.0.0-20261207105622-e633d9d1a2b3", "+dirty" when modified;
	// Go 1.24 and later), or "(devel)" when it knows none.
	Version string
	// Revision is the commit (build setting vcs.revision), "" when the
	// build carries no version-control information.
	Revision string
	// Time is the commit's time, RFC 3339 (vcs.time), "" when absent.
	Time string
	// Modified says the work tree had uncommitted changes
	// (vcs.modified=true); meaningful only when Revision is set.
	Modified bool
	// Go is the toolchain that built the binary ("go1.26.8").
	Go string
}

// readBuildVersion reads a buildVersion from bi, the result of
// debug.ReadBuildInfo (nil when the binary has none). override, when not
// empty, replaces the module version (the -ldflags -X value).
func readBuildVersion(bi *debug.BuildInfo, override string) buildVersion {
	v := buildVersion{Version: "(devel)"}
	if bi != nil {
		v.Go = bi.GoVersion
		if bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if override != "" {
		v.Version = override
	}
	return v
}

// routerVersion is the version string of this binary: the -ldflags
// override, else the main module's version from its build information,
// with the commit's first 12 digits and "-dirty" appended when the
// version does not already name them ("(devel) e633d9d1a2b3-dirty").
func routerVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return readBuildVersion(bi, version).short()
}

// short is the one-word version: Version, plus the short commit (and
// "-dirty") when Version is "(devel)" and a commit is known.
func (v buildVersion) short() string {
	if v.Version != "(devel)" || v.Revision == "" {
		return v.Version
	}
	s := v.Version + " " + shortRevision(v.Revision)
	if v.Modified {
		s += "-dirty"
	}
	return s
}

// shortRevision is a commit's first 12 hexadecimal digits, the length Go
// uses in pseudo-versions.
func shortRevision(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// format is `router version`'s output: the version line, then the commit
// (with its time and whether the tree was dirty) or why there is none,
// then the Go toolchain.
func (v buildVersion) format() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "switchyard router %s (plugin API switchyard.plugin.v1)\n", v.Version)
	if v.Revision != "" {
		state := "clean"
		if v.Modified {
			state = "dirty: uncommitted changes"
		}
		when := v.Time
		if when == "" {
			when = "time unknown"
		}
		fmt.Fprintf(&sb, "commit %s (%s, %s)\n", v.Revision, when, state)
	} else {
		sb.WriteString("commit unknown: no version-control information in this build " +
			"(go run, go test, -buildvcs=false, a build outside a git checkout or in a linked git worktree, golang/go#58218)\n")
	}
	if v.Go != "" {
		fmt.Fprintf(&sb, "built with %s\n", v.Go)
	}
	return sb.String()
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the router's version, commit and Go toolchain (from the binary's build information)",
		Long: `Print the router's version, read from the binary's build information: the
main module's version (a release tag, or a pseudo-version Go derives from the
commit, "+dirty" with uncommitted changes, else "(devel)"), the commit with its
time and whether the work tree was dirty (vcs.revision, vcs.time, vcs.modified),
and the Go toolchain. A binary built without version-control information
(go run, go test, -buildvcs=false, a linked git worktree) says so.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi, _ := debug.ReadBuildInfo()
			_, err := fmt.Fprint(cmd.OutOrStdout(), readBuildVersion(bi, version).format())
			return err
		},
	}
}
