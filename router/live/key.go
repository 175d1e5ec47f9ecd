package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// DefaultCharsPerToken is the text-to-token ratio of the routing key when
// a request carries text, not token ids: an approximation (English text
// under common BPE tokenizers averages about 4 characters a token).
const DefaultCharsPerToken = prefix.DefaultCharsPerToken

// CompletionRequest is the part of an OpenAI completion or chat request
// the router reads; the body is forwarded unchanged.
type CompletionRequest struct {
	Model  string
	Stream bool
	// PreviousResponseID is a Responses request's previous_response_id:
	// the stored response it continues, which only the engine that
	// answered it holds; "" for none and for the other schemas.
	PreviousResponseID string
	// MaxTokens is the request's own cap on generated tokens: chat's
	// max_completion_tokens when set, else its max_tokens (vLLM's
	// ChatCompletionRequest.build_tok_params, vllm/entrypoints/openai/
	// chat_completion/protocol.py, commit
	// d5dba2d7b0ab9b98096560c69db7126b54b14d79), completions' max_tokens,
	// Responses' max_output_tokens, Messages' max_tokens; 0 when it sets
	// none, or sets a number that is not a non-negative integer (the
	// engine answers that); at most maxTokensCap.
	MaxTokens int
	routing   RoutingKey
	// salt is the request's cache_salt ("" for none, or null), vLLM's
	// prefix-cache salt: part of the routing key (key).
	salt string
}

// ErrBadRequest wraps every reason a request body is refused with 400
// (ParseRequest's errors, which name the offending field; Place returns
// them too).
var ErrBadRequest = errors.New("invalid request")

// Bounds of the fast parse: larger bodies, or bodies with more commas and
// opening brackets (a bound on the number of JSON values, each of which
// fastjson builds a node for), are parsed by parseStd, which builds
// nothing but the routing key. A 4 MiB array of zeros would otherwise take
// ~600 MiB of heap; and a node costs fastjson tens of times what a byte
// of string costs it, so a body dense in values (unclosed brackets, say)
// would cost the fast path far more per byte than an ordinary one
// (BenchmarkParseAdversarial).
const (
	fastMaxBytes  = 256 << 10
	fastMaxValues = 8192
)

// plainText reports whether body's strings read the same under fastjson
// and encoding/json: valid UTF-8 (encoding/json turns invalid bytes into
// U+FFFD, fastjson keeps them) and no \uD800-\uDFFF escape (encoding/json
// turns a lone surrogate into U+FFFD, fastjson keeps the escape's text).
// Bodies that fail it take parseStd, which decodes strings as
// encoding/json does, so a prompt's routing key does not depend on its
// body's size. Escaped emoji (surrogate pairs) take it too.
func plainText(body []byte) bool {
	return utf8.Valid(body) && !bytes.Contains(body, []byte(`\ud`)) && !bytes.Contains(body, []byte(`\uD`))
}

// ParseRequest decodes body, a request of schema api, and extracts its
// routing key: APIChat reads "messages", APICompletions "prompt",
// APIResponses "instructions" and "input" (and previous_response_id,
// cache_salt), APIMessages "system" and "messages" (and max_tokens), the
// last two rendered into the chat messages vLLM builds from them
// (parseGen). Errors wrap ErrBadRequest and name the offending field; a
// schema that carries no prompt is refused.
//
// Small bodies of plain text and few values take the fast path
// (parseFast: a fastjson tree); the others parseStd (a walk over the
// body's bytes). Both first check the body (checkBody: nesting depth,
// strict JSON) alike, read a key given twice as its last value, as
// encoding/json and the engines' Python JSON decoders do, and decode
// strings as encoding/json does, so a request is accepted, refused and
// routed the same on either. Each takes time linear in the body's size.
func ParseRequest(body []byte, api API) (*CompletionRequest, error) {
	if api == APIResponses || api == APIMessages {
		return parseGen(body, api)
	}
	if api != APIChat && api != APICompletions {
		return nil, fmt.Errorf("%w: the %s schema carries no prompt to route by", ErrBadRequest, api)
	}
	chat := api == APIChat
	if len(body) <= fastMaxBytes && plainText(body) &&
		bytes.Count(body, []byte{','})+bytes.Count(body, []byte{'['})+bytes.Count(body, []byte{'{'}) <= fastMaxValues {
		return parseFast(body, chat)
	}
	return parseStd(body, chat)
}

