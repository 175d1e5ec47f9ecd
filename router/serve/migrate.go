package serve

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/migrate"
)

// DefaultStallTimeout is how long a streamed answer may send no byte
// before the router takes its engine for hung and migrates the request
// (Options.StallTimeout): 30 s. An engine streams a token every few tens
// of milliseconds once the request runs; the wait for the first token of
// a long prompt queued behind others is the longest silence of a healthy
// engine, and stays well below this on a fleet the router balances.
const DefaultStallTimeout = 30 * time.Second

// DefaultWorkerDrainGrace is how long a request in flight on a worker
// that left the fleet (drained, removed from the configuration, not
// ready) may run there before it migrates (Options.WorkerDrainGrace):
// 20 s, under Kubernetes' default termination grace period of 30 s, so
// that a pod's requests move before the kubelet's SIGKILL cuts them.
const DefaultWorkerDrainGrace = 20 * time.Second

// errStalled is the cause an attempt's context is cancelled with when
// its answer stalled; errDrained when its worker left and the grace
// ended.
var (
	errStalled = errors.New("no byte of the answer for the stall timeout")
	errDrained = errors.New("the worker left the fleet and its drain grace ended")
)

// migration is what the HTTP face keeps to migrate cut streams: the
// policy, the budget of what every stream keeps, the stall timeout and
// the metrics.
type migration struct {
	pol    migrate.Policy
	budget *migrate.Budget
	// stall and grace: Options.StallTimeout and WorkerDrainGrace
	// (negative: never).
	stall, grace time.Duration
	// cuts counts switchyard_migrations_total{cause,outcome}; gap
	// observes switchyard_migration_gap_seconds. nil without a registry.
	cuts *prometheus.CounterVec
	gap  prometheus.Histogram
}

// newMigration returns the face's migration state for o, its metrics on
// reg (nil: none).
func newMigration(o Options, reg *prometheus.Registry) (*migration, error) {
	pol := migrate.DefaultPolicy()
	switch {
	case o.MigrationLimit < 0:
		pol.Limit = 0
	case o.MigrationLimit > 0:
		pol.Limit = o.MigrationLimit
	}
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	m := &migration{pol: pol, budget: migrate.NewBudget(pol.TotalBytes), stall: o.StallTimeout, grace: o.WorkerDrainGrace}
	if m.stall == 0 {
		m.stall = DefaultStallTimeout
	}
	if m.grace == 0 {
		m.grace = DefaultWorkerDrainGrace
	}
	if reg == nil {
		return m, nil
	}
	cuts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_migrations_total",
		Help: "Streamed answers cut mid-answer (the engine's connection reset, the stream ended without its terminator, an engine error event, a stall), by cause and by what became of the request: migrated (continued on another worker), finished (it had ended: only its terminator was added), over_limit, too_long, not_migratable, no_worker, refused (the continuation's engine refused it).",
	}, []string{"cause", "outcome"})
	gap := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "switchyard_migration_gap_seconds",
		Help:    "Time from a stream's cut to the first event of its continuation reaching the client.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	kept := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_migration_kept_bytes",
		Help: "Bytes the router keeps of the answers in flight to continue them (text and token ids), at most the migration budget.",
	}, func() float64 { return float64(m.budget.Used()) })
	// A second face on one runtime's registry shares the first's.
	var err error
	if cuts, err = register(reg, cuts); err != nil {
		return nil, err
	}
	if gap, err = register(reg, gap); err != nil {
		return nil, err
	}
	if _, err = register(reg, kept); err != nil {
		return nil, err
	}
	for _, c := range migrate.Causes {
		for _, o := range migrate.Outcomes {
			cuts.WithLabelValues(string(c), string(o))
		}
	}
	m.cuts, m.gap = cuts, gap
	return m, nil
}

// register registers c on reg, or returns the collector registered
// already under its name.
func register[C prometheus.Collector](reg *prometheus.Registry, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if e, ok := are.ExistingCollector.(C); ok {
			return e, nil
		}
	}
	return c, err
}

func (m *migration) count(c migrate.Cause, o migrate.Outcome) {
	if m.cuts != nil {
		m.cuts.WithLabelValues(string(c), string(o)).Inc()
	}
}

// migratable reports whether ex's answer is read by a migrate.Stream: a
// streamed chat or completions request.
func migratable(ex *exchange) (migrate.API, bool) {
	if !ex.Stream {
		return 0, false
	}
	switch ex.API {
	case live.APIChat:
		return migrate.Chat, true
	case live.APICompletions:
		return migrate.Completions, true
	}
	return 0, false
}

// isSSE reports whether resp is an event stream.
func isSSE(resp *http.Response) bool {
	t, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return err == nil && t == "text/event-stream"
}

