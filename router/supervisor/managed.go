package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/shared"
)

// Status is where a supervised plugin stands.
type Status int32

const (
	// StatusUnknown: the Host has no plugin of that name.
	StatusUnknown Status = iota
	// StatusUp: its process runs and takes calls.
	StatusUp
	// StatusRestarting: its process exited; calls fail fast (their
	// policies decide by fallback) until the restart, after a short
	// backoff, has configured every instance again.
	StatusRestarting
	// StatusBackoff: degraded, serving by fallback. The plugin exited more
	// than max_restarts times within window (a crash loop); calls fail
	// fast and its policies decide by fallback while the host keeps
	// trying to start it after a backoff that doubles up to
	// CrashLoopBackoffMax. It is StatusUp again, by itself, as soon as a
	// start succeeds.
	StatusBackoff
	// StatusFailed: it cannot be restarted without a change on disk (a
	// restart failed its handshake: wrong cookie, no common API version,
	// text on stdout, a sha256 mismatch, or the types changed) or its
	// restart block says max_restarts = 0; calls fail fast (their policies
	// decide by fallback) until a reload.
	StatusFailed
	// StatusStopped: the Host is shut down.
	StatusStopped
)

// String is the status as one lowercase word: "up", "restarting",
// "backoff", "failed", "stopped" or "unknown". Every status but "up" means
// the plugin's policies decide by their fallbacks; "restarting" and
// "backoff" also mean the host brings the plugin back by itself.
func (s Status) String() string {
	switch s {
	case StatusUp:
		return "up"
	case StatusRestarting:
		return "restarting"
	case StatusBackoff:
		return "backoff"
	case StatusFailed:
		return "failed"
	case StatusStopped:
		return "stopped"
	}
	return "unknown"
}

// Errors of decision calls that did not get an answer from the plugin.
// Each fails the call's policy, whose fallback then decides.
var (
	// ErrCallTimeout: no answer within call_timeout. It deliberately does
	// not wrap context.DeadlineExceeded, which means the caller's own
	// deadline.
	ErrCallTimeout = errors.New("no answer within call_timeout")
	// ErrBreakerOpen: the plugin's circuit breaker refused the call.
	ErrBreakerOpen = errors.New("circuit breaker open")
	// ErrRestarting: the plugin's process is being restarted (wrapped with
	// pluginclient.ErrPluginClosed).
	ErrRestarting = errors.New("restarting")
	// ErrBackoff: the plugin is crash-looping (StatusBackoff); the host
	// tries to start it again after a backoff (wrapped with
	// pluginclient.ErrPluginClosed).
	ErrBackoff = errors.New("crash-looping: retried after a backoff")
	// ErrPluginFailed: the plugin cannot be restarted and is not started
	// again until a reload (StatusFailed; wrapped with
	// pluginclient.ErrPluginClosed).
	ErrPluginFailed = errors.New("failed: not restarted until a reload")
	// ErrTooLarge: the plugin's answer (or the task) exceeded the gRPC
	// message-size limit, shared.MaxMessageBytes.
	ErrTooLarge = errors.New("message over the size limit")
)

// Call error codes, the code label of switchyard_plugin_call_errors_total
// and the reason of switchyard_plugin_fallbacks_total.
const (
	codeTimeout     = "timeout"      // no answer within call_timeout
	codeClosed      = "closed"       // the process or stream went away during the call
	codeTooLarge    = "too_large"    // a message over the size limit
	codeError       = "error"        // the plugin answered with an error
	codePanic       = "panic"        // a component panicked (the plugin's SDK recovered it)
	codeCanceled    = "canceled"     // the caller's context ended (no fallback)
	codeBreakerOpen = "breaker_open" // refused by the circuit breaker
	codeRestarting  = "restarting"   // refused: the process is being restarted
	codeBackoff     = "backoff"      // refused: the plugin is crash-looping
	codeFailed      = "failed"       // refused: the plugin is failed
	codeShutdown    = "shutdown"     // refused: the host is shutting down
	// codeInvalidAnswer: the plugin answered, but with rows, costs or a
	// pick that do not fit the task (pluginclient.CheckResult).
	codeInvalidAnswer = "invalid_answer"
)

