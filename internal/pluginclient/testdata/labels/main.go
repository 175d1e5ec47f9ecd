// Command labels is a test plugin that routes by worker names and labels:
// its picker "prefer-name" declares the LABELS input and a list(string)
// parameter, as a plugin author would write one from
// docs/plugin-protocol.md. Package pluginclient's process test and
// cmd/router's replay-equals-serve test run it.
package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/switchyard-router/switchyard/shared"
)

// preferPicker picks, in order: the row of the first name of prefer that
// is a candidate; else the first row carrying label key=value (when set);
// else the first row. It fails when a row's id is not WorkerIDOf its
// name, or the columns are missing, so a test sees a broken contract.
type preferPicker struct {
	prefer     []string
	key, value string
}

func (preferPicker) Inputs() shared.Inputs { return shared.InputLabels }

func (p preferPicker) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	if len(c.Names) != c.Len() || len(c.Labels) != c.Len() {
		return 0, fmt.Errorf("LABELS declared, got %d names and %d label sets for %d rows", len(c.Names), len(c.Labels), c.Len())
	}
	for i, n := range c.Names {
		if shared.WorkerIDOf(n) != c.IDs[i] {
			return 0, fmt.Errorf("row %d: id %d is not WorkerIDOf(%q) = %d", i, c.IDs[i], n, shared.WorkerIDOf(n))
		}
	}
	for _, want := range p.prefer {
		if i := slices.Index(c.Names, want); i >= 0 {
			return i, nil
		}
	}
	if p.key != "" {
		for i, l := range c.Labels {
			if v, ok := l.Get(p.key); ok && v == p.value {
				return i, nil
			}
		}
	}
	return 0, nil
}

var types = []shared.TypeInfo{{
	Name: "prefer-name", Kind: shared.KindPicker, Inputs: shared.InputLabels,
	Doc: "Picks the first candidate named in prefer, else the first carrying label, else the first row.",
	Params: []shared.ParamSpec{
		{Name: "prefer", Type: shared.StringList, Default: []string{}, Doc: "Worker names, most preferred first."},
		{Name: "label", Type: shared.String, Default: "", Doc: `A label "key=value" to fall back on; "" for none.`},
	},
	New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
		pp := preferPicker{prefer: p.Strings("prefer", nil)}
		if l := p.String("label", ""); l != "" {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return nil, &shared.ParamError{Param: "label", Err: fmt.Errorf("want key=value, got %q", l)}
			}
			pp.key, pp.value = k, v
		}
		return pp, nil
	},
}}

func main() {
	shared.Serve(shared.ServeOpts{Version: "0.0.1-labels", Types: types})
}