// attempt is one engine answer of a migrating stream: its context (a
// stall cancels it), its stall timer and its meter.
type attempt struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	stall  time.Duration
	grace  time.Duration
	meter  live.Meter
}

// newAttempt starts an attempt on worker w: its context ends with
// errDrained once w has left the fleet and the drain grace passed, and,
// when stall, with errStalled after the stall timeout without a byte
// (alive).
func (s *Server) newAttempt(ex *exchange, w *fleet.Worker, stall bool) *attempt {
	ctx, cancel := context.WithCancelCause(ex.ctx)
	a := &attempt{ctx: ctx, cancel: cancel, grace: s.mig.grace}
	if stall && s.mig.stall > 0 {
		a.stall = s.mig.stall
		a.timer = time.AfterFunc(a.stall, func() { cancel(errStalled) })
	}
	if left := w.Left(); left != nil && s.mig.grace >= 0 {
		go watchLeave(ctx, cancel, left, s.mig.grace)
	}
	return a
}

// watchLeave cancels an attempt's context with errDrained when its
// worker has left (left is closed) and grace has passed since, unless
// the attempt ends first.
func watchLeave(ctx context.Context, cancel context.CancelCauseFunc, left <-chan struct{}, grace time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-left:
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
		cancel(errDrained)
	}
}

// alive records a byte of the answer: the stall timer starts again.
func (a *attempt) alive() {
	if a.timer != nil {
		a.timer.Reset(a.stall)
	}
}

func (a *attempt) stop() {
	if a.timer != nil {
		a.timer.Stop()
	}
	a.cancel(nil)
}

// migrating sends a streamed chat or completions request to its
// placement d and passes the answer through event by event
// (migrate.Stream); when the answer is cut (the connection fails, the
// stream ends without "data: [DONE]", the engine sends a server error
// event, or no byte comes for the stall timeout) it continues the
// generation on another worker (migrate.Continuation, placed again
// through h: Handle.Retry, the cut worker excluded), up to the
// migration limit, so the client reads one stream with every token once;
// a request that cannot continue gets an error event and the
// terminator. Failures before the first attempt's answer are the hop's
// retries (sendFunc).
func (s *Server) migrating(ex *exchange, h *admission.Handle, d router.Decision, api migrate.API) (int, bool, string) {
	body, st := migrate.Begin(ex.body, api, s.mig.pol, s.mig.budget)
	defer st.Close()
	w := d.Worker
	a := s.newAttempt(ex, w, true)
	defer func() { a.stop() }()
	resp, code, retry, why := s.send(a.ctx, ex, h, w, body)
	if resp == nil {
		return code, retry, why
	}
	if resp.StatusCode/100 != 2 || !isSSE(resp) {
		s.answerStart(ex, w, resp)
		defer func() { _ = resp.Body.Close() }()
		if a.timer != nil {
			a.timer.Stop()
		}
		return s.relay(ex, h, w, resp)
	}
	ex.rewrites = true
	s.answerStart(ex, w, resp)
	rc := http.NewResponseController(ex.w)
	a.meter = s.rt.Meter(h, d, &ex.Request, false, -1)
	return s.follow(ex, h, d, a, resp, st, rc, body), false, ""
}

