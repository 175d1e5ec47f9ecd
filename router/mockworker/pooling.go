package mockworker

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/switchyard-router/switchyard/router/sim"
)

// Pooling and scoring as vLLM serves them. Sources, vllm-project/vllm:
// vllm/entrypoints/pooling/embed/protocol.py@ff8d577a (EmbeddingRequest,
// EmbeddingResponse), pooling/pooling/protocol.py@343bacaf (PoolingResponse),
// pooling/classify/protocol.py@dff4cad3 (ClassificationResponse),
// pooling/score/protocol.py@1fff4ef8 (ScoreRequest: text_1/text_2,
// data_1/data_2, queries/documents or queries/items; RerankRequest,
// RerankResponse) and openai/engine/protocol.py@d7e52523 (UsageInfo).
//
// The mock's model pools each input into EmbeddingDim deterministic
// numbers (a hash of its tokens spread into a unit vector): equal inputs
// pool equally; a score is (1 + the cosine of the two inputs' vectors)/2.
// Each input runs in the simulated engine as a request of its tokens and
// one output token (its prefill takes time proportional to its length,
// and it counts as running while it runs).

// EmbeddingDim is the length of the mock's embeddings.
const EmbeddingDim = 16

// maxPoolInputs bounds the inputs (or pairs) of one pooling request.
const maxPoolInputs = 2048

