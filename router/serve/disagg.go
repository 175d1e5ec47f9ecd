package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// Disaggregated serving: a model that no aggregated worker serves but a
// prefill worker does is served in two hops, by vLLM's disaggregated
// proxy protocol (the NixlConnector toy proxy), on every generation
// endpoint (chat, completions, Responses, Anthropic Messages). The
// prefill hop sends the request, rewritten to compute the prompt's KV and
// one token (live.PrefillBody: the output bound in the schema's own
// field), to a prefill worker admitted like an aggregated request; the
// decode hop, admitted the same way with role decode, sends the original
// request plus the prefill answer's kv_transfer_params (live.DecodeBody)
// to a decode worker and passes its answer through, streamed or not, in
// the schema's own format. The bodies are the ones router/epp/sidecar
// sends behind a gateway: one function, in router/live, for both faces.

// Header naming the prefill worker of a disaggregated request (the decode
// worker is X-Switchyard-Worker).
const headerPrefillWorker = "X-Switchyard-Prefill-Worker"

// disaggregated reports whether model is served in prefill and decode
// hops: no aggregated worker of the fleet serves it and a prefill worker
// does.
func (s *Server) disaggregated(model string) bool {
	return len(s.r.Workers(model, shared.RoleAggregated)) == 0 && len(s.r.Workers(model, shared.RolePrefill)) > 0
}

// decodeFollowUp is the one hop of a disaggregated model's Responses
// follow-up (previous_response_id): on the decode worker that answered
// the previous response, which alone stores it (a prefill engine does
// not: its prefill hop would answer 404), computing the whole prompt
// itself, as a vLLM decode engine does for a request without
// kv_transfer_params; so its request carries the prompt's block hashes.
var decodeFollowUp = admission.Hop{Role: shared.RoleDecode, PrefixHashes: true, Final: true}

// followUpHop is the hop a Responses follow-up of model runs in:
// decodeFollowUp when the model is served disaggregated, else the
// aggregated path's one hop.
func (s *Server) followUpHop(model string) admission.Hop {
	if s.disaggregated(model) {
		return decodeFollowUp
	}
	return admission.Aggregated.Hop(0)
}