// instance is a Configure the plugin answered: replayed, in order, in
// every restarted process.
type instance struct {
	typ    string
	kind   shared.Kind
	info   shared.InstanceInfo
	params shared.Params
	inputs shared.Inputs
}

// managed is one supervised plugin: the process currently serving it (nil
// while it restarts, backs off or after it failed), the instances
// configured in it, and the goroutine that restarts it. Components hold the
// managed plugin, not a process, so they survive restarts.
type managed struct {
	h           *Host
	name        string
	block       config.Plugin
	log         hclog.Logger
	stats       *counters
	met         *Metrics
	health      HealthPolicy
	breaker     BreakerPolicy
	callTimeout time.Duration

	cur    atomic.Pointer[proc]
	status atomic.Int32 // a Status

	mu           sync.Mutex
	restart      RestartPolicy
	instances    []*instance
	restartTimes []time.Time // restart attempts within the window

	// failLogs rate-limit the warnings of failed calls, one per cause
	// code; shadowFailLogs the same of shadow decisions' calls
	// (pipeline.IsShadow), logged apart; the maps are not modified after
	// newManaged.
	failLogs       map[string]*failureLog
	shadowFailLogs map[string]*failureLog

	// crashLoop: the plugin exceeded max_restarts within window and no
	// process has stayed up for window since (StatusBackoff while it has
	// no process).
	crashLoop bool

	quit       chan struct{}   // closed when Shutdown begins
	quitCtx    context.Context // cancelled with quit
	quitCancel context.CancelFunc
	done       chan struct{} // closed when supervise has returned
}

func (h *Host) newManaged(b config.Plugin, st *counters, rp RestartPolicy) *managed {
	m := &managed{
		h:           h,
		name:        b.Name,
		block:       b,
		log:         h.log.Named(b.Name),
		stats:       st,
		met:         h.met,
		health:      h.health,
		breaker:     h.breaker,
		callTimeout: b.CallTimeout,
		restart:     rp.withDefaults(),
		quit:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	if m.callTimeout <= 0 {
		m.callTimeout = config.DefaultCallTimeout
	}
	m.failLogs = make(map[string]*failureLog)
	m.shadowFailLogs = make(map[string]*failureLog)
	for _, code := range []string{codeTimeout, codeClosed, codeTooLarge, codeError, codePanic,
		codeBreakerOpen, codeRestarting, codeBackoff, codeFailed, codeShutdown, codeInvalidAnswer} {
		m.failLogs[code] = &failureLog{s: rate.Sometimes{Every: h.failLog.Every, Interval: h.failLog.Interval}}
		m.shadowFailLogs[code] = &failureLog{s: rate.Sometimes{Every: h.failLog.Every, Interval: h.failLog.Interval}}
	}
	m.quitCtx, m.quitCancel = context.WithCancel(context.Background())
	return m
}

func (m *managed) getStatus() Status { return Status(m.status.Load()) }

// setStatus makes s the plugin's status and sets its gauges, unless the
// Host is shut down (StatusStopped is final).
func (m *managed) setStatus(s Status) {
	for {
		old := m.status.Load()
		if Status(old) == StatusStopped {
			return
		}
		if m.status.CompareAndSwap(old, int32(s)) {
			m.met.setStatus(m, s)
			return
		}
	}
}

// adopt makes p the process serving m: a fresh circuit breaker, the
// health probe, and the gauges.
func (m *managed) adopt(p *proc) {
	if !m.breaker.Disabled {
		p.breaker = m.newBreaker(p)
	}
	p.upSince = time.Now()
	m.cur.Store(p)
	m.setStatus(StatusUp)
	info := p.info()
	m.met.setInfo(m, info)
	m.log.Info("plugin process up", "pid", p.pid, "version", info.Version, "sha256", info.SHA256(), "files", len(info.Files))
	m.met.setBreaker(m, gobreaker.StateClosed)
	if m.health.ProbeInterval > 0 && p.conn != nil {
		p.bg.Add(1)
		go m.probe(p)
	}
}

func (m *managed) newBreaker(p *proc) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	b := m.breaker
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         m.name,
		MaxRequests:  uint32(b.HalfOpenCalls),
		Interval:     b.Window,
		BucketPeriod: b.Window / 10,
		Timeout:      b.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(b.ConsecutiveFailures) ||
				(c.Requests >= uint32(b.MinCalls) && float64(c.TotalFailures) >= b.FailureRatio*float64(c.Requests))
		},
		// The caller's own cancellation or deadline says nothing about
		// the plugin.
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
		},
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if m.cur.Load() == p {
				m.met.setBreaker(m, to)
			}
			m.log.Info("circuit breaker", "from", from.String(), "to", to.String())
		},
	})
}

