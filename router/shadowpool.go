package router

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// ShadowOptions set how a Router runs the shadow policies of its
// policies. The live decision never waits for a shadow decision, except
// Inline, where the shadow runs inside Place after the live booking.
//
// Asynchronously (serve), a decision the sample takes is queued (a
// bounded queue of QueueLen) for a fixed pool of MaxInFlight shadow
// workers; several workers ask a plugin shadow at once, so the plugin
// client's batching (one DecideBatch per message carrying the tasks that
// queued up) absorbs the load. The sample starts at every decision. Every
// SampleInterval (shadowPool.adjust) the Router reads the queue: when it
// dropped decisions or its backlog grows, the shadow cannot keep up, and
// it asks only every k-th decision (sample rate 1/k, k the smallest
// whole number that keeps the asked rate within shadowHeadroom of the
// decisions the workers completed per second); when the workers have
// room again the rate rises back, at most doubling per interval, to 1.
// Each change is exported (switchyard_shadow_sample_rate) and logged
// once; the decisions not asked are counted (ShadowSampledOut). A
// decision is dropped (ShadowDropped) only when the queue is full, that
// is while the rate is above what the shadow keeps up with; a drop brings
// the next adjustment forward. No goroutine is started per decision, no
// lock is held across a shadow's call, and the memory is bounded by
// QueueLen + MaxInFlight pooled jobs.
type ShadowOptions struct {
	// Inline runs each shadow decision inside Place, after the live
	// decision was booked, and returns its outcome in Decision.Shadow:
	// deterministic, for simulated time (replay); no sampling, no queue.
	// Otherwise the shadow workers run it and its outcome reaches Observe
	// only.
	Inline bool
	// MaxInFlight is the number of shadow workers: the most
	// asynchronous shadow decisions running at once. 0 means
	// DefaultShadowInFlight.
	MaxInFlight int
	// QueueLen bounds the decisions waiting for a shadow worker; one more
	// is dropped (ShadowDropped). 0 means DefaultShadowQueue.
	QueueLen int
	// SampleInterval is how often the sample rate is recomputed from the
	// queue, the arrival rate and the workers' throughput. 0 means
	// DefaultShadowSampleInterval.
	SampleInterval time.Duration
	// Recent is how many of the last shadow decisions that ran ShadowView
	// keeps (a ring). 0 means DefaultShadowRecent.
	Recent int
	// Observe, when set, receives every outcome: inside Place when
	// Inline, for ShadowSampledOut and for ShadowDropped; else on the
	// shadow worker. It must not block.
	Observe func(ShadowOutcome)
	// Logger receives the sample rate's changes (one line per change)
	// and the shadow's failures (rate-limited: the first, then at most one
	// per shadowFailLogInterval, with the count); nil discards them.
	Logger hclog.Logger
}

// DefaultShadowInFlight is ShadowOptions.MaxInFlight's default (and
// `router serve --shadow-max-inflight`'s): 8 shadow workers. A plugin
// shadow then has up to 8 tasks in flight, which its client batches
// into few messages; more workers buy capacity only while the plugin has
// idle CPU, and on 2 busy cores 64 decisions in flight cut the live
// throughput to 0.6x (BENCHMARKS.md, "Shadow mode"): a shadow that needs
// more than 8 at once is sampled instead.
const DefaultShadowInFlight = 8

// DefaultShadowQueue is ShadowOptions.QueueLen's default (`router serve
// --shadow-queue`): 1024 decisions, a burst of about a tenth of a second
// at 10,000 decisions per second, each a pooled job of a request copy and
// its candidates' columns.
const DefaultShadowQueue = 1024

// DefaultShadowSampleInterval is ShadowOptions.SampleInterval's default:
// the sample rate follows the shadow's throughput within about a second.
const DefaultShadowSampleInterval = time.Second

// DefaultShadowRecent is ShadowOptions.Recent's default: the /debug/shadow
// view shows the last 256 shadow decisions.
const DefaultShadowRecent = 256

// shadowHeadroom is the share of the workers' throughput the sample rate
// aims at: the rest drains a queue built up by bursts.
const shadowHeadroom = 0.8

