package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// wantAnnotation is the flag annotation (pflag.Flag.Annotations) that
// holds, in words, what values a flag accepts: flagError quotes it for a
// value that does not parse. setWant sets it.
const wantAnnotation = "switchyard/want"

// setWant records on the flag name of fs what values it accepts, in words
// that complete "want ...": "a whole number from 1 to 4096". Every
// numeric flag has one, so that a value out of the type's range is
// answered with the flag's own range.
func setWant(fs *pflag.FlagSet, name, want string) {
	if err := fs.SetAnnotation(name, wantAnnotation, []string{want}); err != nil {
		panic(err) // a flag name misspelt in the code
	}
}

// flagError is the root command's FlagErrorFunc. A value that does not
// parse as its flag's type ("--workers 1e9", "--workers 99999999999999999999",
// "--request-timeout 5") is answered in words, naming the flag and what it
// accepts ("--workers 99999999999999999999: out of range; want a whole
// number from 1 to 4096"), instead of with strconv's or time's message.
// An unknown long flag is answered with the command's closest flags, if
// any is close ("unknown flag: --worker; did you mean --workers?",
// suggestFlags). Other errors (a missing value, an unknown shorthand) are
// pflag's own, already in words. Each is a usage error (exit status 2).
func flagError(cmd *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) && ne.GetSpecifiedShortnames() == "" {
		if s := suggestFlags(cmd.Flags(), ne.GetSpecifiedName()); len(s) > 0 {
			return fmt.Errorf("%w; did you mean %s?", err, strings.Join(s, " or "))
		}
		return fmt.Errorf("%w; see '%s --help'", err, cmd.CommandPath())
	}
	var iv *pflag.InvalidValueError
	if !errors.As(err, &iv) {
		return err
	}
	f := iv.GetFlag()
	want := typeWant(f.Value.Type())
	if w := f.Annotations[wantAnnotation]; len(w) > 0 {
		want = w[0]
	}
	what := ""
	if errors.Is(err, strconv.ErrRange) {
		what = "out of range; "
	}
	v := iv.GetValue()
	if v == "" {
		v = "''"
	}
	return fmt.Errorf("--%s %s: %swant %s", f.Name, v, what, want)
}

// maxSuggestName bounds the length of an unknown flag's name that
// suggestFlags compares (the comparison costs its length times each
// flag's): a longer one gets no suggestion.
const maxSuggestName = 64

// suggestFlags returns, as "--name", fs's visible flags closest to the
// unknown name typed: those at the least edit distance (levenshtein) when
// it is at most 2 and under half the name's length ("worker" ->
// "--workers", "polcy" -> "--policy"), else those the name begins
// ("work" -> "--workers", "--workers-file"); at most 3, in fs's order.
func suggestFlags(fs *pflag.FlagSet, name string) []string {
	name = strings.ToLower(name)
	if name == "" || len(name) > maxSuggestName {
		return nil
	}
	best, byDistance, byPrefix := 3, []string(nil), []string(nil)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		d := levenshtein(name, f.Name)
		if d <= 2 && 2*d < len(name) {
			switch {
			case d < best:
				best, byDistance = d, []string{"--" + f.Name}
			case d == best:
				byDistance = append(byDistance, "--"+f.Name)
			}
		}
		if len(name) >= 3 && strings.HasPrefix(f.Name, name) {
			byPrefix = append(byPrefix, "--"+f.Name)
		}
	})
	s := byDistance
	if len(s) == 0 {
		s = byPrefix
	}
	if len(s) > 3 {
		s = s[:3]
	}
	return s
}

// levenshtein is the edit distance between a and b, in bytes: the fewest
// insertions, deletions and substitutions that turn one into the other.
// It costs len(a)*len(b) steps and one row of memory.
func levenshtein(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		diag := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			next := min(row[j]+1, row[j-1]+1, diag+cost)
			diag, row[j] = row[j], next
		}
	}
	return row[len(b)]
}

// typeWant words what a flag of a pflag type accepts, for a flag without
// a wantAnnotation.
func typeWant(typ string) string {
	switch typ {
	case "int", "int64":
		return fmt.Sprintf("a whole number from %d to %d", math.MinInt64, math.MaxInt64)
	case "float64":
		return "a number"
	case "duration":
		return "a duration with a unit, such as 500ms, 30s, 5m or 1h30m"
	case "bool":
		return "true or false"
	case "stringSlice":
		return "a comma-separated list"
	default:
		return "a " + typ
	}
}
