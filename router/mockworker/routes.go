package mockworker

import (
	"encoding/json"
	"net/http"
)

// DefaultVersion is the version GET /version reports when Config.Version
// is empty.
const DefaultVersion = "0.0.0+mock"

// routes registers the endpoints of the engine's API beyond completions,
// chat, models, tokenize and the mock's own: vLLM's
// (vllm/entrypoints/openai/responses/api_router.py@f6e93254,
// anthropic/api_router.py@42fa4c09, serve/instrumentator's /version and
// /ping) or, with EngineSGLang, what SGLang's http_server.py@0025436e
// serves of them (/v1/responses with GET and cancel, /v1/embeddings,
// /v1/classify, /v1/rerank, /ping; no /v1/messages, /version, /pooling,
// /score, /rerank, /v2/rerank; its /v1/score (decoder-only scoring) and
// native /classify take other schemas and are not mocked: 404). Pooling answers are vLLM's
// shapes in both flavours. Any other path answers 404 {"detail": "Not
// Found"}, FastAPI's answer, as both engines do.
func (s *Server) routes() {
	s.mux.HandleFunc("POST /v1/responses", s.handleResponses)
	s.mux.HandleFunc("GET /v1/responses/{id}", s.handleGetResponse)
	s.mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleCancelResponse)
	s.mux.HandleFunc("GET /ping", ok200)
	s.mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	s.mux.HandleFunc("POST /v1/rerank", s.handleRerank)
	if s.cfg.Engine == EngineSGLang {
		s.mux.HandleFunc("POST /v1/classify", s.handleClassify)
		s.mux.HandleFunc("/", notFound)
		return
	}
	s.mux.HandleFunc("POST /v1/messages", s.handleMessages)
	s.mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	s.mux.HandleFunc("POST /pooling", s.handlePooling)
	s.mux.HandleFunc("POST /classify", s.handleClassify)
	s.mux.HandleFunc("POST /score", s.handleScore)
	s.mux.HandleFunc("POST /v1/score", s.handleScore)
	s.mux.HandleFunc("POST /rerank", s.handleRerank)
	s.mux.HandleFunc("POST /v2/rerank", s.handleRerank)
	s.mux.HandleFunc("POST /ping", ok200)
	s.mux.HandleFunc("GET /version", s.handleVersion)
	s.mux.HandleFunc("/", notFound)
}

func ok200(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

// notFound is FastAPI's answer to a path it does not route.
func notFound(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
}

// handleVersion serves GET /version as vLLM does: {"version": V}.
func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	v := s.cfg.Version
	if v == "" {
		v = DefaultVersion
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"version": v})
}
