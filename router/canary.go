package router

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// Canary is the running canary of one role's policy in a bundle
// (policy.Policy.Canary): it sends the requests whose key hashes below
// its weight to the candidate policy and switches itself off (weight 0
// until the bundle is replaced, that is until the policy file is loaded
// again) when the candidate's fallback share or TTFT p90 over its sliding
// window passes a threshold. Every method is lock-free (atomics): the
// choice of a side costs one hash of the key, and a candidate decision a
// few atomic adds and a sum over canaryBuckets buckets.
type Canary struct {
	role      shared.Role
	live      string
	candidate string
	cfg       policy.Canary
	cand      *rolePolicy
	seed      uint64
	weight    uint64 // the configured threshold (of canaryHashBits bits)
	// threshold is the live threshold: keys hashing below it go to the
	// candidate; 0 once rolled back.
	threshold atomic.Uint64
	width     int64 // one bucket of the window, in nanoseconds
	buckets   [canaryBuckets]canaryBucket
	decisions [2]atomic.Int64 // by side: live, candidate (since the bundle loaded)
	fallbacks atomic.Int64    // the candidate's decisions its fallback made
	ttfts     atomic.Int64    // the candidate's first tokens observed
	rollback  atomic.Pointer[CanaryRollback]
}

// canaryBuckets is how many buckets a canary's window is cut into: the
// window slides by a tenth of its length, and holds about 10 KiB.
const canaryBuckets = 10

// canaryHashBits is the bits of a key's hash compared with a canary's
// threshold: the 53 of a float64's mantissa, so weight × 2^53 is exact.
const canaryHashBits = 53

// TTFT bins of a canary bucket's histogram (for the p90 it shows; the
// rollback counts first tokens above the threshold exactly): bin 0 is up
// to 1 ms, bin i up to 1 ms × 1.1^i, and the last (1.1^127 ms ≈ 183 s)
// also holds everything above.
const (
	canaryTTFTBins  = 128
	canaryTTFTRatio = 1.1
	canaryTTFTFirst = time.Millisecond
)

// canaryBucket is one tenth of a canary's window. slot is 1 + the
// bucket's index (time / width) while it counts for that index, 0 when
// never used and -1 while it is being reset for a new index.
type canaryBucket struct {
	slot      atomic.Int64
	decisions atomic.Int64
	fallbacks atomic.Int64
	ttfts     atomic.Int64
	slow      atomic.Int64 // first tokens above Rollback.MaxTTFTP90
	hist      [canaryTTFTBins]atomic.Uint32
}

// CanaryRollback is a canary switching itself off.
type CanaryRollback struct {
	// Role, Policy (the role's live policy) and Candidate name the canary.
	Role      shared.Role `json:"role"`
	Policy    string      `json:"policy"`
	Candidate string      `json:"candidate"`
	// Reason is "fallback_share" or "ttft_p90": the threshold passed.
	Reason string `json:"reason"`
	// At is the Router's clock (Options.Canary.Now) when it rolled back.
	At time.Time `json:"at"`
	// Window are the figures of the window the threshold was judged over.
	Window CanaryWindow `json:"window"`
	// CandidateDecisions is the candidate's decisions since the bundle
	// loaded, this one included.
	CandidateDecisions int64 `json:"candidate_decisions"`
}

// The rollback reasons (CanaryRollback.Reason, the metric's reason label).
const (
	CanaryReasonFallbackShare = "fallback_share"
	CanaryReasonTTFTP90       = "ttft_p90"
)

// CanaryWindow are a canary candidate's figures over its sliding window.
type CanaryWindow struct {
	// Decisions and Fallbacks are the candidate's decisions, and those its
	// fallback made.
	Decisions int64 `json:"decisions"`
	Fallbacks int64 `json:"fallbacks"`
	// FallbackShare is Fallbacks / Decisions (0 without decisions).
	FallbackShare float64 `json:"fallback_share"`
	// TTFTs is the first tokens observed, Slow those above the
	// MaxTTFTP90 threshold.
	TTFTs int64 `json:"ttfts"`
	Slow  int64 `json:"slow"`
	// TTFTP90 is the p90 of the first tokens, from a histogram of 10%
	// wide bins (the upper bound of the bin holding it); 0 without any.
	TTFTP90 time.Duration `json:"ttft_p90_ns"`
}

