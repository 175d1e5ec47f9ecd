package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/shared"
)

// Codes recorded for requests that got no HTTP answer of their own.
const (
	codeClientGone = 499 // the client left (or cancelled) first
)

// exchange is one client request across its attempts.
type exchange struct {
	w       http.ResponseWriter
	r       *http.Request
	ctx     context.Context // the client's, bounded by the request timeout
	start   time.Time
	path    string
	body    []byte
	model   string
	stream  bool
	id      string // the client's request id (x-request-id or generated)
	session string
	meta    map[string]string
	tokens  int
	hashes  []uint64
	// failed are the workers earlier attempts failed on before a byte;
	// later attempts exclude them (router.Exclude).
	failed []shared.WorkerID
	// abort: the answer failed after its headers were sent; the
	// connection is cut (http.ErrAbortHandler) so the client sees an
	// error rather than a clean end of a truncated answer.
	abort bool
}

// complete handles POST /v1/chat/completions and /v1/completions.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	ex := &exchange{w: w, r: r, ctx: ctx, start: time.Now(), path: r.URL.Path}
	ex.id = r.Header.Get("X-Request-Id")
	if ex.id == "" {
		ex.id = s.newID()
	}
	w.Header().Set("X-Request-Id", ex.id)
	code := s.exchange(ex, chat)
	if s.met != nil {
		label := s.modelLabel(ex.model)
		s.met.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
		s.met.duration.WithLabelValues(label).Observe(time.Since(ex.start).Seconds())
	}
	if ex.abort {
		panic(http.ErrAbortHandler)
	}
}