// maxNesting bounds how deeply a request body nests JSON arrays and
// objects, the top-level object being level 1; checkBody refuses deeper
// bodies (errTooDeep) before anything else reads them, so that no
// recursive reader (the validator, fastjson's parser) recurses deeper.
// Unbounded, fastjson's validation, which checked bodies before, cost the
// square of the depth: 10,000 unclosed brackets took seconds.
//
// 128 levels is serde_json's default recursion limit (so the Rust
// gateways in front of SGLang and TGI refuse deeper bodies too), and
// several times what any OpenAI request needs: Structured Outputs caps a
// schema at 10 levels of nesting (https://platform.openai.com/docs/guides/structured-outputs,
// "Supported schemas"), a few dozen JSON levels with the request around
// it. vLLM (FastAPI) would parse deeper bodies, up to its Python's
// json.loads ceiling, which moves with the interpreter: about 1,000
// levels on Python 3.10 and 3.11 (the default recursion limit), 5,000
// still parse on 3.13, 100,000 on 3.14. A body between the two is refused
// here although vLLM would have read it.
const maxNesting = 128

// errTooDeep is the 400 for a body nested deeper than maxNesting.
var errTooDeep = fmt.Errorf("%w: body is nested too deeply: JSON arrays and objects may nest at most %d levels", ErrBadRequest, maxNesting)

// checkBody is the first step of both parse paths: body must nest at most
// maxNesting levels (errTooDeep) and be strict JSON (RFC 8259, as
// encoding/json reads it). Linear in len(body), and nothing is allocated
// for a valid body.
//
// The validator is gjson's (a recursive descent, zero-allocation, which
// the depth check bounds). fastjson's, which this replaced, builds each
// error as the message of the level below plus, for a bad literal, the
// whole rest of the body: its cost was the square of the depth, or the
// depth times the body (4 MiB took 2 s and 8 GB of allocations). Errors
// are worded by encoding/json, as the API answered before.
func checkBody(body []byte) error {
	if nesting(body, maxNesting) > maxNesting {
		return errTooDeep
	}
	if gjson.ValidBytes(body) {
		return nil
	}
	var syn *json.SyntaxError
	if errors.As(json.Unmarshal(body, &struct{}{}), &syn) {
		return fmt.Errorf("%w: body is not valid JSON: %v", ErrBadRequest, syn)
	}
	return fmt.Errorf("%w: body is not valid JSON", ErrBadRequest)
}

// nesting returns how deeply body nests JSON arrays and objects, counting
// until it passes limit (it returns limit+1 then, at once). It reads body
// once, strings skipped whole, and takes malformed JSON as it comes: the
// count is exact on the valid prefix of body, which is all a validator
// reads before it stops.
func nesting(body []byte, limit int) int {
	depth, deepest := 0, 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '[', '{':
			if depth++; depth > deepest {
				if deepest = depth; deepest > limit {
					return deepest
				}
			}
		case ']', '}':
			depth--
		case '"':
			i = stringEnd(body, i) - 1
		}
	}
	return deepest
}

// stringEnd returns the index just past the JSON string that starts at
// body[i] (a quote): past the next quote that follows an even run of
// backslashes; len(body) when the string is not closed. The runs before
// distinct quotes are distinct, so a walk over body that skips strings
// with it reads each byte a bounded number of times.
func stringEnd(body []byte, i int) int {
	for {
		j := bytes.IndexByte(body[i+1:], '"')
		if j < 0 {
			return len(body)
		}
		i += 1 + j
		k := i - 1
		for body[k] == '\\' {
			k--
		}
		if (i-1-k)%2 == 0 {
			return i + 1
		}
	}
}

// RoutingKey is what a request is routed by: its prompt as token ids or
// as text, and its cache_salt. For a chat request the text is the
// request's tools and messages rendered as prefix.RenderChatTools does,
// and chat holds each message's span in it (ext the tools' and each
// message's fields beside its content, when there are any), so a
// tokenizer can be given the messages and tools themselves (messages,
// tools).
//
// A message whose content is an array of parts has as its content the
// text of its "text" parts (those whose text is a string; other parts
// are ignored) joined by "\n": vLLM's own join for a chat template that
// takes string content (vllm/entrypoints/chat_utils.py,
// _parse_chat_message_content_parts: "\n".join(texts)), so the engine's
// /tokenize, given the joined content, renders what its chat completion
// renders, and the router's token count is the engine's prompt_tokens.
//
// Beside its content a message keeps what vLLM's
// _parse_chat_message_content passes its chat template (chat_utils.py,
// commit 001eadcf295d90aa0664963cd6a9d93f38a2f3da): "name" (a string,
// any role), an assistant's "tool_calls" (a non-empty array, as its raw
// JSON: vLLM drops an empty one in _postprocess_messages) and
// "reasoning" (a string), a tool message's "tool_call_id" (a string);
// and the request's "tools" (a non-empty array, its raw JSON), which
// vLLM's chat completions and /tokenize give the template
// (vllm/entrypoints/serve/tokenize/protocol.py, TokenizeChatRequest.tools;
// serving.py, tool_dicts). Values of another type are ignored, as vLLM's
// isinstance checks ignore them. "reasoning_content" in a request message
// is not read: vLLM reads "reasoning" and gives the template both.
type RoutingKey struct {
	ids  []int64
	text string
	chat []chatSpan
	ext  *chatExt
	salt string
}