// poolRequest is the part of vLLM's pooling requests the mock reads.
type poolRequest struct {
	Model          *string         `json:"model"`
	Input          json.RawMessage `json:"input"`
	Messages       []chatMessage   `json:"messages"`
	EncodingFormat *string         `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	Normalize      *bool           `json:"normalize"`
	// Score and rerank.
	Text1     json.RawMessage `json:"text_1"`
	Text2     json.RawMessage `json:"text_2"`
	Data1     json.RawMessage `json:"data_1"`
	Data2     json.RawMessage `json:"data_2"`
	Queries   json.RawMessage `json:"queries"`
	Documents json.RawMessage `json:"documents"`
	Items     json.RawMessage `json:"items"`
	Query     json.RawMessage `json:"query"`
	TopN      *int            `json:"top_n"`
}

// poolInputs reads a completions-style input (vLLM's
// CompletionRequestMixin): a string, a list of strings, token ids or a
// list of token-id lists; each is one prompt.
func poolInputs(raw json.RawMessage, param string) ([]prompt, *apiError) {
	raw = bytes.TrimSpace(raw)
	bad := func(format string, a ...any) *apiError {
		return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: fmt.Sprintf(format, a...)}
	}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, bad("%s is required", param)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []prompt{{text: s}}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) == 0 || len(ss) > maxPoolInputs {
			return nil, bad("%s has %d inputs, want 1 to %d", param, len(ss), maxPoolInputs)
		}
		out := make([]prompt, len(ss))
		for i, x := range ss {
			out[i] = prompt{text: x}
		}
		return out, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return []prompt{{ids: ids, useIDs: true}}, nil
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) == 0 || len(idss) > maxPoolInputs {
			return nil, bad("%s has %d inputs, want 1 to %d", param, len(idss), maxPoolInputs)
		}
		out := make([]prompt, len(idss))
		for i, x := range idss {
			out[i] = prompt{ids: x, useIDs: true}
		}
		return out, nil
	}
	return nil, bad("%s must be a string, a list of strings, token ids or a list of token-id lists", param)
}

// pooled is one input run through the engine: its tokens and vector.
type pooled struct {
	tokens int
	vec    []float64
}

// vector is the mock's embedding of p: FNV-1a of its ids (or text) seeds
// EmbeddingDim numbers in [-1, 1), L2-normalized.
func vector(p prompt) []float64 {
	h := fnv.New64a()
	if p.useIDs {
		var b [8]byte
		for _, id := range p.ids {
			binary.LittleEndian.PutUint64(b[:], uint64(id))
			_, _ = h.Write(b[:])
		}
	} else {
		_, _ = h.Write([]byte(p.text))
	}
	x := h.Sum64() | 1
	v := make([]float64, EmbeddingDim)
	var n float64
	for i := range v {
		// xorshift64*
		x ^= x >> 12
		x ^= x << 25
		x ^= x >> 27
		v[i] = float64((x*2685821657736338717)>>11)/float64(1<<53)*2 - 1
		n += v[i] * v[i]
	}
	n = math.Sqrt(n)
	for i := range v {
		v[i] /= n
	}
	return v
}

// runPool tokenizes prompts (text with special tokens, as vLLM's pooling
// does), runs each in the engine as a request of one output token, waits
// for all and returns their tokens and vectors. It answers the error
// itself (false): a bad model, a prompt of no tokens or over the KV cache
// (400), a closed engine (503); a client that leaves aborts them all.
func (s *Server) runPool(w http.ResponseWriter, r *http.Request, model string, prompts []prompt) ([]pooled, bool) {
	lora, loraID, aerr := s.resolveModel(model)
	if aerr != nil {
		writeError(w, aerr)
		return nil, false
	}
	req := &genRequest{Model: model, lora: lora, loraID: loraID}
	eng, aerr := s.pickEngine(r, req)
	if aerr != nil {
		writeError(w, aerr)
		return nil, false
	}
	out := make([]pooled, len(prompts))
	runs := make([]*active, 0, len(prompts))
	defer func() {
		for _, a := range runs {
			if a.id != 0 {
				if p := a.since(0); !p.done {
					eng.abort(a.id)
				}
			}
		}
	}()
	for i, p := range prompts {
		if p, aerr = s.textPrompt(r.Context(), p); aerr != nil {
			writeError(w, aerr)
			return nil, false
		}
		sr := sim.Request{OutputLength: 1}
		ids, aerr := s.promptBlocks(p, lora, "", &sr)
		if aerr != nil {
			writeError(w, aerr)
			return nil, false
		}
		a := &active{prompt: sr.InputLength, output: 1, ids: ids, lora: lora, loraID: loraID, notify: make(chan struct{}, 1)}
		if err := eng.submitPicked(a, sr); err != nil {
			writeError(w, s.submitError(err, sr))
			return nil, false
		}
		runs = append(runs, a)
		out[i] = pooled{tokens: sr.InputLength, vec: vector(p)}
	}
	w.Header().Set("x-mock-dp-rank", fmt.Sprint(eng.rank))
	for _, a := range runs {
		for !a.since(0).done {
			select {
			case <-a.notify:
			case <-r.Context().Done():
				return nil, false
			case <-eng.done:
				writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: errClosed.Error()})
				return nil, false
			}
		}
	}
	return out, true
}

// poolUsage is vLLM's UsageInfo of a pooling answer.
func poolUsage(runs []pooled) map[string]any {
	n := 0
	for _, p := range runs {
		n += p.tokens
	}
	return map[string]any{"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": nil}
}

// readPool reads a pooling request body; false after answering an error.
func readPool(w http.ResponseWriter, r *http.Request) (*poolRequest, bool) {
	body, ok := readBody(w, r)
	if !ok {
		return nil, false
	}
	var rq poolRequest
	if aerr := decodeBody(body, &rq); aerr != nil {
		writeError(w, aerr)
		return nil, false
	}
	return &rq, true
}

func (rq *poolRequest) model(s *Server) string {
	if rq.Model != nil && *rq.Model != "" {
		return *rq.Model
	}
	return s.model
}

// prompts are the request's inputs: input, else messages (one prompt, the
// chat rendering).
func (s *Server) poolPrompts(r *http.Request, rq *poolRequest) ([]prompt, *apiError) {
	if rq.Messages != nil && len(bytes.TrimSpace(rq.Input)) == 0 {
		msgs, aerr := chatMessages(rq.Messages)
		if aerr != nil {
			return nil, aerr
		}
		p, aerr := s.chatPrompt(r.Context(), msgs, "")
		if aerr != nil {
			return nil, aerr
		}
		return []prompt{p}, nil
	}
	return poolInputs(rq.Input, "input")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// runInputs runs rq's inputs (poolPrompts, then runPool) and returns
// their results; false when it answered an error.
func (s *Server) runInputs(w http.ResponseWriter, r *http.Request, rq *poolRequest) ([]pooled, bool) {
	prompts, aerr := s.poolPrompts(r, rq)
	if aerr != nil {
		writeError(w, aerr)
		return nil, false
	}
	return s.runPool(w, r, rq.model(s), prompts)
}

// writePoolList answers a pooling request with vLLM's list envelope:
// {"id": prefix+random, "object": "list", "created", "model", "data",
// "usage"}.
func (s *Server) writePoolList(w http.ResponseWriter, prefix string, rq *poolRequest, data []map[string]any, runs []pooled) {
	writeJSON(w, map[string]any{"id": randomID(prefix), "object": "list", "created": time.Now().Unix(),
		"model": rq.model(s), "data": data, "usage": poolUsage(runs)})
}

// handleEmbeddings serves POST /v1/embeddings as vLLM's embedding serving
// does: {"id": "embd-...", "object": "list", "created", "model", "data":
// [{"index", "object": "embedding", "embedding"}], "usage"}; the
// embedding a list of EmbeddingDim floats, or with encoding_format
// "base64" their float32 little-endian bytes in base64. dimensions other
// than EmbeddingDim is a 400 (the mock's model is not matryoshka).
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	rq, ok := readPool(w, r)
	if !ok {
		return
	}
	b64 := false
	if rq.EncodingFormat != nil {
		switch *rq.EncodingFormat {
		case "float":
		case "base64":
			b64 = true
		default:
			writeError(w, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "encoding_format",
				msg: fmt.Sprintf("encoding_format %q is not float or base64", *rq.EncodingFormat)})
			return
		}
	}
	if rq.Dimensions != nil && *rq.Dimensions != EmbeddingDim {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "dimensions",
			msg: fmt.Sprintf("Model %q does not support matryoshka representation, changing output dimensions will lead to poor results.", s.model)})
		return
	}
	runs, ok := s.runInputs(w, r, rq)
	if !ok {
		return
	}
	data := make([]map[string]any, len(runs))
	for i, p := range runs {
		var emb any = p.vec
		if b64 {
			buf := make([]byte, 4*len(p.vec))
			for j, x := range p.vec {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(float32(x)))
			}
			emb = base64.StdEncoding.EncodeToString(buf)
		}
		data[i] = map[string]any{"index": i, "object": "embedding", "embedding": emb}
	}
	s.writePoolList(w, "embd-", rq, data, runs)
}

// handlePooling serves POST /pooling: data [{"index", "object":
// "pooling", "data": the vector}] (vLLM's PoolingResponse, id "pool-").
func (s *Server) handlePooling(w http.ResponseWriter, r *http.Request) {
	rq, ok := readPool(w, r)
	if !ok {
		return
	}
	runs, ok := s.runInputs(w, r, rq)
	if !ok {
		return
	}
	data := make([]map[string]any, len(runs))
	for i, p := range runs {
		data[i] = map[string]any{"index": i, "object": "pooling", "data": p.vec}
	}
	s.writePoolList(w, "pool-", rq, data, runs)
}

// handleClassify serves POST /classify (SGLang: /v1/classify): data
// [{"index", "label", "probs", "num_classes"}] (vLLM's
// ClassificationResponse, id "classify-"), two classes LABEL_0 and
// LABEL_1 (Hugging Face's default labels), probs the softmax of the
// input's first two vector components.
func (s *Server) handleClassify(w http.ResponseWriter, r *http.Request) {
	rq, ok := readPool(w, r)
	if !ok {
		return
	}
	runs, ok := s.runInputs(w, r, rq)
	if !ok {
		return
	}
	data := make([]map[string]any, len(runs))
	for i, p := range runs {
		e0, e1 := math.Exp(p.vec[0]), math.Exp(p.vec[1])
		probs := []float64{e0 / (e0 + e1), e1 / (e0 + e1)}
		label := "LABEL_0"
		if probs[1] > probs[0] {
			label = "LABEL_1"
		}
		data[i] = map[string]any{"index": i, "label": label, "probs": probs, "num_classes": 2}
	}
	s.writePoolList(w, "classify-", rq, data, runs)
}

// scorePairs pairs the two sides of a score request as vLLM does: one
// first input with each second input (1:N), else one to one (N:N); other
// lengths are a 400.
func scorePairs(a, b []prompt) ([][2]prompt, *apiError) {
	switch {
	case len(a) == 1:
	case len(a) == len(b):
	default:
		return nil, badRequest("Input lengths must be either 1:1, 1:N or N:N, got %d:%d", len(a), len(b))
	}
	if len(b) > maxPoolInputs {
		return nil, badRequest("%d pairs, more than %d", len(b), maxPoolInputs)
	}
	out := make([][2]prompt, len(b))
	for i := range b {
		out[i] = [2]prompt{a[min(i, len(a)-1)], b[i]}
	}
	return out, nil
}

// scoreRuns runs each pair as one prompt (the first's tokens then the
// second's, a cross-encoder's input) and returns the runs and scores.
func (s *Server) scoreRuns(w http.ResponseWriter, r *http.Request, model string, pairs [][2]prompt) ([]pooled, []float64, bool) {
	prompts := make([]prompt, len(pairs))
	scores := make([]float64, len(pairs))
	for i, pr := range pairs {
		a, aerr := s.textPrompt(r.Context(), pr[0])
		if aerr == nil {
			pr[1], aerr = s.textPrompt(r.Context(), pr[1])
		}
		if aerr != nil {
			writeError(w, aerr)
			return nil, nil, false
		}
		b := pr[1]
		if a.useIDs && b.useIDs {
			prompts[i] = prompt{ids: append(slices.Clip(a.ids), b.ids...), useIDs: true}
		} else {
			prompts[i] = prompt{text: a.text + b.text}
		}
		va, vb := vector(a), vector(b)
		var cos float64
		for j := range va {
			cos += va[j] * vb[j]
		}
		scores[i] = (1 + cos) / 2
	}
	runs, ok := s.runPool(w, r, model, prompts)
	return runs, scores, ok
}

// handleScore serves POST /score and /v1/score: pairs of text_1 and text_2
// (or data_1/data_2, queries/documents, queries/items), answered data
// [{"index", "object": "score", "score"}] (vLLM's ScoreResponse, id
// "score-").
func (s *Server) handleScore(w http.ResponseWriter, r *http.Request) {
	rq, ok := readPool(w, r)
	if !ok {
		return
	}
	one, two, n1, n2 := rq.Text1, rq.Text2, "text_1", "text_2"
	switch {
	case len(rq.Data1) > 0:
		one, two, n1, n2 = rq.Data1, rq.Data2, "data_1", "data_2"
	case len(rq.Queries) > 0 && len(rq.Documents) > 0:
		one, two, n1, n2 = rq.Queries, rq.Documents, "queries", "documents"
	case len(rq.Queries) > 0:
		one, two, n1, n2 = rq.Queries, rq.Items, "queries", "items"
	}
	a, aerr := poolInputs(one, n1)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	b, aerr := poolInputs(two, n2)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	pairs, aerr := scorePairs(a, b)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	runs, scores, ok := s.scoreRuns(w, r, rq.model(s), pairs)
	if !ok {
		return
	}
	data := make([]map[string]any, len(scores))
	for i, sc := range scores {
		data[i] = map[string]any{"index": i, "object": "score", "score": sc}
	}
	writeJSON(w, map[string]any{"id": randomID("score-"), "object": "list", "created": time.Now().Unix(),
		"model": rq.model(s), "data": data, "usage": poolUsage(runs)})
}

// handleRerank serves POST /rerank, /v1/rerank and /v2/rerank: the query
// scored against each document, answered {"id": "rerank-...", "model",
// "usage": {"prompt_tokens", "total_tokens"}, "results": [{"index",
// "document": {"text", "multi_modal": null}, "relevance_score"}]} highest
// score first, the first top_n when top_n > 0 (vLLM's RerankResponse).
func (s *Server) handleRerank(w http.ResponseWriter, r *http.Request) {
	rq, ok := readPool(w, r)
	if !ok {
		return
	}
	var query string
	if err := json.Unmarshal(rq.Query, &query); err != nil {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "query", msg: "query must be a string"})
		return
	}
	docs, aerr := poolInputs(rq.Documents, "documents")
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	pairs, aerr := scorePairs([]prompt{{text: query}}, docs)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	runs, scores, ok := s.scoreRuns(w, r, rq.model(s), pairs)
	if !ok {
		return
	}
	order := make([]int, len(scores))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		switch {
		case scores[x] > scores[y]:
			return -1
		case scores[x] < scores[y]:
			return 1
		}
		return 0
	})
	if rq.TopN != nil && *rq.TopN > 0 && *rq.TopN < len(order) {
		order = order[:*rq.TopN]
	}
	results := make([]map[string]any, len(order))
	for k, i := range order {
		var doc any
		if !docs[i].useIDs {
			doc = docs[i].text
		}
		results[k] = map[string]any{"index": i, "document": map[string]any{"text": doc, "multi_modal": nil},
			"relevance_score": scores[i]}
	}
	u := poolUsage(runs)
	writeJSON(w, map[string]any{"id": randomID("rerank-"), "model": rq.model(s),
		"usage": map[string]any{"prompt_tokens": u["prompt_tokens"], "total_tokens": u["total_tokens"]}, "results": results})
}
