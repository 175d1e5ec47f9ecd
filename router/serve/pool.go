package serve

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// exchangePool runs a request whose body carries no prompt to key, its
// body read (ex.body, ex.API): pooling and scoring (live.APIPool),
// speech to text (live.APIAudio) and a pass-through (live.APIOther) are
// admitted by load among the engines serving the body's model, with no
// prefix key, booked with their inputs' size (live.Runtime.ParsePoolBody
// at the request's Content-Type: a multipart/form-data speech-to-text or
// pass-through body is read as a form, its "model" part naming the
// model) until the answer ends, and retried like generation when the
// engine fails before answering; an engine utility (live.APIUtility) is
// sent to one engine without admission (utility). The body and its
// Content-Type are forwarded unchanged. It returns the code the request
// is counted under.
func (s *Server) exchangePool(ex *exchange) int {
	pr, err := s.rt.ParsePoolBody(ex.API, ex.r.Header.Get("Content-Type"), ex.body)
	if err != nil {
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	if pr.Model == "" {
		if ex.API == live.APIOther {
			// Nothing names the engines: the path is unknown to the router.
			s.fail(ex, http.StatusNotFound, live.TypeInvalidRequest, "not_found",
				fmt.Sprintf("no endpoint %s %s: the router passes a path it does not route through to an engine serving the body's \"model\", and the body names none", ex.r.Method, ex.path))
			return http.StatusNotFound
		}
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", "you must provide a model parameter")
		return http.StatusBadRequest
	}
	ex.Model, ex.Tokens = pr.Model, pr.Tokens
	ex.Label, ex.labelSet = s.rt.ModelLabel(ex.Model), true
	if err := ex.ctx.Err(); err != nil {
		return s.admitError(ex, err)
	}
	if ex.API == live.APIUtility {
		return s.utility(ex)
	}
	ex.Session = ex.r.Header.Get("X-Session-Id")
	ex.Meta = live.RequestMetadata(ex.r.Header)
	hop := admission.Aggregated.Hop(0)
	if s.rt.Disaggregated(ex.Model) {
		// A model served disaggregated only: its prefill engines compute
		// inputs.
		hop = admission.Hop{Role: shared.RolePrefill, Final: true}
	}
	return s.hop(ex, hopSpec{hop: hop, tag: "#"}, func(h *admission.Handle, d router.Decision) (int, bool, string) {
		return s.passThrough(ex, h, d.Worker, ex.body)
	})
}

// utility sends an engine utility request (tokenize, detokenize) to one
// engine serving its model, of any role: the one with the fewest
// requests in flight, ties broken round-robin. It is not admitted, not
// booked and not counted as load (a tokenizer call costs the engine no
// KV cache and no scheduling). An engine that fails before answering is
// replaced by the next, up to MaxRetries times. It returns the code the
// request is counted under.
func (s *Server) utility(ex *exchange) int {
	var failed []shared.WorkerID
	for attempt := 0; ; attempt++ {
		w := s.utilityWorker(ex.Model, failed)
		if w == nil {
			var mnf *live.ModelNotFoundError
			switch {
			case len(failed) > 0:
				s.fail(ex, http.StatusBadGateway, live.TypeServer, "worker_failed",
					fmt.Sprintf("the selected workers failed before answering (%d attempts)", attempt))
				return http.StatusBadGateway
			case errors.As(s.rt.ModelNotFound(ex.Model, shared.ErrNoWorkers), &mnf):
				s.fail(ex, http.StatusNotFound, live.TypeInvalidRequest, live.CodeModelNotFound, mnf.Error())
				return http.StatusNotFound
			default:
				s.fail(ex, http.StatusServiceUnavailable, live.TypeServer, "no_worker", fmt.Sprintf("no ready worker for model %q: its workers are starting or not answering", ex.Model))
				return http.StatusServiceUnavailable
			}
		}
		code, retry, why := s.passThrough(ex, nil, w, ex.body)
		if !retry {
			return code
		}
		s.log.Debug("utility request: trying another worker", "request_id", ex.ID, "worker", w.Name, "why", why)
		failed = append(failed, w.ID)
		if attempt >= s.retries {
			s.fail(ex, http.StatusBadGateway, live.TypeServer, "worker_failed",
				fmt.Sprintf("the selected workers failed before answering (%d attempts)", attempt+1))
			return http.StatusBadGateway
		}
	}
}

// utilityWorker returns the engine an engine utility of model goes to,
// not in skip: the runtime's choice, shared with the EPP
// (live.Runtime.UtilityWorker: the ready worker of any role with the
// fewest requests in flight, ties round-robin); nil when there is none.
func (s *Server) utilityWorker(model string, skip []shared.WorkerID) *fleet.Worker {
	return s.rt.UtilityWorker(model, skip)
}