// maxShadowEvery bounds k (a sample rate of 1/k): a shadow that answers
// nothing still gets one decision in 2^20.
const maxShadowEvery = 1 << 20

// shadowLatencyWindow is how many of the last decisions' times the
// latency quantiles of ShadowView are taken over.
const shadowLatencyWindow = 1024

// shadowFailLogInterval spaces the warnings of a failing shadow.
const shadowFailLogInterval = 10 * time.Second

// maxShadowText bounds a request id and an error in ShadowView, in bytes.
const maxShadowText = 256

// shadowResults are the results ShadowView counts, in its order.
var shadowResults = [...]ShadowResult{ShadowAgree, ShadowDisagree, ShadowFailed, ShadowNone, ShadowDropped, ShadowSampledOut}

func resultIndex(r ShadowResult) int {
	for i, x := range shadowResults {
		if x == r {
			return i
		}
	}
	return -1
}

// shadowPool runs a Router's asynchronous shadow decisions: the queue,
// the workers, the sampler and its controller, and the view.
type shadowPool struct {
	workers  int
	interval time.Duration
	queue    chan *shadowJob
	run      func(*shadowJob) // Router.shadowAsync
	log      hclog.Logger
	metrics  *shadowMetrics // nil without a Registerer

	ctx  context.Context // cancelled by close
	stop context.CancelFunc

	// closed is set by close: no job begins after it. pending counts the
	// jobs begun and not done; close waits for it to reach 0 (zero is
	// signalled then) before it stops the workers.
	closed  atomic.Bool
	pending atomic.Int64
	zero    chan struct{}
	quit    chan struct{}
	start   sync.Once
	wg      sync.WaitGroup // the workers and the controller

	// every is k of the sample rate 1/k; n counts the decisions sampled.
	every atomic.Int64
	n     atomic.Uint64
	// done and busy count the decisions the workers ran and their summed
	// time in nanoseconds; dropped the queue's drops; running the
	// decisions running now.
	done    atomic.Int64
	busy    atomic.Int64
	dropped atomic.Int64
	running atomic.Int64
	early   chan struct{} // a drop asks for an early adjustment
	counts  [len(shadowResults)]atomic.Int64

	failLog  rate.Sometimes
	failures atomic.Int64

	mu       sync.Mutex // the view below; never held across a call
	recent   []ShadowRecord
	next     int
	lat      []time.Duration
	latNext  int
	changed  time.Time
	capacity float64 // decisions completed per second, over the last interval
	arrival  float64
}

func newShadowPool(o ShadowOptions, run func(*shadowJob), m *shadowMetrics) *shadowPool {
	p := &shadowPool{
		workers:  o.MaxInFlight,
		interval: o.SampleInterval,
		queue:    make(chan *shadowJob, o.QueueLen),
		run:      run,
		log:      o.Logger,
		metrics:  m,
		zero:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		early:    make(chan struct{}, 1),
		failLog:  rate.Sometimes{First: 1, Interval: shadowFailLogInterval},
		recent:   make([]ShadowRecord, 0, o.Recent),
		lat:      make([]time.Duration, 0, shadowLatencyWindow),
		changed:  time.Now(),
	}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	p.every.Store(1)
	p.ctx, p.stop = context.WithCancel(context.Background())
	m.setRate(1)
	return p
}

// sample counts one decision and reports whether the sample takes it,
// with the rate in effect: every k-th decision when the rate is 1/k.
func (p *shadowPool) sample() (bool, float64) {
	k := p.every.Load()
	n := p.n.Add(1)
	if k <= 1 {
		return true, 1
	}
	ask := n%uint64(k) == 0
	if !ask {
		p.counts[resultIndex(ShadowSampledOut)].Add(1)
	}
	return ask, 1 / float64(k)
}

// begin counts a job begun; false once the pool is closing.
func (p *shadowPool) begin() bool {
	p.pending.Add(1)
	if p.closed.Load() {
		p.end()
		return false
	}
	return true
}

// end counts a job done.
func (p *shadowPool) end() {
	if p.pending.Add(-1) == 0 && p.closed.Load() {
		select {
		case p.zero <- struct{}{}:
		default:
		}
	}
}

