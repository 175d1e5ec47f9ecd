package live

import (
	"fmt"
	"unsafe"

	"github.com/switchyard-router/switchyard/router/apiconv"
)

// parseGen is ParseRequest for the Responses and Messages schemas:
// checkBody, then router/apiconv's reading of the body into the chat
// messages vLLM builds from it (apiconv.Responses, apiconv.Anthropic; the
// vLLM source each follows is cited there), set as the routing key's chat
// messages: Runtime.Key's tokenizer path gives the engine's /tokenize
// these messages, and the character-block fallback hashes their
// rendering, as for a chat request with the same messages. One path for
// every body size: apiconv walks the body with gjson, linear in its size,
// and reads a key given twice as its last value. Errors wrap
// ErrBadRequest and name the field.
func parseGen(body []byte, api API) (*CompletionRequest, error) {
	if err := checkBody(body); err != nil {
		return nil, err
	}
	var (
		g   *apiconv.Request
		err error
	)
	if api == APIResponses {
		g, err = apiconv.Responses(body)
	} else {
		g, err = apiconv.Anthropic(body)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadRequest, trimInvalid(err))
	}
	if g.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", ErrBadRequest)
	}
	req := &CompletionRequest{Model: g.Model, Stream: g.Stream, PreviousResponseID: g.PreviousResponseID, salt: g.CacheSalt}
	req.routing.text, req.routing.chat = renderMessages(g.Messages)
	return req, nil
}

// trimInvalid is err's message without apiconv's "invalid request: "
// prefix (ErrBadRequest says it).
func trimInvalid(err error) string {
	s := err.Error()
	if p := apiconv.ErrInvalid.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// renderMessages renders msgs as renderChat does ("role: content\n" per
// message, prefix.RenderChat's text) in one buffer, with each message's
// span in it.
func renderMessages(msgs []apiconv.Message) (string, []chatSpan) {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 3
	}
	buf := make([]byte, 0, n)
	spans := make([]chatSpan, 0, len(msgs))
	for _, m := range msgs {
		buf = append(buf, m.Role...)
		sp := chatSpan{roleEnd: uint32(len(buf))}
		buf = append(buf, ": "...)
		buf = append(buf, m.Content...)
		buf = append(buf, '\n')
		sp.end = uint32(len(buf))
		spans = append(spans, sp)
	}
	if len(buf) == 0 {
		return "", spans
	}
	return unsafe.String(&buf[0], len(buf)), spans
}
