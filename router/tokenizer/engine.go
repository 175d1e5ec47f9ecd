package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/prefix"
)

// EngineURL returns the base URL ("http://host:port", no trailing "/") of
// a ready engine serving the model, for Engine to call /tokenize on; an
// error (wrapped with ErrNoEngine by Engine) when there is none.
type EngineURL func(ctx context.Context) (string, error)

// Defaults of EngineOptions.
const (
	// DefaultMaxAnswerBytes bounds one /tokenize or /tokenizer_info
	// answer: 32 MiB, room for some 3 million token ids as JSON, beyond
	// any served context length.
	DefaultMaxAnswerBytes = 32 << 20
	// DefaultCacheEntries is the cache's entries per model: 8192 (each
	// one tokenized input).
	DefaultCacheEntries = 8192
	// DefaultCacheBytes bounds the cache's memory per model: 256 MiB,
	// counting each entry's input bytes, 8 bytes per token id and 8 per
	// ChunkBytes of text (its prefix-index keys). About 2^24 ids of
	// ordinary text (4 bytes a token: 12 bytes a token in all).
	DefaultCacheBytes = 256 << 20
	// DefaultChunkBytes is the text prefix index's chunk, 256 bytes: the
	// block size of llm-d's prefix store (llm-d-kv-cache-manager,
	// pkg/tokenization/prefixstore, defaultBlockSize). A prompt shares a
	// cached one's prefix only in whole chunks, and a cut closer than one
	// chunk to the start is not worth a second call.
	DefaultChunkBytes = 256
	// DefaultUnsupportedBackoff is how long an Engine stops calling a form
	// of /tokenize (text or chat) that the engine answered 404, 405, 422
	// or 501 for, answering ErrUnsupported at once meanwhile: 30 s. SGLang
	// takes no chat messages (422), TRT-LLM serves no /tokenize (404).
	DefaultUnsupportedBackoff = 30 * time.Second
	// maxProbes bounds the cached prompts a lookup compares with the new
	// one (each comparison reads at most the prompt): 4, so a lookup
	// reads the prompt a bounded number of times.
	maxProbes = 4
	// learnRetry is how long an Engine waits before asking the engine for
	// its special tokens again after the engine did not tell them (no
	// /tokenizer_info, or a failed probe).
	learnRetry = 10 * time.Minute
	// learnRetryTransient is that wait after a transport failure.
	learnRetryTransient = 30 * time.Second
)

// EngineOptions tune an Engine; zero fields take the defaults above.
type EngineOptions struct {
	// Client makes the calls; nil is a client with no timeout of its own
	// (the context of each call bounds it).
	Client *http.Client
	// MaxAnswerBytes bounds an answer's body (DefaultMaxAnswerBytes).
	MaxAnswerBytes int64
	// CacheEntries bounds the cache's entries (DefaultCacheEntries).
	CacheEntries int
	// CacheBytes bounds the cache's memory (DefaultCacheBytes); the least
	// recently used entries are evicted to stay under it, and an entry
	// larger than it is not cached.
	CacheBytes int64
	// ChunkBytes is the text prefix index's chunk in bytes
	// (DefaultChunkBytes).
	ChunkBytes int
	// UnsupportedBackoff is DefaultUnsupportedBackoff's setting.
	UnsupportedBackoff time.Duration
}

// Errors of an Engine.
var (
	// ErrUnsupported: the engine answered this form of /tokenize (a text
	// prompt, or chat messages) 404, 405, 422 or 501, now (the error
	// wraps ErrEngine too: a call was made, and the back-off starts) or
	// within the last EngineOptions.UnsupportedBackoff (no call was made).
	// The caller keys the prompt by characters, and counts no failure.
	ErrUnsupported = errors.New("the engine does not tokenize this form of prompt")
)