// enqueue hands j to the workers, starting them with the first job;
// false (counted as a drop) when the queue is full. It never blocks.
func (p *shadowPool) enqueue(j *shadowJob) bool {
	p.start.Do(p.startWorkers)
	select {
	case p.queue <- j:
		return true
	default:
	}
	p.dropped.Add(1)
	p.counts[resultIndex(ShadowDropped)].Add(1)
	select {
	case p.early <- struct{}{}:
	default:
	}
	return false
}

func (p *shadowPool) startWorkers() {
	p.wg.Add(p.workers + 1)
	for range p.workers {
		go p.work()
	}
	go p.control()
}

func (p *shadowPool) work() {
	defer p.wg.Done()
	for {
		select {
		case j := <-p.queue:
			p.running.Add(1)
			p.run(j)
			p.running.Add(-1)
		case <-p.quit:
			return
		}
	}
}

// closing begins close: no job begins from now on, and the running and
// queued ones end (the context cancelled: a queued job is failed without
// being asked).
func (p *shadowPool) closing() {
	p.closed.Store(true)
	p.stop()
}

// close stops the pool (closing, if not yet): it waits for every job
// begun to end, then for the workers to exit.
func (p *shadowPool) close() {
	p.closing()
	for p.pending.Load() != 0 {
		<-p.zero
	}
	close(p.quit)
	p.wg.Wait()
}

// finished records a job a worker ran: its time for the controller, its
// outcome in the view, and a rate-limited warning when it failed.
func (p *shadowPool) finished(j *shadowJob) {
	out := &j.out
	if out.Elapsed > 0 {
		p.done.Add(1)
		p.busy.Add(int64(out.Elapsed))
	}
	if i := resultIndex(out.Result); i >= 0 {
		p.counts[i].Add(1)
	}
	rec := ShadowRecord{
		At: time.Now().UTC(), RequestID: cut(out.RequestID), Role: string(out.Role), Policy: out.Policy, Shadow: out.Shadow,
		LiveWorker: uint64(out.LiveWorker), LiveDPRank: out.LiveDPRank, LiveWorkerName: j.liveName,
		Result: string(out.Result), ElapsedUS: float64(out.Elapsed) / 1e3,
	}
	if out.Result == ShadowAgree || out.Result == ShadowDisagree {
		w := uint64(out.Worker)
		rec.ShadowWorker, rec.ShadowDPRank, rec.ShadowWorkerName = &w, out.DPRank, j.shadowName
	}
	if out.Err != nil {
		rec.Error = cut(out.Err.Error())
	}
	p.mu.Lock()
	if len(p.recent) < cap(p.recent) {
		p.recent = append(p.recent, rec)
	} else if cap(p.recent) > 0 {
		p.recent[p.next] = rec
	}
	if cap(p.recent) > 0 {
		p.next = (p.next + 1) % cap(p.recent)
	}
	if out.Elapsed > 0 {
		if len(p.lat) < cap(p.lat) {
			p.lat = append(p.lat, out.Elapsed)
		} else {
			p.lat[p.latNext] = out.Elapsed
		}
		p.latNext = (p.latNext + 1) % cap(p.lat)
	}
	p.mu.Unlock()
	if out.Result == ShadowFailed && p.ctx.Err() == nil {
		n := p.failures.Add(1)
		log := false
		p.failLog.Do(func() { log = true })
		if log { // outside Sometimes' lock: a log write may block
			p.log.Warn("shadow decision failed; live decisions are unaffected (the shadow is never acted on)",
				"shadow", out.Shadow, "policy", out.Policy, "role", string(out.Role), "shadow_failures", n, "error", rec.Error)
		}
	}
}

// control adjusts the sample rate every interval, or earlier (after a
// tenth of it) when the queue dropped a decision.
func (p *shadowPool) control() {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	last := p.reading(time.Now())
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		case <-p.early:
			if time.Since(last.at) < p.interval/10 {
				continue // a later drop or the tick adjusts
			}
		}
		now := p.reading(time.Now())
		p.adjust(last, now)
		last = now
	}
}

// shadowReading is the pool's counters at one instant.
type shadowReading struct {
	at                  time.Time
	n                   uint64
	done, busy, dropped int64
	running, queued     int
}

