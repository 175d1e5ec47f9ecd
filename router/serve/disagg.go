package serve

import (
	"bytes"
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
// proxy protocol (the NixlConnector toy proxy). The prefill hop sends the
// request, rewritten to compute the prompt's KV and one token, to a
// prefill worker admitted like an aggregated request; the decode hop,
// admitted the same way with role decode, sends the original request plus
// the prefill answer's kv_transfer_params to a decode worker and passes
// its answer through.

// maxPrefillAnswer bounds a prefill worker's answer, which is read whole
// for its kv_transfer_params (1 MiB).
const maxPrefillAnswer = 1 << 20

// prefillKVParams is the prefill request's kv_transfer_params: compute the
// prompt's KV and keep it for a remote decode worker to fetch.
var prefillKVParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// Header naming the prefill worker of a disaggregated request (the decode
// worker is X-Switchyard-Worker).
const headerPrefillWorker = "X-Switchyard-Prefill-Worker"

// disaggregated reports whether model is served in prefill and decode
// hops: no aggregated worker of the fleet serves it and a prefill worker
// does.
func (s *Server) disaggregated(model string) bool {
	return len(s.r.Workers(model, shared.RoleAggregated)) == 0 && len(s.r.Workers(model, shared.RolePrefill)) > 0
}

// disagg runs a disaggregated request, prefill hop then decode hop, and
// returns the code it is counted under.
func (s *Server) disagg(ex *exchange) int {
	if len(s.r.Workers(ex.Model, shared.RoleDecode)) == 0 {
		s.fail(ex, http.StatusServiceUnavailable, live.TypeServer, "no_worker",
			fmt.Sprintf("no ready decode worker for model %q: it is served disaggregated (it has prefill workers but no aggregated one)", ex.Model))
		return http.StatusServiceUnavailable
	}
	pbody, err := prefillBody(ex.body)
	if err != nil {
		s.fail(ex, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return http.StatusBadRequest
	}
	// The prefill hop set X-Switchyard-Prefill-Worker on the answer.
	kv, code := s.prefill(ex, pbody)
	if code != 0 {
		return code
	}
	dbody, err := decodeBody(ex.body, kv)
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
		answer, err = io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
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
	if len(answer) > maxPrefillAnswer {
		end(false, "prefill answer too large")
		s.fail(ex, http.StatusBadGateway, live.TypeServer, "bad_prefill_answer",
			fmt.Sprintf("prefill worker %q answered more than %d bytes", name, maxPrefillAnswer))
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
	kv, ok := kvTransferParams(answer)
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

// prefillBody is the prefill hop's body: the client's body with
// kv_transfer_params asking for a remote decode, stream false, max_tokens
// 1 (and max_completion_tokens 1 when set), and without stream_options,
// min_tokens and min_completion_tokens (a prefill generates one token).
// Every other field passes unchanged.
func prefillBody(body []byte) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) {
		m["kv_transfer_params"] = prefillKVParams
		m["stream"] = json.RawMessage("false")
		m["max_tokens"] = json.RawMessage("1")
		if _, ok := m["max_completion_tokens"]; ok {
			m["max_completion_tokens"] = json.RawMessage("1")
		}
		delete(m, "stream_options")
		delete(m, "min_tokens")
		delete(m, "min_completion_tokens")
	})
}

// decodeBody is the decode hop's body: the client's body with the prefill
// answer's kv_transfer_params.
func decodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	return editJSON(body, func(m map[string]json.RawMessage) { m["kv_transfer_params"] = kv })
}

// editJSON decodes a JSON object, edits its members and encodes it again
// (members in key order, HTML characters not escaped).
func editJSON(body []byte, edit func(map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %w", live.ErrBadRequest, err)
	}
	if m == nil {
		return nil, fmt.Errorf("%w: body is not a JSON object", live.ErrBadRequest)
	}
	edit(m)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encoding the rewritten body: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// kvTransferParams returns the kv_transfer_params object of a prefill
// answer, as the answer spells it; false when there is none (absent, null,
// not an object, or the answer is not JSON).
func kvTransferParams(answer []byte) (json.RawMessage, bool) {
	var v struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(answer, &v) != nil {
		return nil, false
	}
	kv := bytes.TrimSpace(v.KV)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, false
	}
	return kv, true
}
