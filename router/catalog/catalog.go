// Package catalog is the one registry of component types: the built-in Go
// types (registered at init, see builtin.go) and, per loaded bundle, the
// types each plugin binary declares. Types are keyed by name across all
// kinds, so a filter and a picker cannot share a name.
//
// Like Caddy's module registry, registration rejects an empty, reserved or
// taken name, and every listing is sorted to keep output deterministic.
package catalog

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/switchyard-router/switchyard/shared"
)

// ReservedName is the name no type, policy or plugin may take: it names the
// default policy.
const ReservedName = "default"

// SourceBuiltin is the Source of built-in types.
const SourceBuiltin = "builtin"

// Registration errors callers branch on with errors.Is / errors.As.
var (
	// ErrEmptyName: a type registered without a name.
	ErrEmptyName = errors.New("empty type name")
	// ErrReservedName: a type registered as "default".
	ErrReservedName = errors.New(`name "default" is reserved`)
	// ErrInvalidName: a name with characters outside [A-Za-z0-9_.-].
	ErrInvalidName = errors.New("invalid name: use letters, digits, '_', '.' and '-'")
	// ErrReservedParam: a parameter named as an attribute the policy
	// file's component block takes for itself (see ValidParam).
	ErrReservedParam = errors.New("reserved parameter name")
	// ErrNonFiniteDefault: a NUMBER parameter whose default is NaN or
	// infinite, or a NUMBER_LIST one with such an entry.
	ErrNonFiniteDefault = errors.New("non-finite default")
)

// Attributes the policy file's component block takes besides its type's
// parameters: "type" in every block, "weight" in a scorer's.
const (
	AttrType   = "type"
	AttrWeight = "weight"
)

// ValidParam returns nil when p can be a parameter of a type of kind k, or
// an error wrapping ErrReservedParam (p is named "type", or "weight" in a
// scorer: the policy file's block would set the attribute, never the
// parameter) or ErrNonFiniteDefault (a NUMBER default of NaN or ±Inf, which
// the policy file cannot write nor the instance use).
func ValidParam(k shared.Kind, p shared.ParamSpec) error {
	if p.Name == AttrType || k == shared.KindScorer && p.Name == AttrWeight {
		return fmt.Errorf("parameter %q: %w: a %s block's %q attribute is the block's own, so the parameter could never be set",
			p.Name, ErrReservedParam, k, p.Name)
	}
	if f, ok := p.Default.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return fmt.Errorf("parameter %q: %w %v: a NUMBER default must be finite", p.Name, ErrNonFiniteDefault, f)
	}
	if fs, ok := p.Default.([]float64); ok {
		for i, f := range fs {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("parameter %q: %w %v at entry %d: a NUMBER_LIST default must be finite", p.Name, ErrNonFiniteDefault, f, i)
			}
		}
	}
	return nil
}

var identRe = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// ValidName returns nil when name is a usable identifier for a type, policy
// or plugin, or ErrEmptyName, ErrReservedName or ErrInvalidName.
func ValidName(name string) error {
	switch {
	case name == "":
		return ErrEmptyName
	case name == ReservedName:
		return ErrReservedName
	case !identRe.MatchString(name):
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	return nil
}

// DuplicateError reports a type name registered twice; it names both sources
// ("builtin" or "plugin NAME").
type DuplicateError struct {
	Name     string
	Existing string
	New      string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("type %q from %s is already registered by %s", e.Name, e.New, e.Existing)
}

// UnknownTypeError reports a type name the catalog does not hold, with the
// sorted names of the types that would have fitted.
type UnknownTypeError struct {
	Name      string
	Kind      shared.Kind // 0 when any kind was acceptable
	Available []string
}

func (e *UnknownTypeError) Error() string {
	what := "type"
	if e.Kind != 0 {
		what = e.Kind.String() + " type"
	}
	return fmt.Sprintf("unknown %s %q; available: %s", what, e.Name, strings.Join(e.Available, ", "))
}

// WrongKindError reports a type used as a kind it is not, e.g. a scorer type
// in a picker block.
type WrongKindError struct {
	Name string
	Want shared.Kind
	Got  shared.Kind
}

func (e *WrongKindError) Error() string {
	return fmt.Sprintf("type %q is a %s, not a %s", e.Name, e.Got, e.Want)
}

// Entry is one registered type.
type Entry struct {
	shared.TypeInfo
	// Source is SourceBuiltin or "plugin NAME".
	Source string
	// OutOfProcess is true for types served by a plugin binary.
	OutOfProcess bool
}

// Catalog is a set of component types. Safe for concurrent use.
type Catalog struct {
	mu    sync.RWMutex
	types map[string]*Entry
}

// New returns an empty catalog.
func New() *Catalog { return &Catalog{types: make(map[string]*Entry)} }

// Register adds a type from source. It fails with ErrEmptyName,
// ErrReservedName, ErrInvalidName, a *DuplicateError, an error wrapping
// ErrReservedParam or ErrNonFiniteDefault (ValidParam), or an error for an
// unknown kind or a missing constructor.
func (c *Catalog) Register(source string, t shared.TypeInfo) error {
	if err := ValidName(t.Name); err != nil {
		return fmt.Errorf("registering %s type: %w", source, err)
	}
	if t.Kind < shared.KindFilter || t.Kind > shared.KindClassifier {
		return fmt.Errorf("registering type %q from %s: unknown kind %d", t.Name, source, t.Kind)
	}
	if t.New == nil {
		return fmt.Errorf("registering type %q from %s: missing constructor", t.Name, source)
	}
	for _, p := range t.Params {
		if err := ValidParam(t.Kind, p); err != nil {
			return fmt.Errorf("registering type %q from %s: %w", t.Name, source, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.types[t.Name]; ok {
		return &DuplicateError{Name: t.Name, Existing: old.Source, New: source}
	}
	c.types[t.Name] = &Entry{TypeInfo: t, Source: source, OutOfProcess: source != SourceBuiltin}
	return nil
}

// Lookup returns the named type, or an *UnknownTypeError listing every
// registered type.
func (c *Catalog) Lookup(name string) (*Entry, error) {
	c.mu.RLock()
	e, ok := c.types[name]
	c.mu.RUnlock()
	if !ok {
		return nil, &UnknownTypeError{Name: name, Available: c.Names(0)}
	}
	return e, nil
}

// LookupKind returns the named type when it is of kind k; otherwise an
// *UnknownTypeError listing the types of that kind, or a *WrongKindError.
func (c *Catalog) LookupKind(name string, k shared.Kind) (*Entry, error) {
	c.mu.RLock()
	e, ok := c.types[name]
	c.mu.RUnlock()
	if !ok {
		return nil, &UnknownTypeError{Name: name, Kind: k, Available: c.Names(k)}
	}
	if e.Kind != k {
		return nil, &WrongKindError{Name: name, Want: k, Got: e.Kind}
	}
	return e, nil
}

// Names returns the sorted names of the types of kind k, or of every type
// when k is 0.
func (c *Catalog) Names(k shared.Kind) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.types))
	for name, e := range c.types {
		if k == 0 || e.Kind == k {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Entries returns every type sorted by name.
func (c *Catalog) Entries() []*Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*Entry, 0, len(c.types))
	for _, e := range c.types {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *Entry) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Clone returns an independent copy, so a bundle can add its plugins' types
// without touching the catalog it started from.
func (c *Catalog) Clone() *Catalog {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := &Catalog{types: make(map[string]*Entry, len(c.types))}
	for k, v := range c.types {
		n.types[k] = v
	}
	return n
}