// exchange runs the request and returns the code it is counted under.
func (s *Server) exchange(ex *exchange, chat bool) int {
	rc := http.NewResponseController(ex.w)
	_ = rc.SetReadDeadline(time.Now().Add(s.timeout))
	body, err := io.ReadAll(http.MaxBytesReader(ex.w, ex.r.Body, s.maxBody))
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(ex.w, http.StatusRequestEntityTooLarge, typeInvalidRequest, "body_too_large",
				fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return http.StatusRequestEntityTooLarge
		}
		writeError(ex.w, http.StatusBadRequest, typeInvalidRequest, "invalid_body", "reading the request body: "+err.Error())
		return http.StatusBadRequest
	}
	ex.body = body
	req, err := parseRequest(body, chat)
	if req != nil {
		ex.model, ex.stream = req.Model, req.Stream
	}
	var key routingKey
	if err == nil {
		key, err = req.key(chat)
	}
	if err != nil {
		writeError(ex.w, http.StatusBadRequest, typeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	ex.tokens, ex.hashes = key.hash(s.r.BlockSize(), s.cpt)
	ex.session = ex.r.Header.Get("X-Session-Id")
	ex.meta = make(map[string]string, len(ex.r.Header))
	for k, v := range ex.r.Header {
		if len(v) > 0 {
			ex.meta[strings.ToLower(k)] = v[0]
		}
	}
	for attempt := 0; ; attempt++ {
		tk, code := s.admit(ex, attempt)
		if code != 0 {
			return code
		}
		code, retry := s.forward(ex, tk)
		if !retry {
			return code
		}
		if w := tk.Decision.Worker; w != nil && !slices.Contains(ex.failed, w.ID) {
			ex.failed = append(ex.failed, w.ID)
		}
		if attempt >= s.retries {
			writeError(ex.w, http.StatusBadGateway, typeServer, "worker_failed",
				fmt.Sprintf("the selected workers failed before answering (%d attempts)", attempt+1))
			return http.StatusBadGateway
		}
		s.log.Debug("retrying on another selection", "request_id", ex.id, "attempt", attempt+1)
	}
}

// admit books a worker for one attempt, waiting in the queue when every
// candidate is at capacity; the workers earlier attempts failed on are not
// candidates. It returns the dispatched ticket, or the code of the error
// it answered.
func (s *Server) admit(ex *exchange, attempt int) (router.Ticket, int) {
	req := &shared.Request{
		ID:           ex.id + "#" + strconv.Itoa(attempt),
		Model:        ex.model,
		Role:         shared.RoleAggregated,
		PromptTokens: ex.tokens,
		BlockHashes:  ex.hashes,
		SessionID:    ex.session,
		Metadata:     ex.meta,
	}
	ch := make(chan router.Ticket, 1)
	s.register(req.ID, ch)
	t0 := time.Now()
	var opts []router.AdmitOption
	if len(ex.failed) > 0 {
		opts = append(opts, router.Exclude(ex.failed...))
	}
	tk, err := s.r.Admit(ex.ctx, req, opts...)
	if errors.Is(err, router.ErrDuplicateRequest) {
		// The client reused a live request's id: admit under a unique one.
		s.unregister(req.ID)
		req.ID = s.newID() + "#" + strconv.Itoa(attempt)
		s.register(req.ID, ch)
		tk, err = s.r.Admit(ex.ctx, req, opts...)
	}
	s.observeSelection(tk, req.Role, time.Since(t0))
	if err != nil || !tk.Queued {
		s.unregister(req.ID)
		if err != nil {
			return tk, s.admitError(ex, err)
		}
		return tk, 0
	}
	select {
	case tk = <-ch:
		// deliver unregistered it.
		if tk.Err != nil {
			return tk, s.admitError(ex, tk.Err)
		}
		return tk, 0
	case <-ex.ctx.Done():
		s.unregister(req.ID)
		// Leaves the queue, or releases the booking of a dispatch that
		// raced with the end (its ticket then sits unread in ch).
		_ = s.r.Abort(req.ID, ctxReason(ex))
		s.Wake()
		if ex.r.Context().Err() != nil {
			return tk, codeClientGone
		}
		writeError(ex.w, http.StatusTooManyRequests, typeRateLimit, "queue_timeout",
			"every worker stayed at capacity until the request timeout")
		return tk, http.StatusTooManyRequests
	}
}

func (s *Server) register(id string, ch chan router.Ticket) {
	s.mu.Lock()
	s.waiters[id] = ch
	s.mu.Unlock()
	s.queued.Add(1)
}

func (s *Server) unregister(id string) {
	s.mu.Lock()
	_, ok := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	if ok {
		s.queued.Add(-1)
	}
}

func (s *Server) observeSelection(tk router.Ticket, role shared.Role, d time.Duration) {
	if s.met == nil {
		return
	}
	policy := tk.Decision.Policy
	if policy == "" {
		if b := s.r.Bundle(); b != nil && b.Config != nil {
			policy = b.Config.RolePolicies[role]
		}
	}
	s.met.selection.WithLabelValues(policy, string(role)).Observe(d.Seconds())
}

// admitError answers an admission failure and returns its code.
func (s *Server) admitError(ex *exchange, err error) int {
	var ce *shared.ClassifyError
	switch {
	case ex.r.Context().Err() != nil:
		return codeClientGone
	case errors.Is(err, router.ErrQueueFull):
		writeError(ex.w, http.StatusTooManyRequests, typeRateLimit, "queue_full", "every worker is at capacity and the queue is full")
		return http.StatusTooManyRequests
	case errors.Is(err, router.ErrDue):
		writeError(ex.w, http.StatusTooManyRequests, typeRateLimit, "due_time_passed", "the request's due time passed while it waited for a worker")
		return http.StatusTooManyRequests
	case errors.Is(err, router.ErrAllExcluded):
		// A retry with no worker left that has not failed it.
		writeError(ex.w, http.StatusBadGateway, typeServer, "worker_failed",
			fmt.Sprintf("the selected workers failed before answering and no other worker serves model %q", ex.model))
		return http.StatusBadGateway
	case errors.As(err, &ce), errors.Is(err, router.ErrUnknownClass):
		writeError(ex.w, http.StatusBadRequest, typeInvalidRequest, "classification_failed", err.Error())
		return http.StatusBadRequest
	case errors.Is(err, shared.ErrNoWorkers):
		if ml, ok := s.workers.(modelServer); ok && !ml.Serves(ex.model) {
			// OpenAI's answer for a model that does not exist: not retryable.
			writeError(ex.w, http.StatusNotFound, typeInvalidRequest, "model_not_found", fmt.Sprintf("the model %q does not exist: no worker serves it", ex.model))
			return http.StatusNotFound
		}
		writeError(ex.w, http.StatusServiceUnavailable, typeServer, "no_worker", fmt.Sprintf("no ready worker for model %q: its workers are not answering", ex.model))
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		writeError(ex.w, http.StatusGatewayTimeout, typeServer, "timeout", "the request timed out")
		return http.StatusGatewayTimeout
	case errors.Is(err, router.ErrClosed):
		writeError(ex.w, http.StatusServiceUnavailable, typeServer, "shutting_down", "the router is shutting down")
		return http.StatusServiceUnavailable
	default:
		s.log.Warn("selection failed", "request_id", ex.id, "error", err)
		writeError(ex.w, http.StatusServiceUnavailable, typeServer, "selection_failed", "no worker could be selected: "+err.Error())
		return http.StatusServiceUnavailable
	}
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

// forward sends one attempt to its worker and passes the answer through.
// It ends the attempt's booking exactly once, on every path. retry is true
// when the worker failed before sending a byte and nothing was written to
// the client.
func (s *Server) forward(ex *exchange, tk router.Ticket) (code int, retry bool) {
	id, name := tk.ID, tk.Decision.Worker.Name
	ended := false
	var contextTokens int64 = int64(ex.tokens)
	end := func(complete bool, reason string) {
		if ended {
			return
		}
		ended = true
		if complete {
			_ = s.r.Complete(id, contextTokens)
		} else {
			_ = s.r.Abort(id, reason)
		}
		s.Wake()
	}
	defer end(false, "handler ended")

	base, ok := s.workers.URL(name)
	if !ok {
		end(false, "worker unknown")
		return 0, true
	}
	up, err := http.NewRequestWithContext(ex.ctx, http.MethodPost, base+ex.path, bytes.NewReader(ex.body))
	if err != nil {
		end(false, "bad worker url")
		s.workers.ReportFailure(name)
		return 0, true
	}
	for k, v := range ex.r.Header {
		up.Header[k] = v
	}
	for _, h := range hopHeaders {
		up.Header.Del(h)
	}
	up.Header.Set("X-Request-Id", ex.id)
	resp, err := s.transport.RoundTrip(up)
	if err != nil {
		if ex.ctx.Err() != nil {
			end(false, ctxReason(ex))
			if ex.r.Context().Err() != nil {
				return codeClientGone, false
			}
			writeError(ex.w, http.StatusGatewayTimeout, typeServer, "timeout", "the request timed out before the worker answered")
			return http.StatusGatewayTimeout, false
		}
		s.log.Warn("worker failed before answering", "worker", name, "request_id", ex.id, "error", err)
		end(false, "worker error: "+err.Error())
		s.workers.ReportFailure(name)
		return 0, true
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 500 {
		s.workers.ReportFailure(name)
	} else {
		s.workers.ReportSuccess(name)
	}
	h := ex.w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	for _, hh := range hopHeaders {
		h.Del(hh)
	}
	h.Set("X-Switchyard-Worker", name)
	h.Set("X-Request-Id", ex.id)
	ex.w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(ex.w)
	if resp.ContentLength < 0 {
		// A stream (no length): send the headers now, not with the first
		// chunk. A body of known length goes out with its headers in one
		// write.
		_ = rc.Flush()
	}

	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	first := true
	var events int64 // SSE events ("\n\n"-terminated), about one token each
	var last byte
	// A non-streamed answer of known, bounded size is kept aside as it
	// passes through, so its usage can give the exact context tokens.
	var body []byte
	keep := !ex.stream && resp.ContentLength > 0 && resp.ContentLength <= maxUsageBody
	if keep {
		body = make([]byte, 0, resp.ContentLength)
	}
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if first {
				first = false
				_ = s.r.FirstToken(id)
				if s.met != nil && ex.stream {
					s.met.ttft.WithLabelValues(s.modelLabel(ex.model)).Observe(time.Since(ex.start).Seconds())
				}
			}
			before := events
			for _, c := range buf[:n] {
				if c == '\n' && last == '\n' {
					events++
				}
				last = c
			}
			if keep {
				body = append(body, buf[:n]...)
			}
			if _, werr := ex.w.Write(buf[:n]); werr != nil {
				end(false, "client disconnected")
				return codeClientGone, false
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				end(false, "client disconnected")
				return codeClientGone, false
			}
			if events > before {
				contextTokens = int64(ex.tokens) + events
				s.r.Progress(id, contextTokens)
			}
		}
		if rerr == io.EOF {
			if n, ok := usageTokens(body); keep && ok {
				contextTokens = n
			}
			end(true, "")
			return resp.StatusCode, false
		}
		if rerr != nil {
			switch {
			case ex.r.Context().Err() != nil:
				end(false, "client disconnected")
				return codeClientGone, false
			case ex.ctx.Err() != nil:
				end(false, "request timeout")
				ex.abort = true
				return http.StatusGatewayTimeout, false
			default:
				s.log.Warn("worker failed mid-answer", "worker", name, "request_id", ex.id, "error", rerr)
				end(false, "worker error: "+rerr.Error())
				s.workers.ReportFailure(name)
				ex.abort = true
				return http.StatusBadGateway, false
			}
		}
	}
}

// maxUsageBody bounds the non-streamed answers read for their usage.
const maxUsageBody = 1 << 20

// usageTokens returns an OpenAI answer's usage.total_tokens (prompt plus
// completion), or false when it has none.
func usageTokens(body []byte) (int64, bool) {
	if len(body) == 0 {
		return 0, false
	}
	var v struct {
		Usage *struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil || v.Usage == nil || v.Usage.TotalTokens <= 0 {
		return 0, false
	}
	return v.Usage.TotalTokens, true
}
