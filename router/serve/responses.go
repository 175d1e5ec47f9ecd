package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/live"
)

// followUp runs a Responses request that continues a stored response
// (previous_response_id prev): only the engine that answered prev holds
// it (and its KV cache), so the request is admitted on that worker alone
// (every other member of the model's partition excluded: it waits in the
// queue while that worker is at capacity) and never sent elsewhere. When
// the router knows no live binding of prev (never seen, expired, or its
// engine left the fleet) it answers as vLLM answers an id it does not
// hold (writeResponseNotFound); when that worker fails before answering,
// 502 worker_failed (it is not replaced). A disaggregated model's
// follow-up runs in one hop on the decode worker that answered prev
// (live.Runtime.FollowUp, shared with the EPP). It returns the code the
// request is counted under.
func (s *Server) followUp(ex *exchange, prev string) int {
	w, hop, only, err := s.rt.FollowUp(ex.Model, prev)
	if err != nil {
		// Unknown, expired, or its engine left (or does not serve the
		// request's model): 404; its engine not ready: 503.
		return writeResponseHolderError(ex.w, prev, err)
	}
	spec := hopSpec{hop: hop, tag: "#", opts: []admission.Option{only}, noRetry: true,
		answer: func(ex *exchange, err error) int {
			if errors.Is(err, router.ErrAllExcluded) {
				// The worker left between the lookup and the placement.
				writeResponseNotFound(ex.w, prev)
				return http.StatusNotFound
			}
			return s.admitError(ex, err)
		}}
	return s.hop(ex, spec, func(h *admission.Handle, d router.Decision) (int, bool, string) {
		if d.Worker.ID != w.ID {
			// A worker that joined after the lookup, and so was not
			// excluded: never send the follow-up there.
			s.rt.End(h, admission.Aborted("not the worker holding the previous response"))
			writeResponseNotFound(ex.w, prev)
			return http.StatusNotFound, false, ""
		}
		return s.passThrough(ex, h, d.Worker, ex.body)
	})
}

// maxCancelBody bounds the body of POST /v1/responses/{id}/cancel the
// router forwards (OpenAI's clients send none).
const maxCancelBody = 64 << 10

// storedResponse answers GET /v1/responses/{id} (retrieve a stored
// response; with ?stream=true, resume its stream) and POST
// /v1/responses/{id}/cancel (cancel a background response) from the
// engine that holds the response (live.Runtime.ResponseWorker), passed
// through unchanged. They are not admitted or booked: they read or stop
// what the engine holds. An id the router cannot send there is answered
// as vLLM answers one it does not hold (writeResponseNotFound); the
// engine failing before answering is 502 worker_failed.
func (s *Server) storedResponse(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	start := time.Now()
	id := r.PathValue("id")
	reqID := r.Header.Get("X-Request-Id")
	if reqID == "" {
		reqID = s.rt.NewID()
	}
	w.Header().Set("X-Request-Id", reqID)
	p, err := s.rt.PlaceStored(id, nil)
	wk, model := p.Decision.Worker, p.Model()
	label := s.rt.ModelLabel(model)
	if err != nil {
		s.rt.CountRequest(label, writeResponseHolderError(w, id, err), start)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	ex := &exchange{w: w, r: r, ctx: ctx, path: r.URL.EscapedPath(), query: r.URL.RawQuery}
	ex.Start, ex.Model, ex.Label, ex.labelSet = start, model, label, true
	ex.ID = reqID
	if r.Method != http.MethodGet && r.Body != nil {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCancelBody))
		if err != nil {
			live.WriteError(w, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_body", "reading the request body: "+err.Error())
			s.rt.CountRequest(label, http.StatusBadRequest, start)
			return
		}
		ex.body = body
	}
	code, retry, why := s.passThrough(ex, nil, wk, ex.body)
	if retry {
		live.WriteError(w, http.StatusBadGateway, live.TypeServer, "worker_failed",
			fmt.Sprintf("the engine holding response %q failed before answering: %s", id, why))
		code = http.StatusBadGateway
	}
	s.rt.CountRequest(label, code, start)
	if code == live.CodeClientGone || ex.abort {
		panic(http.ErrAbortHandler)
	}
}
