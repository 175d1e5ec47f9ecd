package serve

import (
	"bytes"
	"errors"
	"unicode/utf8"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// DefaultCharsPerToken is the text-to-token ratio of the routing key when
// a request carries text, not token ids: an approximation (English text
// under common BPE tokenizers averages about 4 characters a token).
const DefaultCharsPerToken = prefix.DefaultCharsPerToken

// completionRequest is the part of an OpenAI completion or chat request
// the router reads; the body is forwarded unchanged.
type completionRequest struct {
	Model   string
	Stream  bool
	routing routingKey
}

// errBadRequest wraps every reason a body is refused with 400.
var errBadRequest = errors.New("invalid request")

// Bounds of the fast parse: larger bodies, or bodies with more commas (a
// proxy for the number of JSON values, each of which fastjson keeps as a
// node of ~100-300 bytes), are parsed by encoding/json, whose memory stays
// within a small multiple of the body. A 4 MiB array of zeros would
// otherwise take ~600 MiB of heap.
const (
	fastMaxBytes  = 256 << 10
	fastMaxCommas = 8192
)

// plainText reports whether body's strings read the same under fastjson
// and encoding/json: valid UTF-8 (encoding/json turns invalid bytes into
// U+FFFD, fastjson keeps them) and no \uD800-\uDFFF escape (encoding/json
// turns a lone surrogate into U+FFFD, fastjson keeps the escape's text).
// Bodies that fail it take encoding/json, so a prompt's routing key does
// not depend on its body's size. Escaped emoji (surrogate pairs) take it
// too: correct, if slower.
func plainText(body []byte) bool {
	return utf8.Valid(body) && !bytes.Contains(body, []byte(`\ud`)) && !bytes.Contains(body, []byte(`\uD`))
}

// parseRequest decodes body and extracts its routing key; chat selects
// the chat schema (messages) over the completions one (prompt). Errors
// wrap errBadRequest and name the offending field.
//
// Small bodies take the fast path (fastjson, one pass, after
// fastjson.ValidateBytes has checked the body is strict JSON); large
// ones, and any body the fast path's validation refuses, take encoding/json
// (parseStd), which is authoritative: its answer, and its error message,
// stand. Both read a key given twice as its last value, as encoding/json
// and the engines' Python JSON decoders do.
func parseRequest(body []byte, chat bool) (*completionRequest, error) {
	if len(body) <= fastMaxBytes && bytes.Count(body, []byte{','}) <= fastMaxCommas && plainText(body) {
		if req, err, ok := parseFast(body, chat); ok {
			return req, err
		}
	}
	return parseStd(body, chat)
}

// routingKey is what a request is routed by: its prompt as token ids or
// as text.
type routingKey struct {
	ids  []int64
	text string
}

// key returns the routing key parseRequest extracted: token ids when the
// request carries them, else the prompt text (the rendered messages for
// chat).
func (req *completionRequest) key() routingKey { return req.routing }

// hash returns the key's prompt length in tokens (estimated for text) and
// the chained hashes of its full blocks of blockSize tokens (prefix
// TokenBlocks and TextBlocks, which the mock engine shares).
func (k routingKey) hash(blockSize, charsPerToken int) (tokens int, hashes []uint64) {
	if k.ids != nil {
		return len(k.ids), prefix.TokenBlocks(k.ids, blockSize)
	}
	return prefix.EstimateTokens(k.text, charsPerToken), prefix.TextBlocks(k.text, blockSize, charsPerToken)
}
