package router

import "context"

// FallsBack reports whether the router answers a decision whose policy
// failed with err (pipeline.Execute's error) by the policy's fallback, as
// Route does: for a component's failure (a plugin's error, timeout,
// invalid answer), not for the policy's own answer (every candidate
// filtered out, none free, none left) nor when ctx, the caller's, is
// done. False for a nil err. `router plugins check` (router/plugincheck)
// says with it what routing would do with a plugin's answer.
func FallsBack(ctx context.Context, err error) bool {
	return err != nil && fallbackAllowed(ctx, err)
}
