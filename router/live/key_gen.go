package live

import (
	"fmt"

	"github.com/switchyard-router/switchyard/router/apiconv"
	"github.com/switchyard-router/switchyard/router/prefix"
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
	req := &CompletionRequest{Model: g.Model, Stream: g.Stream, PreviousResponseID: g.PreviousResponseID, salt: g.CacheSalt,
		MaxTokens: int(min(max(g.MaxTokens, 0), maxTokensCap))}
	req.routing = renderMessages(g.Tools, g.Messages)
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

// renderMessages renders tools and msgs as prefix.RenderChatTools does
// (the text of a chat request with these tools and messages) in one
// buffer, with each message's span in it.
func renderMessages(tools string, msgs []apiconv.Message) RoutingKey {
	n := 0
	if tools != "" {
		n += len(prefix.ToolsLabel) + len(tools) + 1
	}
	for i := range msgs {
		m := &msgs[i]
		n += len(m.Role) + len(m.Content) + 3 + len(m.Name) + len(m.ToolCallID) + len(m.ToolCalls) + len(m.Reasoning)
	}
	b := newChatBuilder(len(msgs), n+64)
	if tools != "" {
		b.tools(tools)
	}
	for i := range msgs {
		m := &msgs[i]
		b.buf = append(b.buf, m.Role...)
		b.role()
		b.buf = append(b.buf, m.Content...)
		b.end(i, &msgFields{name: m.Name, toolCallID: m.ToolCallID, reasoning: m.Reasoning, toolCalls: m.ToolCalls, hasReasoning: m.HasReasoning})
	}
	return b.key()
}