// CanaryStatus is what Router.Canaries shows of one canary.
type CanaryStatus struct {
	Role      shared.Role `json:"role"`
	Policy    string      `json:"policy"`
	Candidate string      `json:"candidate"`
	// Weight is the configured share; Active is false once rolled back
	// (the candidate gets nothing until the file is loaded again).
	Weight float64          `json:"weight"`
	Active bool             `json:"active"`
	Key    policy.CanaryKey `json:"key"`
	// Live and Candidate are each side's decisions since the bundle
	// loaded; Fallbacks the candidate's fallback decisions, TTFTs its
	// first tokens.
	LiveDecisions      int64 `json:"live_decisions"`
	CandidateDecisions int64 `json:"candidate_decisions"`
	Fallbacks          int64 `json:"candidate_fallbacks"`
	TTFTs              int64 `json:"candidate_ttfts"`
	// Window is the candidate's sliding window now.
	Window CanaryWindow `json:"window"`
	// Rollback is the rollback's thresholds.
	Rollback policy.CanaryRollback `json:"-"`
	// RolledBack is the rollback, nil while active.
	RolledBack *CanaryRollback `json:"rolled_back,omitempty"`
}

// CanaryOptions set how a Router's canaries run.
type CanaryOptions struct {
	// Now is the clock of the canaries' windows: simulated time in replay;
	// nil means time.Now.
	Now func() time.Time
	// OnRollback, when set, hears every rollback, once per canary, inside
	// the call that caused it (Place or CanaryTTFT). It must not block.
	OnRollback func(CanaryRollback)
}

