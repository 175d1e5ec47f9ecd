package prefix

import (
	"math/bits"
	"strings"
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

// ChatMessage is one chat message as rendered for hashing: its role and its
// text content (for OpenAI content-part arrays, the text parts joined).
type ChatMessage struct {
	Role, Content string
}

// RenderChat renders chat messages as the text hashed for routing: one
// "role: content\n" line per message, in order. It is not a model's chat
// template; it only has to be the same on the router and the mock engine,
// and to make conversations that extend one another share a text prefix.
func RenderChat(msgs []ChatMessage) string {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 3
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String()
}