// supervise waits for p's exit and restarts the plugin, until Shutdown or
// until the plugin is failed.
func (m *managed) supervise(p *proc) {
	defer close(m.done)
	bo := backoff.NewExponentialBackOff(
		backoff.WithRandomizationFactor(backoffJitter),
		backoff.WithMultiplier(2),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		select {
		case <-p.exited:
		case <-m.quit:
			return
		}
		select {
		case <-m.quit: // Shutdown stops it
			return
		default:
		}
		m.cur.CompareAndSwap(p, nil)
		why := "the process exited"
		if r := p.killReason.Load(); r != nil {
			why = "killed by the host: " + *r
		}
		err := p.stop()
		if p.rc != nil {
			m.stats.eventsDropped.Add(p.rc.EventStats().Dropped)
		}
		m.log.Warn("plugin process gone; restarting it", "pid", p.pid, "reason", why, "stderr", p.stderr.suffix(), "stop_error", err)
		if p = m.restartLoop(bo, time.Since(p.upSince)); p == nil {
			return
		}
	}
}

// restartLoop restarts the plugin after the backoff, again and again,
// after a process that served for uptime exited. Within max_restarts per
// window the backoff stays under backoff_max (StatusRestarting); past it
// the plugin is crash-looping (StatusBackoff) and the backoff doubles on
// up to CrashLoopBackoffMax, until a process has stayed up for window. It
// returns the new process, or nil when the plugin is failed (max_restarts
// 0, or a permanent start error) or the host shuts down.
func (m *managed) restartLoop(bo *backoff.ExponentialBackOff, uptime time.Duration) *proc {
	m.mu.Lock()
	if m.crashLoop && uptime >= m.restart.Window {
		m.crashLoop = false // it stayed up: the next restart is a first one
		m.restartTimes = nil
	}
	m.mu.Unlock()
	for {
		m.mu.Lock()
		rp := m.restart
		now := time.Now()
		m.restartTimes = slices.DeleteFunc(m.restartTimes, func(t time.Time) bool { return now.Sub(t) >= rp.Window })
		n := len(m.restartTimes)
		if rp.MaxRestarts == 0 {
			m.mu.Unlock()
			m.fail("max_restarts is 0")
			return nil
		}
		entered := !m.crashLoop && n >= rp.MaxRestarts
		m.crashLoop = m.crashLoop || entered
		bo.InitialInterval, bo.MaxInterval = rp.BackoffMin, rp.BackoffMax
		if m.crashLoop {
			bo.MaxInterval = max(rp.BackoffMax, CrashLoopBackoffMax)
		} else if n == 0 {
			bo.Reset()
		}
		delay := bo.NextBackOff()
		m.restartTimes = append(m.restartTimes, now)
		crashLoop := m.crashLoop
		m.mu.Unlock()

		status := StatusRestarting
		if crashLoop {
			status = StatusBackoff
		}
		m.setStatus(status)
		if entered {
			m.log.Error("plugin crash-looping: its policies decide by fallback while it is retried with a growing backoff",
				"restarts", n, "window", rp.Window, "max_restarts", rp.MaxRestarts, "next_attempt_in", delay, "backoff_cap", bo.MaxInterval)
		}

		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-m.quit:
			t.Stop()
			return nil
		}
		m.stats.restarts.Add(1)
		m.met.restarted(m.name)
		m.log.Info("restarting plugin", "restarts_in_window", n+1, "backoff", delay, "status", status.String())
		p, err := m.relaunch()
		if err == nil {
			return p
		}
		select {
		case <-m.quit:
			return nil
		default:
		}
		if IsPermanent(err) {
			m.fail(err.Error())
			return nil
		}
		m.log.Warn("plugin restart failed", "error", err)
	}
}