// newCanary resolves p's canary for role, or returns nil without one.
func newCanary(role shared.Role, p *policy.Policy) (*Canary, error) {
	pc := p.Canary
	if pc == nil {
		return nil, nil
	}
	if pc.Policy == nil {
		return nil, errors.New("canary: no candidate policy")
	}
	switch rb := pc.Rollback; {
	case !(pc.Weight >= 0 && pc.Weight <= 1):
		return nil, fmt.Errorf("canary: weight %v, want 0 to 1", pc.Weight)
	case pc.Key != "" && pc.Key != policy.CanaryKeySession && pc.Key != policy.CanaryKeyRequest:
		return nil, fmt.Errorf("canary: key %q, want %q or %q", pc.Key, policy.CanaryKeySession, policy.CanaryKeyRequest)
	case rb.Window < canaryBuckets || !(rb.MaxFallbackShare >= 0 && rb.MaxFallbackShare <= 1) || rb.MaxTTFTP90 < 0 || rb.MinRequests < 1:
		return nil, fmt.Errorf("canary: rollback %+v: want a window of at least %dns, a share 0 to 1, a TTFT >= 0 and min_requests >= 1", rb, canaryBuckets)
	}
	cand, err := resolve(pc.Policy, 1) // no shadow, no canary of its own
	if err != nil {
		return nil, fmt.Errorf("canary %q: %w", pc.Policy.Name, err)
	}
	c := &Canary{role: role, live: p.Name, candidate: pc.Policy.Name, cfg: *pc, cand: cand,
		width: int64(pc.Rollback.Window / canaryBuckets)}
	if c.cfg.Key == "" {
		c.cfg.Key = policy.CanaryKeySession
	}
	// The candidate's name seeds the hash: two canaries split the same
	// sessions independently.
	c.seed = fnvAdd(fnvOffset, pc.Policy.Name)
	c.weight = uint64(pc.Weight * (1 << canaryHashBits))
	c.threshold.Store(c.weight)
	return c, nil
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvAdd(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// hash is key's canaryHashBits-bit hash: FNV-1a 64 seeded with the
// candidate's name, through SplitMix64's finalizer so that keys differing
// in their last byte spread over the whole range.
func (c *Canary) hash(key string) uint64 {
	h := fnvAdd(c.seed^0xff, key)
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h >> (64 - canaryHashBits)
}

// Key is the string req's side is chosen by: its SessionID under
// CanaryKeySession when it has one, else its ID.
func (c *Canary) Key(req *shared.Request) string {
	if c.cfg.Key == policy.CanaryKeySession && req.SessionID != "" {
		return req.SessionID
	}
	return req.ID
}

// Candidate reports whether req goes to the candidate: its key hashes
// below the weight, and the canary has not rolled back. No allocation.
func (c *Canary) Candidate(req *shared.Request) bool {
	thr := c.threshold.Load()
	return thr != 0 && c.hash(c.Key(req)) < thr
}

// bucket returns the bucket counting time index idx, resetting it when it
// counted an older index; nil for an index older than the bucket's (an
// observation delayed past a whole window).
func (c *Canary) bucket(idx int64) *canaryBucket {
	b := &c.buckets[idx%canaryBuckets]
	want := idx + 1
	for {
		s := b.slot.Load()
		switch {
		case s == want:
			return b
		case s > want:
			return nil
		case s == -1:
			continue // another goroutine resets it: a few stores
		}
		if b.slot.CompareAndSwap(s, -1) {
			b.decisions.Store(0)
			b.fallbacks.Store(0)
			b.ttfts.Store(0)
			b.slow.Store(0)
			for i := range b.hist {
				b.hist[i].Store(0)
			}
			b.slot.Store(want)
			return b
		}
	}
}

// index is the bucket index of t.
func (c *Canary) index(t time.Time) int64 { return t.UnixNano() / c.width }

// window sums the buckets of the window ending in bucket idx (the last
// canaryBuckets indexes, idx included); with hist it also estimates the
// TTFT p90.
func (c *Canary) window(idx int64, hist bool) CanaryWindow {
	var w CanaryWindow
	var bins [canaryTTFTBins]int64
	for i := range c.buckets {
		b := &c.buckets[i]
		s := b.slot.Load() - 1
		if s < 0 || s > idx || s <= idx-canaryBuckets {
			continue
		}
		w.Decisions += b.decisions.Load()
		w.Fallbacks += b.fallbacks.Load()
		w.TTFTs += b.ttfts.Load()
		w.Slow += b.slow.Load()
		if hist {
			for k := range bins {
				bins[k] += int64(b.hist[k].Load())
			}
		}
	}
	if w.Decisions > 0 {
		w.FallbackShare = float64(w.Fallbacks) / float64(w.Decisions)
	}
	if hist && w.TTFTs > 0 {
		rank := p90Rank(w.TTFTs)
		var seen int64
		for k, n := range bins {
			if seen += n; seen >= rank {
				w.TTFTP90 = binUpper(k)
				break
			}
		}
	}
	return w
}

// p90Rank is the nearest rank of the 90th percentile of n observations:
// ceil(0.9 n), at least 1.
func p90Rank(n int64) int64 { return max((9*n+9)/10, 1) }

// ttftBin is the histogram bin of d.
func ttftBin(d time.Duration) int {
	if d <= canaryTTFTFirst {
		return 0
	}
	k := int(math.Ceil(math.Log(float64(d)/float64(canaryTTFTFirst)) / math.Log(canaryTTFTRatio)))
	return min(max(k, 0), canaryTTFTBins-1)
}

// binUpper is bin k's upper bound.
func binUpper(k int) time.Duration {
	return time.Duration(float64(canaryTTFTFirst) * math.Pow(canaryTTFTRatio, float64(k)))
}

// judge returns the reason the window w passes a threshold, or "".
func (c *Canary) judge(w CanaryWindow) string {
	rb := &c.cfg.Rollback
	least := int64(rb.MinRequests)
	if w.Decisions >= least && float64(w.Fallbacks) > rb.MaxFallbackShare*float64(w.Decisions) {
		return CanaryReasonFallbackShare
	}
	// The p90 (nearest rank) is above the threshold exactly when more
	// than n - ceil(0.9 n) first tokens are.
	if rb.MaxTTFTP90 > 0 && w.TTFTs >= least && w.Slow > w.TTFTs-p90Rank(w.TTFTs) {
		return CanaryReasonTTFTP90
	}
	return ""
}

// Status is the canary's state at now.
func (c *Canary) Status(now time.Time) CanaryStatus {
	return CanaryStatus{
		Role: c.role, Policy: c.live, Candidate: c.candidate,
		Weight: c.cfg.Weight, Active: c.rollback.Load() == nil,
		Key:                c.cfg.Key,
		LiveDecisions:      c.decisions[0].Load(),
		CandidateDecisions: c.decisions[1].Load(),
		Fallbacks:          c.fallbacks.Load(),
		TTFTs:              c.ttfts.Load(),
		Window:             c.window(c.index(now), true),
		Rollback:           c.cfg.Rollback,
		RolledBack:         c.rollback.Load(),
	}
}

// canaryNow is the canaries' clock (CanaryOptions.Now).
func (r *Router) canaryNow() time.Time {
	if r.canaryOpts.Now != nil {
		return r.canaryOpts.Now()
	}
	return time.Now()
}

// canaryDecided records a decision of c's side (candidate) and judges the
// candidate's window.
func (r *Router) canaryDecided(c *Canary, candidate, fallback bool) {
	if !candidate {
		c.decisions[0].Add(1)
		return
	}
	c.decisions[1].Add(1)
	if fallback {
		c.fallbacks.Add(1)
	}
	if c.rollback.Load() != nil {
		return
	}
	idx := c.index(r.canaryNow())
	if b := c.bucket(idx); b != nil {
		b.decisions.Add(1)
		if fallback {
			b.fallbacks.Add(1)
		}
	}
	r.canaryJudge(c, idx)
}

// CanaryTTFT records the time to first token of a request placed by d,
// from the request's start to its answer's first byte: a candidate
// decision's counts toward its canary's TTFT p90 (Canary.Status), and may
// roll it back. Does nothing for a decision without a canary, on the live
// side, or of a canary rolled back. Lock-free; safe for concurrent use.
func (r *Router) CanaryTTFT(d Decision, ttft time.Duration) {
	c := d.Canary
	if c == nil || !d.Candidate {
		return
	}
	c.ttfts.Add(1)
	if c.rollback.Load() != nil {
		return
	}
	idx := c.index(r.canaryNow())
	if b := c.bucket(idx); b != nil {
		b.ttfts.Add(1)
		if mx := c.cfg.Rollback.MaxTTFTP90; mx > 0 && ttft > mx {
			b.slow.Add(1)
		}
		b.hist[ttftBin(ttft)].Add(1)
	}
	r.canaryJudge(c, idx)
}

// canaryJudge rolls c back when its window ending at idx passes a
// threshold; only the first rollback of c counts.
func (r *Router) canaryJudge(c *Canary, idx int64) {
	w := c.window(idx, false)
	reason := c.judge(w)
	if reason == "" {
		return
	}
	w = c.window(idx, true)
	rb := &CanaryRollback{Role: c.role, Policy: c.live, Candidate: c.candidate, Reason: reason,
		At: r.canaryNow(), Window: w, CandidateDecisions: c.decisions[1].Load()}
	if !c.rollback.CompareAndSwap(nil, rb) {
		return
	}
	c.threshold.Store(0)
	if m := r.canaryMetrics; m != nil {
		m.rollbacks.WithLabelValues(string(c.role), c.live, c.candidate, reason).Inc()
	}
	if f := r.canaryOpts.OnRollback; f != nil {
		f(*rb)
	}
}

// Canaries returns the state of the current bundle's canaries, in role
// order (aggregated, prefill, decode); nil without any, or once the
// Router is closed.
func (r *Router) Canaries() []CanaryStatus {
	b := r.cur.Load()
	if b == nil {
		return nil
	}
	var out []CanaryStatus
	now := r.canaryNow()
	for _, role := range bundleRoles {
		if rp := b.roles[role]; rp != nil && rp.canary != nil {
			out = append(out, rp.canary.Status(now))
		}
	}
	return out
}

// canaryMetrics are a Router's canary metrics.
type canaryMetrics struct {
	rollbacks *prometheus.CounterVec
}

// canaryCollector exports the current bundle's canaries as
// switchyard_canary_state and switchyard_canary_decisions_total.
type canaryCollector struct {
	r                *Router
	state, decisions *prometheus.Desc
}

func (cc *canaryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cc.state
	ch <- cc.decisions
}

func (cc *canaryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range cc.r.Canaries() {
		state := 0.0
		if s.Active {
			state = 1
		}
		role := string(s.Role)
		ch <- prometheus.MustNewConstMetric(cc.state, prometheus.GaugeValue, state, role, s.Policy, s.Candidate)
		ch <- prometheus.MustNewConstMetric(cc.decisions, prometheus.CounterValue, float64(s.LiveDecisions), role, s.Policy, s.Candidate, "live")
		ch <- prometheus.MustNewConstMetric(cc.decisions, prometheus.CounterValue, float64(s.CandidateDecisions), role, s.Policy, s.Candidate, "candidate")
		ch <- prometheus.MustNewConstMetric(cc.decisions, prometheus.CounterValue, float64(s.Fallbacks), role, s.Policy, s.Candidate, "candidate_fallback")
	}
}

// registerCanary registers switchyard_canary_rollbacks_total{role,policy,
// candidate,reason} and the collector of switchyard_canary_state{role,
// policy,candidate} (1 active, 0 rolled back) and
// switchyard_canary_decisions_total{role,policy,candidate,side} (side
// live, candidate or candidate_fallback; since the current bundle
// loaded), or takes the counter a previous Router registered on reg.
func registerCanary(reg prometheus.Registerer, r *Router) (*canaryMetrics, error) {
	m := &canaryMetrics{rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_canary_rollbacks_total",
		Help: "Canary rollbacks by role, live policy, candidate and reason: fallback_share or ttft_p90 (the candidate passed the threshold over its window).",
	}, []string{"role", "policy", "candidate", "reason"})}
	if err := reg.Register(m.rollbacks); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.rollbacks, _ = are.ExistingCollector.(*prometheus.CounterVec); m.rollbacks == nil {
			return nil, err
		}
	}
	cc := &canaryCollector{r: r,
		state: prometheus.NewDesc("switchyard_canary_state",
			"1 while a policy's canary sends its share of requests to the candidate, 0 once it rolled back (until the policy file is loaded again).",
			[]string{"role", "policy", "candidate"}, nil),
		decisions: prometheus.NewDesc("switchyard_canary_decisions_total",
			"Decisions of a canaried role since its policy file loaded, by side: live, candidate, and candidate_fallback (the candidate failed and its fallback decided).",
			[]string{"role", "policy", "candidate", "side"}, nil),
	}
	if err := reg.Register(cc); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		// A previous Router's collector: it keeps reading that Router.
		// Serve builds one Router per process, so this is a test's case.
	}
	return m, nil
}