// follow passes a migrating stream's answer resp (attempt a, placement
// d) to the client, and continues it on other workers when it is cut
// (migrating). It ends h on every path and returns the code the request
// is counted under.
func (s *Server) follow(ex *exchange, h *admission.Handle, d router.Decision, a *attempt, resp *http.Response, st *migrate.Stream, rc *http.ResponseController, body []byte) int {
	w := d.Worker
	var cutAt time.Time
	migrations := 0
	for {
		r := s.pump(ex, h, a, resp, st, rc, &cutAt)
		_ = resp.Body.Close()
		if r.cause == "" {
			return r.code
		}
		// The answer was cut: continue it elsewhere, or end it well.
		cutAt = time.Now()
		s.workers.ReportFailure(w.Name)
		s.log.Warn("worker cut the answer", "worker", w.Name, "request_id", ex.ID, "cause", string(r.cause),
			"tokens", st.Tokens(), "detail", r.detail)
		for {
			next, outcome := s.continuation(st, body, migrations)
			switch outcome {
			case migrate.Finished:
				s.mig.count(r.cause, outcome)
				s.rt.End(h, admission.Completed(int64(ex.Tokens+st.Tokens())))
				return s.writeEnd(ex, rc, st.EndEvents(ex.Model, time.Now().Unix()), http.StatusOK)
			case migrate.Migrated:
			default:
				s.mig.count(r.cause, outcome)
				s.rt.End(h, admission.Aborted("worker cut the answer: "+string(r.cause)))
				ev := migrate.Event(r.event)
				if r.event == nil {
					ev = migrate.ErrorEvent("the worker failed mid-answer and the answer could not be continued: "+
						cutReason(outcome, st), live.TypeServer, "worker_failed")
				}
				return s.writeEnd(ex, rc, migrate.WithDone(ev), http.StatusBadGateway)
			}
			// Placed again through the same lifecycle, the cut worker
			// excluded.
			var code int
			d, code = s.replace(ex, h, migrations+1, st.Tokens(), "worker cut the answer: "+string(r.cause), w)
			if code == codeNoWorker {
				s.mig.count(r.cause, migrate.NoWorker)
				ev := migrate.ErrorEvent("the worker failed mid-answer and no other worker could continue it", live.TypeServer, "worker_failed")
				return s.writeEnd(ex, rc, migrate.WithDone(ev), http.StatusBadGateway)
			}
			if code == http.StatusGatewayTimeout {
				return s.writeEnd(ex, rc, migrate.WithDone(migrate.ErrorEvent("the request timed out", live.TypeServer, "timeout")), code)
			}
			if code != 0 {
				return code // the client left
			}
			migrations++
			a.stop()
			w = d.Worker
			a = s.newAttempt(ex, w, true)
			defer a.stop()
			var retry bool
			resp, code, retry, _ = s.send(a.ctx, ex, h, w, next)
			if resp == nil && !retry {
				// The client left or the request timed out (h has ended).
				if code == http.StatusGatewayTimeout {
					return s.writeEnd(ex, rc, migrate.WithDone(migrate.ErrorEvent("the request timed out", live.TypeServer, "timeout")), code)
				}
				return code
			}
			if resp == nil {
				// The continuation's worker failed before answering: one
				// more cut of the same cause.
				s.log.Warn("worker failed before continuing the answer", "worker", w.Name, "request_id", ex.ID)
				continue
			}
			if resp.StatusCode/100 != 2 || !isSSE(resp) {
				// The engine's own answer (the context window, for one):
				// its error reaches the client in the stream.
				s.mig.count(r.cause, migrate.Refused)
				ev := engineError(resp)
				_ = resp.Body.Close()
				s.rt.End(h, admission.Aborted("the continuation was refused"))
				return s.writeEnd(ex, rc, migrate.WithDone(ev), resp.StatusCode)
			}
			break
		}
		s.mig.count(r.cause, migrate.Migrated)
		st.Continue()
		a.meter = s.rt.Meter(h, d, &ex.Request, false, -1)
		a.meter.Continued()
	}
}

// codeNoWorker is replace's code when no worker can take the
// continuation (nothing was answered: the stream is open).
const codeNoWorker = -1

// replace places the migrating request h again as its attempt n after
// worker w cut it (why), with tokens generated so far. It returns the placement, or codeNoWorker when no
// other worker can take it, or the code the request is counted under
// when the client left or the request timed out (h has ended then).
func (s *Server) replace(ex *exchange, h *admission.Handle, n, tokens int, why string, w *fleet.Worker) (router.Decision, int) {
	suffix := "#m" + strconv.Itoa(n)
	// The continuation's prompt is the prompt and the tokens so far: its
	// engine prefills them all again (replay books it so too).
	if req := h.Request(); req != nil {
		req.PromptTokens = max(ex.Tokens, 1) + tokens
	}
	err := h.Retry(ex.ctx, ex.ID+suffix, why, w.ID)
	if errors.Is(err, admission.ErrDuplicateRequest) {
		err = h.Retry(ex.ctx, s.rt.NewID()+suffix, why, w.ID)
	}
	var d router.Decision
	if err == nil {
		d, err = h.Wait(ex.ctx)
	}
	switch {
	case err == nil:
		return d, 0
	case ex.r.Context().Err() != nil:
		s.rt.End(h, admission.Aborted("client disconnected"))
		return d, live.CodeClientGone
	case ex.ctx.Err() != nil:
		s.rt.End(h, admission.Aborted("request timeout"))
		return d, http.StatusGatewayTimeout
	default:
		s.rt.End(h, admission.Aborted(why))
		s.log.Warn("no worker to continue a cut answer", "request_id", ex.ID, "error", err)
		return d, codeNoWorker
	}
}