// relaunch starts a new process and configures every instance in it, with
// the names, roles and parameters they were configured with.
func (m *managed) relaunch() (*proc, error) {
	p, desc, err := m.h.launch(m.quitCtx, m.block)
	if err != nil {
		return nil, err
	}
	fail := func(permanent bool, err error) (*proc, error) {
		return nil, &StartError{Plugin: m.name, Cause: errors.Join(err, p.stop()), Permanent: permanent}
	}
	m.mu.Lock()
	insts := slices.Clone(m.instances)
	m.mu.Unlock()
	for _, in := range insts {
		i := slices.IndexFunc(desc.Types, func(t shared.TypeInfo) bool { return t.Name == in.typ })
		if i < 0 || desc.Types[i].Kind != in.kind {
			return fail(true, fmt.Errorf("the restarted plugin no longer has %s type %q", in.kind, in.typ))
		}
		ctx, cancel := context.WithTimeout(m.quitCtx, p.startTimeout)
		stopAfter := context.AfterFunc(p.ctx, cancel)
		inputs, diags, err := p.rc.Configure(ctx, pluginclient.ConfigureRequest{Info: in.info, Type: in.typ, Params: in.params})
		stopAfter()
		cancel()
		switch {
		case err != nil:
			return fail(false, fmt.Errorf("configuring %s %q again: %w", in.typ, in.info.Name, err))
		case len(diags) > 0:
			return fail(true, fmt.Errorf("configuring %s %q again: %w", in.typ, in.info.Name, diagErrors(diags)))
		case inputs != in.inputs:
			return fail(true, fmt.Errorf("configuring %s %q again: it declares inputs %v, before %v", in.typ, in.info.Name, inputs, in.inputs))
		}
	}
	m.adopt(p)
	m.log.Info("plugin restarted", "pid", p.pid, "instances", len(insts))
	return p, nil
}

// fail marks the plugin failed: it is not restarted again.
func (m *managed) fail(reason string) {
	m.setStatus(StatusFailed)
	m.log.Error("plugin failed: it is not restarted again; its policies decide by fallback until the policy file is reloaded",
		"reason", reason)
}

// probe checks the plugin's gRPC health service every ProbeInterval, and
// at once when a call missed its deadline (p.checkNow) unless a check
// succeeded within the last ProbeInterval; each check runs under its own
// ProbeTimeout. It kills the process group after ProbeFailures failed
// checks in a row. It also refreshes the breaker gauge (open turns
// half-open only when looked at).
func (m *managed) probe(p *proc) {
	defer p.bg.Done()
	hc := healthpb.NewHealthClient(p.conn)
	t := time.NewTicker(m.health.ProbeInterval)
	defer t.Stop()
	fails := 0
	var lastOK time.Time
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.checkNow:
			if time.Since(lastOK) < m.health.ProbeInterval {
				continue
			}
		}
		if p.breaker != nil && m.cur.Load() == p {
			m.met.setBreaker(m, p.breaker.State())
		}
		ctx, cancel := context.WithTimeout(p.ctx, m.health.ProbeTimeout)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
		cancel()
		if p.ctx.Err() != nil {
			return
		}
		ok := err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		m.met.healthChecked(m.name, ok)
		if ok {
			fails, lastOK = 0, time.Now()
			continue
		}
		if err == nil {
			err = fmt.Errorf("status %v", resp.GetStatus())
		}
		fails++
		m.log.Warn("plugin health check failed", "pid", p.pid, "error", err, "failures", fails)
		if fails >= m.health.ProbeFailures {
			p.killGroup(fmt.Sprintf("%d failed health checks (deadline %v)", fails, m.health.ProbeTimeout))
			return
		}
	}
}