func (p *shadowPool) reading(at time.Time) shadowReading {
	return shadowReading{at: at, n: p.n.Load(), done: p.done.Load(), busy: p.busy.Load(), dropped: p.dropped.Load(),
		running: int(p.running.Load()), queued: len(p.queue)}
}

// adjust sets the sample rate from the interval between two readings.
// The shadow is overloaded when the queue dropped decisions or its
// backlog grew past a quarter of QueueLen: then the capacity is what the
// workers completed per second, and k becomes the smallest that keeps
// the asked rate (arrivals / k) within shadowHeadroom of it, at least
// k+1 (one more in 2^20 decisions when nothing completed). Otherwise,
// while sampling with at most an eighth of QueueLen waiting, the
// workers' occupancy u (their summed decision time over workers x the
// interval) says how much more they could take: k becomes k*u /
// shadowHeadroom, at least half of k (the rate at most doubles per
// adjustment), and only when that is a quarter below k, so that noise
// does not flap the rate. The evidence is the queue's, not a model: a
// shadow whose decisions keep up is never sampled.
func (p *shadowPool) adjust(a, b shadowReading) {
	dt := b.at.Sub(a.at).Seconds()
	arrivals := b.n - a.n
	if dt <= 0 || arrivals == 0 {
		return
	}
	completions, busy, drops := b.done-a.done, b.busy-a.busy, b.dropped-a.dropped
	lambda := float64(arrivals) / dt
	mu := float64(completions) / dt
	capQ := cap(p.queue)
	k := p.every.Load()
	want := k
	overloaded := drops > 0 || b.queued > capQ/4 && b.queued > a.queued
	switch {
	case overloaded && completions == 0:
		want = max(2*k, int64(math.Ceil(float64(arrivals)/shadowHeadroom)))
	case overloaded:
		want = max(k+1, int64(math.Ceil(lambda/(shadowHeadroom*mu))))
	case k > 1 && b.queued <= capQ/8:
		u := float64(busy) / (float64(p.workers) * dt * 1e9)
		want = max((k+1)/2, int64(math.Ceil(float64(k)*u/shadowHeadroom)))
		if want*4 > k*3 {
			want = k
		}
	}
	want = min(max(want, 1), maxShadowEvery)
	p.mu.Lock()
	p.capacity, p.arrival = mu, lambda
	if want != k {
		p.changed = b.at
	}
	p.mu.Unlock()
	if want == k {
		return
	}
	p.every.Store(want)
	p.metrics.setRate(1 / float64(want))
	if want == 1 {
		p.log.Info("shadow decisions no longer sampled: the shadow keeps up with every decision",
			"sample_rate", 1.0, "decisions_per_second", round(lambda), "shadow_completed_per_second", round(mu))
		return
	}
	p.log.Warn("shadow decisions sampled: the shadow cannot keep up with every decision",
		"sample_rate", 1/float64(want), "every", want, "decisions_per_second", round(lambda),
		"shadow_completed_per_second", round(mu), "queued", b.queued, "dropped", drops)
}

func round(f float64) float64 { return math.Round(f*10) / 10 }

// cut bounds s to maxShadowText bytes of valid UTF-8.
func cut(s string) string {
	if len(s) <= maxShadowText && utf8.ValidString(s) {
		return s
	}
	s = toValidUTF8(s)
	if len(s) <= maxShadowText {
		return s
	}
	i := maxShadowText
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

func toValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, min(len(s), 4*maxShadowText))
	for _, r := range s {
		b = utf8.AppendRune(b, r)
		if len(b) > maxShadowText {
			break
		}
	}
	return string(b)
}

