package supervisor

import "time"

// Restart defaults (RestartPolicy).
const (
	DefaultMaxRestarts   = 5
	DefaultRestartWindow = time.Minute
	DefaultBackoffMin    = 100 * time.Millisecond
	DefaultBackoffMax    = 10 * time.Second
)

// RestartPolicy says how a plugin whose process exited (crashed, was
// killed, or was killed by the host for being frozen) is restarted: after
// an exponential backoff with jitter that starts at BackoffMin and doubles
// up to BackoffMax, and at most MaxRestarts times within Window. One more
// exit within Window marks the plugin failed: its components fail fast
// (their policies decide by fallback) until a reload starts it on a new
// Host. The backoff starts over from BackoffMin once no restart lies within
// Window. It is the HCL block `restart { max_restarts, window,
// backoff_min, backoff_max }`; a zero field takes its default.
type RestartPolicy struct {
	// MaxRestarts is how many restarts Window allows (DefaultMaxRestarts).
	// A negative value means never restart: the first exit marks the
	// plugin failed.
	MaxRestarts int
	// Window is the sliding window MaxRestarts counts in
	// (DefaultRestartWindow).
	Window time.Duration
	// BackoffMin is the delay before the first restart (DefaultBackoffMin).
	BackoffMin time.Duration
	// BackoffMax caps the delay (DefaultBackoffMax).
	BackoffMax time.Duration
}

// backoffJitter is the backoff's randomization factor: each delay is drawn
// from [d*(1-j), d*(1+j)].
const backoffJitter = 0.2

func (r RestartPolicy) withDefaults() RestartPolicy {
	if r.MaxRestarts == 0 {
		r.MaxRestarts = DefaultMaxRestarts
	}
	if r.MaxRestarts < 0 {
		r.MaxRestarts = 0
	}
	if r.Window <= 0 {
		r.Window = DefaultRestartWindow
	}
	if r.BackoffMin <= 0 {
		r.BackoffMin = DefaultBackoffMin
	}
	if r.BackoffMax <= 0 {
		r.BackoffMax = DefaultBackoffMax
	}
	if r.BackoffMax < r.BackoffMin {
		r.BackoffMax = r.BackoffMin
	}
	return r
}

// Health defaults (HealthPolicy).
const (
	DefaultProbeInterval   = time.Second
	DefaultProbeTimeout    = 250 * time.Millisecond
	DefaultProbeFailures   = 1
	DefaultMaxCallTimeouts = 3
)

// HealthPolicy says when a running plugin counts as frozen (stopped,
// deadlocked, a handler that never returns): its process group is then
// killed and the plugin restarted under its RestartPolicy.
type HealthPolicy struct {
	// ProbeInterval is the time between two gRPC health checks on the
	// plugin's connection (DefaultProbeInterval). Negative: no probe.
	ProbeInterval time.Duration
	// ProbeTimeout is each check's own deadline (DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// ProbeFailures is how many consecutive failed checks make the plugin
	// frozen (DefaultProbeFailures).
	ProbeFailures int
	// MaxCallTimeouts is how many consecutive decision calls without an
	// answer within call_timeout make the plugin frozen
	// (DefaultMaxCallTimeouts). Negative: never.
	MaxCallTimeouts int
}

func (h HealthPolicy) withDefaults() HealthPolicy {
	if h.ProbeInterval == 0 {
		h.ProbeInterval = DefaultProbeInterval
	}
	if h.ProbeTimeout <= 0 {
		h.ProbeTimeout = DefaultProbeTimeout
	}
	if h.ProbeFailures <= 0 {
		h.ProbeFailures = DefaultProbeFailures
	}
	if h.MaxCallTimeouts == 0 {
		h.MaxCallTimeouts = DefaultMaxCallTimeouts
	}
	return h
}

// Circuit breaker defaults (BreakerPolicy).
const (
	DefaultBreakerConsecutiveFailures = 5
	DefaultBreakerFailureRatio        = 0.5
	DefaultBreakerMinCalls            = 20
	DefaultBreakerWindow              = 10 * time.Second
	DefaultBreakerOpenTimeout         = time.Second
	DefaultBreakerHalfOpenCalls       = 1
)

// BreakerPolicy configures each plugin's circuit breaker (one per
// process: a restarted plugin starts closed). In the closed state it opens
// after ConsecutiveFailures failed calls in a row, or when at least
// MinCalls calls within Window failed in FailureRatio or more of them.
// While open, calls fail at once without reaching the plugin (their
// policies decide by fallback); after OpenTimeout it lets HalfOpenCalls
// probe calls through: all of them succeeding close it, one failing opens
// it again. Calls the caller cancelled count neither way.
type BreakerPolicy struct {
	// Disabled turns the breaker off.
	Disabled bool
	// ConsecutiveFailures (DefaultBreakerConsecutiveFailures).
	ConsecutiveFailures int
	// FailureRatio (DefaultBreakerFailureRatio) over at least MinCalls
	// (DefaultBreakerMinCalls) calls within Window (DefaultBreakerWindow).
	FailureRatio float64
	MinCalls     int
	Window       time.Duration
	// OpenTimeout is how long it stays open (DefaultBreakerOpenTimeout).
	OpenTimeout time.Duration
	// HalfOpenCalls is how many probe calls it lets through half-open
	// (DefaultBreakerHalfOpenCalls).
	HalfOpenCalls int
}

func (b BreakerPolicy) withDefaults() BreakerPolicy {
	if b.ConsecutiveFailures <= 0 {
		b.ConsecutiveFailures = DefaultBreakerConsecutiveFailures
	}
	if b.FailureRatio <= 0 || b.FailureRatio > 1 {
		b.FailureRatio = DefaultBreakerFailureRatio
	}
	if b.MinCalls <= 0 {
		b.MinCalls = DefaultBreakerMinCalls
	}
	if b.Window <= 0 {
		b.Window = DefaultBreakerWindow
	}
	if b.OpenTimeout <= 0 {
		b.OpenTimeout = DefaultBreakerOpenTimeout
	}
	if b.HalfOpenCalls <= 0 {
		b.HalfOpenCalls = DefaultBreakerHalfOpenCalls
	}
	return b
}