// configure asks the plugin for a new instance of type typ: the New of
// the types Start returns. A diagnostic naming a parameter becomes a
// *shared.ParamError; one about the whole block, a plain error. The
// instance is recorded, to be configured again in restarted processes.
func (m *managed) configure(typ string, kind shared.Kind, info shared.InstanceInfo, params shared.Params) (shared.Component, error) {
	switch kind {
	case shared.KindFilter, shared.KindScorer, shared.KindPicker, shared.KindClassifier:
	default:
		return nil, fmt.Errorf("plugin %q: type %q: out-of-process %s components are not supported", m.name, typ, kind)
	}
	p := m.cur.Load()
	if p == nil || !p.enter() {
		_, err := m.refusal(p)
		return nil, err
	}
	defer p.leave()
	ctx, cancel := context.WithTimeout(context.Background(), p.startTimeout)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()

	params = maps.Clone(params)
	start := time.Now()
	cr, err := p.rc.ConfigureInstance(ctx, pluginclient.ConfigureRequest{Info: info, Type: typ, Params: params})
	m.met.observe(m.name, "configure", time.Since(start))
	if err != nil {
		if p.ctx.Err() != nil {
			return nil, p.closedErr(err)
		}
		return nil, fmt.Errorf("plugin %q: type %s: %w", m.name, typ, err) // err names the instance
	}
	if err := diagErrors(cr.Diagnostics); err != nil {
		return nil, err
	}
	inputs := cr.Inputs
	in := &instance{typ: typ, kind: kind, info: info, params: params, inputs: inputs}
	m.mu.Lock()
	if i := slices.IndexFunc(m.instances, func(o *instance) bool { return o.info.Name == info.Name }); i >= 0 {
		m.instances[i] = in
	} else {
		m.instances = append(m.instances, in)
	}
	m.mu.Unlock()
	c := &component{m: m, name: info.Name, typ: typ, kind: kind, inputs: inputs}
	switch {
	case kind == shared.KindClassifier && cr.Events:
		return &listeningFactory{classifierFactory{c}}, nil
	case kind == shared.KindClassifier:
		return &classifierFactory{c}, nil
	case cr.Events:
		return &listeningComponent{c}, nil
	}
	return c, nil
}

// decide sends one task to the current process under call_timeout, through
// its circuit breaker, and counts it. It fails fast while the plugin
// restarts, is failed or shuts down, or while the breaker is open. The
// call's context is also cancelled when the process exits or stops. An
// answer that does not fit the task (pluginclient.CheckResult) fails the
// call like an error (cause invalid_answer): it is logged, counted, and
// counts toward the breaker, so a plugin wrong on every call opens it.
func (m *managed) decide(ctx context.Context, task *pluginclient.Task) (pluginclient.TaskResult, error) {
	res := pluginclient.TaskResult{Picked: -1}
	err := m.call(ctx, "decide", func(cctx context.Context, p *proc) (err error) {
		if res, err = p.rc.Decide(cctx, task); err == nil {
			err = pluginclient.CheckResult(task, res)
		}
		return err
	})
	if err != nil {
		return pluginclient.TaskResult{Picked: -1}, err
	}
	return res, nil
}

