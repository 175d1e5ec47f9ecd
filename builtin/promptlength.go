package builtin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/shared"
)

// TypePromptLengthClass is the type name of the PromptLengthClass classifier.
const TypePromptLengthClass = "prompt-length-class"

// ParamBuckets is the name of prompt-length-class's bucket list parameter.
const ParamBuckets = "buckets"

// PromptLengthClass puts each request in the policy class of its prompt
// length bucket. Buckets are written "short:1024,medium:8192,long": classes
// with inclusive upper bounds in tokens, strictly ascending, and a last
// class without a bound that takes every longer prompt. A prompt of
// exactly 1024 tokens is "short", 1025 is "medium".
//
// It buckets by the uncached prompt tokens the request carries: the router
// passes Request.PromptTokens, minus the prefix it knows to be cached when
// it knows it. It sets only the class; priority stays 0.
//
// PromptLengthClass is stateless: it is its own factory and every partition
// shares the one instance.
type PromptLengthClass struct {
	bounds  []int    // bounds[i] is the inclusive upper bound of classes[i]
	classes []string // len(classes) == len(bounds)+1
}

// PromptLengthClassType describes the prompt-length-class classifier.
func PromptLengthClassType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypePromptLengthClass,
		Kind: shared.KindClassifier,
		Params: []shared.ParamSpec{
			{Name: ParamBuckets, Type: shared.String, Required: true,
				Doc: "Comma-separated buckets \"class:max_tokens,...,class\", e.g. \"short:1024,medium:8192,long\": " +
					"a request whose uncached prompt has at most max_tokens tokens goes to that class; bounds are " +
					"integers >= 1, strictly ascending; the last class has no bound. Class names are identifiers " +
					"[A-Za-z0-9_.-] naming queue classes, each used once. Required."},
		},
		Doc: "Sets each request's policy class by the length of its uncached prompt, in configured " +
			"token buckets such as \"short:1024,medium:8192,long\".",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewPromptLengthClass(p) },
	}
}

// NewPromptLengthClass returns a prompt-length-class classifier from p. It
// fails with a *shared.ParamError naming buckets when the list is missing or
// malformed.
func NewPromptLengthClass(p shared.Params) (*PromptLengthClass, error) {
	bounds, classes, err := parseBuckets(p.String(ParamBuckets, ""))
	if err != nil {
		return nil, &shared.ParamError{Param: ParamBuckets, Err: err}
	}
	return &PromptLengthClass{bounds: bounds, classes: classes}, nil
}

// parseBuckets parses "a:100,b:200,c" into bounds [100 200] and classes
// [a b c].
func parseBuckets(s string) (bounds []int, classes []string, err error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil, errors.New(`must list buckets, e.g. "short:1024,medium:8192,long"`)
	}
	parts := strings.Split(s, ",")
	seen := make(map[string]bool, len(parts))
	for i, part := range parts {
		part = strings.TrimSpace(part)
		name, bound, hasBound := strings.Cut(part, ":")
		name = strings.TrimSpace(name)
		last := i == len(parts)-1
		if !validClassName(name) {
			return nil, nil, fmt.Errorf("bucket %d (%q): class %q is not a class name: use letters, digits, '_', '.' and '-'",
				i+1, part, name)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("bucket %d (%q): class %q is used twice", i+1, part, name)
		}
		seen[name] = true
		classes = append(classes, name)
		if last {
			if hasBound {
				return nil, nil, fmt.Errorf("bucket %d (%q): the last bucket takes every longer prompt and has no bound; "+
					"add a final class without one", i+1, part)
			}
			break
		}
		if !hasBound {
			return nil, nil, fmt.Errorf("bucket %d (%q): only the last bucket may omit its bound; write %q", i+1, part, name+":TOKENS")
		}
		n, err := strconv.Atoi(strings.TrimSpace(bound))
		if err != nil || n < 1 {
			return nil, nil, fmt.Errorf("bucket %d (%q): bound %q is not an integer >= 1", i+1, part, strings.TrimSpace(bound))
		}
		if len(bounds) > 0 && n <= bounds[len(bounds)-1] {
			return nil, nil, fmt.Errorf("bucket %d (%q): bound %d is not above the previous bound %d", i+1, part, n, bounds[len(bounds)-1])
		}
		bounds = append(bounds, n)
	}
	return bounds, classes, nil
}

// QueueClasses returns buckets and its classes, shortest prompts first.
func (c *PromptLengthClass) QueueClasses() (string, []string) {
	return ParamBuckets, c.classes
}

// Inputs returns 0: the classifier reads only the request.
func (*PromptLengthClass) Inputs() shared.Inputs { return 0 }

// NewClassifier returns c itself: it keeps no per-partition state.
func (c *PromptLengthClass) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return c, nil
}

// Classify sets the class of req's uncached prompt length bucket
// (PromptTokens - CachedPromptTokens, at least 0). A nil request falls in
// the first bucket. It never fails and does not allocate.
func (c *PromptLengthClass) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	var tokens int
	if req != nil {
		tokens = max(req.PromptTokens-req.CachedPromptTokens, 0)
	}
	return shared.Classification{PolicyClass: c.classFor(tokens)}, nil
}

// classFor returns the class of a prompt of tokens uncached tokens.
func (c *PromptLengthClass) classFor(tokens int) string {
	for i, b := range c.bounds {
		if tokens <= b {
			return c.classes[i]
		}
	}
	return c.classes[len(c.bounds)]
}

// Buckets returns the configured classes and their inclusive upper bounds
// (one fewer bound than classes).
func (c *PromptLengthClass) Buckets() (classes []string, bounds []int) {
	return append([]string(nil), c.classes...), append([]int(nil), c.bounds...)
}

// Interface guards.
var (
	_ shared.ClassifierFactory = (*PromptLengthClass)(nil)
	_ shared.Classifier        = (*PromptLengthClass)(nil)
)
