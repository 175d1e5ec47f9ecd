package builtin

import (
	"context"
	"fmt"
	"math"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeCacheAware is the type name of the CacheAware picker.
const TypeCacheAware = "cache-aware"

// Parameter names and values of the cache-aware picker (balance_abs and
// balance_rel are shared with kv-affinity: ParamBalanceAbs, ParamBalanceRel).
const (
	ParamCacheThreshold = "cache_threshold"
	ParamImbalanced     = "imbalanced"
	ParamMatchTies      = "match_ties"
	ParamStddevFactor   = "stddev_factor"
	ParamTies           = "ties"

	// ImbalancedLeastLoaded: an imbalanced fleet sends the request to the
	// least-loaded worker (SGLang).
	ImbalancedLeastLoaded = "least-loaded"
	// ImbalancedMatchLeastLoaded: an imbalanced fleet restricts the prefix
	// match to the workers with the fewest requests (AIBrix).
	ImbalancedMatchLeastLoaded = "match-least-loaded"
	// MatchTiesAny: workers with the same best match are tied.
	MatchTiesAny = "any"
	// MatchTiesLeastLoaded: among the same best match, fewer requests win.
	MatchTiesLeastLoaded = "least-loaded"
	// TiesRandom breaks the remaining ties uniformly at random.
	TiesRandom = "random"
	// TiesFirst takes the first tied row (ascending worker id).
	TiesFirst = "first"

	defaultCacheThreshold = 0.3
	defaultCABalanceAbs   = 64.0
	defaultCABalanceRel   = 1.5
)

// CacheAware is the rule-based cache-aware picker of SGLang's model gateway
// and AIBrix's prefix-cache router: it goes to the worker holding the
// longest prefix of the request unless the fleet is imbalanced or the
// match is too short, and then to the worker with the fewest in-flight
// requests. Load is the router's in-flight request count per worker
// (ACTIVE_REQUESTS), which is what both count (SGLang's worker load,
// AIBrix's realtime running requests tracked by the gateway); the match is
// matchRatio: the fraction of the prompt the worker holds (CACHE).
//
//  1. Imbalance: with lo, hi the smallest and largest counts, the fleet is
//     imbalanced when hi - lo > balance_abs and (balance_rel is 0 or
//     hi > balance_rel * lo). Then imbalanced = "least-loaded" returns a
//     row with count lo (SGLang); "match-least-loaded" restricts steps 2
//     and 3 to the rows with count lo (AIBrix).
//  2. Match: among the (remaining) rows with match > cache_threshold and,
//     when stddev_factor is set, count <= mean + stddev_factor * stddev
//     (sample standard deviation of all rows' counts, 0 for one row:
//     AIBrix's guard), the highest match wins; among equal matches, with
//     match_ties = "least-loaded" the fewest requests (AIBrix), with
//     "any" none (SGLang's tree returns one of the tenants at the match).
//  3. Otherwise a row with the fewest requests among all rows.
//
// Remaining ties go to the first row (ties = "first": SGLang's
// min_by_key, in its worker list's order) or a uniform one ("random":
// AIBrix's rand.Intn and shuffle).
//
// Sources: sgl-project/sglang sgl-model-gateway/src/policies/cache_aware.rs
// @ b93974f140de1e545d9134d87e77f0bd1fbf3014 (CacheAwarePolicy::
// select_worker), whose defaults (cache_threshold 0.3, balance_abs 64,
// balance_rel 1.5) are the gateway's command-line defaults
// (sgl-model-gateway/src/main.rs @ 01f6c92a0ae883504466f0be6235eb8e70651c46,
// CliArgs); vllm-project/aibrix pkg/plugins/gateway/algorithms/prefix_cache.go
// @ e3e10f9e4aebe9aac5e7d992fb87d2648e01628b (routeOriginal,
// getTargetPodListOnLoadImbalance, getTargetPodFromMatchedPods) and
// least_request.go (selectTargetPodWithLeastRequestCount), util.go
// (standardDeviation, divided by n - 1) at the same commit.
//
// Pick makes two passes over the rows (three with the guard) and
// allocates nothing.
type CacheAware struct {
	threshold    float64
	balanceAbs   float64
	balanceRel   float64
	restrict     bool // imbalanced = "match-least-loaded"
	tieLoad      bool // match_ties = "least-loaded"
	guard        bool // stddev_factor set
	stddevFactor float64
	firstTie     bool // ties = "first"
	rng          *rng
}

// CacheAwareType describes the cache-aware picker.
func CacheAwareType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeCacheAware,
		Kind:   shared.KindPicker,
		Inputs: shared.InputActiveRequests | shared.InputCache,
		Params: []shared.ParamSpec{
			{Name: ParamCacheThreshold, Type: shared.Number, Default: defaultCacheThreshold,
				Doc: "The best match must exceed this fraction of the prompt to win; below it the " +
					"least-loaded worker is taken. In [0, 1); default 0.3 (SGLang's --cache-threshold); " +
					"0 lets any held block win (AIBrix)."},
			{Name: ParamBalanceAbs, Type: shared.Number, Default: defaultCABalanceAbs,
				Doc: "Imbalance: the largest and smallest in-flight request counts must differ by " +
					"more than this. Finite, >= 0; default 64 (SGLang's --balance-abs-threshold)."},
			{Name: ParamBalanceRel, Type: shared.Number, Default: defaultCABalanceRel,
				Doc: "Imbalance: and the largest must exceed this times the smallest; 0 skips this " +
					"test. 0 or >= 1, finite; default 1.5 (SGLang's --balance-rel-threshold)."},
			{Name: ParamImbalanced, Type: shared.String, Default: ImbalancedLeastLoaded,
				Doc: `What an imbalanced fleet does: "least-loaded" takes a worker with the fewest ` +
					`requests (SGLang, the default); "match-least-loaded" matches the prefix among ` +
					`those workers only (AIBrix).`},
			{Name: ParamMatchTies, Type: shared.String, Default: MatchTiesAny,
				Doc: `Among workers with the same best match: "any" (default, SGLang) or ` +
					`"least-loaded": the fewest requests (AIBrix).`},
			{Name: ParamStddevFactor, Type: shared.Number,
				Doc: "When set, a matched worker must have at most mean + stddev_factor * stddev " +
					"in-flight requests (over all candidates, sample standard deviation) to win " +
					"(AIBrix's guard, factor 1). Finite, >= 0; unset: no guard."},
			{Name: ParamTies, Type: shared.String, Default: TiesRandom,
				Doc: `Remaining ties: "random" (default, uniform; AIBrix) or "first" (the lowest ` +
					`worker id; SGLang takes the first in its worker list).`},
			seedSpec(),
		},
		Doc: "SGLang's and AIBrix's cache-aware rule: the longest held prefix wins when it exceeds " +
			"cache_threshold and the fleet's in-flight counts are balanced; otherwise the fewest " +
			"in-flight requests.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewCacheAware(p) },
	}
}

