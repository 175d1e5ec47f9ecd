package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	Model          string          `json:"model"`
	Stream         bool            `json:"stream"`
	Messages       []chatMessage   `json:"messages"`
	Prompt         json.RawMessage `json:"prompt"`
	PromptTokenIDs []int64         `json:"prompt_token_ids"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of a chat message's content array.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// errBadRequest wraps every reason a body is refused with 400.
var errBadRequest = errors.New("invalid request")

// parseRequest decodes body; chat selects the chat schema (messages) over
// the completions one (prompt).
func parseRequest(body []byte, chat bool) (*completionRequest, error) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("%w: %q must not be a JSON %s", errBadRequest, te.Field, te.Value)
		}
		return nil, fmt.Errorf("%w: body is not valid JSON: %v", errBadRequest, err)
	}
	if req.Model == "" {
		return nil, fmt.Errorf("%w: you must provide a model parameter", errBadRequest)
	}
	if chat && len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: messages must be a non-empty array", errBadRequest)
	}
	if !chat && len(bytes.TrimSpace(req.Prompt)) == 0 && len(req.PromptTokenIDs) == 0 {
		return nil, fmt.Errorf("%w: you must provide a prompt", errBadRequest)
	}
	return &req, nil
}

// routingKey is what a request is routed by: its prompt as token ids or
// as text.
type routingKey struct {
	ids  []int64
	text string
}

// key extracts the routing key: token ids when the request carries them,
// else the prompt text (the rendered messages for chat).
func (req *completionRequest) key(chat bool) (routingKey, error) {
	if len(req.PromptTokenIDs) > 0 {
		return routingKey{ids: req.PromptTokenIDs}, nil
	}
	if chat {
		msgs := make([]prefix.ChatMessage, len(req.Messages))
		for i, m := range req.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				return routingKey{}, err
			}
			msgs[i] = prefix.ChatMessage{Role: m.Role, Content: text}
		}
		return routingKey{text: prefix.RenderChat(msgs)}, nil
	}
	return promptKey(req.Prompt)
}

// contentText renders a chat message's content: a string, null, or an
// array of parts whose "text" parts are joined (as the mock engine
// renders them).
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		// Fast path: a string without escapes is its bytes between the
		// quotes (the body was validated once already); only escaped
		// strings are decoded again.
		if n := len(raw); n >= 2 && raw[n-1] == '"' {
			if inner := raw[1 : n-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
				return string(inner), nil
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%w: message content: %v", errBadRequest, err)
		}
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", fmt.Errorf("%w: message content: %v", errBadRequest, err)
		}
		var sb strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				sb.WriteString(p.Text)
			}
		}
		return sb.String(), nil
	}
	return "", fmt.Errorf("%w: message content must be a string or an array of parts", errBadRequest)
}

// promptKey reads a completions prompt: a string, an array of strings
// (joined by newlines), an array of token ids, or an array of token-id
// arrays (concatenated).
func promptKey(raw json.RawMessage) (routingKey, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return routingKey{}, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		return routingKey{text: s}, nil
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		if len(elems) == 0 {
			return routingKey{}, nil
		}
		switch bytes.TrimSpace(elems[0])[0] {
		case '"':
			var ss []string
			if err := json.Unmarshal(raw, &ss); err != nil {
				return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
			}
			return routingKey{text: strings.Join(ss, "\n")}, nil
		case '[':
			var batches [][]int64
			if err := json.Unmarshal(raw, &batches); err != nil {
				return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
			}
			var ids []int64
			for _, b := range batches {
				ids = append(ids, b...)
			}
			return routingKey{ids: ids}, nil
		default:
			var ids []int64
			if err := json.Unmarshal(raw, &ids); err != nil {
				return routingKey{}, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
			}
			return routingKey{ids: ids}, nil
		}
	}
	return routingKey{}, fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", errBadRequest)
}

// hash returns the key's prompt length in tokens (estimated for text) and
// the chained hashes of its full blocks of blockSize tokens (prefix
// TokenBlocks and TextBlocks, which the mock engine shares).
func (k routingKey) hash(blockSize, charsPerToken int) (tokens int, hashes []uint64) {
	if k.ids != nil {
		return len(k.ids), prefix.TokenBlocks(k.ids, blockSize)
	}
	return prefix.EstimateTokens(k.text, charsPerToken), prefix.TextBlocks(k.text, blockSize, charsPerToken)
}
