package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/workers"
)

// modelCards is implemented by Workers that read the engines' model
// lists (workers.Manager): each model's card, with the engine's own
// object for it.
type modelCards interface {
	ModelCards() []workers.ModelCard
}

// modelEntry is the router's own object for a model no engine described
// (its workers' block names it, or they have not answered yet): OpenAI's
// model object, with vLLM's root, parent and max_model_len when known.
type modelEntry struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root,omitempty"`
	Parent      string `json:"parent,omitempty"`
	MaxModelLen int64  `json:"max_model_len,omitempty"`
}

// modelView returns the fleet's models, sorted by id, each as one JSON
// object: the engine's own (workers.ModelCard.Raw: the card of the first
// ready worker by name whose engine lists it, a LoRA adapter's parent
// included), else the router's (modelEntry). With Workers that read no
// model list, the runtime's models, each the router's object. Linear in
// the models; each object is at most workers.MaxCardBytes.
func (s *Server) modelView() []json.RawMessage {
	var out []json.RawMessage
	if mc, ok := s.workers.(modelCards); ok {
		cards := mc.ModelCards()
		out = make([]json.RawMessage, 0, len(cards))
		for _, c := range cards {
			if c.Raw != "" {
				out = append(out, json.RawMessage(c.Raw))
				continue
			}
			b, _ := json.Marshal(modelEntry{ID: c.ID, Object: "model", OwnedBy: "switchyard", Root: c.Root, Parent: c.Parent, MaxModelLen: c.MaxModelLen})
			out = append(out, b)
		}
		return out
	}
	for _, m := range s.rt.Models() { // also the models whose workers are down
		b, _ := json.Marshal(modelEntry{ID: m, Object: "model", OwnedBy: "switchyard"})
		out = append(out, b)
	}
	return out
}

// models answers GET /v1/models: OpenAI's model list of the fleet's
// models (modelView), {"object":"list","data":[...]}.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	data := s.modelView()
	if data == nil {
		data = []json.RawMessage{}
	}
	live.WriteJSON(w, http.StatusOK, struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{"list", data})
}

// model answers GET /v1/models/{id} (OpenAI's models.retrieve) from the
// same view as GET /v1/models: the model's object, or 404 model_not_found
// in OpenAI's shape. The id is the rest of the path, unescaped, so it may
// contain '/' ("meta-llama/Llama-3.1-8B", sent as is or as
// meta-llama%2FLlama-3.1-8B).
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range s.modelView() {
		var head struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m, &head) == nil && head.ID == id {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(len(m)+1))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(append(slices.Clip(m), '\n'))
			return
		}
	}
	live.WriteError(w, http.StatusNotFound, live.TypeInvalidRequest, live.CodeModelNotFound,
		fmt.Sprintf("The model `%s` does not exist.", id))
}

// health answers GET /health (vLLM's and SGLang's liveness probe) and GET
// and POST /ping (SageMaker's health check, which vLLM serves): 200 with
// an empty body while the router can route (live.Runtime.Readiness, the
// rule of /readyz: the policy loaded and a worker ready), 503 with an
// empty body otherwise.
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	if s.rt.Readiness().Ready {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// versionView answers GET /version as vLLM does, {"version": "..."}, with
// the router's version (Options.Version).
func (s *Server) versionView(w http.ResponseWriter, _ *http.Request) {
	v := s.version
	if v == "" {
		v = "unknown"
	}
	live.WriteJSON(w, http.StatusOK, struct {
		Version string `json:"version"`
	}{v})
}

// fixedPaths are the router's own paths other than live.Endpoints, with
// the methods each takes (for 405's Allow).
var fixedPaths = map[string]string{
	"/v1/models": "GET", "/healthz": "GET", "/readyz": "GET", "/metrics": "GET",
	"/health": "GET", "/version": "GET", "/ping": "GET, POST",
}

// allowed returns the methods path takes, "" when the router does not
// route it.
func allowed(path string) string {
	if m, ok := fixedPaths[path]; ok {
		return m
	}
	if _, ok := live.EndpointFor(path); ok {
		return "POST"
	}
	switch {
	case strings.HasPrefix(path, "/v1/models/"):
		return "GET"
	case strings.HasPrefix(path, "/v1/responses/") && strings.HasSuffix(path, "/cancel"):
		return "POST"
	case strings.HasPrefix(path, "/v1/responses/") && !strings.Contains(path[len("/v1/responses/"):], "/"):
		return "GET"
	}
	return ""
}

// unrouted answers what no route took: a known path with another method
// is 405 method_not_allowed (with Allow); a POST under /v1/ is passed
// through to an engine serving the body's model (Options.DisablePassThrough
// turns it off); the rest is 404 not_found. Errors are in the path's
// API's shape (Anthropic's under /v1/messages).
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if m := allowed(p); m != "" {
		// The router routes p, but not with this method (else a route
		// would have taken it).
		w.Header().Set("Allow", m)
		writeError(w, p, http.StatusMethodNotAllowed, live.TypeInvalidRequest, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s", r.Method, p))
		return
	}
	if r.Method == http.MethodPost && strings.HasPrefix(p, "/v1/") && s.passUnknown {
		s.complete(w, r, live.APIOther)
		return
	}
	writeError(w, p, http.StatusNotFound, live.TypeInvalidRequest, "not_found", fmt.Sprintf("no endpoint %s %s", r.Method, p))
}
