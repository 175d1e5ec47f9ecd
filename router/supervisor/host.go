package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// DefaultShutdownGrace is how long Shutdown lets in-flight calls finish.
const DefaultShutdownGrace = 2 * time.Second

// ReplayCallTimeout is the call deadline a simulated-time replay gives
// every plugin (Options.CallTimeout) in place of call_timeout: a decision's
// outcome must not depend on the machine's speed, so only a plugin that
// holds one call this long (a wedged one) makes its policy fall back.
const ReplayCallTimeout = time.Minute

// Options configure a Host.
type Options struct {
	// Logger receives the host's logs and, under a sub-logger named after
	// each plugin, the plugins' stderr. Default: hclog's default logger.
	Logger hclog.Logger
	// ShutdownGrace bounds how long Shutdown waits for in-flight calls
	// before it kills the plugins (DefaultShutdownGrace).
	ShutdownGrace time.Duration
	// Restart is every plugin's restart policy, unless SetRestartPolicy
	// gives one its own; zero fields take their defaults.
	Restart RestartPolicy
	// Health says when a plugin counts as frozen; zero fields take their
	// defaults.
	Health HealthPolicy
	// Breaker configures each plugin's circuit breaker; zero fields take
	// their defaults.
	Breaker BreakerPolicy
	// Metrics receives the plugin metrics (NewMetrics). nil: Registerer
	// decides.
	Metrics *Metrics
	// CallTimeout, when positive, replaces every plugin block's
	// call_timeout. A replay sets it (ReplayCallTimeout): in simulated time
	// how long a call takes changes nothing, so a call must not fall back
	// because the machine was busy.
	CallTimeout time.Duration
	// Registerer, when Metrics is nil, is the registry the metrics go to,
	// through NewMetrics: Hosts given the same Registerer (the old and new
	// bundles of a reload) share one Metrics. nil: no metrics.
	Registerer prometheus.Registerer
	// FailureLog rate-limits the warning each failed call logs; the zero
	// value means DefaultFailureLog.
	FailureLog FailureLogPolicy
	// StopGrace is how long stopping a plugin process waits, once it has
	// been asked to shut down (plugin.GRPCController/Shutdown), for it to
	// exit on its own before its process group is killed. Zero: 500 ms.
	// go-plugin kills it after 2 s whatever this says.
	StopGrace time.Duration
	// Stopped, when set, is told how every plugin process the host stops
	// (at Shutdown, a restart, a failed start) went; it runs on the
	// stopping goroutine, once the process group is gone.
	Stopped func(StopReport)
	// Stdout, when set, receives what plugins write to stdout after the
	// handshake, as far as go-plugin's stdio service
	// (plugin.GRPCStdio/StreamStdio) relays it: a Go plugin's os.Stdout.
	// What a plugin writes to its raw stdout pipe after the handshake
	// (file descriptor 1: a child's output, a library's, a plugin not
	// built on the SDK) is read and discarded by the host, with a warning
	// at most every 10 s, so that the plugin never blocks writing it
	// (cmdRunner). Default: dropped too.
	Stdout io.Writer
}

// StopReport says how a plugin process stopped.
type StopReport struct {
	// Plugin is the plugin block's name; PID its process (group) id.
	Plugin string
	PID    int
	// WasRunning: the process had not exited when the stop began.
	WasRunning bool
	// Exited: it exited on its own within StopGrace of being asked to
	// shut down (after its client was closed); otherwise its process
	// group was killed.
	Exited bool
	// After is how long after the stop began it exited, or StopGrace when
	// it did not exit on its own.
	After time.Duration
	// Status is how the process ended, as os.ProcessState prints it
	// ("exit status 3", "signal: killed"); "" when it is not known.
	Status string
	// KillReason says why the host killed the process before the stop
	// (frozen, stuck, its event stream broke); "" when it did not.
	KillReason string
}

// FailureLogPolicy rate-limits the warning a failed plugin call logs (the
// call's error, its cause and how many calls of the plugin failed for that
// cause so far), separately for each plugin and cause (CallError.Cause):
// the first failure is always logged, then every Every-th one, and one
// whenever Interval has passed since the last line (golang.org/x/time/rate's
// Sometimes: a union of the rules; a zero field turns its rule off).
// Calls the caller cancelled are not logged.
type FailureLogPolicy struct {
	// Every logs the 1st, (Every+1)-th, (2·Every+1)-th... failure.
	Every int
	// Interval logs a failure when Interval has passed since the last
	// line. It reads the wall clock, so a replay, whose logs should
	// repeat, uses Every instead.
	Interval time.Duration
}

