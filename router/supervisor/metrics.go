package supervisor

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
)

// Metrics are the plugin metrics of one Prometheus registry, shared by
// every Host reporting to it: NewMetrics returns the same *Metrics for the
// same registry, and Options.Registerer goes through NewMetrics. Old and
// new Hosts of a reload thus share the counters, and the gauges of a
// plugin name belong to the Host that started it last (a Host shutting
// down deletes only the gauges it still owns).
type Metrics struct {
	up           *prometheus.GaugeVec
	state        *prometheus.GaugeVec
	restarts     *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	callErrors   *prometheus.CounterVec
	fallbacks    *prometheus.CounterVec
	breakerState *prometheus.GaugeVec
	healthChecks *prometheus.CounterVec
	decideTasks  *prometheus.HistogramVec
	invalid      *prometheus.CounterVec
	info         *prometheus.GaugeVec
	startTime    *prometheus.GaugeVec

	mu     sync.Mutex
	owners map[string]*managed // plugin name -> who sets its gauges
}

// Call duration buckets: 20us to 100ms.
var callBuckets = prometheus.ExponentialBucketsRange(20e-6, 0.1, 12)

// Tasks-per-message buckets: 1, 2, 4 ... 128.
var batchBuckets = prometheus.ExponentialBuckets(1, 2, 8)

// NewMetrics returns reg's plugin metrics, creating and registering them
// on first use; later calls with the same reg return the same *Metrics
// (the registry is remembered for the life of the process). A collector
// reg already holds under the same name is reused rather than registered
// twice. nil reg: nil Metrics, no metrics.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, nil
	}
	metricsMu.Lock()
	defer metricsMu.Unlock()
	if m := metricsByReg[reg]; m != nil {
		return m, nil
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	metricsByReg[reg] = m
	return m, nil
}

func newMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_plugin_up",
			Help: "1 while the plugin's process is up and serving, 0 while its policies decide by fallback (restarting, backoff, failed).",
		}, []string{"plugin"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_plugin_state",
			Help: "1 for the plugin's current state, 0 for the others: up; restarting, backoff (crash-looping, retried by itself) and failed (until a reload) serve by fallback.",
		}, []string{"plugin", "state"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_plugin_restarts_total",
			Help: "Restart attempts of the plugin's process.",
		}, []string{"plugin"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_plugin_call_duration_seconds",
			Help:    "Duration of calls that reached the plugin, by method (decide, configure).",
			Buckets: callBuckets,
		}, []string{"plugin", "method"}),
		callErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_plugin_call_errors_total",
			Help: "Failed decision calls by code: timeout, closed, too_large, error, panic, invalid_answer, canceled, breaker_open, restarting, backoff, failed, shutdown.",
		}, []string{"plugin", "code"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_plugin_fallbacks_total",
			Help: "Decision calls that failed over to the policy's fallback, by reason (as call_errors_total's code, but for calls the caller cancelled).",
		}, []string{"plugin", "reason"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_plugin_breaker_state",
			Help: "The plugin's circuit breaker: 0 closed, 1 half-open, 2 open.",
		}, []string{"plugin"}),
		healthChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_plugin_health_checks_total",
			Help: "The host's gRPC health checks of the plugin, by result: ok, failed (no SERVING answer within the probe timeout; probe_failures in a row kill the process group).",
		}, []string{"plugin", "result"}),
		decideTasks: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_plugin_decide_tasks_per_message",
			Help:    "Decision tasks in each DecideBatch message sent to the plugin: decisions that queue while one is being sent share the next (batching under load, no timer).",
			Buckets: batchBuckets,
		}, []string{"plugin"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_plugin_invalid_answers_total",
			Help: "Decision calls whose answer did not fit the task (call_errors_total's invalid_answer), by reason: kept_out_of_range, row_count, non_finite_cost, picked_out_of_range, filtered_by.",
		}, []string{"plugin", "reason"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_plugin_info",
			Help: "1 for what the plugin's current process runs: version (its DescribeResponse.plugin_version), sha256 (of its executable, as sha256sum prints it; empty when unreadable) and files_sha256 (of the files among its args and in sha256_files, comma-separated in /readyz's order, - for an unreadable one).",
		}, []string{"plugin", "version", "sha256", "files_sha256"}),
		startTime: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_plugin_start_time_seconds",
			Help: "When the plugin's current process started serving (handshake and Describe done), in seconds since the Unix epoch.",
		}, []string{"plugin"}),
		owners: make(map[string]*managed),
	}
	var errs []error
	m.up = register(reg, m.up, &errs)
	m.state = register(reg, m.state, &errs)
	m.restarts = register(reg, m.restarts, &errs)
	m.callDuration = register(reg, m.callDuration, &errs)
	m.callErrors = register(reg, m.callErrors, &errs)
	m.fallbacks = register(reg, m.fallbacks, &errs)
	m.breakerState = register(reg, m.breakerState, &errs)
	m.healthChecks = register(reg, m.healthChecks, &errs)
	m.decideTasks = register(reg, m.decideTasks, &errs)
	m.invalid = register(reg, m.invalid, &errs)
	m.info = register(reg, m.info, &errs)
	m.startTime = register(reg, m.startTime, &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// register registers c on reg, or returns the collector of the same
// description reg already holds.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errs *[]error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old
		}
	}
	*errs = append(*errs, err)
	return c
}