// Engine tokenizes by calling the engine's own POST /tokenize, so the ids
// are the engine's by construction, chat templates included.
//
// The endpoint, as read in the engines' sources:
//   - vLLM (vllm/entrypoints/serve/tokenize/protocol.py,
//     TokenizeCompletionRequest and TokenizeChatRequest; serving.py):
//     {"model", "prompt", "add_special_tokens": true} or {"model",
//     "messages", "tools", "add_generation_prompt": true,
//     "add_special_tokens": false} (commit
//     030ea52effcb05071543c8c42b8f0145e94cee43; serving.py gives the
//     template the tools' model_dump), answered by {"count",
//     "max_model_len", "tokens": [ids]}. A
//     chat request is rendered by the model's template to text and that
//     text tokenized without special tokens, a prompt tokenized with
//     them, both by the model's Hugging Face tokenizer. GET
//     /tokenizer_info (only with --enable-tokenizer-info-endpoint)
//     answers the tokenizer's init_kwargs, added_tokens_decoder (id ->
//     content) among them.
//   - SGLang (python/sglang/srt/entrypoints/openai/serving_tokenize.py,
//     served at /v1/tokenize and /tokenize): {"model", "prompt",
//     "add_special_tokens"} with the same answer shape; it takes no chat
//     messages (EncodeChat then fails with ErrUnsupported).
//
// # The cache
//
// Every answer is cached under its whole input (the prompt, or the chat
// tools and messages serialised as length-prefixed strings): an exact
// repeat costs no call. The cache never answers a prompt with another
// prompt's ids: an entry answers only the input it was made for, or, for
// a text prompt, gives the ids of a prefix of the new prompt up to a safe
// cut, the rest of the prompt being tokenized by a call.
//
// A safe cut is the start of an added token (a special token such as
// "<|im_start|>"): a Hugging Face tokenizer splits the text at its added
// tokens (leftmost-longest matches) before it normalizes, pre-tokenizes
// and encodes the pieces between them one by one, and its post-processor
// adds its tokens (a BOS) around the whole. So if a cached prompt A and
// the new prompt P agree on their first c + L + 1 bytes, where an added
// token starts at byte c of A and L is the longest added token's length
// (every match starting at or before c, and the characters around it that
// lstrip, rstrip and single_word look at, lie in that span), then P's
// pieces before c are A's, P has that token at c, and
//
//	ids(P) = ids(A)[:j] ++ ids(P[c:], add_special_tokens=false) ++ post
//
// where j is the token's index in ids(A) and post the post-processor's
// trailing tokens: the second call starts with the token, so the text
// after it is a piece after an added token, as in P. j is found by pairing
// A's added-token matches (scanned in A's text) with the added-token ids
// in ids(A) in order; when they do not pair one to one with equal
// contents (a normalized or single_word token the scan cannot follow),
// A offers no cut. The added tokens come from the engine's GET
// /tokenizer_info, and the post-processor's pre and post tokens from
// tokenizing "a" with and without special tokens, once per Engine: an
// engine that serves no /tokenizer_info (vLLM's default; SGLang) or
// refuses add_special_tokens=false gets exact repeats only.
//
// Chat messages get exact repeats only: the engine renders the template,
// /tokenize returns no text and no offsets, so the rendering of a new turn
// (and where the earlier turns' rendering ends in it) is not known
// without asking the engine for the whole conversation.
type Engine struct {
	model     string
	url       EngineURL
	client    *http.Client
	maxAnswer int64
	chunk     int
	backoff   time.Duration
	seed      maphash.Seed

	// mu guards the cache: exact (by the input's hash) and byChunk (the
	// entry of a text prompt under the chained hash of each of its full
	// chunks, the latest one put).
	mu       sync.Mutex
	exact    *simplelru.LRU[uint64, *entry]
	byChunk  map[uint64]*entry
	bytes    int64
	maxBytes int64

	// spMu serialises learning the special tokens; sp holds them once
	// learned (nil while unknown or when the engine does not tell them).
	spMu      sync.Mutex
	sp        atomic.Pointer[specials]
	spDone    bool      // learned (sp may still be nil: none)
	spRetryAt time.Time // not learned: when to ask again
	// textOff and chatOff hold the UnixNano until which the form is not
	// called (ErrUnsupported); spliceOff is set once the engine refused
	// add_special_tokens=false.
	textOff, chatOff atomic.Int64
	spliceOff        atomic.Bool

	calls, hits, splices, tokens atomic.Int64
}

// entry is one tokenized input.
type entry struct {
	key     string // the form's byte ('p' or 'c') and the input
	ids     []int64
	anchors []anchor // a text prompt's safe cuts, ascending; nil: none
	chunks  []uint64 // its keys in byChunk (a text prompt's full chunks)
	cost    int64
}

// anchor is a safe cut of a text prompt: an added token starts at byte
// cut, and ids[:at] are the prompt before it.
type anchor struct{ cut, at int }