// DefaultFailureLog logs, per plugin and cause, the first failure and then
// at most one line every 10 seconds: a plugin failing every call of a busy
// router writes a few lines a minute, not one per request, and a failure
// that persists still shows at least every 10 s.
var DefaultFailureLog = FailureLogPolicy{Interval: 10 * time.Second}

// Stats are one plugin's decision-call counters.
type Stats struct {
	// Calls is every decision call (a fused Run, or a component called
	// alone), including those refused because the plugin was gone.
	Calls int64
	// Errors is the failed calls that did not time out.
	Errors int64
	// Timeouts is the calls that got no answer within call_timeout.
	Timeouts int64
	// Fallbacks is every failed call (Errors + Timeouts): each makes its
	// policy fall back.
	Fallbacks int64
	// Restarts is how many times the plugin's process was restarted
	// (attempts, successful or not).
	Restarts int64
	// EventsDropped is the lifecycle events for the plugin's interested
	// instances that were dropped: emitted while no process served the
	// plugin (restarting, failed, shut down), or lost with a process (see
	// pluginclient.EventStats.Dropped). Classify calls of an out-of-process
	// request classifier count in Calls, Errors, Timeouts and Fallbacks
	// like decision calls, but a failed one fails its request (there is
	// no classifier fallback).
	EventsDropped int64
}

// Host starts and supervises out-of-process plugins. It implements
// config.PluginHost. Safe for concurrent use.
type Host struct {
	log         hclog.Logger
	grace       time.Duration
	callTimeout time.Duration
	restart     RestartPolicy
	health      HealthPolicy
	breaker     BreakerPolicy
	met         *Metrics
	failLog     FailureLogPolicy
	stopGrace   time.Duration
	onStopped   func(StopReport)
	stdout      io.Writer

	// testHookDecideBatch, when a test sets it before starting plugins,
	// runs after each DecideBatch's size is observed, on the sending
	// goroutine of the plugin's client: it can hold the sender.
	testHookDecideBatch func(tasks int)

	// starting counts launches in progress (Start, Describe); Shutdown
	// waits for them. Add only under mu while !closed.
	starting sync.WaitGroup

	mu     sync.Mutex
	closed bool
	done   chan struct{}       // closed when Shutdown has finished
	procs  map[string]*managed // nil while starting
	stats  map[string]*counters
	// restartFor are the restart policies SetRestartPolicy gave.
	restartFor map[string]RestartPolicy
}

var _ config.PluginHost = (*Host)(nil)

// NewHost returns a Host with no plugin running.
func NewHost(o Options) *Host {
	if o.Logger == nil {
		o.Logger = hclog.Default()
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	if o.StopGrace <= 0 {
		o.StopGrace = gracefulKill
	}
	if o.FailureLog == (FailureLogPolicy{}) {
		o.FailureLog = DefaultFailureLog
	}
	met := o.Metrics
	if met == nil && o.Registerer != nil {
		var err error
		if met, err = NewMetrics(o.Registerer); err != nil {
			o.Logger.Error("plugin metrics not registered", "error", err)
		}
	}
	return &Host{
		log:         o.Logger,
		grace:       o.ShutdownGrace,
		callTimeout: o.CallTimeout,
		restart:     o.Restart,
		health:      o.Health.withDefaults(),
		breaker:     o.Breaker.withDefaults(),
		met:         met,
		failLog:     o.FailureLog,
		stopGrace:   o.StopGrace,
		onStopped:   o.Stopped,
		stdout:      o.Stdout,
		done:        make(chan struct{}),
		procs:       make(map[string]*managed),
		stats:       make(map[string]*counters),
		restartFor:  make(map[string]RestartPolicy),
	}
}

// restartFromConfig maps a plugin block's restart block (whose
// max_restarts = 0 means never restart) to a RestartPolicy (where that is
// a negative MaxRestarts, zero meaning the default).
func restartFromConfig(r config.RestartPolicy) RestartPolicy {
	rp := RestartPolicy{MaxRestarts: r.MaxRestarts, Window: r.Window, BackoffMin: r.BackoffMin, BackoffMax: r.BackoffMax}
	if rp.MaxRestarts == 0 {
		rp.MaxRestarts = -1
	}
	return rp
}

// SetRestartPolicy gives the plugin named name its own restart policy, in
// place of its block's restart block (config.Plugin.Restart) or, when the
// block has none, Options.Restart. Call it
// before Start; on a running plugin it applies from its next exit.
func (h *Host) SetRestartPolicy(name string, rp RestartPolicy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.restartFor[name] = rp
	if m := h.procs[name]; m != nil {
		m.mu.Lock()
		m.restart = rp.withDefaults()
		m.mu.Unlock()
	}
}

// Status reports where the named plugin stands.
func (h *Host) Status(name string) Status {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return StatusUnknown
	}
	return m.getStatus()
}

