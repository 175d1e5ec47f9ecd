package live

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is the OpenAI error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Error types of the answers (the OpenAI error body's "type").
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
)

// WriteError answers status with the OpenAI error body: message msg,
// type typ (TypeInvalidRequest, TypeRateLimit, TypeServer), code code,
// param null. The HTTP face and the debug views answer their errors so.
func WriteError(w http.ResponseWriter, status int, typ, code, msg string) {
	WriteJSON(w, status, apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
}

// WriteJSON answers status with v as JSON and a final newline, with its
// Content-Length; v failing to encode is a 500 internal error.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