// entryOverhead is what an entry costs beyond its input and ids (its
// struct, its slices' headers, its LRU element and map slots), counted
// against CacheBytes.
const entryOverhead = 160

// NewEngine returns an Engine for model calling the engines url chooses.
func NewEngine(model string, url EngineURL, o EngineOptions) (*Engine, error) {
	if url == nil {
		return nil, fmt.Errorf("tokenizer: engine source for %q: no engine chooser", model)
	}
	e := &Engine{model: model, url: url, client: o.Client, maxAnswer: o.MaxAnswerBytes, chunk: o.ChunkBytes,
		backoff: o.UnsupportedBackoff, maxBytes: o.CacheBytes, seed: maphash.MakeSeed(), byChunk: make(map[uint64]*entry)}
	if e.client == nil {
		e.client = &http.Client{}
	}
	if e.maxAnswer <= 0 {
		e.maxAnswer = DefaultMaxAnswerBytes
	}
	if e.chunk <= 0 {
		e.chunk = DefaultChunkBytes
	}
	if e.backoff <= 0 {
		e.backoff = DefaultUnsupportedBackoff
	}
	if e.maxBytes <= 0 {
		e.maxBytes = DefaultCacheBytes
	}
	n := o.CacheEntries
	if n <= 0 {
		n = DefaultCacheEntries
	}
	c, err := simplelru.NewLRU(n, func(_ uint64, v *entry) { e.dropLocked(v) })
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	e.exact = c
	return e, nil
}

// EngineStats counts an Engine's work since it was made.
type EngineStats struct {
	Calls     int64 // /tokenize calls answered with ids (splices' and probes' included)
	CacheHits int64 // requests answered from the cache without a call (exact repeats)
	Splices   int64 // text prompts answered by a cached prefix and a call for the rest
	Tokens    int64 // token ids the calls returned, summed: the engine's tokenizing work
}

// Stats returns the counts so far.
func (e *Engine) Stats() EngineStats {
	return EngineStats{Calls: e.calls.Load(), CacheHits: e.hits.Load(), Splices: e.splices.Load(), Tokens: e.tokens.Load()}
}

// Encode returns the engine's ids of prompt, special tokens added: from
// the cache when the prompt was tokenized before, else spliced from a
// cached prefix at a safe cut and a call for the rest, else one call (see
// Engine). Errors wrap ErrNoEngine, ErrEngine or ErrUnsupported, or are
// the call's (the context's deadline included).
func (e *Engine) Encode(ctx context.Context, prompt string) ([]int64, error) {
	key := "p" + prompt
	if ids, ok := e.get(key); ok {
		e.hits.Add(1)
		return ids, nil
	}
	if err := e.allowed(&e.textOff); err != nil {
		return nil, err
	}
	sp := e.specials(ctx)
	var chain []uint64
	if sp != nil {
		chain = prefix.TextBlocks(prompt, e.chunk, 1)
		ids, ok, err := e.splice(ctx, sp, prompt, chain)
		if err != nil {
			return nil, err
		}
		if ok {
			e.splices.Add(1)
			e.put(key, ids, sp, chain)
			return ids, nil
		}
	}
	ids, err := e.call(ctx, &e.textOff, map[string]any{"model": e.model, "prompt": prompt, "add_special_tokens": true})
	if err != nil {
		return nil, err
	}
	e.put(key, ids, sp, chain)
	return ids, nil
}

