package config

import (
	"math"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// The canary block's defaults (docs/policy-file.md, "Canary", says why).
const (
	// DefaultCanaryWeight is a canary's share of requests when its block
	// sets no weight: 5%, the usual first step of a canary rollout, small
	// enough that a broken candidate hurts few conversations and large
	// enough that DefaultCanaryMinRequests arrive within seconds at a few
	// requests per second.
	DefaultCanaryWeight = 0.05
	// DefaultCanaryMaxFallbackShare is the fallback share that rolls a
	// candidate back: 5%. A healthy Go plugin falls back on 0.23% of
	// decisions under load and a Python one at a 20 ms call_timeout on
	// 20% (issue 29), so 5% passes the first and stops the second.
	DefaultCanaryMaxFallbackShare = 0.05
	// DefaultCanaryMaxTTFTP90 is the TTFT p90 that rolls a candidate back:
	// 2 s, an interactive bound; set it to the live policy's p90 plus a
	// margin for the deployment's own models, or "0s" to judge fallbacks
	// only.
	DefaultCanaryMaxTTFTP90 = 2 * time.Second
	// DefaultCanaryWindow is the sliding window the thresholds are judged
	// over: 60 s, long enough for DefaultCanaryMinRequests at a 5% share
	// of about 17 requests per second, short enough that a failure
	// starting now dominates it within seconds.
	DefaultCanaryWindow = 60 * time.Second
	// DefaultCanaryMinRequests is how many candidate decisions (first
	// tokens, for TTFT) the window needs before a threshold is judged:
	// 50, so one slow or failed request among the first few does not roll
	// back (at 50 a share above 5% means at least 3 fallbacks).
	DefaultCanaryMinRequests = 50
)

var canarySchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "policy", Required: true},
		{Name: "weight"},
		{Name: "key"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "rollback"}},
}

var canaryRollbackSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "max_fallback_share"},
		{Name: "max_ttft_p90"},
		{Name: "window"},
		{Name: "min_requests"},
	},
}

// canaryDecl is a policy's canary block while the loader resolves it.
type canaryDecl struct {
	blk        *hcl.Block
	policyAttr *hcl.Attribute
	name       string // the candidate as written; "" when in error
	weight     float64
	key        policy.CanaryKey
	rollback   policy.CanaryRollback
	cand       *policyDecl // resolved; nil when in error
}

// DefaultCanaryRollback is the rollback of a canary block without a
// rollback block, and the defaults of the attributes one leaves out.
func DefaultCanaryRollback() policy.CanaryRollback {
	return policy.CanaryRollback{
		MaxFallbackShare: DefaultCanaryMaxFallbackShare,
		MaxTTFTP90:       DefaultCanaryMaxTTFTP90,
		Window:           DefaultCanaryWindow,
		MinRequests:      DefaultCanaryMinRequests,
	}
}

// canaryBlock decodes d's canary block (at most one):
//
//	canary {
//	  policy = "trial"        # required: a declared policy (or "default")
//	  weight = 0.05           # share of keys sent to it, 0 to 1
//	  key    = "session"      # or "request"
//	  rollback {
//	    max_fallback_share = 0.05
//	    max_ttft_p90       = "2s"   # "0s": not judged
//	    window             = "60s"
//	    min_requests       = 50
//	  }
//	}
func (l *loader) canaryBlock(d *policyDecl, blk *hcl.Block) {
	if d.canary != nil {
		l.errorf(blk.DefRange, "Duplicate canary",
			"Policy %q already has a canary block at %s; a policy has at most one canary.", d.name, pos(d.canary.blk.DefRange))
		return
	}
	c := &canaryDecl{blk: blk, weight: DefaultCanaryWeight, key: policy.CanaryKeySession, rollback: DefaultCanaryRollback()}
	d.canary = c
	content, diags := blk.Body.Content(canarySchema)
	l.diags = append(l.diags, diags...)
	if attr, ok := content.Attributes["policy"]; ok {
		c.policyAttr = attr
		if s, ok := l.stringAttr(attr); ok && s == "" {
			l.attrErrorf(attr, "Empty canary policy",
				"The canary of policy %q names no candidate: name the policy to try, or remove the canary block.", d.name)
		} else if ok {
			c.name = s
		}
	}
	if attr, ok := content.Attributes["weight"]; ok {
		if f, ok := l.floatAttr(attr); ok {
			if f < 0 || f > 1 {
				l.attrErrorf(attr, "Invalid canary weight",
					"weight is the share of requests sent to the candidate, between 0 (none) and 1 (all), got %g.", f)
			} else {
				c.weight = f
			}
		}
	}
	if attr, ok := content.Attributes["key"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			switch k := policy.CanaryKey(s); k {
			case policy.CanaryKeySession, policy.CanaryKeyRequest:
				c.key = k
			default:
				l.attrErrorf(attr, "Invalid canary key",
					"key must be %q (a conversation stays on one side) or %q, got %q.", policy.CanaryKeySession, policy.CanaryKeyRequest, s)
			}
		}
	}
	var rb *hcl.Block
	for _, b := range content.Blocks {
		if rb != nil {
			l.errorf(b.DefRange, "Duplicate rollback",
				"The canary of policy %q already has a rollback block at %s.", d.name, pos(rb.DefRange))
			continue
		}
		rb = b
		l.canaryRollback(&c.rollback, b)
	}
}

