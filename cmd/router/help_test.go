package main

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// allCommands is every command of the router's tree, root first.
func allCommands(root *cobra.Command) []*cobra.Command {
	cmds := []*cobra.Command{root}
	for _, c := range root.Commands() {
		cmds = append(cmds, allCommands(c)...)
	}
	return cmds
}

// statesDefault matches a usage string that states its flag's default
// itself: "(default 0)", "default: one engine step", "defaults to 8",
// "one engine step by default".
// A usage naming a value called "default" ("default, all, or names";
// `"default" for the bundled trace`) does not match.
var statesDefault = regexp.MustCompile(`(?i)\(default[\s:]|\bdefault:|\bdefaults? (is|to)\b|[;,] default\b|\bby default\b`)

// pflagDefault matches a "(default X)" as pflag writes it.
var pflagDefault = regexp.MustCompile(`\(default[\s:]`)

// helpLine renders f's --help line as cobra's usage template does
// (pflag.FlagSet.FlagUsages).
func helpLine(f *pflag.Flag) string {
	fs := pflag.NewFlagSet("one", pflag.ContinueOnError)
	fs.AddFlag(f)
	return fs.FlagUsages()
}

// pflagPrintsDefault reports whether pflag appends "(default ...)" to f's
// help line: it does for every flag whose default is not its type's zero
// value ("false", "0", "", "[]" is not one of them).
func pflagPrintsDefault(f *pflag.Flag) bool {
	bare := *f
	bare.Usage = "x"
	return strings.Contains(helpLine(&bare), "(default ")
}

// TestHelpOneDefaultPerFlag walks every flag of every command: a flag
// whose usage string states its default while pflag also prints one
// ("(default ...)"), or whose help line shows two "(default" at all,
// fails; so does pflag's "(default [])" of an empty list, which says
// nothing.
func TestHelpOneDefaultPerFlag(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	seen := 0
	for _, cmd := range allCommands(root) {
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			seen++
			line := helpLine(f)
			switch {
			case pflagPrintsDefault(f) && statesDefault.MatchString(f.Usage):
				t.Errorf("%s --%s: the usage states a default and pflag prints one too:\n%s", cmd.CommandPath(), f.Name, line)
			case len(pflagDefault.FindAllString(line, -1)) > 1:
				t.Errorf("%s --%s: two defaults:\n%s", cmd.CommandPath(), f.Name, line)
			case strings.Contains(line, "(default [])"):
				t.Errorf("%s --%s: pflag prints the empty list as its default:\n%s", cmd.CommandPath(), f.Name, line)
			}
		})
	}
	if seen < 100 {
		t.Fatalf("walked only %d flags", seen)
	}
}
