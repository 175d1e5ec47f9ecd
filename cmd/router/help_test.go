package main

import (
	"fmt"
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

// TestUnknownFlagSuggestions: an unknown long flag is a usage error
// (exit 2) naming the closest flags of the command, its inherited ones
// included, or pointing at --help when none is close.
func TestUnknownFlagSuggestions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--worker", "4"}, "router: unknown flag: --worker; did you mean --workers?\n"},
		{[]string{"replay", "--polcy", "x.hcl"}, "router: unknown flag: --polcy; did you mean --policy?\n"},
		{[]string{"replay", "--Workers=4"}, "router: unknown flag: --Workers; did you mean --workers?\n"},
		{[]string{"replay", "--work", "4"}, "router: unknown flag: --work; did you mean --workers?\n"},
		{[]string{"validate", "--log-levl", "debug", "x.hcl"}, "router: unknown flag: --log-levl; did you mean --log-level?\n"},
		{[]string{"trace", "generate", "--request", "3"}, "router: unknown flag: --request; did you mean --requests?\n"},
		{[]string{"replay", "--xyzzy"}, "router: unknown flag: --xyzzy; see 'router replay --help'\n"},
		{[]string{"replay", "-z"}, "router: unknown shorthand flag: 'z' in -z\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := routerRun(t, tc.args...)
			if code != 2 || out != "" || errOut != tc.want {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, out, errOut, tc.want)
			}
		})
	}
}

func TestSuggestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	for _, n := range []string{"workers", "workers-file", "prefill-workers", "policy", "seed", "seeds", "hidden-one"} {
		fs.String(n, "", "")
	}
	_ = fs.MarkHidden("hidden-one")
	for _, tc := range []struct {
		name string
		want string
	}{
		{"worker", "--workers"},
		{"sed", "--seed"},              // distance 1 to seed, 2 to seeds: the closest only
		{"seedz", "--seed or --seeds"}, // a tie
		{"wor", "--workers or --workers-file"},
		{"hidden-on", ""}, // hidden flags are never suggested
		{"ab", ""},        // two edits would rewrite it whole
		{strings.Repeat("w", maxSuggestName+1), ""},
	} {
		if got := strings.Join(suggestFlags(fs, tc.name), " or "); got != tc.want {
			t.Errorf("suggestFlags(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "abc", 3}, {"kitten", "sitting", 3}, {"workers", "worker", 1}, {"flaw", "lawn", 2}, {"same", "same", 0}} {
		if d := levenshtein(tc.a, tc.b); d != tc.d {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}

// TestCommandGroups: every command that holds subcommands, the root and
// cobra's completion included, behaves the same: alone, it prints its
// help (its commands listed) on stdout and exits 0; followed by a word
// that is none of its commands, it is a usage error (exit 2) naming the
// word, with a suggestion when one is close.
func TestCommandGroups(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	groups := 0
	for _, cmd := range allCommands(root) {
		if !cmd.HasAvailableSubCommands() {
			continue
		}
		groups++
		path := strings.Fields(cmd.CommandPath())[1:]
		t.Run(cmd.CommandPath(), func(t *testing.T) {
			code, out, errOut := routerRun(t, path...)
			if code != 0 || errOut != "" {
				t.Errorf("alone: exit %d, stderr %q; want its help and exit 0", code, errOut)
			}
			if !strings.HasPrefix(out, cmd.Short) && !strings.HasPrefix(out, cmd.Long) || !strings.Contains(out, "Available Commands:") {
				t.Errorf("alone: stdout is not its help:\n%s", out)
			}
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() && !strings.Contains(out, "\n  "+sub.Name()+" ") {
					t.Errorf("alone: its help does not list %q:\n%s", sub.Name(), out)
				}
			}
			code, out, errOut = routerRun(t, append(path, "no-such-command")...)
			if want := fmt.Sprintf("router: unknown command %q for %q", "no-such-command", cmd.CommandPath()); code != 2 || out != "" || !strings.HasPrefix(errOut, want) {
				t.Errorf("with an unknown command: exit %d, stdout %q, stderr %q; want exit 2 and %q", code, out, errOut, want)
			}
		})
	}
	if groups < 4 {
		t.Fatalf("found %d command groups, want the root, completion, plugins and trace at least", groups)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"trace", "genrate"}, `router: unknown command "genrate" for "router trace"; did you mean "generate"? (its commands: generate; see 'router trace --help')` + "\n"},
		{[]string{"plugins", "chek"}, `router: unknown command "chek" for "router plugins"; did you mean "check"? (its commands: check, describe; see 'router plugins --help')` + "\n"},
	} {
		if code, _, errOut := routerRun(t, tc.args...); code != 2 || errOut != tc.want {
			t.Errorf("%v: exit %d, stderr %q; want exit 2, %q", tc.args, code, errOut, tc.want)
		}
	}
}
