package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/migrate"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// exchange is one client request across its attempts: the runtime's
// live.Request and what the HTTP face keeps of it.
type exchange struct {
	live.Request
	w   http.ResponseWriter
	r   *http.Request
	ctx context.Context // the client's, bounded by the request timeout
	// path is the client's path as it sent it (escaped), query the
	// query string: the engine is asked the same.
	path, query string
	body        []byte
	// labelSet: Request.Label was set, the body parsed.
	labelSet bool
	// pre and preErr: what was read of the answer before its headers
	// went to the client (passThroughWatched), for relay.
	pre    []byte
	preErr error
	// rewrites: the answer is a stream the router rewrites
	// (migrate.Stream): the engine's Content-Length does not hold.
	rewrites bool
	// sent: the answer's headers went to the client (answerStart); a
	// migrating stream's later attempts answer their errors in the stream.
	sent bool
	// watch links a non-streamed attempt into the drain watch
	// (drainwatch.go) and holds ex.ctx's cancel and deadline.
	watch watchLink
	// abort: the answer failed after its headers were sent; the
	// connection is cut (http.ErrAbortHandler) so the client sees an
	// error rather than a clean end of a truncated answer.
	abort bool
}

// complete handles a POST request of schema api (live.Endpoints, and the
// pass-through's live.APIOther): generation (chat, completions,
// Responses, Messages), pooling and scoring, the engine utilities.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, api live.API) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	deadline := time.Now().Add(s.timeout)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	ex := &exchange{w: w, r: r, ctx: ctx, path: r.URL.EscapedPath(), query: r.URL.RawQuery}
	ex.watch.shard, ex.watch.cancel, ex.watch.deadline = -1, cancel, deadline
	defer func() { ex.watch.cancel() }() // renew may replace the context
	ex.Start = time.Now()
	ex.ID = r.Header.Get("X-Request-Id")
	if ex.ID == "" {
		ex.ID = s.rt.NewID()
	}
	w.Header().Set("X-Request-Id", ex.ID)
	code := s.exchange(ex, api)
	if code == live.CodeClientGone {
		// Nothing more can reach the client; ending the handler normally
		// would let net/http answer a client that only half-closed with an
		// empty 200, or end a cut stream with a clean chunked terminator.
		ex.abort = true
	}
	label := ex.Label
	if !ex.labelSet {
		label = s.rt.ModelLabel(ex.Model)
	}
	s.rt.CountRequest(label, code, ex.Start)
	if ex.abort {
		panic(http.ErrAbortHandler)
	}
}

// bodyReadTimeout bounds reading a request body (or the request timeout,
// when shorter): a client that declares more than it sends does not hold
// its handler for the whole request timeout. It bounds the whole body,
// not each read, so a client trickling its body is cut as one that
// stalls is; and as a body is held only as it arrives (bodyFirstStep),
// holding budget for this long costs a client the bytes it holds.
const bodyReadTimeout = time.Minute

// bodyLinger is how long, after a body was refused or failed (its answer
// carries Connection: close), net/http may still read what already
// arrived of it before closing the connection (at most 256 KiB, its
// maxPostHandlerReadBytes): closing a socket with unread bytes resets it,
// and a reset can destroy the answer before the client reads it. A
// client that keeps sending holds its connection no longer than this.
const bodyLinger = 250 * time.Millisecond