// BreakerOpen reports whether the named plugin's circuit breaker is open
// or half-open: its process is up, but its recent calls failed, so most
// of its policies' decisions are made by their fallbacks. False for an
// unknown plugin, one without a process, or one without a breaker.
func (h *Host) BreakerOpen(name string) bool {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return false
	}
	p := m.cur.Load()
	return p != nil && p.breaker != nil && p.breaker.State() != gobreaker.StateClosed
}

// Start launches the plugin p describes, completes the handshake,
// Describes it and returns its component types; each type's New
// configures an instance in the plugin. A failure is a *StartError; the
// process group is then gone and nothing is retried.
func (h *Host) Start(ctx context.Context, p config.Plugin) ([]shared.TypeInfo, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, &StartError{Plugin: p.Name, Cause: ErrHostClosed, Permanent: true}
	}
	if _, dup := h.procs[p.Name]; dup {
		h.mu.Unlock()
		return nil, &StartError{Plugin: p.Name, Cause: errors.New("already started"), Permanent: true}
	}
	h.procs[p.Name] = nil // reserved while starting
	if h.callTimeout > 0 {
		p.CallTimeout = h.callTimeout
	}
	st := h.stats[p.Name]
	if st == nil {
		st = &counters{}
		h.stats[p.Name] = st
	}
	rp, ok := h.restartFor[p.Name]
	if !ok {
		rp = h.restart
		if p.Restart != (config.RestartPolicy{}) {
			rp = restartFromConfig(p.Restart)
		}
	}
	h.starting.Add(1)
	h.mu.Unlock()
	defer h.starting.Done()

	pr, desc, err := h.launch(ctx, p)
	var m *managed
	if err == nil {
		m = h.newManaged(p, st, rp)
		m.met.own(m)
		m.adopt(pr)
		go m.supervise(pr)
	}
	h.mu.Lock()
	if err != nil {
		delete(h.procs, p.Name)
	} else {
		h.procs[p.Name] = m
	}
	h.mu.Unlock()
	if err != nil {
		h.log.Debug("plugin failed to start", "plugin", p.Name, "error", err)
		return nil, err
	}

	types := make([]shared.TypeInfo, len(desc.Types))
	for i, t := range desc.Types {
		types[i] = shared.TypeInfo{
			Name:   t.Name,
			Kind:   t.Kind,
			Inputs: t.Inputs,
			Params: slices.Clone(t.Params),
			Doc:    t.Doc,
			New: func(info shared.InstanceInfo, params shared.Params) (shared.Component, error) {
				return m.configure(t.Name, t.Kind, info, params)
			},
		}
	}
	return types, nil
}

// Describe starts the plugin b describes (its Path or Command, Args, Env,
// PassEnv, SHA256 and StartTimeout; the rest is not used), describes it
// and stops it: `router plugins describe`. The types' New is nil. An
// error stopping the plugin is returned with the description.
func (h *Host) Describe(ctx context.Context, b config.Plugin) (*pluginclient.Description, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, &StartError{Plugin: b.Name, Cause: ErrHostClosed, Permanent: true}
	}
	h.starting.Add(1)
	h.mu.Unlock()
	defer h.starting.Done()

	pr, desc, err := h.launch(ctx, b)
	if err != nil {
		return nil, err
	}
	for i := range desc.Types {
		desc.Types[i].New = nil
	}
	if err := pr.stop(); err != nil {
		return desc, fmt.Errorf("plugin %q: stopping: %w", b.Name, err)
	}
	return desc, nil
}