// call runs one call of the plugin (op names it in the latency metric) on
// the current process under call_timeout, through its circuit breaker, and
// counts it: decide and classify. It fails fast while the plugin restarts,
// is failed or shuts down, or while the breaker is open. The call's
// context is also cancelled when the process exits or stops.
//
// A shadow decision's call (pipeline.IsShadow) is refused while the
// breaker is open but never counts toward it, and its failures are not
// counted as fallbacks: nothing falls back for a shadow, and a failing
// shadow must not open the breaker that the live policies using the same
// plugin go through.
func (m *managed) call(ctx context.Context, op string, fn func(ctx context.Context, p *proc) error) error {
	m.stats.calls.Add(1)
	shadow := pipeline.IsShadow(ctx)
	p := m.cur.Load()
	if p == nil || !p.enter() {
		code, err := m.refusal(p)
		return m.failed(op, code, err, shadow)
	}
	defer p.leave()
	var done func(error)
	switch {
	case p.breaker == nil:
	case shadow:
		if p.breaker.State() == gobreaker.StateOpen {
			return m.failed(op, codeBreakerOpen, fmt.Errorf("plugin %q: %w", m.name, ErrBreakerOpen), shadow)
		}
	default:
		d, err := p.breaker.Allow()
		if err != nil {
			return m.failed(op, codeBreakerOpen, fmt.Errorf("plugin %q: %w", m.name, ErrBreakerOpen), shadow)
		}
		done = d
	}
	start := time.Now()
	deadline := start.Add(p.callTimeout)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()

	err := fn(cctx, p)
	m.met.observe(m.name, op, time.Since(start))
	if err == nil {
		if done != nil {
			done(nil)
		}
		return nil
	}
	code, err := m.classify(p, ctx, deadline, err)
	if done != nil {
		if code == codeTimeout && !p.countTimeout(start, deadline) {
			// Late together with a timeout the breaker already counted:
			// one late message (batched calls go out and come back
			// together) or one slow spell is one failure, not one per
			// call in it. Neither success nor failure for the breaker.
			done(context.DeadlineExceeded)
		} else {
			done(err)
		}
	}
	if code == codeTimeout {
		// Late is not dead: the health probe decides (HealthPolicy), and a
		// decision call's stream must stay silent for StallTimeout.
		p.requestCheck()
		if op == "decide" {
			m.checkStall(p, start)
		}
	}
	return m.failed(op, code, err, shadow)
}

// countTimeout reports whether a call that started at start and timed out
// at deadline counts as a failure for the circuit breaker: only when it
// started after the deadline of the last timeout that counted, so calls
// that were in flight together (one batched message, one stall) count
// once, and a plugin that times out call after call still trips it.
func (p *proc) countTimeout(start, deadline time.Time) bool {
	s, d := int64(start.Sub(monoBase)), int64(deadline.Sub(monoBase))
	for {
		last := p.lastTimeout.Load()
		if s < last {
			return false
		}
		if p.lastTimeout.CompareAndSwap(last, d) {
			return true
		}
	}
}

// monoBase anchors the monotonic clock readings stored as int64s
// (proc.lastTimeout).
var monoBase = time.Now()

// checkStall is the stall rule of HealthPolicy, run when a decision call
// sent at sent got no answer within call_timeout: it kills p's process
// group once the earliest such call with no answer on the Decide stream
// since it was sent is StallTimeout old, the stream still silent.
func (m *managed) checkStall(p *proc, sent time.Time) {
	if m.health.StallTimeout < 0 {
		return
	}
	last := p.rc.LastAnswer()
	if !last.Before(sent) {
		return // the plugin answered something since: late, not stuck
	}
	var since time.Time
	for {
		old := p.stallSince.Load()
		if old != nil && last.Before(*old) && !old.After(sent) {
			since = *old // an earlier call is still unanswered
			break
		}
		if p.stallSince.CompareAndSwap(old, &sent) {
			since = sent
			break
		}
	}
	if time.Since(since) >= m.health.StallTimeout && p.rc.LastAnswer().Before(since) && p.ctx.Err() == nil {
		p.killGroup(fmt.Sprintf("no answer to any decision call for %v", m.health.StallTimeout))
	}
}

