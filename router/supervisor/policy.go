package supervisor

import "time"

// Restart defaults (RestartPolicy).
const (
	DefaultMaxRestarts   = 5
	DefaultRestartWindow = time.Minute
	DefaultBackoffMin    = 100 * time.Millisecond
	DefaultBackoffMax    = 10 * time.Second
	// CrashLoopBackoffMax caps the delay between two attempts to start a
	// crash-looping plugin (StatusBackoff), unless BackoffMax is larger:
	// 5 minutes, Kubernetes' cap for a container in CrashLoopBackOff. A
	// plugin broken for good then costs one start attempt every 5
	// minutes, and one that got well again (a dependency came back, the
	// machine is no longer starved) serves again within 5 minutes without
	// a reload.
	CrashLoopBackoffMax = 5 * time.Minute
)

// RestartPolicy says how a plugin whose process exited (crashed, was
// killed, or was killed by the host for being frozen) is restarted: after
// an exponential backoff with jitter that starts at BackoffMin and doubles
// up to BackoffMax (StatusRestarting), MaxRestarts times within Window.
// Past that the plugin is crash-looping (StatusBackoff): its components
// fail fast and its policies decide by fallback, while the host keeps
// trying to start it, the delay doubling on past BackoffMax up to
// CrashLoopBackoffMax (the way Kubernetes treats a crash loop). A start
// that succeeds makes it serve again (StatusUp); once a process has then
// stayed up for Window, its next exit counts as a first restart again,
// with the backoff back at BackoffMin. Outside a crash loop the backoff
// also starts over from BackoffMin once no restart lies within Window. It
// is the HCL block `restart { max_restarts, window, backoff_min,
// backoff_max }`; a zero field takes its default.
type RestartPolicy struct {
	// MaxRestarts is how many restarts Window allows before the plugin
	// counts as crash-looping (DefaultMaxRestarts). A negative value means
	// never restart: the first exit marks the plugin failed (StatusFailed)
	// until a reload.
	MaxRestarts int
	// Window is the sliding window MaxRestarts counts in, and how long a
	// process started during a crash loop must stay up to end it
	// (DefaultRestartWindow).
	Window time.Duration
	// BackoffMin is the delay before the first restart (DefaultBackoffMin).
	BackoffMin time.Duration
	// BackoffMax caps the delay while the plugin is not crash-looping
	// (DefaultBackoffMax).
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

// Health defaults (HealthPolicy). The host kills a plugin's process group
// only after DefaultProbeFailures gRPC health checks in a row got no
// SERVING answer within DefaultProbeTimeout each: a plugin stopped by
// SIGSTOP, or wedged as a whole, is killed about 5 x 2 s = 10 s after the
// first check that found it so (at its first missed call deadline under
// traffic, within DefaultProbeInterval when idle). A healthy plugin on a
// starved machine is killed only if it gets no health answer through in
// 2 s five times in a row. Measured on a 2-core machine
// (BenchmarkHealthCheck, BENCHMARKS.md): a check takes 0.3 ms (p50) and at
// most 0.2 s with stress-ng --cpu 4 running; with four goroutines spinning
// in the host process as well (the CPU denial of service of issue 10) it
// takes 140 ms (p50), 1.1 s (p99), 2.3 s at worst. So one slow check
// happens, five in a row do not. Being wrong on the slow side is cheap: a
// frozen plugin's calls already fail fast (call_timeout, then its open
// circuit breaker) and its policies decide by fallback; a wrong kill under
// load adds a restart to the load and can end in a crash loop.
//
// DefaultStallTimeout is the same trade for a plugin whose process answers
// its health checks while its decision handlers never return (a deadlock in
// plugin code): it is killed once decision calls have gone unanswered for
// 30 s with nothing at all coming back on its Decide stream meanwhile, late
// answers included. A healthy plugin on a starved machine answers late,
// within seconds (the 2.3 s worst case above is a whole round trip through
// the starved host), and every answer, however late, ends a stall; 30 s of
// total silence is more than ten times that worst case. Killing the stuck
// plugin sooner would buy little, since its calls fail fast and its
// policies decide by fallback meanwhile, and the restart brings back a
// plugin whose deadlock would otherwise last until a reload.
const (
	// DefaultProbeInterval: a health check every 2 s while the plugin
	// answers.
	DefaultProbeInterval = 2 * time.Second
	// DefaultProbeTimeout: each check's own deadline.
	DefaultProbeTimeout = 2 * time.Second
	// DefaultProbeFailures: consecutive failed checks before a kill.
	DefaultProbeFailures = 5
	// DefaultStallTimeout: how long decision calls may get no answer at
	// all before the plugin counts as stuck (HealthPolicy.StallTimeout).
	DefaultStallTimeout = 30 * time.Second
)

// HealthPolicy says when a running plugin counts as frozen or stuck: its
// process group is then killed and the plugin restarted under its
// RestartPolicy. Two rules kill, and nothing else does:
//
//   - The health probe: ProbeFailures gRPC health checks in a row without
//     a SERVING answer within ProbeTimeout each (stopped by a signal,
//     wedged as a whole).
//   - The stall rule: decision calls got no answer for StallTimeout and
//     nothing at all came back on the plugin's Decide stream since (a
//     handler that never returns while the process still answers its
//     health checks).
//
// A decision call that misses call_timeout falls back and makes the probe
// check at once (unless a check succeeded within the last ProbeInterval),
// but never kills the plugin by itself, since on a starved machine a
// healthy plugin misses a 20 ms deadline routinely. Such a call is where
// the stall rule is evaluated: the host remembers the send time of the
// earliest call that timed out and has had no answer on the stream since,
// and kills the plugin at a timeout that finds that time StallTimeout past
// with the stream still silent. Any answer, to any call, even one whose caller gave
// up long ago (pluginclient.Client.LastAnswer), starts the count over: a
// plugin that answers late is slow, not stuck. While the circuit breaker
// is open its half-open trial calls (one per OpenTimeout) keep the rule
// evaluated; a plugin that gets no decision calls at all is never found
// stuck, and need not be. A plugin with one stuck component whose other
// components keep answering is not stuck by this rule either: its calls to
// the stuck one time out and fall back. Classify calls (a request
// classifier's, unary gRPC) are not covered: one that never returns only
// times out.
type HealthPolicy struct {
	// ProbeInterval is the time between two gRPC health checks on the
	// plugin's connection (DefaultProbeInterval). Negative: no probe, and
	// no early check after a missed deadline either.
	ProbeInterval time.Duration
	// ProbeTimeout is each check's own deadline (DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// ProbeFailures is how many consecutive failed checks make the plugin
	// frozen (DefaultProbeFailures).
	ProbeFailures int
	// StallTimeout is how long decision calls may get no answer, with
	// nothing at all received from the plugin's Decide stream meanwhile,
	// before the plugin counts as stuck (DefaultStallTimeout). Negative:
	// never.
	StallTimeout time.Duration
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
	if h.StallTimeout == 0 {
		h.StallTimeout = DefaultStallTimeout
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