// continuation decides what becomes of a cut stream: Migrated with the
// continuation's body, Finished (it had ended, or used up max_tokens),
// or why it cannot continue.
func (s *Server) continuation(st *migrate.Stream, body []byte, migrations int) ([]byte, migrate.Outcome) {
	if st.Finished() {
		return nil, migrate.Finished
	}
	if ok, o := st.Migratable(); !ok {
		return nil, o
	}
	if ok, o := s.mig.pol.Decide(migrations, st.Tokens()); !ok {
		return nil, o
	}
	next, err := migrate.Continuation(body, st)
	switch {
	case errors.Is(err, migrate.ErrNothingLeft):
		st.UsedUp()
		return nil, migrate.Finished
	case err != nil:
		st.Refuse(err.Error())
		return nil, migrate.NotMigratable
	}
	return next, migrate.Migrated
}

// cutReason words why a cut stream was not continued.
func cutReason(o migrate.Outcome, st *migrate.Stream) string {
	if r := st.Reason(); r != "" {
		return r
	}
	switch o {
	case migrate.OverLimit:
		return "it was migrated as many times as the migration limit allows"
	case migrate.TooLong:
		return "the answer so far is over the migration bounds"
	}
	if r := st.Reason(); r != "" {
		return r
	}
	return string(o)
}

// pumpResult is how an attempt's answer ended: cause is "" when the
// request ended (code is its code; h has ended), else the cut's cause,
// its detail, and the engine's error event when it sent one.
type pumpResult struct {
	code   int
	cause  migrate.Cause
	detail string
	event  []byte
}

// pump passes the attempt's answer resp to the client event by event
// until it ends or is cut. cutAt, when set, is when the previous attempt
// was cut: the first event passed observes the gap and clears it.
func (s *Server) pump(ex *exchange, h *admission.Handle, a *attempt, resp *http.Response, st *migrate.Stream, rc *http.ResponseController, cutAt *time.Time) pumpResult {
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	var out []byte
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			a.alive()
			a.meter.FirstByte()
			a.meter.Read(buf[:n])
			var cut *migrate.Cut
			out, cut = st.Feed(buf[:n], out[:0])
			if len(out) > 0 {
				if !cutAt.IsZero() {
					if s.mig.gap != nil {
						s.mig.gap.Observe(time.Since(*cutAt).Seconds())
					}
					*cutAt = time.Time{}
				}
				if _, werr := ex.w.Write(out); werr != nil {
					s.rt.End(h, admission.Aborted("client disconnected"))
					return pumpResult{code: live.CodeClientGone}
				}
				if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
					s.rt.End(h, admission.Aborted("client disconnected"))
					return pumpResult{code: live.CodeClientGone}
				}
			}
			if cut != nil {
				return pumpResult{cause: cut.Cause, detail: "the engine sent an error event", event: cut.Event}
			}
		}
		switch {
		case rerr == nil:
			continue
		case rerr == io.EOF && st.Done():
			s.rt.End(h, admission.Completed(a.meter.Done()))
			return pumpResult{code: resp.StatusCode}
		case rerr == io.EOF:
			return pumpResult{cause: migrate.CauseEOF, detail: "the stream ended without data: [DONE]"}
		case ex.r.Context().Err() != nil:
			s.rt.End(h, admission.Aborted("client disconnected"))
			return pumpResult{code: live.CodeClientGone}
		case ex.ctx.Err() != nil:
			s.rt.End(h, admission.Aborted("request timeout"))
			_, _ = ex.w.Write(migrate.WithDone(migrate.ErrorEvent("the request timed out", live.TypeServer, "timeout")))
			_ = rc.Flush()
			return pumpResult{code: http.StatusGatewayTimeout}
		case errors.Is(context.Cause(a.ctx), errStalled):
			return pumpResult{cause: migrate.CauseStall, detail: "no byte for " + a.stall.String()}
		case errors.Is(context.Cause(a.ctx), errDrained):
			return pumpResult{cause: migrate.CauseDrain, detail: "the worker left the fleet " + a.grace.String() + " ago"}
		default:
			return pumpResult{cause: migrate.CauseReset, detail: rerr.Error()}
		}
	}
}

// writeEnd writes the stream's last events and returns code.
func (s *Server) writeEnd(ex *exchange, rc *http.ResponseController, events []byte, code int) int {
	if len(events) > 0 {
		if _, err := ex.w.Write(events); err != nil {
			return live.CodeClientGone
		}
		_ = rc.Flush()
	}
	return code
}

// maxEngineError bounds the error body of a refused continuation that is
// passed to the client: 64 KiB.
const maxEngineError = 64 << 10

// engineError returns the error event carrying a refused continuation's
// answer: its JSON body when it is one, else the router's words with its
// status.
func engineError(resp *http.Response) []byte {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxEngineError))
	if ev := migrate.EngineErrorEvent(b); ev != nil {
		return ev
	}
	return migrate.ErrorEvent("the worker refused the answer's continuation: "+resp.Status, live.TypeServer, "worker_failed")
}
