package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/tidwall/gjson"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// DebugRoute is the /debug/route answer (on --debug-listen's address):
// which engine holds how much of a request's prompt and where the
// request would go now, as a dry run of the live path
// (docs/serve.md, "/debug/route").
type DebugRoute struct {
	Key RouteKey `json:"key"`
	// Hops are the request's selections: one (aggregated), or prefill
	// then decode for a model served disaggregated.
	Hops []RouteHop `json:"hops"`
}

// RouteKey is the request's routing key, as the live handler builds it.
type RouteKey struct {
	Model string `json:"model"`
	// BlockSize is the tokens per block the prompt is keyed at (the
	// model's engines' block size, or router.block_size when set).
	BlockSize    int `json:"block_size"`
	PromptTokens int `json:"prompt_tokens"`
	Blocks       int `json:"blocks"`
	// KeyedBy is how the prompt was keyed: "token_ids" (the request's
	// own), "engine" (its engines' /tokenize), "file" (a tokenizer
	// block's file) or "characters" (no token ids: scored
	// approximately everywhere); TokenizerError is why a tokenizer
	// failed when it did.
	KeyedBy        string `json:"keyed_by"`
	TokenizerError string `json:"tokenizer_error,omitempty"`
	// Precise is true when the key has token ids, which a precise index
	// (KV events) can score.
	Precise bool `json:"precise"`
	// LoRA is the LoRA adapter the request runs with; CacheSalt its
	// cache_salt; absent for none.
	LoRA      string `json:"lora,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
}

// RouteHop is one selection of a DebugRoute (router.Explanation).
type RouteHop struct {
	Role   string `json:"role"`
	Policy string `json:"policy"`
	Hosted bool   `json:"hosted"`
	// Fallback: the role's policy failed (FallbackCause) and its
	// fallback decided. Target: the request's advisory target was taken
	// without running the policy.
	Fallback      bool   `json:"fallback,omitempty"`
	FallbackCause string `json:"fallback_cause,omitempty"`
	Target        bool   `json:"target,omitempty"`
	// Canary: the role's policy has a canary whose candidate takes this
	// request; Policy names the candidate.
	Canary bool `json:"canary,omitempty"`
	// Classifier, when set, says that the live path classifies the
	// request first, which the dry run does not.
	Classifier string `json:"classifier,omitempty"`
	// Chosen is where the request would go; null with Error.
	Chosen *RouteChoice `json:"chosen"`
	Error  *RouteError  `json:"error,omitempty"`
	// Candidates are the members of the model and role, in the order
	// selections see them.
	Candidates []RouteCandidate `json:"candidates"`
}

// RouteChoice is a hop's chosen candidate.
type RouteChoice struct {
	Worker string `json:"worker"`
	Rank   uint32 `json:"rank"`
	// OverlapBlocks is the leading blocks of the prompt it is believed
	// to hold (CACHE); CachedTokens those in tokens.
	OverlapBlocks int `json:"overlap_blocks"`
	CachedTokens  int `json:"cached_tokens"`
}

// RouteError is what the live path would answer instead of a choice:
// Status, Code and Message are its error answer; Queued is true when it
// would queue the request instead (every candidate at capacity).
type RouteError struct {
	Status  int    `json:"status,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Queued  bool   `json:"queued,omitempty"`
}

// RouteCandidate is one member in a RouteHop.
type RouteCandidate struct {
	Worker string `json:"worker"`
	Rank   uint32 `json:"rank"`
	// KVEvents is its KV-event stream's state ("live", "cold",
	// "connecting", "bootstrapping", "stale"; "none" without one).
	KVEvents string `json:"kv_events"`
	// PreciseGPUTokens and PreciseCPUTokens are the leading prompt tokens
	// its live precise index holds on GPU and, right after, on CPU; null
	// when it is not scored precisely (no live index, or no token ids).
	// EngineBlockSize is the index's block size.
	PreciseGPUTokens *int `json:"precise_gpu_tokens"`
	PreciseCPUTokens *int `json:"precise_cpu_tokens"`
	EngineBlockSize  int  `json:"engine_block_size,omitempty"`
	// ApproxTokens is what its approximate list (what the router sent
	// it) holds of the prompt; OverlapBlocks the CACHE input, in the
	// key's blocks (the precise figure when it is scored precisely).
	ApproxTokens  int   `json:"approx_tokens"`
	OverlapBlocks int32 `json:"overlap_blocks"`
	// ActiveRequests, Load and CapacityBlocks are ACTIVE_REQUESTS, LOAD
	// and CAPACITY.
	ActiveRequests int64     `json:"active_requests"`
	Load           RouteLoad `json:"load"`
	CapacityBlocks int64     `json:"capacity_blocks"`
	// Excluded is why it was no candidate ("capacity": at the queue's
	// max_active_requests); FilteredBy the filter that left it out.
	Excluded   string `json:"excluded,omitempty"`
	FilteredBy string `json:"filtered_by,omitempty"`
	// Cost is its summed weighted cost, the picker's input, and Costs
	// each scorer's; absent when it was not scored.
	Cost   *float64    `json:"cost,omitempty"`
	Costs  []RouteCost `json:"costs,omitempty"`
	Chosen bool        `json:"chosen"`
}