// ShadowView is the state of a Router's shadow decisions
// (Router.ShadowView; `router serve`'s GET /debug/shadow on
// --debug-listen).
type ShadowView struct {
	// Mode is "async" (serve: queue, workers, sampling) or "inline"
	// (replay).
	Mode string `json:"mode"`
	// Workers is ShadowOptions.MaxInFlight, Running how many run now;
	// QueueLen the queue's bound, Queued how many wait.
	Workers  int `json:"workers"`
	Running  int `json:"running"`
	QueueLen int `json:"queue_len"`
	Queued   int `json:"queued"`
	// SampleRate is the share of decisions asked now, 1/SampleEvery;
	// SampleSince when it last changed (the Router's start when never).
	SampleRate  float64   `json:"sample_rate"`
	SampleEvery int64     `json:"sample_every"`
	SampleSince time.Time `json:"sample_since"`
	// CompletedPerSecond and DecisionsPerSecond are the shadow decisions
	// the workers completed per second and the arrival rate of decisions
	// over the last adjustment's interval (0 before the first).
	CompletedPerSecond float64 `json:"completed_per_second"`
	DecisionsPerSecond float64 `json:"decisions_per_second"`
	// Decisions counts every decision of a policy with a shadow since
	// the start; Results splits it by ShadowResult (the ones that ran,
	// ShadowDropped and ShadowSampledOut; the running and queued ones
	// not yet).
	Decisions int64            `json:"decisions"`
	Results   map[string]int64 `json:"results"`
	// Agreement is agree / (agree + disagree) since the start;
	// RecentAgreement the same over Recent; -1 without such decisions.
	Agreement       float64 `json:"agreement"`
	RecentAgreement float64 `json:"recent_agreement"`
	// Failures counts ShadowFailed since the start, the Router's closing
	// aside.
	Failures int64 `json:"failures"`
	// Latency is the quantiles of the last (at most 1024) shadow
	// decisions' times.
	Latency ShadowLatency `json:"latency"`
	// Recent is the last ShadowOptions.Recent shadow decisions that
	// ran, newest first.
	Recent []ShadowRecord `json:"recent"`
}

// ShadowLatency is quantiles of shadow decision times, in microseconds.
type ShadowLatency struct {
	Samples int     `json:"samples"`
	P50us   float64 `json:"p50_us"`
	P90us   float64 `json:"p90_us"`
	P99us   float64 `json:"p99_us"`
	MaxUS   float64 `json:"max_us"`
}

// ShadowRecord is one shadow decision in ShadowView.Recent: where the
// live policy sent the request and where the shadow would have.
type ShadowRecord struct {
	At        time.Time `json:"at"`
	RequestID string    `json:"request_id"` // shared.Request.ID, at most 256 bytes
	Role      string    `json:"role"`
	Policy    string    `json:"policy"`
	Shadow    string    `json:"shadow"`
	// LiveWorker is the live decision's worker (fleet.Worker.ID, DPRank,
	// Name).
	LiveWorker     uint64 `json:"live_worker"`
	LiveDPRank     uint32 `json:"live_dp_rank"`
	LiveWorkerName string `json:"live_worker_name"`
	// ShadowWorker is the shadow's pick; absent when it picked none.
	ShadowWorker     *uint64 `json:"shadow_worker,omitempty"`
	ShadowDPRank     uint32  `json:"shadow_dp_rank,omitempty"`
	ShadowWorkerName string  `json:"shadow_worker_name,omitempty"`
	// Result is the ShadowResult; ElapsedUS the decision's time in
	// microseconds; Error the shadow's error (at most 256 bytes).
	Result    string  `json:"result"`
	ElapsedUS float64 `json:"elapsed_us"`
	Error     string  `json:"error,omitempty"`
}

