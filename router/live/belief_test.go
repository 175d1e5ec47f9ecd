package live

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// countBelief compares the belief, capped where the engine recomputes a
// fully cached prompt's last block, with the engine's cached tokens.
func TestCountBelief(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)}) // block size 16
	cached := func(prompt, cached int64) usage {
		return usage{prompt: prompt, cached: cached, ok: true, hasCached: true}
	}
	for _, c := range []struct {
		name    string
		b       prefix.Belief
		u       usage
		precise string // "" when not counted
		approx  string
	}{
		{"both exact", prefix.Belief{Taken: true, Precise: true, PreciseTokens: 64, EngineBlockSize: 16, ApproxTokens: 64}, cached(100, 64), "exact", "exact"},
		// A fully cached 64-token prompt: the engine recomputes its last
		// block, serving 48.
		{"whole prompt", prefix.Belief{Taken: true, Precise: true, PreciseTokens: 64, EngineBlockSize: 16, ApproxTokens: 64}, cached(64, 48), "exact", "exact"},
		{"precise over, approx under", prefix.Belief{Taken: true, Precise: true, PreciseTokens: 32, EngineBlockSize: 16, ApproxTokens: 0}, cached(100, 16), "over", "under"},
		{"cold: approximate only", prefix.Belief{Taken: true, ApproxTokens: 32}, cached(100, 32), "", "exact"},
		{"no cached_tokens", prefix.Belief{Taken: true, ApproxTokens: 32}, usage{prompt: 100, ok: true}, "", ""},
		{"no belief (characters)", prefix.Belief{}, cached(100, 32), "", ""},
	} {
		e.rt.met.belief.Reset()
		e.rt.countBelief("", 0, router.Decision{Belief: c.b, Worker: &fleet.Worker{}}, c.u)
		for mode, want := range map[string]string{"precise": c.precise, "approximate": c.approx} {
			for _, r := range []string{"exact", "over", "under"} {
				wantN := 0.0
				if r == want {
					wantN = 1
				}
				if got := testutil.ToFloat64(e.rt.met.belief.WithLabelValues(mode, r)); got != wantN {
					t.Errorf("%s: %s %s = %v, want %v", c.name, mode, r, got, wantN)
				}
			}
		}
	}
}
