package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/shared"
)

// Codes recorded for requests that got no HTTP answer of their own.
const (
	codeClientGone = 499 // the client left (or cancelled) first
)

// exchange is one client request across its attempts.
type exchange struct {
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context // the client's, bounded by the request timeout
	start  time.Time
	path   string
	body   []byte
	model  string
	stream bool
	chat   bool   // a chat request (messages), not a completions one
	id     string // the client's request id (x-request-id or generated)
	// label is the model's metrics label, set when the body parsed.
	label    string
	labelSet bool
	session  string
	meta     map[string]string
	tokens   int
	hashes   []uint64
	// blockSize is the tokens per block hashes were cut at (the model's
	// key block size: keyBlockSize).
	blockSize int
	// ids are the prompt's token ids: the request's own, or its
	// tokenizer's; nil when it was keyed by character blocks.
	ids []int64
	// lora is the LoRA adapter the request runs with (its model, when
	// that is an adapter), salt its cache_salt; "" for none.
	lora, salt string
	// keyedBy says how the prompt was keyed (routingHashes): keyedIDs,
	// keyedEngine, keyedFile or keyedChars; tokErr is why a tokenizer
	// failed, when it did and the prompt was keyed by characters.
	keyedBy string
	tokErr  error
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
	if code == codeClientGone {
		// Nothing more can reach the client; ending the handler normally
		// would let net/http answer a client that only half-closed with an
		// empty 200, or end a cut stream with a clean chunked terminator.
		ex.abort = true
	}
	if s.met != nil {
		label := ex.label
		if !ex.labelSet {
			label = s.modelLabel(ex.model)
		}
		s.met.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
		s.met.duration.WithLabelValues(label).Observe(time.Since(ex.start).Seconds())
	}
	if ex.abort {
		panic(http.ErrAbortHandler)
	}
}

// credentialHeaders (canonical names) are not copied into a request's
// Metadata: classifiers and policy plugins, which may be third-party
// binaries, see the other headers but not the client's credentials. They
// are still forwarded to the engine.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key"}