// canaryRollback decodes a canary's rollback block into r, which holds
// the defaults.
func (l *loader) canaryRollback(r *policy.CanaryRollback, blk *hcl.Block) {
	content, diags := blk.Body.Content(canaryRollbackSchema)
	l.diags = append(l.diags, diags...)
	if attr, ok := content.Attributes["max_fallback_share"]; ok {
		if f, ok := l.floatAttr(attr); ok {
			if f < 0 || f > 1 {
				l.attrErrorf(attr, "Invalid max_fallback_share",
					"max_fallback_share is a share of the candidate's decisions, between 0 and 1 (1: never roll back on fallbacks), got %g.", f)
			} else {
				r.MaxFallbackShare = f
			}
		}
	}
	if attr, ok := content.Attributes["max_ttft_p90"]; ok {
		if v, ok := l.durationAttr(attr); ok {
			if v < 0 {
				l.attrErrorf(attr, "Invalid max_ttft_p90",
					"max_ttft_p90 must be a duration >= 0 such as \"2s\" (\"0s\": never roll back on latency), got %q.", v.String())
			} else {
				r.MaxTTFTP90 = v
			}
		}
	}
	if attr, ok := content.Attributes["window"]; ok {
		if v, ok := l.durationAttr(attr); ok {
			if v < time.Second || v > 24*time.Hour {
				l.attrErrorf(attr, "Invalid window",
					"window must be a duration between 1s and 24h such as \"60s\", got %q.", v.String())
			} else {
				r.Window = v
			}
		}
	}
	if attr, ok := content.Attributes["min_requests"]; ok {
		if n, ok := l.intAttr(attr); ok {
			if n < 1 || n > 1<<30 {
				l.attrErrorf(attr, "Invalid min_requests",
					"min_requests must be between 1 and %d, got %d.", 1<<30, n)
			} else {
				r.MinRequests = int(n)
			}
		}
	}
}

// floatAttr decodes attr as a finite number.
func (l *loader) floatAttr(attr *hcl.Attribute) (float64, bool) {
	v, ok := l.nonNull(attr, cty.Number)
	if !ok {
		return 0, false
	}
	f, err := toFloat(v)
	if err != nil || math.IsNaN(f) {
		l.attrErrorf(attr, "Invalid number", "The value of %q %s.", attr.Name, err)
		return 0, false
	}
	return f, true
}

// resolveCanary links d's canary to its candidate: a declared policy or
// the default policy, not d itself, without a canary of its own
// (canaries do not chain), and neither in d's fallback chain nor d's
// shadow (the candidate's instance would be shared with the live path).
// Resolve every fallback and shadow first.
func (l *loader) resolveCanary(d *policyDecl) {
	c := d.canary
	if c == nil || c.policyAttr == nil || c.name == "" {
		return
	}
	attr, name := c.policyAttr, c.name
	s := l.byName[name]
	if name == DefaultPolicyName && s == nil {
		s = l.def
	}
	prev := l.badSelection
	l.badSelection = true // a candidate in error may have meant any policy
	switch {
	case s == nil && name == DefaultPolicyName:
		l.attrErrorf(attr, "Default policy unavailable",
			"The canary of policy %q is the default policy (%s scorer + %s picker), but the catalog does not register both types; name another candidate.",
			d.name, DefaultScorerType, DefaultPickerType)
		return
	case s == nil:
		l.attrErrorf(attr, "Unknown canary policy",
			"The canary of policy %q is %q, which is not a policy. %s A candidate is a policy; to try a picker type, declare a policy with just that picker.",
			d.name, name, l.policyChoices())
		return
	case s == d:
		l.attrErrorf(attr, "Policy canaries itself",
			"Policy %q names itself as its canary; the candidate is another policy, tried on a share of the requests.", d.name)
		return
	case s.canary != nil:
		l.attrErrorf(attr, "Canary chain",
			"The canary of policy %q is %q, which has a canary of its own (at %s); canaries do not chain: remove one of the two.",
			d.name, s.name, pos(s.canary.blk.DefRange))
		return
	case s == d.shadow:
		l.attrErrorf(attr, "Canary is the shadow",
			"The canary of policy %q is %q, which is also its shadow; the two would share one instance. Remove the shadow, or shadow with another policy.",
			d.name, s.name)
		return
	}
	for f, n := d.fallback, 0; f != nil && n <= len(l.decls); f, n = f.fallback, n+1 {
		if f == s {
			l.attrErrorf(attr, "Canary in the fallback chain",
				"The canary of policy %q is %q, which is also in its fallback chain; the candidate would share the live path's instance, and its fallbacks could not be told from the live policy's. Try another policy.",
				d.name, s.name)
			return
		}
	}
	c.cand = s
	l.badSelection = prev
}

// canaryOf returns the role instance of d's canary, or nil without one.
func canaryOf(d *policyDecl, role shared.Role) *policy.Canary {
	c := d.canary
	if c == nil || c.cand == nil {
		return nil
	}
	p := c.cand.instances[role]
	if p == nil {
		p = c.cand.policy
	}
	if p == nil {
		return nil
	}
	return &policy.Canary{Policy: p, Weight: c.weight, Key: c.key, Rollback: c.rollback}
}
