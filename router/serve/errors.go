package serve

import (
	"errors"
	"net/http"
	"strings"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/live"
)

// anthropicPath reports whether path is Anthropic's Messages API
// (/v1/messages and the paths under it, such as /v1/messages/count_tokens):
// the router answers its errors there in Anthropic's error shape.
func anthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// fail answers ex's request with an error in the shape of its API:
// Anthropic's on /v1/messages (writeAnthropicError), OpenAI's elsewhere
// (live.WriteError).
func (s *Server) fail(ex *exchange, status int, typ, code, msg string) {
	writeError(ex.w, ex.path, status, typ, code, msg)
}

// writeError answers an error on path in its API's shape (fail).
func writeError(w http.ResponseWriter, path string, status int, typ, code, msg string) {
	if anthropicPath(path) {
		writeAnthropicError(w, status, typ, msg)
		return
	}
	live.WriteError(w, status, typ, code, msg)
}

// anthropicError is Anthropic's error body, as vLLM's Anthropic front end
// answers it (vllm/entrypoints/anthropic/protocol.py,
// AnthropicErrorResponse; api_router.py, translate_error_response):
// {"type":"error","error":{"type":...,"message":...}}. vLLM keeps the
// OpenAI error type in error.type (invalid_request_error, ...), and so
// does the router.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// writeAnthropicError answers status with Anthropic's error body of type
// typ and message msg.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	live.WriteJSON(w, status, anthropicError{Type: "error", Error: anthropicErrorBody{Type: typ, Message: msg}})
}

// responseNotFound is vLLM's answer to a Responses id it does not hold
// (vllm/entrypoints/openai/serving_responses.py, _make_not_found_error:
// 404, invalid_request_error, param "response_id", and vLLM's ErrorInfo
// carries the status as its integer code).
type responseNotFound struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   string `json:"param"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// writeResponseNotFound answers a request for the stored response id
// that the router cannot send to the engine holding it (the id is
// unknown to the router, its binding expired, or its engine is gone) as
// vLLM answers an id it does not hold: 404, "Response with id '<id>' not
// found." (an id longer than untrusted.MaxClient bytes, which the router
// never binds, is echoed cut to that bound, escaped, as the EPP echoes it).
func writeResponseNotFound(w http.ResponseWriter, id string) {
	var a responseNotFound
	a.Error.Message = (&live.ResponseNotFoundError{ID: untrusted.Text(id, untrusted.MaxClient)}).Error()
	a.Error.Type, a.Error.Param, a.Error.Code = live.TypeInvalidRequest, "response_id", http.StatusNotFound
	live.WriteJSON(w, http.StatusNotFound, a)
}

// writeResponseHolderError answers a request for a stored response that
// the runtime cannot send to the engine holding it (err, from
// live.Runtime.FollowUp or PlaceStored): 503 no_worker, retryable, when
// that engine is configured but not ready (*live.ResponseHolderDownError),
// else vLLM's 404 (writeResponseNotFound). It returns the status.
func writeResponseHolderError(w http.ResponseWriter, id string, err error) int {
	var down *live.ResponseHolderDownError
	if errors.As(err, &down) {
		live.WriteError(w, http.StatusServiceUnavailable, live.TypeServer, "no_worker", untrusted.Text(err.Error(), 2*untrusted.MaxClient))
		return http.StatusServiceUnavailable
	}
	writeResponseNotFound(w, id)
	return http.StatusNotFound
}

// wrongPathHint returns, for a body that lacks the field the schema of
// api requires, a message naming the field and the path whose schema the
// body looks like ("" when it has the field or looks like none). It reads
// the body's top-level keys only (linear in the body); called only on a
// body ParseRequest refused, to word the refusal.
func wrongPathHint(body []byte, api live.API) string {
	has := topLevelKeys(body, "input", "messages", "prompt")
	var field string
	var hints []string
	switch api {
	case live.APIResponses:
		field = "input"
		if has["messages"] {
			hints = []string{"/v1/chat/completions", "/v1/messages"}
		} else if has["prompt"] {
			hints = []string{"/v1/completions"}
		}
	case live.APIChat, live.APIMessages:
		field = "messages"
		if has["input"] {
			hints = []string{"/v1/responses"}
		} else if has["prompt"] {
			hints = []string{"/v1/completions"}
		}
	case live.APICompletions:
		field = "prompt"
		if has["messages"] {
			hints = []string{"/v1/chat/completions"}
		} else if has["input"] {
			hints = []string{"/v1/responses"}
		}
	}
	if field == "" || has[field] || len(hints) == 0 {
		return ""
	}
	return "the request has no \"" + field + "\", which this endpoint requires: its body looks like a request for " +
		strings.Join(hints, " or ") + "; send it there"
}

// topLevelKeys reports which of names are keys of body's top-level
// object, in one pass over body with no recursion: strings are skipped
// whole, and a string at depth 1 followed by ':' is a key. Malformed JSON
// is read as it comes (the answer only words a refusal).
func topLevelKeys(body []byte, names ...string) map[string]bool {
	has := make(map[string]bool, len(names))
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			end := stringEnd(body, i)
			if depth == 1 {
				j := end
				for j < len(body) && (body[j] == ' ' || body[j] == '\t' || body[j] == '\n' || body[j] == '\r') {
					j++
				}
				if j < len(body) && body[j] == ':' && end-i >= 2 {
					key := string(body[i+1 : end-1])
					for _, n := range names {
						if n == key {
							has[n] = true
						}
					}
				}
			}
			i = end - 1
		}
	}
	return has
}

// stringEnd returns the index just past the JSON string that starts at
// body[i] (a quote): past the next quote not escaped by an odd run of
// backslashes; len(body) when the string is not closed. Each byte is read
// a bounded number of times.
func stringEnd(body []byte, i int) int {
	for j := i + 1; j < len(body); j++ {
		switch body[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(body)
}
