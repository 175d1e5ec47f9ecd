package prefix

import (
	"math/bits"
)

// Routing keys for live OpenAI-compatible requests, shared by the router's
// HTTP front and the mock engine (router/mockworker) so both hash a prompt
// into the same chained block hashes.
//
// Without a tokenizer, text is cut into blocks of blockTokens·charsPerToken
// bytes: charsPerToken (4 by default, DefaultCharsPerToken) is the usual
// rule of thumb for English text with Llama-3/GPT-class tokenizers, an
// approximation. "Characters" are bytes of the UTF-8 text, so a block may
// end inside a multi-byte character; that changes nothing for hashing.
// Only full blocks are hashed, as an engine caches only full KV blocks.

// DefaultCharsPerToken is the assumed characters (bytes) per token when a
// request carries text, not token ids.
const DefaultCharsPerToken = 4

// FNV-1a 64-bit (Fowler, Noll, Vo), the per-block content id before
// chaining: stable across processes and versions, unlike hash/maphash.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// TextBlocks returns the chained hashes (ChainHash folded from 0) of the
// full blocks of blockTokens·charsPerToken bytes of text, the block's
// content id being FNV-1a 64 of its bytes. A trailing partial block is not
// hashed. It returns nil if blockTokens or charsPerToken is not positive or
// text is shorter than one block.
func TextBlocks(text string, blockTokens, charsPerToken int) []uint64 {
	if blockTokens <= 0 || charsPerToken <= 0 {
		return nil
	}
	size := blockTokens * charsPerToken
	n := len(text) / size
	if n == 0 {
		return nil
	}
	out := make([]uint64, 0, n)
	var h uint64
	for i := range n {
		id := uint64(fnvOffset)
		for j := i * size; j < (i+1)*size; j++ {
			id ^= uint64(text[j])
			id *= fnvPrime
		}
		h = ChainHash(h, id)
		out = append(out, h)
	}
	return out
}

// TokenBlocks returns the chained hashes of the full blocks of blockTokens
// token ids, the block's content id being tokenContentID of its ids. A
// trailing partial block is not hashed. It returns nil if blockTokens is not positive or ids is shorter
// than one block.
func TokenBlocks(ids []int64, blockTokens int) []uint64 {
	return tokenBlocks(nil, ids, blockTokens)
}

// tokenBlocks appends to dst the chained hashes of the full blocks of
// blockTokens ids.
func tokenBlocks(dst []uint64, ids []int64, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return dst
	}
	n := len(ids) / blockTokens
	if n == 0 {
		return dst
	}
	if dst == nil {
		dst = make([]uint64, 0, n)
	}
	var h uint64
	for i := range n {
		h = ChainHash(h, tokenContentID(ids[i*blockTokens:(i+1)*blockTokens]))
		dst = append(dst, h)
	}
	return dst
}

// tokenContentID is a token block's content id: starting from the FNV-1a
// offset basis, each id (as a 64-bit two's-complement word) is xored in,
// the word multiplied by 2^64/φ and rotated left by 31 bits (the multiply
// spreads low bits up, the rotation brings high bits back down for the
// next multiply), so every bit of every id reaches the result; ChainHash
// then finalises it. One multiply per token: the precise index hashes
// every block an engine reports (BenchmarkIngest), where FNV-1a over the
// ids' bytes cost eight.
func tokenContentID(ids []int64) uint64 {
	id := uint64(fnvOffset)
	for _, t := range ids {
		id = bits.RotateLeft64((id^uint64(t))*0x9e3779b97f4a7c15, 31)
	}
	return id
}

// bytesContentID is FNV-1a 64 of b.
func bytesContentID(b []byte) uint64 {
	id := uint64(fnvOffset)
	for _, c := range b {
		id ^= uint64(c)
		id *= fnvPrime
	}
	return id
}

// EstimateTokens returns the approximate token count of text,
// ceil(len(text)/charsPerToken) (0 for empty text or charsPerToken <= 0).
func EstimateTokens(text string, charsPerToken int) int {
	if charsPerToken <= 0 {
		return 0
	}
	return (len(text) + charsPerToken - 1) / charsPerToken
}