// EncodeChat returns the engine's ids of msgs and tools rendered by its
// chat template with the generation prompt (vLLM's chat form of
// /tokenize, TokenizeChatRequest: messages with their name, tool_call_id,
// tool_calls and reasoning, and tools, as vLLM's chat completions take
// them): from the cache for the same messages and tools, else one call.
// Errors as Encode's.
func (e *Engine) EncodeChat(ctx context.Context, msgs []prefix.ChatMessage, tools string) ([]int64, error) {
	var key []byte
	key = append(key, 'c')
	put := func(s string) {
		key = binary.AppendUvarint(key, uint64(len(s)))
		key = append(key, s...)
	}
	put(tools)
	wire := make([]wireMessage, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		flags := byte(0)
		if m.HasReasoning {
			flags = 1
		}
		key = append(key, flags)
		for _, s := range []string{m.Role, m.Content, m.Name, m.ToolCallID, m.ToolCalls, m.Reasoning} {
			put(s)
		}
		w := wireMessage{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		if m.ToolCalls != "" {
			w.ToolCalls = json.RawMessage(m.ToolCalls)
		}
		if m.HasReasoning {
			w.Reasoning = &m.Reasoning
		}
		wire[i] = w
	}
	k := string(key)
	if ids, ok := e.get(k); ok {
		e.hits.Add(1)
		return ids, nil
	}
	if err := e.allowed(&e.chatOff); err != nil {
		return nil, err
	}
	body := map[string]any{
		"model": e.model, "messages": wire, "add_generation_prompt": true, "add_special_tokens": false,
	}
	if tools != "" {
		body["tools"] = json.RawMessage(tools)
	}
	ids, err := e.call(ctx, &e.chatOff, body)
	if err != nil {
		return nil, err
	}
	e.put(k, ids, nil, nil)
	return ids, nil
}

// wireMessage is one message of vLLM's TokenizeChatRequest
// (ChatCompletionMessageParam, vllm/entrypoints/chat_utils.py
// CustomChatCompletionMessageParam: role, content, name, tool_call_id,
// tool_calls, reasoning); fields that are absent are left out.
type wireMessage struct {
	Role       string          `json:"role"`
	Content    string          `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	Reasoning  *string         `json:"reasoning,omitempty"`
}

// allowed returns ErrUnsupported while off (a UnixNano) is in the future.
func (e *Engine) allowed(off *atomic.Int64) error {
	if until := off.Load(); until != 0 && time.Now().UnixNano() < until {
		return fmt.Errorf("tokenizer: model %q: %w (answered unsupported within the last %v)", e.model, ErrUnsupported, e.backoff)
	}
	return nil
}

// get returns a copy of the ids cached for exactly key.
func (e *Engine) get(key string) ([]int64, bool) {
	h := maphash.String(e.seed, key)
	e.mu.Lock()
	c, ok := e.exact.Get(h)
	e.mu.Unlock()
	if !ok || c.key != key {
		return nil, false
	}
	return slices.Clone(c.ids), true
}

// splice answers a text prompt from the cached prompt that shares the
// longest run of its leading chunks (chain: prefix.TextBlocks(prompt,
// chunk, 1)) and offers a safe cut in the shared part, plus a call for
// the rest; false when there is none or the call failed for a reason of
// the engine's (the caller then tokenizes the whole prompt). The error is
// the context's. Cost: at most maxProbes comparisons of cached prompts
// with this one, and one call.
func (e *Engine) splice(ctx context.Context, sp *specials, prompt string, chain []uint64) ([]int64, bool, error) {
	if e.spliceOff.Load() {
		return nil, false, nil
	}
	probes := 0
	for k := len(chain); k > 0 && probes < maxProbes; k-- {
		e.mu.Lock()
		c := e.byChunk[chain[k-1]]
		e.mu.Unlock()
		if c == nil {
			continue
		}
		probes++
		text := c.key[1:]
		n := k * e.chunk
		if len(text) < n || text[:n] != prompt[:n] {
			continue // another prompt under a colliding hash
		}
		shared := n + commonPrefix(text[n:], prompt[n:])
		a, ok := lastAnchor(c.anchors, shared-sp.maxLen-1)
		if !ok || a.cut < e.chunk {
			continue
		}
		rest, err := e.call(ctx, nil, map[string]any{"model": e.model, "prompt": prompt[a.cut:], "add_special_tokens": false})
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, err
			}
			if errors.Is(err, errRefused) {
				e.spliceOff.Store(true)
			}
			return nil, false, nil
		}
		ids := make([]int64, 0, a.at+len(rest)+len(sp.post))
		ids = append(append(append(ids, c.ids[:a.at]...), rest...), sp.post...)
		return ids, true, nil
	}
	return nil, false, nil
}

// lastAnchor returns the last anchor whose cut is at most limit.
func lastAnchor(as []anchor, limit int) (anchor, bool) {
	i, _ := slices.BinarySearchFunc(as, limit+1, func(a anchor, t int) int { return a.cut - t })
	if i == 0 {
		return anchor{}, false
	}
	return as[i-1], true
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && a[i:i+8] == b[i:i+8] {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// put caches ids under key; for a text prompt with the special tokens
// known (sp), also its safe cuts and its chunks (chain, computed when nil)
// in the prefix index. Entries over the bytes bound are evicted, least
// recently used first; an entry larger than the bound is not cached.
func (e *Engine) put(key string, ids []int64, sp *specials, chain []uint64) {
	c := &entry{key: key, ids: slices.Clone(ids)}
	if sp != nil && key[0] == 'p' {
		text := key[1:]
		if c.anchors = sp.anchors(text, ids); c.anchors != nil {
			if chain == nil {
				chain = prefix.TextBlocks(text, e.chunk, 1)
			}
			c.chunks = chain
		}
	}
	c.cost = int64(len(key)) + 8*int64(len(ids)) + 8*int64(len(c.chunks)) + 16*int64(len(c.anchors)) + entryOverhead
	if c.cost > e.maxBytes {
		return
	}
	h := maphash.String(e.seed, key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.exact.Remove(h) // the callback drops the replaced entry's accounting
	e.exact.Add(h, c)
	e.bytes += c.cost
	for _, k := range c.chunks {
		e.byChunk[k] = c
	}
	for e.bytes > e.maxBytes {
		if _, _, ok := e.exact.RemoveOldest(); !ok {
			break
		}
	}
}

// dropLocked undoes an evicted entry's accounting and its prefix-index
// keys that still name it. e.mu is held (the LRU's callback runs in the
// goroutine that changes it).
func (e *Engine) dropLocked(c *entry) {
	e.bytes -= c.cost
	for _, k := range c.chunks {
		if e.byChunk[k] == c {
			delete(e.byChunk, k)
		}
	}
}

// errRefused marks an answer of status 400 to 499: the engine refused
// the request as asked (a splice's add_special_tokens=false).
var errRefused = errors.New("refused")

// call posts body to the chosen engine's /tokenize and returns its ids.
// A 404, 405, 422 or 501 sets *off (when off is not nil) for the backoff.
func (e *Engine) call(ctx context.Context, off *atomic.Int64, body map[string]any) ([]int64, error) {
	data, status, url, err := e.do(ctx, http.MethodPost, "/tokenize", body)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		err := fmt.Errorf("tokenizer: POST %s: %w: status %d: %s", url, ErrEngine, status, untrusted.Bytes(data, 200))
		switch status {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity, http.StatusNotImplemented:
			if off != nil {
				// The answer that starts the back-off is ErrUnsupported, as
				// the back-off's are: the engine lacks the form, which is
				// no failure.
				off.Store(time.Now().Add(e.backoff).UnixNano())
				err = fmt.Errorf("%w (%w)", err, ErrUnsupported)
			}
		}
		if status >= 400 && status < 500 {
			err = fmt.Errorf("%w (%w)", err, errRefused)
		}
		return nil, err
	}
	var ans struct {
		Tokens *[]int64 `json:"tokens"`
		Count  *int     `json:"count"`
	}
	if err := json.Unmarshal(data, &ans); err != nil || ans.Tokens == nil {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: the answer is not {\"tokens\": [ids], ...}: %s", url, ErrEngine, untrusted.Bytes(data, 200))
	}
	if ans.Count != nil && *ans.Count != len(*ans.Tokens) {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: count %d but %d tokens", url, ErrEngine, *ans.Count, len(*ans.Tokens))
	}
	e.calls.Add(1)
	e.tokens.Add(int64(len(*ans.Tokens)))
	return *ans.Tokens, nil
}

// do sends one request (body nil: none) to the chosen engine's path and
// returns its answer's body (at most maxAnswer bytes) and status.
func (e *Engine) do(ctx context.Context, method, path string, body any) ([]byte, int, string, error) {
	base, err := e.url(ctx)
	if err != nil {
		return nil, 0, "", fmt.Errorf("tokenizer: model %q: %w: %w", e.model, ErrNoEngine, err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, "", fmt.Errorf("tokenizer: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	url := base + path
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, 0, url, fmt.Errorf("tokenizer: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, 0, url, fmt.Errorf("tokenizer: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, e.maxAnswer+1))
	if err != nil {
		return nil, 0, url, fmt.Errorf("tokenizer: %s %s: reading the answer: %w", method, url, err)
	}
	if int64(len(data)) > e.maxAnswer {
		return nil, 0, url, fmt.Errorf("tokenizer: %s %s: %w: the answer is over %d bytes", method, url, ErrEngine, e.maxAnswer)
	}
	return data, resp.StatusCode, url, nil
}