// NewCacheAware returns a cache-aware picker from p (absent parameters
// take their defaults). A cache_threshold outside [0, 1), a negative or
// non-finite balance_abs or stddev_factor, a balance_rel strictly between
// 0 and 1 (or negative, non-finite), or an unknown imbalanced, match_ties
// or ties value fails with a *shared.ParamError naming it.
func NewCacheAware(p shared.Params) (*CacheAware, error) {
	c := &CacheAware{
		threshold:    p.Float(ParamCacheThreshold, defaultCacheThreshold),
		balanceAbs:   p.Float(ParamBalanceAbs, defaultCABalanceAbs),
		balanceRel:   p.Float(ParamBalanceRel, defaultCABalanceRel),
		guard:        p.Has(ParamStddevFactor),
		stddevFactor: p.Float(ParamStddevFactor, 0),
		rng:          newRNG(p),
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{ParamCacheThreshold, c.threshold}, {ParamBalanceAbs, c.balanceAbs}, {ParamBalanceRel, c.balanceRel}, {ParamStddevFactor, c.stddevFactor}} {
		if err := shared.NonNegative(v.name, v.v); err != nil {
			return nil, err
		}
	}
	if c.threshold >= 1 {
		return nil, &shared.ParamError{Param: ParamCacheThreshold, Err: fmt.Errorf("must be in [0, 1), got %g", c.threshold)}
	}
	if c.balanceRel > 0 && c.balanceRel < 1 {
		return nil, &shared.ParamError{Param: ParamBalanceRel, Err: fmt.Errorf("must be 0 (off) or >= 1, got %g", c.balanceRel)}
	}
	var err error
	if c.restrict, err = choice(p, ParamImbalanced, ImbalancedLeastLoaded, ImbalancedMatchLeastLoaded); err != nil {
		return nil, err
	}
	if c.tieLoad, err = choice(p, ParamMatchTies, MatchTiesAny, MatchTiesLeastLoaded); err != nil {
		return nil, err
	}
	if c.firstTie, err = choice(p, ParamTies, TiesRandom, TiesFirst); err != nil {
		return nil, err
	}
	return c, nil
}