// requestMetadata is a request's shared.Request Metadata: each header's
// first value under its lower-cased name, but the credentialHeaders.
func requestMetadata(h http.Header) map[string]string {
	meta := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 && !slices.Contains(credentialHeaders, k) {
			meta[strings.ToLower(k)] = v[0]
		}
	}
	return meta
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
func (s *Server) exchange(ex *exchange, chat bool) int {
	if ex.r.ContentLength > s.maxBody {
		// Refused before a byte is read (and before a 100 Continue).
		writeError(ex.w, http.StatusRequestEntityTooLarge, typeInvalidRequest, "body_too_large",
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
	ex.body, ex.chat = body, chat
	req, err := parseRequest(body, chat)
	var key routingKey
	if req != nil {
		ex.model, ex.stream, key = req.Model, req.Stream, req.key()
		// The metrics' model label as the request arrives: a model whose
		// workers leave while it is served still counts under its name.
		ex.label, ex.labelSet = s.modelLabel(ex.model), true
	}
	if err != nil {
		writeError(ex.w, http.StatusBadRequest, typeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	if err := ex.ctx.Err(); err != nil {
		// The client left, or the request timeout passed, while the body
		// was read and parsed: nothing more is done for it.
		return s.admitError(ex, err)
	}
	s.routingHashes(ex, key)
	ex.session = ex.r.Header.Get("X-Session-Id")
	ex.meta = requestMetadata(ex.r.Header)
	if s.disaggregated(ex.model) {
		return s.disagg(ex)
	}
	return s.hop(ex, hopSpec{hop: admission.Aggregated.Hop(0), tag: "#"},
		func(h *admission.Handle, d router.Decision) (int, bool, string) {
			return s.passThrough(ex, h, d.Worker, ex.body)
		})
}

// routingHashes sets ex's prompt length, token ids, block size and block
// hashes from its routing key. The block size is the model's
// (keyBlockSize: router.block_size when set, else its engines'). Token
// ids the request carries are hashed as they are; a text prompt of a
// model with a tokenizer (its block's, or its engines' /tokenize; a LoRA
// adapter's base model's) is tokenized (chat: the messages, rendered by
// the model's template); otherwise, or when the tokenizer fails (counted,
// logged at debug; an engine that does not serve /tokenize is neither),
// it is keyed by character blocks. The hashes are seeded by the request's
// LoRA adapter and cache_salt (keySeed). The tokenizer runs in the
// request's goroutine under its context, with no lock held.
func (s *Server) routingHashes(ex *exchange, key routingKey) {
	parent := s.engines.Parent(ex.model)
	if parent == ex.model {
		parent = ""
	}
	bs := s.keyBlockSize(ex.model, parent)
	ex.blockSize, ex.salt = bs, key.salt
	if parent != "" {
		ex.lora = ex.model
	}
	seed := keySeed(ex.lora, ex.salt)
	ex.keyedBy = keyedIDs
	if key.ids == nil {
		ex.keyedBy = keyedChars
		if set := s.toks.Load(); set != nil {
			if tok := set.For(ex.model); tok != nil {
				t0 := time.Now()
				hashes, ids, err := tokenizer.Blocks(ex.ctx, tok, tokenizer.Prompt{Text: key.text, Messages: key.messages()}, bs, s.cpt)
				if s.met != nil && !errors.Is(err, tokenizer.ErrUnsupported) {
					s.met.tokenize.WithLabelValues(ex.label).Observe(time.Since(t0).Seconds())
				}
				if err == nil {
					ex.tokens, ex.hashes, ex.ids = len(ids), seedHashes(hashes, seed), ids
					ex.keyedBy = keyedFile
					if _, ok := tok.(*tokenizer.Engine); ok {
						ex.keyedBy = keyedEngine
					}
					return
				}
				ex.tokErr = err
				if !errors.Is(err, tokenizer.ErrUnsupported) {
					if s.met != nil {
						s.met.tokFails.WithLabelValues(ex.label).Inc()
					}
					s.log.Debug("tokenizer failed; keyed by character blocks", "model", ex.model, "request_id", ex.id, "error", err)
				}
			}
		}
	}
	ex.tokens, ex.hashes = key.hash(bs, s.cpt, seed)
	ex.ids = key.ids
}

// How a prompt was keyed (exchange.keyedBy).
const (
	keyedIDs    = "token_ids"  // the request's own token ids
	keyedEngine = "engine"     // its engines' /tokenize
	keyedFile   = "file"       // a tokenizer block's file
	keyedChars  = "characters" // character blocks: no token ids
)

// promptKey is the request's token ids as a shared.PromptKey, which a
// candidate's precise prefix index (KV events) looks up at its engine's
// block size, with the LoRA adapter and cache_salt the engine's block
// hashes carry; nil (no PromptKey) when the prompt was keyed by
// characters.
func (ex *exchange) promptKey() shared.PromptKey {
	if ex.ids == nil {
		return nil
	}
	return &prefix.Key{IDs: ex.ids, LoRA: ex.lora, Salt: ex.salt}
}

// SetTokenizers makes set the tokenizers of the requests that arrive from
// now on (nil: none, every text prompt keyed by character blocks).
func (s *Server) SetTokenizers(set *tokenizer.Set) { s.toks.Store(set) }

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
	defer s.End(h, admission.Aborted("handler ended"))
	for attempt := 0; ; attempt++ {
		code, retry, why := send(h, d)
		if !retry {
			return code
		}
		if attempt >= s.retries {
			s.End(h, admission.Aborted(why))
			writeError(ex.w, http.StatusBadGateway, typeServer, "worker_failed",
				fmt.Sprintf("the selected %s failed before answering (%d attempts)", spec.workers, attempt+1))
			return http.StatusBadGateway
		}
		s.log.Debug("retrying on another selection", "request_id", ex.id, "role", spec.hop.Role, "attempt", attempt+1)
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
	h, err := s.admitHop(ex, spec)
	if err != nil {
		return nil, router.Decision{}, s.answer(ex, spec, err)
	}
	d, code := s.await(ex, spec, h)
	return h, d, code
}

// admitHop admits the first attempt of hop spec (under a unique id when
// the client reused a live request's), with opts, and records the
// selection's duration. It returns the handle, placed or queued, or the
// admission's error.
func (s *Server) admitHop(ex *exchange, spec hopSpec, opts ...admission.Option) (*admission.Handle, error) {
	req := spec.hop.Request(&shared.Request{
		Model:        ex.model,
		PromptTokens: ex.tokens,
		BlockSize:    ex.blockSize,
		BlockHashes:  ex.hashes,
		SessionID:    ex.session,
		Metadata:     ex.meta,
		Prompt:       ex.promptKey(),
	})
	req.ID = ex.id + spec.tag + "0"
	t0 := time.Now()
	h, err := s.adm.Admit(ex.ctx, req, opts...)
	if errors.Is(err, admission.ErrDuplicateRequest) {
		// The client reused a live request's id: admit under a unique one.
		req.ID = s.newID() + spec.tag + "0"
		h, err = s.adm.Admit(ex.ctx, req, opts...)
	}
	var policy string
	if h != nil {
		policy = h.Decision().Policy
	}
	s.observeSelection(policy, req.Role, time.Since(t0))
	if err != nil {
		return nil, err
	}
	return h, nil
}

// retry places hop spec's handle again as attempt n after its worker
// failed (why), excluding it, and waits for the new placement; the code of
// the error it answered otherwise (the handle has ended then).
func (s *Server) retry(ex *exchange, spec hopSpec, h *admission.Handle, n int, why string, failed shared.WorkerID) (router.Decision, int) {
	suffix := spec.tag + strconv.Itoa(n)
	err := h.Retry(ex.ctx, ex.id+suffix, why, failed)
	if errors.Is(err, admission.ErrDuplicateRequest) {
		err = h.Retry(ex.ctx, s.newID()+suffix, why, failed)
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
		s.End(h, admission.Aborted(ctxReason(ex)))
		if ex.r.Context().Err() != nil {
			return d, codeClientGone
		}
		writeError(ex.w, http.StatusTooManyRequests, typeRateLimit, "queue_timeout",
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

// End ends h, a handle of this Server's admission (Place's), with o, then
// wakes the dispatcher to look at the queue.
func (s *Server) End(h *admission.Handle, o admission.Outcome) {
	h.End(o)
	s.Wake()
}

// observeSelection records one selection's duration under the policy
// that decided ("" before a decision: the role's policy).
func (s *Server) observeSelection(policy string, role shared.Role, d time.Duration) {
	if s.met == nil {
		return
	}
	if policy == "" {
		if b := loader.Current(s.r); b != nil {
			policy = b.PolicyName(role)
		}
	}
	s.met.selection.WithLabelValues(policy, string(role)).Observe(d.Seconds())
}

// admitError answers an admission failure and returns its code.
func (s *Server) admitError(ex *exchange, err error) int {
	if ex.r.Context().Err() != nil {
		return codeClientGone
	}
	a := s.errorAnswer(ex.model, ex.id, err, true)
	writeError(ex.w, a.status, a.typ, a.code, a.msg)
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
		return errAnswer{http.StatusTooManyRequests, typeRateLimit, "queue_full", "every worker is at capacity and the queue is full"}
	case errors.Is(err, admission.ErrDue):
		return errAnswer{http.StatusTooManyRequests, typeRateLimit, "due_time_passed", "the request's due time passed while it waited for a worker"}
	case errors.Is(err, router.ErrAllExcluded):
		// A retry with no worker left that has not failed it.
		return errAnswer{http.StatusBadGateway, typeServer, "worker_failed",
			fmt.Sprintf("the selected workers failed before answering and no other worker serves model %q", model)}
	case errors.As(err, &ce) && ce.Err == nil:
		// The classifier panicked: the router's fault, not the request's.
		if log {
			s.log.Error("classifier panicked", "classifier", ce.Classifier, "request_id", id, "panic", ce.Panic, "stack", string(ce.Stack))
		}
		return errAnswer{http.StatusInternalServerError, typeServer, "classification_failed", "the request classifier failed"}
	case ce != nil && pluginCause(ce.Err) == "panic":
		// The classifier panicked in its plugin (the SDK recovered it):
		// as in process, the router's fault.
		if log {
			s.log.Error("classifier panicked in its plugin", "classifier", ce.Classifier, "request_id", id, "error", ce.Err)
		}
		return errAnswer{http.StatusInternalServerError, typeServer, "classification_failed", "the request classifier failed"}
	case ce != nil && pluginCause(ce.Err) != "" && pluginCause(ce.Err) != "error":
		// The classifier's plugin did not answer (timeout, restarting,
		// breaker open...): the router's trouble, and worth a retry.
		return errAnswer{http.StatusServiceUnavailable, typeServer, "classifier_unavailable",
			"the request classifier is unavailable: " + ce.Err.Error()}
	case ce != nil:
		// The classifier's own words, without the router's request id.
		return errAnswer{http.StatusBadRequest, typeInvalidRequest, "classification_failed", "the request could not be classified: " + ce.Err.Error()}
	case errors.Is(err, admission.ErrUnknownClass):
		// The router's text, without the router's request id.
		msg := err.Error()
		if i := strings.Index(msg, admission.ErrUnknownClass.Error()); i >= 0 {
			msg = msg[i:]
		}
		return errAnswer{http.StatusBadRequest, typeInvalidRequest, "classification_failed", "the request could not be classified: " + msg}
	case errors.Is(err, shared.ErrNoWorkers):
		if ml, ok := s.workers.(modelServer); ok && !ml.Serves(model) {
			// OpenAI's answer for a model that does not exist: not retryable.
			return errAnswer{http.StatusNotFound, typeInvalidRequest, "model_not_found", fmt.Sprintf("the model %q does not exist: no worker serves it", model)}
		}
		return errAnswer{http.StatusServiceUnavailable, typeServer, "no_worker", fmt.Sprintf("no ready worker for model %q: its workers are starting or not answering", model)}
	case errors.Is(err, context.DeadlineExceeded):
		return errAnswer{http.StatusGatewayTimeout, typeServer, "timeout", "the request timed out"}
	case errors.Is(err, router.ErrClosed):
		return errAnswer{http.StatusServiceUnavailable, typeServer, "shutting_down", "the router is shutting down"}
	default:
		if log {
			s.log.Warn("selection failed", "request_id", id, "error", err)
		}
		return errAnswer{http.StatusServiceUnavailable, typeServer, "selection_failed", "no worker could be selected: " + err.Error()}
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
		writeError(ex.w, http.StatusRequestEntityTooLarge, typeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Before the context's check: net/http cancels the request's
		// context on any failed read, this one included.
		writeError(ex.w, http.StatusRequestTimeout, typeInvalidRequest, "body_timeout",
			fmt.Sprintf("the request body did not arrive within %v", timeout))
		return http.StatusRequestTimeout
	case ex.r.Context().Err() != nil:
		return codeClientGone // it left (or half-closed) mid-body
	default:
		writeError(ex.w, http.StatusBadRequest, typeInvalidRequest, "invalid_body", "reading the request body: "+err.Error())
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
			"request_id", untrusted.Text(ex.id, 0), "held", s.bodyBytesHeld(), "suppressed", suppressed)
	}
	writeError(ex.w, http.StatusServiceUnavailable, typeServer, "overloaded", msg)
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

// upstream builds the request of one attempt to the worker w: POST body to
// the client's path, with the client's headers but the hop-by-hop ones
// and any X-Data-Parallel-Rank, the request id, and, when w's engine
// reports data-parallel ranks (fleet.Spec.DataParallel), w's rank in
// HeaderDPRank. nil and why when the worker is unknown or its URL does
// not make a request (reported as the worker's failure).
func (s *Server) upstream(ex *exchange, w *fleet.Worker, body []byte) (*http.Request, string) {
	name := w.Name
	base, ok := s.workers.URL(name)
	if !ok {
		return nil, "worker unknown"
	}
	up, err := http.NewRequestWithContext(ex.ctx, http.MethodPost, base+ex.path, bytes.NewReader(body))
	if err != nil {
		s.workers.ReportFailure(name)
		return nil, "bad worker url"
	}
	copyHeaders(up.Header, ex.r.Header)
	up.Header.Set("X-Request-Id", ex.id)
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
// a byte and nothing was written to the client (sendFunc).
func (s *Server) passThrough(ex *exchange, h *admission.Handle, w *fleet.Worker, body []byte) (code int, retry bool, why string) {
	name := w.Name
	contextTokens := int64(ex.tokens)
	end := func(complete bool, reason string) {
		if complete {
			s.End(h, admission.Completed(contextTokens))
		} else {
			s.End(h, admission.Aborted(reason))
		}
	}
	up, why := s.upstream(ex, w, body)
	if up == nil {
		return 0, true, why
	}
	resp, err := s.transport.RoundTrip(up)
	if err != nil {
		if ex.ctx.Err() != nil {
			end(false, ctxReason(ex))
			if ex.r.Context().Err() != nil {
				return codeClientGone, false, ""
			}
			writeError(ex.w, http.StatusGatewayTimeout, typeServer, "timeout", "the request timed out before the worker answered")
			return http.StatusGatewayTimeout, false, ""
		}
		s.log.Warn("worker failed before answering", "worker", name, "request_id", ex.id, "error", err)
		s.workers.ReportFailure(name)
		return 0, true, "worker error: " + err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 500 {
		s.workers.ReportFailure(name)
	} else {
		s.workers.ReportSuccess(name)
	}
	hdr := ex.w.Header()
	s.answerHeaders(hdr, resp.Header)
	hdr.Set("X-Switchyard-Worker", name)
	hdr.Set("X-Request-Id", ex.id)
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
	var kept []byte
	keep := !ex.stream && resp.ContentLength > 0 && resp.ContentLength <= maxUsageBody
	if keep {
		kept = make([]byte, 0, resp.ContentLength)
	}
	// A stream's usage comes in one of its last events (the client's
	// stream_options.include_usage): the latest chunk that mentions it is
	// kept (at most one read buffer), and read at the end.
	var streamed []byte
	watch := ex.stream && s.met != nil
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if first {
				first = false
				h.FirstToken()
				if s.met != nil && ex.stream {
					s.met.ttft.WithLabelValues(ex.label).Observe(time.Since(ex.start).Seconds())
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
				kept = append(kept, buf[:n]...)
			} else if watch && bytes.Contains(buf[:n], usageKey) {
				streamed = append(streamed[:0], buf[:n]...)
			}
			if _, werr := ex.w.Write(buf[:n]); werr != nil {
				end(false, "client disconnected")
				return codeClientGone, false, ""
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				end(false, "client disconnected")
				return codeClientGone, false, ""
			}
			if events > before {
				contextTokens = int64(ex.tokens) + events
				h.Progress(contextTokens)
			}
		}
		if rerr == io.EOF {
			var u usage
			switch {
			case keep:
				u = readUsage(kept)
				if u.total > 0 {
					contextTokens = u.total
				}
			case streamed != nil:
				u = streamUsage(streamed)
			}
			s.countUsage(ex.label, u)
			s.countBelief(ex, h.Decision(), u)
			s.checkPromptTokens(promptCount{label: ex.label, id: ex.id, worker: name, chat: ex.chat,
				exact: ex.ids != nil, tokens: ex.tokens}, u)
			end(true, "")
			return resp.StatusCode, false, ""
		}
		if rerr != nil {
			switch {
			case ex.r.Context().Err() != nil:
				end(false, "client disconnected")
				return codeClientGone, false, ""
			case ex.ctx.Err() != nil:
				end(false, "request timeout")
				ex.abort = true
				return http.StatusGatewayTimeout, false, ""
			default:
				s.log.Warn("worker failed mid-answer", "worker", name, "request_id", ex.id, "error", rerr)
				end(false, "worker error: "+rerr.Error())
				s.workers.ReportFailure(name)
				ex.abort = true
				return http.StatusBadGateway, false, ""
			}
		}
	}
}

// maxUsageBody bounds the non-streamed answers read for their usage.
const maxUsageBody = 1 << 20

// usage is an OpenAI answer's usage object; ok is false when the answer
// has none.
type usage struct {
	prompt, cached, completion, total int64
	ok                                bool
	// hasPrompt: the answer reports usage.prompt_tokens.
	hasPrompt bool
	// hasCached: the answer reports cached_tokens (vLLM does with prefix
	// caching on; cached is 0 when it does not).
	hasCached bool
}

// usageKey marks the chunks of a stream that may carry its usage.
var usageKey = []byte(`"usage"`)

// readUsage reads an OpenAI answer's usage: prompt_tokens,
// prompt_tokens_details.cached_tokens (vLLM with prefix caching reports
// it; 0 when absent), completion_tokens and total_tokens. ok is false
// when the body is not strict JSON nested at most maxNesting levels, or
// has no usage object with a positive count.
func readUsage(body []byte) usage {
	// fastjson's parser builds its error for a malformed body from the rest
	// of the body at each level: checked first, as request bodies are.
	if nesting(body, maxNesting) > maxNesting || !gjson.ValidBytes(body) {
		return usage{}
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return usage{}
	}
	u := usage{
		prompt:     max(v.GetInt64("usage", "prompt_tokens"), 0),
		cached:     max(v.GetInt64("usage", "prompt_tokens_details", "cached_tokens"), 0),
		completion: max(v.GetInt64("usage", "completion_tokens"), 0),
		total:      max(v.GetInt64("usage", "total_tokens"), 0),
	}
	u.ok = u.prompt > 0 || u.completion > 0 || u.total > 0
	u.hasCached = v.Exists("usage", "prompt_tokens_details", "cached_tokens")
	pt := v.Get("usage", "prompt_tokens")
	u.hasPrompt = pt != nil && pt.Type() == fastjson.TypeNumber && pt.GetInt64() >= 0
	return u
}

// streamUsage reads the usage of the last event of an SSE chunk that has
// one ("data: {...}" lines).
func streamUsage(chunk []byte) usage {
	var found usage
	for line := range bytes.Lines(chunk) {
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok || !bytes.Contains(data, usageKey) {
			continue
		}
		if u := readUsage(bytes.TrimSpace(data)); u.ok {
			found = u
		}
	}
	return found
}

// countBelief compares what the prefix index believed the worker held of
// the prompt (b, taken at selection) with what the engine says it served
// from cache (u's cached_tokens), in switchyard_prefix_belief_total, for
// the precise belief (when the worker's KV-event stream was live) and the
// approximate one. The engine computes at least the prompt's last token
// and caches whole blocks of E tokens, so a belief of t tokens means
// min(t, floor((prompt-1)/E)·E) served (vLLM's KV cache manager caps a
// hit at prompt_len-1); E is the engine's block size, or the request's
// key block size when no precise index told it. Answers without cached_tokens, and
// prompts keyed by characters (no belief), are not counted.
//
// A precise belief that differs is logged at debug level with the worker
// and both counts.
func (s *Server) countBelief(ex *exchange, d router.Decision, u usage) {
	b := d.Belief
	if s.met == nil || !b.Taken || !u.ok || !u.hasCached || u.prompt <= 0 {
		return
	}
	e := b.EngineBlockSize
	if e <= 0 {
		e = ex.blockSize
	}
	if e <= 0 {
		e = s.r.BlockSize()
	}
	limit := (int((u.prompt - 1)) / e) * e
	served := int(u.cached)
	if b.Precise {
		r := compareBelief(min(b.PreciseTokens, limit), served)
		s.met.belief.WithLabelValues("precise", r).Inc()
		if r != "exact" && s.log.IsDebug() {
			s.log.Debug("precise prefix belief differs from the engine's cached tokens", "request_id", ex.id,
				"worker", d.Worker.Name, "rank", d.Worker.DPRank, "believed_tokens", min(b.PreciseTokens, limit),
				"cached_tokens", served, "prompt_tokens", u.prompt, "approximate_tokens", min(b.ApproxTokens, limit))
		}
	}
	s.met.belief.WithLabelValues("approximate", compareBelief(min(b.ApproxTokens, limit), served)).Inc()
}

// compareBelief says how a belief of believed tokens compares with the
// served ones: "exact", "over" (believed more) or "under".
func compareBelief(believed, served int) string {
	switch {
	case believed == served:
		return "exact"
	case believed > served:
		return "over"
	}
	return "under"
}

// promptCount is what the router counted of one request's prompt, for
// checkPromptTokens.
type promptCount struct {
	label  string // the model's metrics label
	id     string // the request's id (from the client: escaped when logged)
	worker string // the worker that answered
	chat   bool
	// exact: tokens is the length of the prompt's token ids (the
	// request's own, or its tokenizer's: for a chat request the messages
	// rendered by the model's chat template); otherwise the prompt was
	// keyed by characters and tokens is an estimate.
	exact  bool
	tokens int
}

// checkPromptTokens compares the router's token count of a request's
// prompt (c) with the engine's usage.prompt_tokens (u), in
// switchyard_prompt_token_match_total{model, result}: exact, over (the
// router counted more), under, or unknown when the router had no token
// ids (the prompt was keyed by characters). An answer without
// usage.prompt_tokens (a stream whose client did not ask for its usage)
// is not counted. Its routing key is the engine's only when the counts
// agree, so a difference is logged, at warn, at most once per
// tokenLogInterval per model (the lines held back are counted in the
// next one), with both counts.
func (s *Server) checkPromptTokens(c promptCount, u usage) {
	if !u.hasPrompt {
		return
	}
	result := "unknown"
	if c.exact {
		result = compareBelief(c.tokens, int(u.prompt))
	}
	if s.met != nil {
		s.met.promptMatch.WithLabelValues(c.label, result).Inc()
	}
	if result == "exact" || result == "unknown" {
		return
	}
	if ok, suppressed := s.tokenLogs.allow(c.label); ok {
		s.log.Warn("the router's token count of a prompt differs from the engine's prompt_tokens: its routing key is not the engine's",
			"model", untrusted.Text(c.label, untrusted.MaxLabel), "request_id", untrusted.Text(c.id, untrusted.MaxLog),
			"worker", c.worker, "chat", c.chat, "router_tokens", c.tokens, "engine_prompt_tokens", u.prompt,
			"suppressed", suppressed)
	}
}

// tokenLogInterval is the least time between two log lines of token
// counts differing for one model: 10 s, the interval the router's other
// rate-limited lines keep (untrusted.NewLimiter's default).
const tokenLogInterval = 10 * time.Second

// maxTokenLogModels bounds the models tokenLog keeps a limit for; the
// models beyond it share one.
const maxTokenLogModels = 1024

// tokenLog rate-limits checkPromptTokens' log lines per model: one line
// per model per tokenLogInterval (untrusted.Limiter), for at most
// maxTokenLogModels models (names the engines report, so their set is
// bounded here, not by the engines); further models share one limit.
type tokenLog struct {
	lim    *untrusted.Limiter
	mu     sync.Mutex
	models map[string]struct{}
}

func newTokenLog() *tokenLog {
	return &tokenLog{lim: untrusted.NewLimiter(tokenLogInterval), models: make(map[string]struct{})}
}

// allow is untrusted.Limiter.Allow for model's cause.
func (t *tokenLog) allow(model string) (bool, uint64) {
	cause := "model " + model
	t.mu.Lock()
	if _, ok := t.models[model]; !ok {
		if len(t.models) < maxTokenLogModels {
			t.models[model] = struct{}{}
		} else {
			cause = "other models"
		}
	}
	t.mu.Unlock()
	return t.lim.Allow(cause)
}

// countUsage adds an answer's usage to the token counters of its model.
func (s *Server) countUsage(label string, u usage) {
	if s.met == nil || !u.ok {
		return
	}
	s.met.promptTokens.WithLabelValues(label).Add(float64(u.prompt))
	s.met.cachedTokens.WithLabelValues(label).Add(float64(min(u.cached, u.prompt)))
	s.met.completionTokens.WithLabelValues(label).Add(float64(u.completion))
}
