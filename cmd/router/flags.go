package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"

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
// Other errors (an unknown flag, a missing value) are pflag's own, already
// in words. Either is a usage error (exit status 2).
func flagError(_ *cobra.Command, err error) error {
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
