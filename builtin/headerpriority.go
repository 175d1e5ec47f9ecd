package builtin

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeHeaderPriority is the type name of the HeaderPriority classifier.
const TypeHeaderPriority = "header-priority"

// Parameter names of the header-priority classifier.
const (
	ParamPriorityKey     = "priority_key"
	ParamClassKey        = "class_key"
	ParamDefaultClass    = "default_class"
	ParamDefaultPriority = "default_priority"
)

// Defaults of the header-priority classifier.
const (
	DefaultPriorityKey = "x-priority"
	DefaultClassKey    = "x-policy-class"
)

// ErrInvalidPriority is wrapped by the error HeaderPriority returns for a
// request whose priority value is not an integer (or overflows int).
var ErrInvalidPriority = errors.New("invalid priority")

// maxQuoted bounds how much of an untrusted metadata value an error quotes.
const maxQuoted = 64

// HeaderPriority takes a request's priority and policy class from its
// metadata (HTTP headers in serve, trace fields in replay): the integer
// under priority_key, default_priority when absent or empty, and the class
// under class_key, default_class when absent or empty. Keys match
// case-insensitively, as HTTP header names do. A priority that is not an
// integer fails that request with an error wrapping ErrInvalidPriority.
//
// HeaderPriority is stateless: it is its own factory and every partition
// shares the one instance.
type HeaderPriority struct {
	prioKey, prioCanon   string // lower-case and canonical MIME forms
	classKey, classCanon string
	defClass             string
	defPrio              int
}

// HeaderPriorityType describes the header-priority classifier.
func HeaderPriorityType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypeHeaderPriority,
		Kind: shared.KindClassifier,
		Params: []shared.ParamSpec{
			{Name: ParamPriorityKey, Type: shared.String, Default: DefaultPriorityKey,
				Doc: "Metadata key (HTTP header in serve, trace field in replay) holding the request's integer " +
					"priority, higher first; matched case-insensitively. Default \"x-priority\"."},
			{Name: ParamClassKey, Type: shared.String, Default: DefaultClassKey,
				Doc: "Metadata key holding the request's policy class, a queue class name; matched " +
					"case-insensitively. Default \"x-policy-class\"."},
			{Name: ParamDefaultClass, Type: shared.String, Default: "",
				Doc: "Class of a request without (or with an empty) class value. Default \"\": the queue's default class."},
			{Name: ParamDefaultPriority, Type: shared.Int, Default: int64(0),
				Doc: "Priority of a request without (or with an empty) priority value. Default 0."},
		},
		Doc: "Sets each request's priority and policy class from its metadata (HTTP headers in serve, " +
			"trace fields in replay), keys matched case-insensitively; a non-integer priority fails the request.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewHeaderPriority(p) },
	}
}

// NewHeaderPriority returns a header-priority classifier from p. It fails
// with a *shared.ParamError for an empty key, a default_class that is not an
// identifier, or a default_priority that overflows int.
func NewHeaderPriority(p shared.Params) (*HeaderPriority, error) {
	var errs []error
	key := func(name, def string) string {
		k := strings.TrimSpace(p.String(name, def))
		if k == "" {
			errs = append(errs, &shared.ParamError{Param: name, Err: errors.New("must not be empty")})
		}
		return strings.ToLower(k)
	}
	h := &HeaderPriority{
		prioKey:  key(ParamPriorityKey, DefaultPriorityKey),
		classKey: key(ParamClassKey, DefaultClassKey),
		defClass: p.String(ParamDefaultClass, ""),
	}
	h.prioCanon = textproto.CanonicalMIMEHeaderKey(h.prioKey)
	h.classCanon = textproto.CanonicalMIMEHeaderKey(h.classKey)
	if h.defClass != "" && !validClassName(h.defClass) {
		errs = append(errs, &shared.ParamError{Param: ParamDefaultClass,
			Err: fmt.Errorf("%q is not a class name: use letters, digits, '_', '.' and '-'", h.defClass)})
	}
	dp := p.Int(ParamDefaultPriority, 0)
	if int64(int(dp)) != dp {
		errs = append(errs, &shared.ParamError{Param: ParamDefaultPriority, Err: fmt.Errorf("%d overflows int", dp)})
	}
	h.defPrio = int(dp)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return h, nil
}

// Inputs returns 0: the classifier reads only the request.
func (*HeaderPriority) Inputs() shared.Inputs { return 0 }

// NewClassifier returns h itself: it keeps no per-partition state.
func (h *HeaderPriority) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return h, nil
}

// Classify reads the priority and class from req.Metadata. It does not
// allocate unless it fails.
func (h *HeaderPriority) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	cl := shared.Classification{Priority: h.defPrio, PolicyClass: h.defClass}
	if req == nil {
		return cl, nil
	}
	if v := strings.TrimSpace(lookupFold(req.Metadata, h.prioKey, h.prioCanon)); v != "" {
		prio, err := strconv.Atoi(v)
		if err != nil {
			why := "not an integer"
			if errors.Is(err, strconv.ErrRange) {
				why = "out of range"
			}
			return shared.Classification{}, fmt.Errorf("%s: %w: metadata %q = %q is %s",
				TypeHeaderPriority, ErrInvalidPriority, h.prioKey, truncate(v, maxQuoted), why)
		}
		cl.Priority = prio
	}
	if v := strings.TrimSpace(lookupFold(req.Metadata, h.classKey, h.classCanon)); v != "" {
		cl.PolicyClass = v
	}
	return cl, nil
}

// lookupFold returns m's value for key matched case-insensitively: the
// lower-case key first, then its canonical MIME form (X-Priority, as
// net/http stores headers), then any other key of the same length equal
// ignoring case.
func lookupFold(m map[string]string, lower, canon string) string {
	if len(m) == 0 {
		return ""
	}
	if v, ok := m[lower]; ok {
		return v
	}
	if v, ok := m[canon]; ok {
		return v
	}
	for k, v := range m {
		if len(k) == len(lower) && strings.EqualFold(k, lower) {
			return v
		}
	}
	return ""
}

// QueueClassNamer is implemented by the classifiers whose parameters name
// queue classes: header-priority's default_class and prompt-length-class's
// buckets. The policy-file loader (router/config) checks every name against
// the file's queue and reports one the queue lacks as an error at the
// parameter, instead of a router that refuses each request so classified.
type QueueClassNamer interface {
	// QueueClasses returns the name of the parameter that names queue
	// classes and the classes it names, in order; no classes when the
	// parameter leaves the class to the queue's default_class.
	QueueClasses() (param string, classes []string)
}

// QueueClasses returns default_class and its class, or none when it is
// empty (the queue's default class).
func (h *HeaderPriority) QueueClasses() (string, []string) {
	if h.defClass == "" {
		return ParamDefaultClass, nil
	}
	return ParamDefaultClass, []string{h.defClass}
}

// validClassName reports whether s is an identifier [A-Za-z0-9_.-]+.
func validClassName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// truncate shortens s to at most n bytes for quoting in an error.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Interface guards.
var (
	_ shared.ClassifierFactory = (*HeaderPriority)(nil)
	_ shared.Classifier        = (*HeaderPriority)(nil)
)
