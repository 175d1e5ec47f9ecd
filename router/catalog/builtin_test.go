package catalog

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

func TestDefaultNames(t *testing.T) {
	want := []string{
		builtin.TypeBusy,
		builtin.TypeKVCost,
		builtin.TypeLeastLoaded,
		builtin.TypeMinCost,
		builtin.TypePowerOfTwo,
		builtin.TypeRandom,
		builtin.TypeRoundRobin,
	}
	if diff := cmp.Diff(want, Default().Names(0)); diff != "" {
		t.Errorf("Default().Names(0) (-want +got):\n%s", diff)
	}
}

func TestDefaultKinds(t *testing.T) {
	want := map[string]shared.Kind{
		"busy":         shared.KindFilter,
		"kv-cost":      shared.KindScorer,
		"least-loaded": shared.KindPicker,
		"min-cost":     shared.KindPicker,
		"power-of-two": shared.KindPicker,
		"random":       shared.KindPicker,
		"round-robin":  shared.KindPicker,
	}
	got := map[string]shared.Kind{}
	for _, e := range Default().Entries() {
		got[e.Name] = e.Kind
		if e.Source != SourceBuiltin || e.OutOfProcess {
			t.Errorf("%s: Source = %q, OutOfProcess = %v; want %q, false", e.Name, e.Source, e.OutOfProcess, SourceBuiltin)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}

// TestDefaultConstructs checks every built-in builds with its schema
// defaults (plus a limit for busy) into an instance of its kind.
func TestDefaultConstructs(t *testing.T) {
	extra := map[string]shared.Params{"busy": {"max_active_requests": int64(8)}}
	for _, e := range Default().Entries() {
		t.Run(e.Name, func(t *testing.T) {
			c, err := e.New(shared.InstanceInfo{}, e.WithDefaults(extra[e.Name]))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var ok bool
			switch e.Kind {
			case shared.KindFilter:
				_, ok = c.(shared.Filter)
			case shared.KindScorer:
				_, ok = c.(shared.Scorer)
			case shared.KindPicker:
				_, ok = c.(shared.Picker)
			}
			if !ok {
				t.Errorf("%T does not implement the %s interface", c, e.Kind)
			}
			if in := c.Inputs(); !e.Inputs.Has(in) {
				t.Errorf("instance inputs %v not within type inputs %v", in, e.Inputs)
			}
		})
	}
}

func TestDefaultUnknownListsSorted(t *testing.T) {
	_, err := Default().Lookup("nope")
	var u *UnknownTypeError
	if !errors.As(err, &u) {
		t.Fatalf("Lookup(nope) error = %v, want *UnknownTypeError", err)
	}
	want := []string{"busy", "kv-cost", "least-loaded", "min-cost", "power-of-two", "random", "round-robin"}
	if diff := cmp.Diff(want, u.Available); diff != "" {
		t.Errorf("Available (-want +got):\n%s", diff)
	}
	const msg = `unknown type "nope"; available: busy, kv-cost, least-loaded, min-cost, power-of-two, random, round-robin`
	if err.Error() != msg {
		t.Errorf("error = %q, want %q", err, msg)
	}

	_, err = Default().LookupKind("nope", shared.KindPicker)
	if !errors.As(err, &u) {
		t.Fatalf("LookupKind(nope) error = %v, want *UnknownTypeError", err)
	}
	wantPickers := []string{"least-loaded", "min-cost", "power-of-two", "random", "round-robin"}
	if diff := cmp.Diff(wantPickers, u.Available); diff != "" {
		t.Errorf("picker Available (-want +got):\n%s", diff)
	}
}

func TestDefaultIsIndependent(t *testing.T) {
	a := Default()
	if err := a.Register("plugin x", shared.TypeInfo{
		Name: "extra", Kind: shared.KindPicker,
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) {
			return builtin.NewRoundRobin(), nil
		},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Default().Lookup("extra"); err == nil {
		t.Error("a type registered in one Default() leaked into the next")
	}
	var dup *DuplicateError
	if err := Default().Register("plugin x", builtin.RandomType()); !errors.As(err, &dup) {
		t.Errorf("re-registering random: error = %v, want *DuplicateError", err)
	}
}
