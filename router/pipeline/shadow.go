package pipeline

import "context"

// shadowKey marks a context as a shadow decision's (WithShadow).
type shadowKey struct{}

// WithShadow returns ctx marked as the context of a shadow decision
// (policy.Policy.Shadow): one whose answer the router never acts on. The
// plugin host reads the mark (IsShadow) so that a shadow's failed calls
// do not count toward the plugin's circuit breaker or its fallbacks: a
// failing shadow must not change how the live policy is served, even when
// both use the same plugin.
func WithShadow(ctx context.Context) context.Context {
	return context.WithValue(ctx, shadowKey{}, true)
}

// IsShadow reports whether ctx is a shadow decision's (WithShadow).
func IsShadow(ctx context.Context) bool {
	v, _ := ctx.Value(shadowKey{}).(bool)
	return v
}