// ShadowView returns the state of the Router's shadow decisions. The
// Inline mode keeps no view: only Mode is set. It copies under a brief
// lock and sorts outside it: O(Recent + 1024 log 1024).
func (r *Router) ShadowView() ShadowView {
	if r.shadow.Inline {
		return ShadowView{Mode: "inline"}
	}
	p := r.shadowPool
	v := ShadowView{Mode: "async", Workers: p.workers, Running: int(p.running.Load()), QueueLen: cap(p.queue), Queued: len(p.queue),
		Results: make(map[string]int64, len(shadowResults)), Failures: p.failures.Load()}
	v.SampleEvery = p.every.Load()
	v.SampleRate = 1 / float64(v.SampleEvery)
	for i, res := range shadowResults {
		n := p.counts[i].Load()
		v.Results[string(res)] = n
		v.Decisions += n
	}
	v.Agreement = share(v.Results[string(ShadowAgree)], v.Results[string(ShadowDisagree)])
	p.mu.Lock()
	v.SampleSince, v.CompletedPerSecond, v.DecisionsPerSecond = p.changed.UTC(), round(p.capacity), round(p.arrival)
	lat := slices.Clone(p.lat)
	v.Recent = make([]ShadowRecord, 0, len(p.recent))
	for i := range len(p.recent) {
		// newest first: the one before next, backwards
		v.Recent = append(v.Recent, p.recent[(p.next-1-i+2*len(p.recent))%len(p.recent)])
	}
	p.mu.Unlock()
	var agree, disagree int64
	for _, rec := range v.Recent {
		switch ShadowResult(rec.Result) {
		case ShadowAgree:
			agree++
		case ShadowDisagree:
			disagree++
		}
	}
	v.RecentAgreement = share(agree, disagree)
	if len(lat) > 0 {
		slices.Sort(lat)
		q := func(f float64) float64 {
			return float64(lat[min(len(lat)-1, int(math.Ceil(f*float64(len(lat))))-1)]) / 1e3
		}
		v.Latency = ShadowLatency{Samples: len(lat), P50us: q(0.5), P90us: q(0.9), P99us: q(0.99), MaxUS: float64(lat[len(lat)-1]) / 1e3}
	}
	return v
}

func share(a, b int64) float64 {
	if a+b == 0 {
		return -1
	}
	return float64(a) / float64(a+b)
}

// shadowMetrics are the Router's shadow series (Options.Registerer).
type shadowMetrics struct {
	decisions *prometheus.CounterVec   // role, policy, shadow, result
	seconds   *prometheus.HistogramVec // role, shadow
	rate      prometheus.Gauge
}

// shadowBuckets span 1us to about 4s: a built-in shadow takes
// microseconds, a plugin call milliseconds up to its call_timeout.
var shadowBuckets = prometheus.ExponentialBuckets(1e-6, 4, 12)

// registerShadow registers switchyard_shadow_decisions_total,
// switchyard_shadow_decision_seconds and switchyard_shadow_sample_rate,
// or takes the ones a previous Router registered on reg.
func registerShadow(reg prometheus.Registerer) (*shadowMetrics, error) {
	m := &shadowMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_shadow_decisions_total",
			Help: "Decisions of policies with a shadow by role, live policy, shadow policy and result: agree (the shadow picked the live worker), disagree, failed (error, call_timeout, panic), none (the shadow's filters kept no candidate), sampled_out (not in the sample: see switchyard_shadow_sample_rate) or dropped (in the sample, but the shadow's queue was full).",
		}, []string{"role", "policy", "shadow", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_shadow_decision_seconds",
			Help:    "Wall time of each shadow decision that ran (not the dropped or sampled-out ones), off the live request's path, by role and shadow policy.",
			Buckets: shadowBuckets,
		}, []string{"role", "shadow"}),
	}
	m.rate = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "switchyard_shadow_sample_rate",
		Help: "Share of the decisions of policies with a shadow that the shadow is asked about (1/k: every k-th); below 1 when the shadow cannot keep up with every decision (its queue drops or grows). 1 in replay (inline).",
	})
	if err := reg.Register(m.rate); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.rate, _ = are.ExistingCollector.(prometheus.Gauge); m.rate == nil {
			return nil, err
		}
	}
	if err := reg.Register(m.decisions); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.decisions, _ = are.ExistingCollector.(*prometheus.CounterVec); m.decisions == nil {
			return nil, err
		}
	}
	if err := reg.Register(m.seconds); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		if m.seconds, _ = are.ExistingCollector.(*prometheus.HistogramVec); m.seconds == nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *shadowMetrics) observe(out ShadowOutcome) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(string(out.Role), out.Policy, out.Shadow, string(out.Result)).Inc()
	if out.Result != ShadowDropped && out.Result != ShadowSampledOut {
		m.seconds.WithLabelValues(string(out.Role), out.Shadow).Observe(out.Elapsed.Seconds())
	}
}

// setRate sets switchyard_shadow_sample_rate.
func (m *shadowMetrics) setRate(r float64) {
	if m != nil {
		m.rate.Set(r)
	}
}