// Stats returns the named plugin's counters; zero for an unknown name.
func (h *Host) Stats(name string) Stats {
	h.mu.Lock()
	c := h.stats[name]
	h.mu.Unlock()
	if c == nil {
		return Stats{}
	}
	return Stats{
		Calls:     c.calls.Load(),
		Errors:    c.errors.Load(),
		Timeouts:  c.timeouts.Load(),
		Fallbacks: c.fallbacks.Load(),
		Restarts:  c.restarts.Load(),

		EventsDropped: c.eventsDropped.Load(),
	}
}

// Shutdown stops every plugin: restarts stop (a restart in progress
// finishes first, bounded by start_timeout), new calls fail at once, calls in flight get
// up to ShutdownGrace (or until ctx ends) to finish, then each client is
// closed, each plugin's whole process group killed and reaped, and its
// socket directory removed. Starts in progress finish first (bounded by
// their start_timeout) and are stopped too. A second Shutdown waits for
// the first. It returns the errors of plugins that did not stop cleanly.
func (h *Host) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		select {
		case <-h.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	defer close(h.done)

	h.starting.Wait()
	h.mu.Lock()
	var plugins []*managed
	for _, m := range h.procs {
		if m != nil {
			plugins = append(plugins, m)
		}
	}
	h.mu.Unlock()
	slices.SortFunc(plugins, func(a, b *managed) int { return strings.Compare(a.name, b.name) })
	for _, m := range plugins {
		m.beginShutdown()
	}
	var procs []*proc
	for _, m := range plugins {
		<-m.done
		if p := m.cur.Load(); p != nil {
			procs = append(procs, p)
		}
	}
	defer func() {
		for _, m := range plugins {
			m.met.disown(m)
		}
	}()

	drained := make([]<-chan struct{}, len(procs))
	for i, p := range procs {
		drained[i] = p.beginClose()
	}
	grace := time.NewTimer(h.grace)
	defer grace.Stop()
wait:
	for i, d := range drained {
		select {
		case <-d:
		case <-grace.C:
			h.log.Warn("shutdown grace expired with calls in flight", "plugin", procs[i].name, "grace", h.grace)
			break wait
		case <-ctx.Done():
			break wait
		}
	}

	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() {
			if err := p.stop(); err != nil {
				errs[i] = fmt.Errorf("plugin %q: %w", p.name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// CheckHealth asks the named running plugin once, under ctx, whether it
// serves: the gRPC health check of the service "plugin" that the health
// probe makes every ProbeInterval. It fails when the plugin is unknown or
// has no process, when the call fails, or when the answer is not SERVING.
// `router plugins check` uses it.
func (h *Host) CheckHealth(ctx context.Context, name string) error {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return fmt.Errorf("plugin %q is not running", name)
	}
	p := m.cur.Load()
	if p == nil || p.conn == nil {
		return fmt.Errorf("plugin %q has no process", name)
	}
	resp, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
	if err != nil {
		return fmt.Errorf("plugin %q: health check: %w", name, err)
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("plugin %q: health check answered %v, not SERVING", name, s)
	}
	return nil
}

// ProcessInfo is a running plugin process, as `router plugins check`
// needs it to speak the protocol directly and to watch the process.
type ProcessInfo struct {
	// PID is the process id, also its process group id.
	PID int
	// SocketDir is the PLUGIN_UNIX_SOCKET_DIR the host made for it.
	SocketDir string
	// Conn is the gRPC connection the host's own client uses; it is
	// closed when the process stops.
	Conn *grpc.ClientConn
	// Exited is closed once the process has exited (for whatever reason,
	// a stop included).
	Exited <-chan struct{}
}

// Process returns the named plugin's current process. It fails when the
// plugin is unknown or has no process.
func (h *Host) Process(name string) (ProcessInfo, error) {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return ProcessInfo{}, fmt.Errorf("plugin %q is not running", name)
	}
	p := m.cur.Load()
	if p == nil || p.conn == nil {
		return ProcessInfo{}, fmt.Errorf("plugin %q has no process", name)
	}
	return ProcessInfo{PID: p.pid, SocketDir: p.sockDir, Conn: p.conn, Exited: p.exited}, nil
}

// Info returns what the named plugin's current process runs: its version,
// the checksums of its files and when it started. ok is false when the
// plugin is unknown or has no process (restarting, failed, shut down).
func (h *Host) Info(name string) (info PluginInfo, ok bool) {
	h.mu.Lock()
	m := h.procs[name]
	h.mu.Unlock()
	if m == nil {
		return PluginInfo{}, false
	}
	p := m.cur.Load()
	if p == nil {
		return PluginInfo{}, false
	}
	return p.info(), true
}