// choice reads a two-valued string parameter: false for def (also when
// absent), true for alt, a *shared.ParamError otherwise.
func choice(p shared.Params, name, def, alt string) (bool, error) {
	switch v := p.String(name, def); v {
	case def:
		return false, nil
	case alt:
		return true, nil
	default:
		return false, &shared.ParamError{Param: name, Err: fmt.Errorf("must be %q or %q, got %q", def, alt, v)}
	}
}

// Inputs returns ACTIVE_REQUESTS|CACHE.
func (*CacheAware) Inputs() shared.Inputs { return shared.InputActiveRequests | shared.InputCache }

// Pick returns a row of c chosen by the rule the type describes. It fails
// with shared.ErrNoWorkers when c is empty and with ErrMissingColumn when
// the ActiveRequests or OverlapBlocks column is missing. A request with
// BlockSize <= 0 or no prompt tokens matches nothing.
func (a *CacheAware) Pick(_ context.Context, req *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	if len(c.ActiveRequests) != n || len(c.OverlapBlocks) != n {
		return -1, fmt.Errorf("%s: %w: need ACTIVE_REQUESTS and CACHE columns of %d rows", TypeCacheAware, ErrMissingColumn, n)
	}
	counts, overlap := c.ActiveRequests[:n], c.OverlapBlocks[:n]
	lo, hi, sum := counts[0], counts[0], 0.0
	for _, k := range counts {
		lo, hi = min(lo, k), max(hi, k)
		sum += float64(k)
	}
	imbalanced := float64(hi-lo) > a.balanceAbs && (a.balanceRel == 0 || float64(hi) > a.balanceRel*float64(lo))
	if imbalanced && !a.restrict {
		return a.leastLoaded(counts, lo), nil
	}
	bound := math.Inf(1)
	if a.guard {
		mean, ss := sum/float64(n), 0.0
		for _, k := range counts {
			d := float64(k) - mean
			ss += d * d
		}
		sd := 0.0
		if n > 1 {
			sd = math.Sqrt(ss / float64(n-1))
		}
		bound = mean + a.stddevFactor*sd
	}
	g := a.rng.stream()
	best, bestRatio, bestCount, ties := -1, 0.0, int64(0), 0
	for i, k := range counts {
		if imbalanced && k != lo { // restricted to the least-loaded rows
			continue
		}
		r := matchRatio(req, overlap[i])
		if r <= a.threshold || float64(k) > bound {
			continue
		}
		switch {
		case best < 0 || r > bestRatio || (r == bestRatio && a.tieLoad && k < bestCount):
			best, bestRatio, bestCount, ties = i, r, k, 1
		case r == bestRatio && (!a.tieLoad || k == bestCount):
			ties++
			if !a.firstTie && g.intn(ties) == 0 {
				best, bestCount = i, k
			}
		}
	}
	if best >= 0 {
		return best, nil
	}
	return a.leastLoaded(counts, lo), nil
}

// leastLoaded returns a row whose count is lo: the first, or a uniform one
// (reservoir sampling).
func (a *CacheAware) leastLoaded(counts []int64, lo int64) int {
	g := a.rng.stream()
	best, ties := -1, 0
	for i, k := range counts {
		if k != lo {
			continue
		}
		if a.firstTie {
			return i
		}
		ties++
		if g.intn(ties) == 0 {
			best = i
		}
	}
	return best
}

// Interface guard.
var _ shared.Picker = (*CacheAware)(nil)