// chatSpan is one chat message in RoutingKey.text: its role is
// text[start:roleEnd] and its content text[roleEnd+2:end-1] (to its
// msgExt's contentEnd when it has one), start being the previous span's
// end (the first's: chatExt.toolsEnd, else 0).
// The offsets are 32-bit (a body is far below 4 GiB) so a body of many
// small messages costs little more than its size.
type chatSpan struct {
	roleEnd, end uint32
}

// chatExt is what a chat key holds beside roles and contents; nil when
// the request has no tools and no message has a field beside its content,
// the common case.
type chatExt struct {
	// toolsEnd is the end of the "tools: TOOLS\n" line that starts the
	// text; 0 for none.
	toolsEnd uint32
	// msgs are the messages with fields beside their content, by
	// ascending index.
	msgs []msgExt
}

// msgExt is message index's fields beside its content, each a span of
// the text (zero: absent).
type msgExt struct {
	index, contentEnd                      uint32
	name, toolCallID, reasoning, toolCalls textSpan
	hasReasoning                           bool
}

// textSpan is text[start:end].
type textSpan struct{ start, end uint32 }

func (s textSpan) of(text string) string { return text[s.start:s.end] }

// messages returns the chat messages of k (nil for a text prompt), their
// strings sharing k.text.
func (k RoutingKey) messages() []prefix.ChatMessage {
	if k.chat == nil {
		return nil
	}
	out := make([]prefix.ChatMessage, len(k.chat))
	var (
		start uint32
		xs    []msgExt
	)
	if k.ext != nil {
		start, xs = k.ext.toolsEnd, k.ext.msgs
	}
	for i, sp := range k.chat {
		m := &out[i]
		m.Role = k.text[start:sp.roleEnd]
		end := sp.end - 1
		if len(xs) > 0 && xs[0].index == uint32(i) {
			x := &xs[0]
			end = x.contentEnd
			m.Name, m.ToolCallID = x.name.of(k.text), x.toolCallID.of(k.text)
			m.Reasoning, m.HasReasoning = x.reasoning.of(k.text), x.hasReasoning
			m.ToolCalls = x.toolCalls.of(k.text)
			xs = xs[1:]
		}
		m.Content = k.text[sp.roleEnd+2 : end]
		start = sp.end
	}
	return out
}

// tools returns the request's tools, a JSON array ("" for none).
func (k RoutingKey) tools() string {
	if k.ext == nil || k.ext.toolsEnd == 0 {
		return ""
	}
	return k.text[len(prefix.ToolsLabel) : k.ext.toolsEnd-1]
}

// msgFields are a message's fields beside its role and content, as a
// parse read them ("" absent; see RoutingKey).
type msgFields struct {
	name, toolCallID, reasoning, toolCalls string
	hasReasoning                           bool
}

func (f *msgFields) any() bool {
	return f.name != "" || f.toolCallID != "" || f.toolCalls != "" || f.hasReasoning
}

// chatBuilder writes a chat key's text (prefix.RenderChatTools's
// rendering) and its spans in one buffer. A message is written as: its
// role appended to buf, role(), its content appended to buf, end().
type chatBuilder struct {
	buf   []byte
	spans []chatSpan
	ext   *chatExt
	cur   chatSpan
}

// newChatBuilder returns a builder for n messages of about size bytes.
func newChatBuilder(n, size int) chatBuilder {
	return chatBuilder{buf: make([]byte, 0, size), spans: make([]chatSpan, 0, n)}
}

// tools writes the request's tools line; before any message.
func (b *chatBuilder) tools(raw string) {
	b.buf = append(b.buf, prefix.ToolsLabel...)
	b.buf = append(b.buf, raw...)
	b.buf = append(b.buf, '\n')
	b.ext = &chatExt{toolsEnd: uint32(len(b.buf))}
}

