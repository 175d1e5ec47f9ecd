package mockworker

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/sim"
)

// dpRankHeader is the header vLLM reads to pin a request to a
// data-parallel rank (OpenAIServing._get_data_parallel_rank), and SGLang
// too (OpenAIServingBase.extract_routed_dp_rank_from_header,
// "X-Data-Parallel-Rank"); HTTP header names are case-insensitive.
const dpRankHeader = "X-data-parallel-rank"

// pickEngine chooses the rank serving r, whose body is req, as the
// engine played does (pickVLLM, pickSGLang).
func (s *Server) pickEngine(r *http.Request, req *genRequest) (*engine, *apiError) {
	if s.cfg.Engine == EngineSGLang {
		return s.pickSGLang(r, req)
	}
	return s.pickVLLM(r)
}

// pickVLLM chooses the rank serving r, as vLLM's API server does: the
// rank in the X-data-parallel-rank header when it is an integer (a value
// that is not an integer is ignored, as vLLM ignores it; one out of range
// is a 400), else the least loaded rank by vLLM's internal balancer's
// score, 4·waiting + running (DPLBAsyncMPClient.get_core_engine_for_request),
// waiting counting the requests this balancer sent that are not yet queued,
// ties to the lowest rank.
func (s *Server) pickVLLM(r *http.Request) (*engine, *apiError) {
	if h := r.Header.Get(dpRankHeader); h != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil {
			if n < 0 || n >= len(s.engines) {
				return nil, badRequest("%s: %d, this engine has data-parallel ranks 0 to %d", dpRankHeader, n, len(s.engines)-1)
			}
			return s.engines[n], nil
		}
	}
	best, bestScore := s.engines[0], int64(-1)
	for _, e := range s.engines {
		score := 4*(e.waiting.Load()+e.pending.Load()) + e.running.Load()
		if bestScore < 0 || score < bestScore {
			best, bestScore = e, score
		}
	}
	return best, nil
}

// pickSGLang chooses the rank serving r as SGLang does
// (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_base.py
// extract_routed_dp_rank_from_header, managers/data_parallel_controller.py
// maybe_external_dp_rank_routing and round_robin_scheduler): the
// X-Data-Parallel-Rank header's rank (a value that is not an integer is a
// 400, "Invalid X-Data-Parallel-Rank header"), else the body's
// routed_dp_rank, else its deprecated data_parallel_rank; a rank out of
// range is a 400 ("routed_dp_rank=N out of range [0, dp_size)"), and rank
// 0 of a server without data parallelism is ignored
// (_resolve_routed_dp_rank). A request without a rank goes to the ranks
// round-robin: the DataParallelController's default load_balance_method
// ("auto", round_robin outside prefill-decode disaggregation), blind to
// what each rank caches.
func (s *Server) pickSGLang(r *http.Request, req *genRequest) (*engine, *apiError) {
	var rank *int
	if h, ok := r.Header[http.CanonicalHeaderKey(dpRankHeader)]; ok && len(h) > 0 {
		n, err := strconv.Atoi(strings.TrimSpace(h[0]))
		if err != nil {
			return nil, badRequest("Invalid X-Data-Parallel-Rank header: must be an integer, got '%s'", untrusted.Text(h[0], 64))
		}
		rank = &n
	} else if req.RoutedDPRank != nil {
		rank = req.RoutedDPRank
	} else {
		rank = req.DataParallelRank
	}
	dp := len(s.engines)
	switch {
	case rank == nil || dp <= 1 && *rank == 0:
	case *rank < 0 || *rank >= dp:
		return nil, badRequest("routed_dp_rank=%d out of range [0, %d)", *rank, dp)
	default:
		return s.engines[*rank], nil
	}
	return s.engines[(s.roundRobin.Add(1)-1)%uint64(dp)], nil
}

// submitPicked submits a to e, counting it pending for the balancer until
// e has queued it.
func (e *engine) submitPicked(a *active, r sim.Request) error {
	e.pending.Add(1)
	defer e.pending.Add(-1)
	return e.submit(a, r)
}

// handleResetPrefixCache serves POST /reset_prefix_cache (vLLM's, served
// in its development mode): every rank drops its prefix cache and
// publishes AllBlocksCleared. 200 when all did; 409 naming the ranks that
// refused because requests were running (their caches are unchanged).
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	var refused []string
	for _, e := range s.engines {
		if !e.clearCache() {
			refused = append(refused, strconv.Itoa(e.rank))
		}
	}
	if len(refused) > 0 {
		writeError(w, &apiError{status: http.StatusConflict, typ: "conflict_error",
			msg: fmt.Sprintf("prefix cache not reset on data-parallel rank(s) %s: requests are running there", strings.Join(refused, ", "))})
		return
	}
	w.WriteHeader(http.StatusOK)
}