// exchange runs the request and returns the code it is counted under.
func (s *Server) exchange(ex *exchange, api live.API) int {
	if ex.r.ContentLength > s.maxBody {
		// Refused before a byte is read (and before a 100 Continue).
		s.fail(ex, http.StatusRequestEntityTooLarge, live.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body of %d bytes exceeds %d bytes", ex.r.ContentLength, s.maxBody))
		return http.StatusRequestEntityTooLarge
	}
	rc := http.NewResponseController(ex.w)
	bodyTimeout := min(s.timeout, bodyReadTimeout)
	_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
	// Bodies held at once are bounded (MaxBodyBytesInFlight,
	// MaxBodyBytesPerClient), counting the bytes as they arrive, until the
	// request ends. A declared length that would not fit now is refused
	// before a byte is read (and before a 100 Continue).
	hold := &bodyHold{b: s.bodies, client: clientKey(ex.r.RemoteAddr)}
	defer hold.release()
	if declared := ex.r.ContentLength; declared > 0 {
		if bound := s.bodies.fits(hold.client, declared); bound != boundNone {
			return s.bodyFailed(ex, rc, &bodyRefused{bound: bound}, bodyTimeout)
		}
	}
	body, err := readBody(ex.w, ex.r, s.maxBody, hold)
	if err != nil {
		return s.bodyFailed(ex, rc, err, bodyTimeout)
	}
	_ = rc.SetReadDeadline(time.Time{})
	ex.body, ex.API = body, api
	if !api.Generates() {
		return s.exchangePool(ex)
	}
	req, err := live.ParseRequest(body, api)
	var key live.RoutingKey
	if req != nil {
		ex.Model, ex.Stream, key = req.Model, req.Stream, req.Key()
		// The metrics' model label as the request arrives: a model whose
		// workers leave while it is served still counts under its name.
		ex.Label, ex.labelSet = s.rt.ModelLabel(ex.Model), true
	}
	if err != nil {
		msg := err.Error()
		if hint := wrongPathHint(body, api); hint != "" {
			msg = hint
		}
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", msg)
		return http.StatusBadRequest
	}
	ex.MaxTokens = req.MaxTokens
	if ex.SLO, err = live.ParseSLO(ex.r.Header); err != nil {
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	if err := ex.ctx.Err(); err != nil {
		// The client left, or the request timeout passed, while the body
		// was read and parsed: nothing more is done for it.
		return s.admitError(ex, err)
	}
	s.rt.Key(ex.ctx, &ex.Request, key)
	ex.Session = ex.r.Header.Get("X-Session-Id")
	ex.Meta = live.RequestMetadata(ex.r.Header)
	if req.PreviousResponseID != "" {
		return s.followUp(ex, req.PreviousResponseID)
	}
	if s.rt.Disaggregated(ex.Model) {
		return s.disagg(ex)
	}
	return s.hop(ex, hopSpec{hop: admission.Aggregated.Hop(0), tag: "#"},
		func(h *admission.Handle, d router.Decision) (int, bool, string) {
			if api, ok := migratable(ex); ok {
				return s.migrating(ex, h, d, api)
			}
			if !ex.Stream {
				return s.passThroughWatched(ex, h, d.Worker)
			}
			return s.passThrough(ex, h, d.Worker, ex.body)
		})
}

// hopSpec is one hop of a request's path (admission.Path: the same hops
// replay walks) with what serve adds to it.
type hopSpec struct {
	// hop says the hop's role and whether its request carries the
	// prompt's block hashes (not a decode hop's: its KV arrives by
	// transfer, so the prefix index must not record it).
	hop admission.Hop
	// tag goes between the request's id and the attempt number in the
	// admitted request's id ("#"; "#d" for a decode hop, whose request is
	// live while its prefill's is not yet ended).
	tag string
	// workers names the hop's workers in messages ("workers", "prefill
	// workers", "decode workers").
	workers string
	// answer answers an admission error and returns its code; nil:
	// admitError.
	answer func(*exchange, error) int
	// opts narrow the hop's admission (admission.Exclude); noRetry: a
	// worker that fails before answering is not replaced (the hop has one
	// possible worker).
	opts    []admission.Option
	noRetry bool
}

// sendFunc sends one attempt of a hop to its placement and returns the
// code of the answer it gave the client; retry is true when the worker
// failed before answering and nothing was written to the client, with
// why it failed. It ends the handle on every path that does not retry.
type sendFunc func(h *admission.Handle, d router.Decision) (code int, retry bool, why string)

// hop runs one hop of a request (aggregated, prefill or decode): admitted
// once (classified once), sent, and, when its worker fails before
// answering, placed again with that worker excluded (Handle.Retry), up to
// MaxRetries times. The handle ends exactly once, on every path. It
// returns the code the request is counted under.
func (s *Server) hop(ex *exchange, spec hopSpec, send sendFunc) int {
	if spec.workers == "" {
		spec.workers = "workers"
	}
	h, d, code := s.admit(ex, spec)
	if code != 0 {
		return code
	}
	defer s.rt.End(h, admission.Aborted("handler ended"))
	for attempt := 0; ; attempt++ {
		code, retry, why := send(h, d)
		if !retry {
			return code
		}
		if attempt >= s.retries || spec.noRetry {
			s.rt.End(h, admission.Aborted(why))
			s.fail(ex, http.StatusBadGateway, live.TypeServer, "worker_failed",
				fmt.Sprintf("the selected %s failed before answering (%d attempts)", spec.workers, attempt+1))
			return http.StatusBadGateway
		}
		s.log.Debug("retrying on another selection", "request_id", ex.ID, "role", spec.hop.Role, "attempt", attempt+1)
		if d, code = s.retry(ex, spec, h, attempt+1, why, d.Worker.ID); code != 0 {
			return code
		}
	}
}

// admit admits the first attempt of hop spec and waits for its placement
// when every candidate is at capacity. It returns the handle and its
// placement, or the code of the error it answered (the handle has ended
// then).
func (s *Server) admit(ex *exchange, spec hopSpec) (*admission.Handle, router.Decision, int) {
	h, err := s.rt.Admit(ex.ctx, &ex.Request, spec.hop, spec.tag, spec.opts...)
	if err != nil {
		return nil, router.Decision{}, s.answer(ex, spec, err)
	}
	d, code := s.await(ex, spec, h)
	return h, d, code
}

// retry places hop spec's handle again as attempt n after its worker
// failed (why), excluding it, and waits for the new placement; the code of
// the error it answered otherwise (the handle has ended then).
func (s *Server) retry(ex *exchange, spec hopSpec, h *admission.Handle, n int, why string, failed shared.WorkerID) (router.Decision, int) {
	suffix := spec.tag + strconv.Itoa(n)
	err := h.Retry(ex.ctx, ex.ID+suffix, why, failed)
	if errors.Is(err, admission.ErrDuplicateRequest) {
		err = h.Retry(ex.ctx, s.rt.NewID()+suffix, why, failed)
	}
	if err != nil {
		return router.Decision{}, s.answer(ex, spec, err)
	}
	return s.await(ex, spec, h)
}

// await waits for h's placement while it is queued; when the request's
// context ends first it leaves the queue and the client gets 429 (or
// nothing: it left).
func (s *Server) await(ex *exchange, spec hopSpec, h *admission.Handle) (router.Decision, int) {
	d, err := h.Wait(ex.ctx)
	switch {
	case err == nil:
		return d, 0
	case ex.ctx.Err() != nil:
		s.rt.End(h, admission.Aborted(ctxReason(ex)))
		if ex.r.Context().Err() != nil {
			return d, live.CodeClientGone
		}
		s.fail(ex, http.StatusTooManyRequests, live.TypeRateLimit, "queue_timeout",
			"every worker stayed at capacity until the request timeout")
		return d, http.StatusTooManyRequests
	default:
		return d, s.answer(ex, spec, err)
	}
}

// answer answers an admission error of hop spec and returns its code.
func (s *Server) answer(ex *exchange, spec hopSpec, err error) int {
	if spec.answer != nil {
		return spec.answer(ex, err)
	}
	return s.admitError(ex, err)
}

// admitError answers an admission failure and returns its code: a
// *shared.NoHeadroomError is 429 slo_no_headroom with a Retry-After
// header (live.NoHeadroom), counted (live.Runtime.CountRefusal); the
// others as errorAnswer words them.
func (s *Server) admitError(ex *exchange, err error) int {
	if ex.r.Context().Err() != nil {
		return live.CodeClientGone
	}
	if nh, retryAfter, ok := live.NoHeadroom(err); ok {
		// No worker is predicted to meet the request's latency targets
		// and its on_miss is reject: retry when one is predicted to.
		s.rt.CountRefusal(ex.Label, err)
		ex.w.Header().Set("Retry-After", retryAfter)
		s.fail(ex, http.StatusTooManyRequests, live.TypeRateLimit, live.CodeSLONoHeadroom, nh.Error())
		return http.StatusTooManyRequests
	}
	a := s.errorAnswer(ex.Model, ex.ID, err, true)
	s.fail(ex, a.status, a.typ, a.code, a.msg)
	return a.status
}

// errAnswer is the OpenAI error a request gets for an error.
type errAnswer struct {
	status         int
	typ, code, msg string
}

// errorAnswer is the answer to an admission failure of a request for
// model (id, the request's, for logs); with log, the failures that are
// the router's are logged.
func (s *Server) errorAnswer(model, id string, err error, log bool) errAnswer {
	var ce *admission.ClassifyError
	switch {
	case errors.Is(err, admission.ErrQueueFull):
		return errAnswer{http.StatusTooManyRequests, live.TypeRateLimit, "queue_full", "every worker is at capacity and the queue is full"}
	case errors.Is(err, admission.ErrDue):
		return errAnswer{http.StatusTooManyRequests, live.TypeRateLimit, "due_time_passed", "the request's due time passed while it waited for a worker"}
	case errors.Is(err, router.ErrAllExcluded):
		// A retry with no worker left that has not failed it.
		return errAnswer{http.StatusBadGateway, live.TypeServer, "worker_failed",
			fmt.Sprintf("the selected workers failed before answering and no other worker serves model %q", model)}
	case errors.As(err, &ce) && ce.Err == nil:
		// The classifier panicked: the router's fault, not the request's.
		if log {
			s.log.Error("classifier panicked", "classifier", ce.Classifier, "request_id", id, "panic", ce.Panic, "stack", string(ce.Stack))
		}
		return errAnswer{http.StatusInternalServerError, live.TypeServer, "classification_failed", "the request classifier failed"}
	case ce != nil && pluginCause(ce.Err) == "panic":
		// The classifier panicked in its plugin (the SDK recovered it):
		// as in process, the router's fault.
		if log {
			s.log.Error("classifier panicked in its plugin", "classifier", ce.Classifier, "request_id", id, "error", ce.Err)
		}
		return errAnswer{http.StatusInternalServerError, live.TypeServer, "classification_failed", "the request classifier failed"}
	case ce != nil && pluginCause(ce.Err) != "" && pluginCause(ce.Err) != "error":
		// The classifier's plugin did not answer (timeout, restarting,
		// breaker open...): the router's trouble, and worth a retry.
		return errAnswer{http.StatusServiceUnavailable, live.TypeServer, "classifier_unavailable",
			"the request classifier is unavailable: " + ce.Err.Error()}
	case ce != nil:
		// The classifier's own words, without the router's request id.
		return errAnswer{http.StatusBadRequest, live.TypeInvalidRequest, "classification_failed", "the request could not be classified: " + ce.Err.Error()}
	case errors.Is(err, admission.ErrUnknownClass):
		// The router's text, without the router's request id.
		msg := err.Error()
		if i := strings.Index(msg, admission.ErrUnknownClass.Error()); i >= 0 {
			msg = msg[i:]
		}
		return errAnswer{http.StatusBadRequest, live.TypeInvalidRequest, "classification_failed", "the request could not be classified: " + msg}
	case errors.Is(err, shared.ErrNoWorkers):
		var mnf *live.ModelNotFoundError
		if errors.As(s.rt.ModelNotFound(model, err), &mnf) {
			// OpenAI's answer for a model that does not exist: not retryable.
			return errAnswer{http.StatusNotFound, live.TypeInvalidRequest, live.CodeModelNotFound, mnf.Error()}
		}
		return errAnswer{http.StatusServiceUnavailable, live.TypeServer, "no_worker", fmt.Sprintf("no ready worker for model %q: its workers are starting or not answering", model)}
	case errors.Is(err, context.DeadlineExceeded):
		return errAnswer{http.StatusGatewayTimeout, live.TypeServer, "timeout", "the request timed out"}
	case errors.Is(err, router.ErrClosed):
		return errAnswer{http.StatusServiceUnavailable, live.TypeServer, "shutting_down", "the router is shutting down"}
	default:
		if log {
			s.log.Warn("selection failed", "request_id", id, "error", err)
		}
		return errAnswer{http.StatusServiceUnavailable, live.TypeServer, "selection_failed", "no worker could be selected: " + err.Error()}
	}
}

// pluginCause is the supervisor.CallError cause in err ("error" when the
// component itself returned an error, "panic", "timeout", "restarting",
// "breaker_open"...), or "" when err did not come from a plugin call.
func pluginCause(err error) string {
	var ce *supervisor.CallError
	if errors.As(err, &ce) {
		return ce.Cause
	}
	return ""
}

// bodyFailed answers a request whose body was refused or could not be
// read whole (err, from readBody) and returns the code it is counted
// under: 503 overloaded (a budget refused it), 413, 408 (the body did
// not arrive within timeout), 499 (the client left mid-body: no answer)
// or 400.
//
// Nothing more of the body is wanted, and what is left of it on the wire
// must not be read as the next request: the answer carries Connection:
// close, and the read deadline is set bodyLinger from now (it was passed
// already after a timeout) rather than cleared, so that net/http's read
// of the rest after the handler (at most 256 KiB) ends within it, and
// the connection is closed then. A client that stalls or trickles its
// body thus holds a connection and a goroutine for at most the body
// timeout and bodyLinger.
func (s *Server) bodyFailed(ex *exchange, rc *http.ResponseController, err error, timeout time.Duration) int {
	_ = rc.SetReadDeadline(time.Now().Add(bodyLinger))
	ex.w.Header().Set("Connection", "close")
	var refused *bodyRefused
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &refused):
		return s.overloaded(ex, refused.bound)
	case errors.As(err, &tooBig):
		s.fail(ex, http.StatusRequestEntityTooLarge, live.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Before the context's check: net/http cancels the request's
		// context on any failed read, this one included.
		s.fail(ex, http.StatusRequestTimeout, live.TypeInvalidRequest, "body_timeout",
			fmt.Sprintf("the request body did not arrive within %v", timeout))
		return http.StatusRequestTimeout
	case ex.r.Context().Err() != nil:
		return live.CodeClientGone // it left (or half-closed) mid-body
	default:
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_body", "reading the request body: "+err.Error())
		return http.StatusBadRequest
	}
}

// overloaded answers a request whose body a budget refused (bound: the
// router's MaxBodyBytesInFlight or the client address's
// MaxBodyBytesPerClient), and logs it at warn, one line per bound per
// 10 s at most (with the count of those left out).
func (s *Server) overloaded(ex *exchange, bound bodyBound) int {
	msg, cause := "the router holds as many request bodies as it may; retry shortly", "body budget"
	if bound == boundClient {
		msg, cause = "the router holds as many request bodies from this client address as it may; retry shortly", "body budget per client"
	}
	if ok, suppressed := s.refusals.Allow(cause); ok {
		s.log.Warn("request body refused: "+cause+" reached (503 overloaded)", "client", clientKey(ex.r.RemoteAddr),
			"request_id", untrusted.Text(ex.ID, 0), "held", s.bodyBytesHeld(), "suppressed", suppressed)
	}
	s.fail(ex, http.StatusServiceUnavailable, live.TypeServer, "overloaded", msg)
	return http.StatusServiceUnavailable
}

// ctxReason names why ex's context ended.
func ctxReason(ex *exchange) string {
	if ex.r.Context().Err() != nil {
		return "client disconnected"
	}
	return "request timeout"
}

// Hop-by-hop headers are not forwarded (RFC 9110 section 7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// copyHeaders copies src's end-to-end headers into dst: not the
// hop-by-hop ones, nor those src's Connection header names (RFC 9110
// section 7.6.1).
func copyHeaders(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
	for _, c := range src.Values("Connection") {
		for _, name := range strings.Split(c, ",") {
			if name = strings.TrimSpace(name); name != "" {
				dst.Del(name)
			}
		}
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
}

// answerHeaders copies an engine's answer headers src into the client's
// answer headers hdr (copyHeaders), keeping the Connection: close that
// connectionClose set, and adding it once Serve began its shutdown.
func (s *Server) answerHeaders(hdr, src http.Header) {
	closeConn := hdr.Get("Connection") == "close" || s.closing.Load()
	copyHeaders(hdr, src)
	if closeConn {
		hdr.Set("Connection", "close")
	}
}

// HeaderDPRank names the data-parallel rank a request is for: vLLM's
// OpenAI server reads it (OpenAIServing._get_data_parallel_rank, added by
// vLLM PR #24945, merged September 2025, in v0.11.0 and later) and sends
// the request to that engine of its data-parallel group, bypassing its own
// balancing; SGLang honours it too (PR #19832). Header names are
// case-insensitive.
const HeaderDPRank = "X-Data-Parallel-Rank"

// upstream builds the request of one attempt to the worker w: the
// client's method (a GET without a body; else body) to the client's path
// and query, with the client's headers but the hop-by-hop ones
// and any X-Data-Parallel-Rank, the request id, and, when w's engine
// reports data-parallel ranks (fleet.Spec.DataParallel), w's rank in
// HeaderDPRank. nil and why when the worker is unknown or its URL does
// not make a request (reported as the worker's failure).
func (s *Server) upstream(ex *exchange, w *fleet.Worker, body []byte) (*http.Request, string) {
	return s.upstreamCtx(ex.ctx, ex, w, body)
}

// upstreamCtx is upstream with the request's context ctx (an attempt's,
// which a stall cancels, within ex.ctx).
func (s *Server) upstreamCtx(ctx context.Context, ex *exchange, w *fleet.Worker, body []byte) (*http.Request, string) {
	name := w.Name
	base, ok := s.workers.URL(name)
	if !ok {
		return nil, "worker unknown"
	}
	target := base + ex.path
	if ex.query != "" {
		target += "?" + ex.query
	}
	var rd io.Reader
	if ex.r.Method != http.MethodGet {
		rd = bytes.NewReader(body)
	}
	up, err := http.NewRequestWithContext(ctx, ex.r.Method, target, rd)
	if err != nil {
		s.workers.ReportFailure(name)
		return nil, "bad worker url"
	}
	copyHeaders(up.Header, ex.r.Header)
	up.Header.Set("X-Request-Id", ex.ID)
	// The router places the request: a client's rank never reaches the
	// engine.
	up.Header.Del(HeaderDPRank)
	if w.DataParallel {
		up.Header.Set(HeaderDPRank, strconv.FormatUint(uint64(w.DPRank), 10))
	}
	return up, ""
}

// passThrough sends body to the worker w as the admitted
// request h and passes the answer through to the client: headers, then
// the body chunk by chunk, flushed as it arrives. It records the first
// token at the first byte and ends h (completed or aborted) on every path
// but one: retry is true, with why, when the worker failed before sending
// a byte and nothing was written to the client (sendFunc). h is nil for a
// request that is not admitted (an engine utility, a stored response's
// GET): nothing is booked or ended then.
//
// A generation request's answer is metered (live.Meter); another's (a
// pooling request's, a pass-through's) only marks the handle's first
// token and ends it with the request's size as its context tokens. A
// successful Responses answer's id (live.Meter.ResponseID) is bound to w
// as soon as the answer carries it (live.Runtime.BindResponse), so a
// follow-up can reach w while the answer still streams.
func (s *Server) passThrough(ex *exchange, h *admission.Handle, w *fleet.Worker, body []byte) (code int, retry bool, why string) {
	resp, code, retry, why := s.send(ex.ctx, ex, h, w, body)
	if resp == nil {
		return code, retry, why
	}
	defer func() { _ = resp.Body.Close() }()
	s.answerStart(ex, w, resp)
	return s.relay(ex, h, w, resp)
}

// send sends body to the worker w as the admitted request h (nil: not
// admitted) with the context ctx, and returns the engine's answer with
// its headers read. resp is nil when there is none: retry is true, with
// why, when the worker failed before answering (sendFunc); else code is
// the code of the error answered to the client (the request timed out)
// or live.CodeClientGone, and h has ended.
func (s *Server) send(ctx context.Context, ex *exchange, h *admission.Handle, w *fleet.Worker, body []byte) (resp *http.Response, code int, retry bool, why string) {
	name := w.Name
	up, why := s.upstreamCtx(ctx, ex, w, body)
	if up == nil {
		return nil, 0, true, why
	}
	resp, err := s.transport.RoundTrip(up)
	if err != nil {
		if ex.watch.drained.Load() {
			// The drain watch cut it: the worker left (passThroughWatched).
			return nil, 0, true, "the worker left the fleet and its drain grace ended"
		}
		if ex.ctx.Err() != nil {
			if h != nil {
				s.rt.End(h, admission.Aborted(ctxReason(ex)))
			}
			if ex.r.Context().Err() != nil {
				return nil, live.CodeClientGone, false, ""
			}
			if !ex.sent {
				s.fail(ex, http.StatusGatewayTimeout, live.TypeServer, "timeout", "the request timed out before the worker answered")
			}
			return nil, http.StatusGatewayTimeout, false, ""
		}
		if errors.Is(context.Cause(ctx), errStalled) {
			// A stream's stall timer ran out before the headers came.
			s.log.Warn("worker sent no answer for the stall timeout", "worker", name, "request_id", ex.ID, "stall_timeout", s.mig.stall)
			s.workers.ReportFailure(name)
			return nil, 0, true, "no answer for the stall timeout"
		}
		s.log.Warn("worker failed before answering", "worker", name, "request_id", ex.ID, "error", err)
		s.workers.ReportFailure(name)
		return nil, 0, true, "worker error: " + err.Error()
	}
	if resp.StatusCode >= 500 {
		s.workers.ReportFailure(name)
	} else {
		s.workers.ReportSuccess(name)
	}
	if resp.StatusCode == http.StatusServiceUnavailable && h != nil {
		// The engine is not serving (vLLM answers 503 once its engine is
		// dead or it is shutting down; a draining engine does): nothing
		// has reached the client, so the request goes elsewhere, as when
		// the connection fails.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxEngineError))
		_ = resp.Body.Close()
		s.log.Warn("worker answered 503 (not serving)", "worker", name, "request_id", ex.ID)
		return nil, 0, true, "worker answered 503"
	}
	return resp, 0, false, ""
}

// answerStart writes the client's answer headers from the engine's
// answer resp of worker w (flushed at once for a stream).
func (s *Server) answerStart(ex *exchange, w *fleet.Worker, resp *http.Response) {
	ex.sent = true
	hdr := ex.w.Header()
	s.answerHeaders(hdr, resp.Header)
	if ex.rewrites {
		hdr.Del("Content-Length")
	}
	hdr.Set("X-Switchyard-Worker", w.Name)
	hdr.Set("X-Request-Id", ex.ID)
	ex.w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(ex.w)
	if resp.ContentLength < 0 || ex.rewrites {
		// A stream (no length): send the headers now, not with the first
		// chunk. A body of known length goes out with its headers in one
		// write.
		_ = rc.Flush()
	}
}

// relay passes the engine's answer resp (its headers written to the
// client by answerStart) through to the client chunk by chunk, as
// passThrough describes, and ends h on every path.
func (s *Server) relay(ex *exchange, h *admission.Handle, w *fleet.Worker, resp *http.Response) (code int, retry bool, why string) {
	name := w.Name
	rc := http.NewResponseController(ex.w)
	end := func(o admission.Outcome) {
		if h != nil {
			s.rt.End(h, o)
		}
	}

	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	// The meter reads the answer as it passes: first token, SSE events,
	// usage. A non-streamed answer of known, bounded size is kept aside
	// as it passes through, so its usage can give the exact context
	// tokens.
	metered := h != nil && ex.API.Generates()
	var m live.Meter
	if metered {
		m = s.rt.Meter(h, h.Decision(), &ex.Request, resp.ContentLength > 0 && resp.ContentLength <= live.MaxUsageBody, resp.ContentLength)
	}
	// bind: a Responses answer whose id is still to be bound. The id is
	// bound before the chunk that carries it reaches the client, so the
	// client cannot send a follow-up the router would not place: a
	// stream's is read from its response.created event (the first), a
	// whole answer's from its last chunk (read, the bytes read so far,
	// reaching its Content-Length; Meter.ResponseID is asked once then).
	bind := metered && ex.API == live.APIResponses && resp.StatusCode/100 == 2
	var read int64
	first := false
	aborted := func(reason string) { end(admission.Aborted(reason)) }
	// last is the answer's last byte that is not white space: a whole
	// JSON answer's is '}'.
	var last byte
	for {
		var n int
		var rerr error
		if ex.pre != nil {
			// Read before the headers went out (passThroughWatched).
			n, rerr = copy(buf, ex.pre), ex.preErr
			ex.pre, ex.preErr = nil, nil
		} else {
			n, rerr = resp.Body.Read(buf)
		}
		for i := n - 1; i >= 0; i-- {
			if c := buf[i]; c != ' ' && c != '\n' && c != '\r' && c != '\t' {
				last = c
				break
			}
		}
		if n > 0 {
			switch {
			case metered:
				m.FirstByte()
				m.Read(buf[:n])
				if read += int64(n); bind && (ex.Stream || read == resp.ContentLength) {
					if id := m.ResponseID(); id != "" {
						s.rt.BindResponse(ex.Model, id, w)
						bind = false
					}
				}
			case h != nil && !first:
				h.FirstToken()
			}
			first = true
			if _, werr := ex.w.Write(buf[:n]); werr != nil {
				aborted("client disconnected")
				return live.CodeClientGone, false, ""
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				aborted("client disconnected")
				return live.CodeClientGone, false, ""
			}
		}
		if rerr == io.EOF {
			if metered && !ex.Stream && resp.StatusCode/100 == 2 && last != '}' {
				// A whole answer cut short where its connection's close
				// ends its body: not a whole JSON answer.
				s.log.Warn("worker ended its answer before its end", "worker", name, "request_id", ex.ID)
				s.workers.ReportFailure(name)
				s.mig.count(migrate.CauseEOF, migrate.NotMigratable)
				aborted("worker cut the answer")
				ex.abort = true
				return http.StatusBadGateway, false, ""
			}
			if metered && !m.Ended() && resp.StatusCode/100 == 2 && isSSE(resp) {
				// A stream without its terminator was cut, however cleanly
				// its connection ended: the client must not take it for
				// a whole answer.
				s.log.Warn("worker ended the stream without its terminator", "worker", name, "request_id", ex.ID)
				s.workers.ReportFailure(name)
				s.mig.count(migrate.CauseEOF, migrate.NotMigratable)
				aborted("worker cut the stream")
				ex.abort = true
				return http.StatusBadGateway, false, ""
			}
			if metered {
				end(admission.Completed(m.Done()))
			} else {
				end(admission.Completed(int64(ex.Tokens)))
			}
			return resp.StatusCode, false, ""
		}
		if rerr != nil {
			switch {
			case ex.r.Context().Err() != nil:
				aborted("client disconnected")
				return live.CodeClientGone, false, ""
			case ex.ctx.Err() != nil:
				aborted("request timeout")
				ex.abort = true
				return http.StatusGatewayTimeout, false, ""
			default:
				s.log.Warn("worker failed mid-answer", "worker", name, "request_id", ex.ID, "error", rerr)
				aborted("worker error: " + rerr.Error())
				s.workers.ReportFailure(name)
				ex.abort = true
				return http.StatusBadGateway, false, ""
			}
		}
	}
}