var (
	metricsMu    sync.Mutex
	metricsByReg = map[prometheus.Registerer]*Metrics{}
)

// The methods below accept a nil *Metrics (no metrics).

// own makes p the owner of its name's gauges.
func (m *Metrics) own(p *managed) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.owners[p.name] = p
	m.mu.Unlock()
	m.restarts.WithLabelValues(p.name) // the series exists from the start
}

// disown deletes p's gauges if p still owns them.
func (m *Metrics) disown(p *managed) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners[p.name] != p {
		return
	}
	delete(m.owners, p.name)
	m.up.DeleteLabelValues(p.name)
	m.state.DeletePartialMatch(prometheus.Labels{"plugin": p.name})
	m.breakerState.DeleteLabelValues(p.name)
	m.info.DeletePartialMatch(prometheus.Labels{"plugin": p.name})
	m.startTime.DeleteLabelValues(p.name)
}

// gauges sets p's gauges if p owns them.
func (m *Metrics) gauges(p *managed, set func(name string)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners[p.name] == p {
		set(p.name)
	}
}

// gaugedStates are the values of switchyard_plugin_state's state label.
var gaugedStates = []Status{StatusUp, StatusRestarting, StatusBackoff, StatusFailed}

func (m *Metrics) setStatus(p *managed, s Status) {
	m.gauges(p, func(name string) {
		m.up.WithLabelValues(name).Set(b2f(s == StatusUp))
		for _, g := range gaugedStates {
			m.state.WithLabelValues(name, g.String()).Set(b2f(s == g))
		}
	})
}

// setInfo makes info p's switchyard_plugin_info series (the one series of
// p's name) and its start time, if p owns its gauges.
func (m *Metrics) setInfo(p *managed, info PluginInfo) {
	m.gauges(p, func(name string) {
		m.info.DeletePartialMatch(prometheus.Labels{"plugin": name})
		m.info.WithLabelValues(name, info.Version, info.SHA256(), filesLabel(info.Files)).Set(1)
		m.startTime.WithLabelValues(name).Set(float64(info.Started.UnixNano()) / 1e9)
	})
}

func (m *Metrics) setBreaker(p *managed, s gobreaker.State) {
	m.gauges(p, func(name string) { m.breakerState.WithLabelValues(name).Set(float64(s)) })
}

func (m *Metrics) restarted(name string) {
	if m != nil {
		m.restarts.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) healthChecked(name string, ok bool) {
	if m == nil {
		return
	}
	result := "failed"
	if ok {
		result = "ok"
	}
	m.healthChecks.WithLabelValues(name, result).Inc()
}

func (m *Metrics) observe(name, method string, d time.Duration) {
	if m != nil {
		m.callDuration.WithLabelValues(name, method).Observe(d.Seconds())
	}
}

// decideBatch returns the observer of the named plugin's DecideBatch
// sizes (pluginclient.Options.DecideBatch), or nil without metrics.
func (m *Metrics) decideBatch(name string) func(tasks int) {
	if m == nil {
		return nil
	}
	h := m.decideTasks.WithLabelValues(name)
	return func(tasks int) { h.Observe(float64(tasks)) }
}

func (m *Metrics) callFailed(name, code string, shadow bool) {
	if m == nil {
		return
	}
	m.callErrors.WithLabelValues(name, code).Inc()
	if code != codeCanceled && !shadow {
		m.fallbacks.WithLabelValues(name, code).Inc()
	}
}

// invalidAnswer counts a decision call of the named plugin whose answer
// did not fit its task, by reason (a pluginclient.Invalid* constant).
func (m *Metrics) invalidAnswer(name, reason string) {
	if m != nil {
		m.invalid.WithLabelValues(name, reason).Inc()
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
