package replay

import (
	"cmp"
	"errors"
	"slices"
	"strings"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/supervisor"
)

// Cause labels of FallbackSource.Causes besides supervisor.CallError's.
const (
	causeUnavailable = "unavailable"
	causeError       = "error"
)

// sourceKey identifies a FallbackSource.
type sourceKey struct{ plugin, policy string }

// fallbackTally counts a replay's fallbacks by source and cause. It is fed
// only by selections that fell back, so a replay whose policies do not
// fail allocates nothing for it.
type fallbackTally struct {
	sources map[sourceKey]*report.FallbackSource
}

// add counts one selection that fell back: policy is the role's policy,
// whose failure cause made its fallback decide.
func (t *fallbackTally) add(policy string, cause error) {
	k, why := sourceKey{policy: policy}, causeError
	var ce *supervisor.CallError
	var ue *config.UnavailableError
	switch {
	case errors.As(cause, &ce):
		k, why = sourceKey{plugin: ce.Plugin}, ce.Cause
	case errors.As(cause, &ue):
		k, why = sourceKey{plugin: strings.Join(ue.Plugins, ", ")}, causeUnavailable
	}
	s := t.sources[k]
	if s == nil {
		if t.sources == nil {
			t.sources = make(map[sourceKey]*report.FallbackSource)
		}
		s = &report.FallbackSource{Plugin: k.plugin, Policy: k.policy, Causes: make(map[string]int64)}
		if cause != nil {
			s.FirstError = cause.Error()
		}
		t.sources[k] = s
	}
	s.Fallbacks++
	s.Causes[why]++
}

// list returns the sources, most fallbacks first, then plugins before
// policies, each by name; nil when there were none.
func (t *fallbackTally) list() []report.FallbackSource {
	if len(t.sources) == 0 {
		return nil
	}
	out := make([]report.FallbackSource, 0, len(t.sources))
	for _, s := range t.sources {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b report.FallbackSource) int {
		switch {
		case a.Fallbacks != b.Fallbacks:
			return cmp.Compare(b.Fallbacks, a.Fallbacks)
		case (a.Plugin == "") != (b.Plugin == ""):
			if a.Plugin != "" {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Plugin+a.Policy, b.Plugin+b.Policy)
	})
	return out
}