// disagg runs a disaggregated request, prefill hop then decode hop, and
// returns the code it is counted under.
func (s *Server) disagg(ex *exchange) int {
	if len(s.r.Workers(ex.Model, shared.RoleDecode)) == 0 {
		s.fail(ex, http.StatusServiceUnavailable, live.TypeServer, "no_worker",
			fmt.Sprintf("no ready decode worker for model %q: it is served disaggregated (it has prefill workers but no aggregated one)", ex.Model))
		return http.StatusServiceUnavailable
	}
	pbody, err := live.PrefillBody(ex.body, ex.API)
	if err != nil {
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	// The prefill hop set X-Switchyard-Prefill-Worker on the answer.
	kv, code := s.prefill(ex, pbody)
	if code != 0 {
		return code
	}
	dbody, err := live.DecodeBody(ex.body, kv)
	if err != nil {
		// The body and kv were both decoded as JSON already: unreachable.
		s.fail(ex, http.StatusInternalServerError, live.TypeServer, "internal", err.Error())
		return http.StatusInternalServerError
	}
	return s.decode(ex, dbody)
}

// prefill runs the prefill hop: admitted with role prefill (classifier,
// queue and capacity as for an aggregated request), retried on another
// prefill worker when one fails before answering. It returns the prefill
// answer's kv_transfer_params, or the code of the answer it gave the
// client.
func (s *Server) prefill(ex *exchange, body []byte) (kv json.RawMessage, code int) {
	code = s.hop(ex, hopSpec{hop: admission.Disaggregated.Hop(0), tag: "#", workers: "prefill workers"},
		func(h *admission.Handle, d router.Decision) (int, bool, string) {
			var code int
			var retry bool
			var why string
			kv, code, retry, why = s.prefillHop(ex, h, d.Worker, body)
			return code, retry, why
		})
	return kv, code
}

// prefillHop sends the prefill request to the worker called name and
// reads its answer whole. It ends h on every path but a retry: completed
// (the prompt plus the one token, after its first token) when the answer
// carries kv_transfer_params, aborted otherwise. code is 0 on success,
// else the code of the answer given to the client: a non-2xx prefill
// answer passed through as is, 502 for an answer without
// kv_transfer_params, 499 or 504 when the request's context ended. retry
// is true, with why, when the worker failed before its answer was
// complete; nothing was written to the client then.
func (s *Server) prefillHop(ex *exchange, h *admission.Handle, w *fleet.Worker, body []byte) (kv json.RawMessage, code int, retry bool, why string) {
	name := w.Name
	end := func(complete bool, reason string) {
		if complete {
			// The prompt plus the one token the prefill generated.
			s.rt.End(h, admission.Completed(admission.Disaggregated.Hop(0).ContextTokens(ex.Tokens, 1)))
		} else {
			s.rt.End(h, admission.Aborted(reason))
		}
	}
	up, why := s.upstream(ex, w, body)
	if up == nil {
		return nil, 0, true, why
	}
	// The router reads this answer itself: no compressed encoding.
	up.Header.Del("Accept-Encoding")
	resp, err := s.transport.RoundTrip(up)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, live.MaxPrefillAnswer+1))
		_ = resp.Body.Close()
	}
	if err != nil {
		if ex.ctx.Err() != nil {
			end(false, ctxReason(ex))
			if ex.r.Context().Err() != nil {
				return nil, live.CodeClientGone, false, ""
			}
			s.fail(ex, http.StatusGatewayTimeout, live.TypeServer, "timeout", "the request timed out before the prefill worker answered")
			return nil, http.StatusGatewayTimeout, false, ""
		}
		s.log.Warn("prefill worker failed before answering", "worker", name, "request_id", ex.ID, "error", err)
		s.workers.ReportFailure(name)
		return nil, 0, true, "worker error: " + err.Error()
	}
	if resp.StatusCode >= 500 {
		s.workers.ReportFailure(name)
	} else {
		s.workers.ReportSuccess(name)
	}
	// The prefill worker answered: whatever the client gets now names it.
	ex.w.Header().Set(headerPrefillWorker, name)
	if len(answer) > live.MaxPrefillAnswer {
		end(false, "prefill answer too large")
		s.fail(ex, http.StatusBadGateway, live.TypeServer, "bad_prefill_answer",
			fmt.Sprintf("prefill worker %q answered more than %d bytes", name, live.MaxPrefillAnswer))
		return nil, http.StatusBadGateway, false, ""
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		end(false, "prefill answered "+strconv.Itoa(resp.StatusCode))
		hdr := ex.w.Header()
		s.answerHeaders(hdr, resp.Header)
		hdr.Set(headerPrefillWorker, name) // over the worker's own
		hdr.Set("X-Request-Id", ex.ID)
		hdr.Set("Content-Length", strconv.Itoa(len(answer)))
		ex.w.WriteHeader(resp.StatusCode)
		_, _ = ex.w.Write(answer)
		return nil, resp.StatusCode, false, ""
	}
	kv, ok := live.KVTransferParams(answer)
	if !ok {
		s.log.Warn("prefill answer without kv_transfer_params", "worker", name, "request_id", ex.ID)
		end(false, "prefill answer without kv_transfer_params")
		s.fail(ex, http.StatusBadGateway, live.TypeServer, "bad_prefill_answer",
			fmt.Sprintf("prefill worker %q answered without a kv_transfer_params object: is it an engine with a KV connector producing KV (vLLM --kv-transfer-config kv_role kv_producer or kv_both)?", name))
		return nil, http.StatusBadGateway, false, ""
	}
	h.FirstToken()
	end(true, "")
	return kv, 0, false, ""
}

// decode runs the decode hop: admitted with role decode (classifier,
// queue and capacity as for the prefill hop), with the prompt's token
// count and no block hashes (the KV arrives by transfer; it is not in the
// decode worker's prefix cache, so the prefix index must not record it),
// and the answer passed through. A decode worker that fails before a byte
// is excluded and the hop placed again, up to MaxRetries times. It
// returns the code the request is counted under.
func (s *Server) decode(ex *exchange, body []byte) int {
	return s.hop(ex, hopSpec{hop: admission.Disaggregated.Hop(1), tag: "#d", workers: "decode workers", answer: s.decodeError},
		func(h *admission.Handle, d router.Decision) (int, bool, string) {
			return s.passThrough(ex, h, d.Worker, body)
		})
}

// decodeError answers a decode admission's failure and returns its code.
func (s *Server) decodeError(ex *exchange, err error) int {
	switch {
	case ex.r.Context().Err() != nil:
		return live.CodeClientGone
	case errors.Is(err, router.ErrAllExcluded):
		s.fail(ex, http.StatusBadGateway, live.TypeServer, "worker_failed",
			fmt.Sprintf("the selected decode workers failed before answering and no other decode worker serves model %q", ex.Model))
		return http.StatusBadGateway
	case errors.Is(err, shared.ErrNoWorkers):
		s.fail(ex, http.StatusServiceUnavailable, live.TypeServer, "no_worker",
			fmt.Sprintf("no ready decode worker for model %q", ex.Model))
		return http.StatusServiceUnavailable
	}
	return s.admitError(ex, err)
}