// ChatMessage is one chat message as the engine's chat template receives
// it: its role, its text content (for OpenAI content-part arrays, the text
// parts joined), and what vLLM's parse_chat_messages keeps beside them
// (vllm/entrypoints/chat_utils.py, _parse_chat_message_content; commit
// 001eadcf295d90aa0664963cd6a9d93f38a2f3da): an assistant message's
// tool_calls and reasoning, a tool message's tool_call_id, any message's
// name. A field that is "" is absent, but Reasoning, which is present
// when HasReasoning is set ("" included: templates test "is string").
type ChatMessage struct {
	Role, Content string
	// Name is the message's "name".
	Name string
	// ToolCallID is a tool message's "tool_call_id".
	ToolCallID string
	// ToolCalls is an assistant message's "tool_calls": the JSON array
	// as the engine receives it (for a chat request, the client's bytes),
	// each call {"id", "type": "function", "function": {"name",
	// "arguments"}}; "" for none or an empty array (vLLM drops those).
	ToolCalls string
	// Reasoning is an assistant message's "reasoning" (the template sees
	// it as reasoning and reasoning_content), when HasReasoning.
	Reasoning    string
	HasReasoning bool
}

// extras reports whether m has anything beside its role and content.
func (m *ChatMessage) extras() bool {
	return m.Name != "" || m.ToolCallID != "" || m.ToolCalls != "" || m.HasReasoning
}

// The lines RenderChatTools writes for the request's tools and for a
// message's fields beside its content, each "label" + value + "\n".
const (
	ToolsLabel      = "tools: "
	NameLabel       = "name: "
	ToolCallIDLabel = "tool_call_id: "
	ReasoningLabel  = "reasoning: "
	ToolCallsLabel  = "tool_calls: "
)

// RenderChat renders chat messages as the text hashed for routing when no
// tokenizer is configured: RenderChatTools without tools.
func RenderChat(msgs []ChatMessage) string { return RenderChatTools("", msgs) }

// RenderChatTools renders a chat request's tools (a JSON array, "" for
// none) and messages as the text hashed for routing: a "tools: TOOLS\n"
// line first when there are tools (chat templates render them ahead of
// the conversation), then per message a "role: content\n" line followed,
// when set, by "name: ...\n", "tool_call_id: ...\n", "reasoning:
// ...\n" and "tool_calls: JSON\n" lines, in order. It is not a model's
// chat template; it only has to be the same on the router and the mock
// engine, to make conversations that extend one another share a text
// prefix, and to count what the engine's template renders. Linear in
// the size of its inputs; tools is written once.
func RenderChatTools(tools string, msgs []ChatMessage) string {
	n := 0
	if tools != "" {
		n += len(ToolsLabel) + len(tools) + 1
	}
	for i := range msgs {
		m := &msgs[i]
		n += len(m.Role) + len(m.Content) + 3
		if m.extras() {
			n += len(m.Name) + len(m.ToolCallID) + len(m.ToolCalls) + len(m.Reasoning) + 64
		}
	}
	b := make([]byte, 0, n)
	if tools != "" {
		b = appendLine(b, ToolsLabel, tools)
	}
	for i := range msgs {
		b = AppendChatMessage(b, &msgs[i])
	}
	return string(b)
}

// AppendChatMessage appends m's rendering (see RenderChatTools) to b.
func AppendChatMessage(b []byte, m *ChatMessage) []byte {
	b = append(b, m.Role...)
	b = append(b, ": "...)
	b = append(b, m.Content...)
	b = append(b, '\n')
	if !m.extras() {
		return b
	}
	if m.Name != "" {
		b = appendLine(b, NameLabel, m.Name)
	}
	if m.ToolCallID != "" {
		b = appendLine(b, ToolCallIDLabel, m.ToolCallID)
	}
	if m.HasReasoning {
		b = appendLine(b, ReasoningLabel, m.Reasoning)
	}
	if m.ToolCalls != "" {
		b = appendLine(b, ToolCallsLabel, m.ToolCalls)
	}
	return b
}

func appendLine(b []byte, label, value string) []byte {
	b = append(b, label...)
	b = append(b, value...)
	return append(b, '\n')
}