// role marks the end of the message's role, which is in buf.
func (b *chatBuilder) role() {
	b.cur = chatSpan{roleEnd: uint32(len(b.buf))}
	b.buf = append(b.buf, ": "...)
}

// end ends message i, whose content is in buf, with its fields f (nil:
// none).
func (b *chatBuilder) end(i int, f *msgFields) {
	contentEnd := uint32(len(b.buf))
	b.buf = append(b.buf, '\n')
	if f != nil && f.any() {
		x := msgExt{index: uint32(i), contentEnd: contentEnd, hasReasoning: f.hasReasoning}
		x.name = b.line(prefix.NameLabel, f.name, f.name != "")
		x.toolCallID = b.line(prefix.ToolCallIDLabel, f.toolCallID, f.toolCallID != "")
		x.reasoning = b.line(prefix.ReasoningLabel, f.reasoning, f.hasReasoning)
		x.toolCalls = b.line(prefix.ToolCallsLabel, f.toolCalls, f.toolCalls != "")
		if b.ext == nil {
			b.ext = &chatExt{}
		}
		b.ext.msgs = append(b.ext.msgs, x)
	}
	b.cur.end = uint32(len(b.buf))
	b.spans = append(b.spans, b.cur)
}

// line writes "label value\n" when present and returns value's span.
func (b *chatBuilder) line(label, value string, present bool) textSpan {
	if !present {
		return textSpan{}
	}
	b.buf = append(b.buf, label...)
	s := textSpan{start: uint32(len(b.buf))}
	b.buf = append(b.buf, value...)
	s.end = uint32(len(b.buf))
	b.buf = append(b.buf, '\n')
	return s
}

// key returns the routing key written. buf is not written again: the
// text shares it (as strings.Builder does) instead of copying the
// prompt once more.
func (b *chatBuilder) key() RoutingKey {
	k := RoutingKey{chat: b.spans, ext: b.ext}
	if len(b.buf) > 0 {
		k.text = unsafe.String(&b.buf[0], len(b.buf))
	}
	return k
}

// Key returns the routing key ParseRequest extracted: token ids when the
// request carries them, else the prompt text (the rendered messages for
// chat); and its cache_salt.
func (req *CompletionRequest) Key() RoutingKey {
	k := req.routing
	k.salt = req.salt
	return k
}

// hash returns the key's prompt length in tokens (estimated for text) and
// the chained hashes of its full blocks of blockSize tokens (prefix
// TokenBlocks and TextBlocks, which the mock engine shares), seeded
// (seedHashes) by seed.
func (k RoutingKey) hash(blockSize, charsPerToken int, seed uint64) (tokens int, hashes []uint64) {
	if k.ids != nil {
		return len(k.ids), seedHashes(prefix.TokenBlocks(k.ids, blockSize), seed)
	}
	return prefix.EstimateTokens(k.text, charsPerToken), seedHashes(prefix.TextBlocks(k.text, blockSize, charsPerToken), seed)
}

// keySeed is the seed of a request's approximate block hashes: 0 for a
// base model's request without cache_salt (its hashes are prefix's
// TokenBlocks or TextBlocks as they are), else a hash of the LoRA adapter
// the request runs with ("" for a base model) and its cache_salt, each
// length-prefixed, so that an adapter's or a salt's prompts never share a
// block with another's or with the base model's unsalted ones: vLLM's
// block hash has the adapter's name in every block's extra keys and the
// salt in the first block's (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys).
func keySeed(lora, salt string) uint64 {
	if lora == "" && salt == "" {
		return 0
	}
	h := uint64(fnvOffset)
	for _, s := range []string{lora, salt} {
		for n, k := uint64(len(s)), 0; k < 8; k, n = k+1, n>>8 { // 8 bytes of length
			h = (h ^ (n & 0xff)) * fnvPrime
		}
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * fnvPrime
		}
	}
	return prefix.ChainHash(h, 0x73616c74) // never 0 but by chance
}

// FNV-1a 64 (keySeed's hash of the adapter and salt).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// seedHashes mixes seed into each of hashes in place (hashes[i] =
// prefix.ChainHash(seed, hashes[i])) and returns them; seed 0 leaves them
// as they are. ChainHash is a bijection of its second argument for a given
// first, so hashes that differ stay different, and equal hashes under two
// seeds differ but by chance: the seed is the chain's first link. One
// multiply-mix per block.
func seedHashes(hashes []uint64, seed uint64) []uint64 {
	if seed == 0 {
		return hashes
	}
	for i, h := range hashes {
		hashes[i] = prefix.ChainHash(seed, h)
	}
	return hashes
}