// RouteLoad is a candidate's LOAD input.
type RouteLoad struct {
	// Available is true when the load is known (engine metrics fresh).
	Available           bool     `json:"available"`
	ActivePrefillTokens int64    `json:"active_prefill_tokens"`
	ActiveDecodeBlocks  int64    `json:"active_decode_blocks"`
	KVUsage             *float64 `json:"kv_usage,omitempty"`
	Waiting             *int64   `json:"waiting,omitempty"`
}

// RouteCost is one scorer's weighted cost.
type RouteCost struct {
	Scorer string  `json:"scorer"`
	Cost   float64 `json:"cost"`
}

// routeView answers /debug/route: s's parsing, key and admission
// settings, with the runtime's KV-event streams (live.Runtime.EventStream)
// giving each candidate's KV-event state.
type routeView struct {
	s *Server
}

// ServeHTTP answers GET /debug/route?model=M&prompt=P[&cache_salt=S][&chat=1]
// (P a completions prompt, or with chat=1 the content of one user
// message) and POST /debug/route with an OpenAI chat/completions body
// (one with "messages") or completions body, bounded as the live
// handler's (MaxBodyBytes, the bodies' budgets, the body read
// timeout). It parses and keys the
// request with the live path's code (live.ParseRequest, live.Runtime.Key: the
// model's block size, LoRA adapter, cache_salt and tokenizer, which may
// ask an engine's /tokenize), then runs each hop's selection as a dry
// run (router.Router.Explain, with the queue's capacity): nothing is
// booked, recorded or sent. 400 for a body the live path refuses, 405
// for another method; else 200 with DebugRoute, also when the live path
// would fail (RouteHop.Error).
func (v routeView) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := v.s
	var body []byte
	chat := false
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		chat = q.Get("chat") == "1" || q.Get("chat") == "true"
		// Only what the query names: without a prompt the body has none,
		// and the live path's "you must provide a prompt" answers (400).
		req := map[string]any{"model": q.Get("model")}
		switch {
		case !q.Has("prompt"):
		case chat:
			req["messages"] = []map[string]string{{"role": "user", "content": q.Get("prompt")}}
		default:
			req["prompt"] = q.Get("prompt")
		}
		if q.Has("cache_salt") {
			req["cache_salt"] = q.Get("cache_salt")
		}
		body, _ = json.Marshal(req)
	case http.MethodPost:
		if r.ContentLength > s.maxBody {
			live.WriteError(w, http.StatusRequestEntityTooLarge, live.TypeInvalidRequest, "body_too_large",
				fmt.Sprintf("request body of %d bytes exceeds %d bytes", r.ContentLength, s.maxBody))
			return
		}
		// As the API reads a body: within the body timeout, its bytes
		// counted in the bodies' budgets while it is held.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(min(s.timeout, bodyReadTimeout)))
		hold := &bodyHold{b: s.bodies, client: clientKey(r.RemoteAddr)}
		defer hold.release()
		var err error
		body, err = readBody(w, r, s.maxBody, hold)
		_ = rc.SetReadDeadline(time.Time{})
		if err != nil {
			w.Header().Set("Connection", "close")
			var tooBig *http.MaxBytesError
			var refused *bodyRefused
			switch {
			case errors.As(err, &tooBig):
				live.WriteError(w, http.StatusRequestEntityTooLarge, live.TypeInvalidRequest, "body_too_large",
					fmt.Sprintf("request body exceeds %d bytes", s.maxBody))
			case errors.As(err, &refused):
				live.WriteError(w, http.StatusServiceUnavailable, live.TypeServer, "overloaded", refused.Error())
			default:
				live.WriteError(w, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", "reading the request body: "+err.Error())
			}
			return
		}
		chat = gjson.GetBytes(body, "messages").Exists()
	default:
		live.WriteError(w, http.StatusMethodNotAllowed, live.TypeInvalidRequest, "method_not_allowed", r.Method+" is not allowed on /debug/route")
		return
	}
	api := live.APICompletions
	if chat {
		api = live.APIChat
	}
	req, err := live.ParseRequest(body, api)
	if err != nil {
		live.WriteError(w, http.StatusBadRequest, live.TypeInvalidRequest, "invalid_request", err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	ex := &exchange{ctx: ctx}
	ex.Model, ex.ID, ex.Session, ex.Meta = req.Model, s.rt.NewID()+"-debug", r.Header.Get("X-Session-Id"), live.RequestMetadata(r.Header)
	s.rt.Key(ctx, &ex.Request, req.Key())
	out := DebugRoute{Key: RouteKey{Model: req.Model, BlockSize: ex.BlockSize, PromptTokens: ex.Tokens, Blocks: len(ex.Hashes),
		KeyedBy: ex.KeyedBy, Precise: ex.IDs != nil, LoRA: ex.LoRA, CacheSalt: untrusted.Text(ex.Salt, untrusted.MaxClient)}}
	if ex.TokErr != nil {
		out.Key.TokenizerError = untrusted.Text(ex.TokErr.Error(), untrusted.MaxClient)
	}
	path := admission.Aggregated
	if s.rt.Disaggregated(ex.Model) {
		path = admission.Disaggregated
	}
	for i := range path.Len() {
		hop := path.Hop(i)
		sr := hop.Request(&shared.Request{Model: ex.Model, PromptTokens: ex.Tokens, BlockSize: ex.BlockSize, BlockHashes: ex.Hashes,
			SessionID: ex.Session, Metadata: ex.Meta, Prompt: ex.PromptKey()})
		sr.ID = ex.ID + "#" + strconv.Itoa(i)
		out.Hops = append(out.Hops, v.hop(ctx, ex, sr))
	}
	live.WriteJSON(w, http.StatusOK, out)
}

// hop explains one hop's selection of req.
func (v routeView) hop(ctx context.Context, ex *exchange, req *shared.Request) RouteHop {
	s := v.s
	e := s.r.Explain(ctx, req, router.Placement{Capacity: s.rt.Capacity()})
	h := RouteHop{Role: string(req.Role), Policy: e.Policy, Hosted: e.Hosted, Fallback: e.Fallback, Target: e.Target, Canary: e.Canary,
		Candidates: make([]RouteCandidate, 0, len(e.Candidates))}
	if e.FallbackCause != nil {
		h.FallbackCause = untrusted.Text(e.FallbackCause.Error(), untrusted.MaxClient)
	}
	if s.r.ClassifierFactory() != nil {
		h.Classifier = "the policy file's request_classifier classifies the live request first (its priority, class and advisory target); the dry run does not run it"
	}
	bs := req.BlockSize
	for _, c := range e.Candidates {
		rc := RouteCandidate{Worker: c.Worker.Name, Rank: c.Worker.DPRank, KVEvents: "none", ApproxTokens: c.Belief.ApproxTokens,
			OverlapBlocks: c.OverlapBlocks, ActiveRequests: c.ActiveRequests, CapacityBlocks: c.TotalKVBlocks,
			Excluded: c.Excluded, FilteredBy: c.FilteredBy, Chosen: c.Chosen,
			Load: RouteLoad{Available: c.Load.Available, ActivePrefillTokens: c.Load.ActivePrefillTokens, ActiveDecodeBlocks: c.Load.ActiveDecodeBlocks}}
		if st, ok := s.rt.EventStream(c.Worker.ID, c.Worker.DPRank); ok {
			rc.KVEvents = st.State
		}
		if b := c.Belief; b.Precise {
			gpu, cpu := b.PreciseTokens, b.CPUTokens
			rc.PreciseGPUTokens, rc.PreciseCPUTokens, rc.EngineBlockSize = &gpu, &cpu, b.EngineBlockSize
		}
		if c.Load.HasKVUsage {
			u := c.Load.KVUsage
			rc.Load.KVUsage = &u
		}
		if c.Load.HasWaiting {
			n := c.Load.Waiting
			rc.Load.Waiting = &n
		}
		if c.HasCost {
			cost := c.Cost
			rc.Cost = &cost
			for _, sc := range c.Costs {
				rc.Costs = append(rc.Costs, RouteCost{Scorer: sc.Scorer, Cost: sc.Cost})
			}
		}
		h.Candidates = append(h.Candidates, rc)
	}
	switch {
	case e.Err == nil:
		h.Chosen = &RouteChoice{Worker: e.Worker.Name, Rank: e.Worker.DPRank, OverlapBlocks: e.OverlapBlocks, CachedTokens: e.OverlapBlocks * bs}
	case errors.Is(e.Err, shared.ErrAllBusy):
		h.Error = &RouteError{Code: "queued", Queued: true,
			Message: "every candidate is at capacity (the queue's max_active_requests): the live request would wait in the queue"}
	default:
		a := s.errorAnswer(ex.Model, ex.ID, e.Err, false)
		h.Error = &RouteError{Status: a.status, Code: a.code, Message: untrusted.Text(a.msg, 2*untrusted.MaxClient)}
	}
	return h
}
