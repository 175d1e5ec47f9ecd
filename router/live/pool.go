package live

import (
	"fmt"

	"github.com/tidwall/gjson"
)

// PoolRequest is what the router reads of a request that carries no
// prompt to key (the pooling and scoring schemas, APIPool, and a
// pass-through body, APIOther): the model that chooses its engines and
// its size, which it is booked with as load. The body is forwarded
// unchanged.
type PoolRequest struct {
	// Model is the body's "model"; "" when it names none (or null).
	Model string
	// Tokens is the request's inputs' size in tokens (poolSizeFields):
	// each string counts its bytes divided by the runtime's characters
	// per token, rounded up; each number (a token id) counts 1; batched
	// inputs and a score or rerank request's query and documents are
	// summed. At least 1.
	Tokens int
}

// poolSizeFields are the top-level fields whose values are a pooling or
// scoring request's inputs, of vLLM's and SGLang's schemas:
//   - embeddings, pooling, classify (vLLM's EmbeddingRequest,
//     PoolingRequest, ClassificationRequest in
//     vllm/entrypoints/pooling/*/protocol.py): "input" (a string, a list
//     of strings, a list of token ids or a list of such lists) or
//     "messages" (the chat form);
//   - score (vLLM's ScoreRequest): "text_1" and "text_2", or "data_1" and
//     "data_2", or "queries" and "documents"; SGLang's /v1/score: "query"
//     and "items";
//   - rerank (vLLM's RerankRequest, SGLang's /v1/rerank, Jina's and
//     Cohere's v2 schemas): "query" and "documents";
//   - "prompt", for a pass-through body shaped like a completion.
//
// Fields not listed (options, "model", ...) do not count.
var poolSizeFields = [...]string{"input", "messages", "prompt", "text_1", "text_2", "data_1", "data_2",
	"queries", "query", "documents", "items"}

// ParsePool reads body, a request of a schema that carries no prompt to
// key (APIPool, APIOther): its "model" and its inputs' size (PoolRequest),
// at the runtime's characters per token (Options.CharsPerToken). The
// body must be a JSON object, nested at most 128 levels (as ParseRequest
// takes it); "model" must be a string or null. A key given twice counts
// with its last value, as encoding/json and the engines' Python JSON
// decoders read it. Time is linear in len(body): the body is checked in
// one pass, its top level walked once, and each counted value read once.
//
// Errors wrap ErrBadRequest and name the offending field: a body over
// MaxBodyBytes, not JSON, nested too deeply, not an object, or a model
// that is not a string. The model is not required here: a face refuses a
// body that names none in its own words.
//
// ParsePool reads JSON whatever the body's Content-Type: ParsePoolBody
// reads a speech-to-text or pass-through body by its Content-Type (a
// multipart/form-data one as a form).
func (rt *Runtime) ParsePool(body []byte) (PoolRequest, error) {
	if int64(len(body)) > rt.maxBody {
		return PoolRequest{}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), rt.maxBody)
	}
	return parsePool(body, rt.cpt)
}

// parsePool is ParsePool at cpt characters per token.
func parsePool(body []byte, cpt int) (PoolRequest, error) {
	if cpt < 1 {
		cpt = DefaultCharsPerToken
	}
	if err := checkBody(body); err != nil {
		return PoolRequest{}, err
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return PoolRequest{}, fmt.Errorf("%w: body must be a JSON object, not a JSON %s", ErrBadRequest, rawType([]byte(root.Raw)))
	}
	var (
		req   PoolRequest
		err   error
		model gjson.Result
		sizes [len(poolSizeFields)]string // each field's last value
	)
	root.ForEach(func(k, v gjson.Result) bool {
		name := k.String()
		if name == "model" {
			model = v
			return true
		}
		for i, f := range poolSizeFields {
			if f == name {
				sizes[i] = v.Raw
				break
			}
		}
		return true
	})
	switch model.Type {
	case gjson.Null:
	case gjson.String:
		req.Model = model.String()
	default:
		err = fmt.Errorf("%w: %q must not be a JSON %s", ErrBadRequest, "model", rawType([]byte(model.Raw)))
		return PoolRequest{}, err
	}
	for _, raw := range sizes {
		req.Tokens += valueTokens(raw, cpt)
	}
	req.Tokens = max(req.Tokens, 1)
	return req, nil
}

// valueTokens counts the tokens of one valid JSON value raw, in one pass:
// every string value (not an object's keys) its bytes between the quotes
// divided by cpt, rounded up; every number 1 (a token id); literals
// nothing. Linear in len(raw): each string is skipped whole (stringEnd).
func valueTokens(raw string, cpt int) int {
	b := []byte(raw)
	n := 0
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			end := stringEnd(b, i)
			j := end
			for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
				j++
			}
			if j >= len(b) || b[j] != ':' { // a value, not a key
				if l := end - i - 2; l > 0 {
					n += (l + cpt - 1) / cpt
				}
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			n++
			for i++; i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] == '+' || b[i] == '-' || (b[i] >= '0' && b[i] <= '9')); i++ {
			}
		default:
			i++
		}
	}
	return n
}