// classify names a failed call's cause and words its error.
func (m *managed) classify(p *proc, ctx context.Context, deadline time.Time, err error) (string, error) {
	var invalid *pluginclient.InvalidAnswerError
	if errors.As(err, &invalid) {
		// An answer came: whatever the clocks say now, it is the answer
		// that failed.
		return codeInvalidAnswer, fmt.Errorf("plugin %q: plugin decide: %w", m.name, err)
	}
	late := errors.Is(err, context.DeadlineExceeded) || !time.Now().Before(deadline)
	callerDL, hasDL := ctx.Deadline()
	switch {
	case status.Code(err) == codes.ResourceExhausted, errors.Is(err, pluginclient.ErrResultTooLarge):
		return codeTooLarge, fmt.Errorf("plugin %q: %w (%d MiB): %w", m.name, ErrTooLarge, shared.MaxMessageBytes>>20, err)
	case p.ctx.Err() != nil || errors.Is(err, pluginclient.ErrPluginClosed):
		return codeClosed, p.closedErr(err)
	case ctx.Err() != nil, late && hasDL && !callerDL.After(deadline):
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return codeCanceled, fmt.Errorf("plugin %q: %w", m.name, cause)
	case late:
		return codeTimeout, fmt.Errorf("plugin %q: %w (%v)", m.name, ErrCallTimeout, p.callTimeout)
	}
	err = fmt.Errorf("plugin %q: %w", m.name, err)
	if errors.Is(err, pluginclient.ErrComponentPanicked) {
		return codePanic, err
	}
	return codeError, err
}

// refusal is the code and error of a call the plugin cannot take now.
func (m *managed) refusal(p *proc) (string, error) {
	switch m.getStatus() {
	case StatusRestarting:
		return codeRestarting, fmt.Errorf("plugin %q: %w: %w", m.name, pluginclient.ErrPluginClosed, ErrRestarting)
	case StatusBackoff:
		return codeBackoff, fmt.Errorf("plugin %q: %w: %w", m.name, pluginclient.ErrPluginClosed, ErrBackoff)
	case StatusFailed:
		return codeFailed, fmt.Errorf("plugin %q: %w: %w", m.name, pluginclient.ErrPluginClosed, ErrPluginFailed)
	case StatusStopped:
		return codeShutdown, fmt.Errorf("plugin %q: %w: shutting down", m.name, pluginclient.ErrPluginClosed)
	}
	if p == nil {
		return codeRestarting, fmt.Errorf("plugin %q: %w: %w", m.name, pluginclient.ErrPluginClosed, ErrRestarting)
	}
	return codeClosed, p.closedErr(nil)
}

// failed counts a failed call of op, logs it (rate-limited, see
// FailureLogPolicy) and returns err as a *CallError with its cause code.
func (m *managed) failed(op, code string, err error, shadow bool) error {
	if !shadow {
		m.stats.fallbacks.Add(1)
	}
	if code == codeTimeout {
		m.stats.timeouts.Add(1)
	} else {
		m.stats.errors.Add(1)
	}
	m.met.callFailed(m.name, code, shadow)
	if code == codeInvalidAnswer {
		var invalid *pluginclient.InvalidAnswerError
		if errors.As(err, &invalid) {
			m.met.invalidAnswer(m.name, invalid.Reason)
		}
	}
	logs := m.failLogs
	if shadow {
		logs = m.shadowFailLogs
	}
	if l := logs[code]; l != nil { // not canceled: the caller's doing
		n := l.n.Add(1)
		log := false
		l.s.Do(func() { log = true })
		switch {
		case !log: // outside Sometimes' lock: a log write may block
		case shadow:
			// A shadow's failure changes no live decision; the Router
			// warns about failing shadows itself (router.ShadowOptions.Logger).
			m.log.Debug("shadow plugin call failed", "call", op, "cause", code, "shadow_failures", n, "error", err)
		default:
			m.log.Warn("plugin call failed", "call", op, "cause", code, "failures", n, "error", err)
		}
	}
	return &CallError{Plugin: m.name, Cause: code, Err: err}
}

// failureLog is the log rate limit of one plugin's failures of one cause.
type failureLog struct {
	n atomic.Int64 // failures so far
	s rate.Sometimes
}

// beginShutdown stops the restarts; Shutdown then stops the current
// process once supervise has returned (m.done).
func (m *managed) beginShutdown() {
	m.status.Store(int32(StatusStopped)) // its gauges go with disown
	close(m.quit)
	m.quitCancel()
}
