package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// EngineURL returns the base URL ("http://host:port", no trailing "/") of
// a ready engine serving the model, for Engine to call /tokenize on; an
// error (wrapped with ErrNoEngine by Engine) when there is none.
type EngineURL func(ctx context.Context) (string, error)

// Defaults of EngineOptions.
const (
	// DefaultMaxAnswerBytes bounds one /tokenize answer: 32 MiB, room for
	// some 3 million token ids as JSON, beyond any served context length.
	DefaultMaxAnswerBytes = 32 << 20
	// DefaultCacheEntries is the prefix cache's entries per model: 8192
	// (each holds one tokenized prompt: its ids and under ChunkBytes of
	// text).
	DefaultCacheEntries = 8192
	// DefaultCacheTokens bounds the prefix cache's token ids per model in
	// all: 2^24 (128 MiB of ids), as the entries alone would let clients
	// fill it with 8192 long prompts (a 32 MiB answer holds millions).
	DefaultCacheTokens = 1 << 24
	// DefaultChunkBytes is the prefix cache's chunk of text, 256 bytes:
	// the block size of llm-d's prefix store (llm-d-kv-cache-manager,
	// pkg/tokenization/prefixstore, defaultBlockSize).
	DefaultChunkBytes = 256
	// DefaultMinCoverage is the share of a prompt the cache must cover to
	// skip the engine call: 0.8, llm-d's defaultMinPrefixOverlapRatio
	// (pkg/tokenization/pool.go).
	DefaultMinCoverage = 0.8
)

// EngineOptions tune an Engine; zero fields take the defaults above.
type EngineOptions struct {
	// Client makes the calls; nil is a client with no timeout of its own
	// (the context of each call bounds it).
	Client *http.Client
	// MaxAnswerBytes bounds an answer's body (DefaultMaxAnswerBytes).
	MaxAnswerBytes int64
	// CacheEntries bounds the prefix cache (DefaultCacheEntries).
	CacheEntries int
	// CacheTokens bounds the token ids the prefix cache holds in all
	// (DefaultCacheTokens); the least recently used inputs are evicted
	// to stay under it, and an answer larger than it is not cached.
	CacheTokens int
	// ChunkBytes is the cache's chunk size in bytes (DefaultChunkBytes).
	ChunkBytes int
	// MinCoverage is the share of a prompt's bytes the cache must cover
	// to answer without a call, in (0, 1] (DefaultMinCoverage); 1 calls
	// the engine for everything but exact repeats.
	MinCoverage float64
}

// Engine tokenizes by calling the engine's own POST /tokenize, so the ids
// are the engine's by construction, chat templates included.
//
// The endpoint, as read in the engines' sources:
//   - vLLM (vllm/entrypoints/openai/protocol.py, TokenizeCompletionRequest
//     and TokenizeChatRequest, served at /tokenize; the copies of several
//     releases checked agree on these fields and defaults):
//     {"model", "prompt", "add_special_tokens": true} or
//     {"model", "messages", "add_generation_prompt": true,
//     "add_special_tokens": false}, answered by {"count", "max_model_len",
//     "tokens": [ids]} (and "token_strs" when asked).
//   - SGLang (python/sglang/srt/entrypoints/openai/serving_tokenize.py,
//     listed as /tokenize among SGLang's native APIs): {"model", "prompt",
//     "add_special_tokens"} with the same answer shape; it takes no chat
//     messages, so EncodeChat needs vLLM (an SGLang engine answers it
//     with an error status, which EncodeChat returns).
//
// A prefix cache makes a conversation's shared prefix cost one call, the
// simplest equivalent of llm-d's prefix store: each tokenized input (the
// prompt, or the chat messages serialised as length-prefixed role and
// content, which keeps a conversation's earlier turns a byte prefix of
// its later ones) is stored, with its ids, under the chained hash of its
// full ChunkBytes chunks (prefix.TextBlocks of the input at one "token"
// per byte), with the bytes after its last full chunk kept to compare. An
// input that begins with a stored one which covers at least MinCoverage
// of its bytes is answered from the cache without a call. llm-d keeps
// tokens per chunk, using the offsets its in-process tokenizer returns;
// /tokenize returns no offsets, hence whole inputs.
//
// What is approximate, on a cache answer only (a call is exact): the ids
// are those of the earlier, shorter input, so the rest of the prompt (at
// most 1 - MinCoverage of it) is not in them, and the last word of the
// earlier input may tokenize differently once the prompt continues it.
// For chat, the earlier input's generation prompt stands where the later
// one has the assistant's turn, which agrees for templates that render
// each turn independently of the next (ChatML, Llama 3) and not for those
// that rewrite earlier turns (such as dropping past reasoning). For prefix
// keys this means fewer hashed blocks, never wrong leading ones, except
// that last word.
type Engine struct {
	model       string
	url         EngineURL
	client      *http.Client
	maxAnswer   int64
	chunk       int
	minCoverage float64
	cache       *lru.Cache[uint64, cached]

	// addMu serialises additions to cache, so that cachedIDs, the ids it
	// holds (kept by its eviction callback, which runs in the adding
	// goroutine), stays under maxCachedIDs.
	addMu                   sync.Mutex
	cachedIDs, maxCachedIDs int

	calls, hits, tokens atomic.Int64
}

// cached is one tokenized input: its ids and its bytes past its last full
// chunk.
type cached struct {
	ids  []int64
	tail string
}

// NewEngine returns an Engine for model calling the engines url chooses.
func NewEngine(model string, url EngineURL, o EngineOptions) (*Engine, error) {
	if url == nil {
		return nil, fmt.Errorf("tokenizer: engine source for %q: no engine chooser", model)
	}
	e := &Engine{model: model, url: url, client: o.Client, maxAnswer: o.MaxAnswerBytes, chunk: o.ChunkBytes, minCoverage: o.MinCoverage}
	if e.client == nil {
		e.client = &http.Client{}
	}
	if e.maxAnswer <= 0 {
		e.maxAnswer = DefaultMaxAnswerBytes
	}
	if e.chunk <= 0 {
		e.chunk = DefaultChunkBytes
	}
	if e.minCoverage <= 0 || e.minCoverage > 1 {
		e.minCoverage = DefaultMinCoverage
	}
	n := o.CacheEntries
	if n <= 0 {
		n = DefaultCacheEntries
	}
	e.maxCachedIDs = o.CacheTokens
	if e.maxCachedIDs <= 0 {
		e.maxCachedIDs = DefaultCacheTokens
	}
	c, err := lru.NewWithEvict(n, func(_ uint64, v cached) { e.cachedIDs -= len(v.ids) })
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	e.cache = c
	return e, nil
}

// EngineStats counts an Engine's work since it was made.
type EngineStats struct {
	Calls     int64 // /tokenize calls answered with ids
	CacheHits int64 // requests answered from the prefix cache
	Tokens    int64 // token ids the calls returned, summed
}

// Stats returns the counts so far.
func (e *Engine) Stats() EngineStats {
	return EngineStats{Calls: e.calls.Load(), CacheHits: e.hits.Load(), Tokens: e.tokens.Load()}
}

// Encode returns the engine's ids of prompt, special tokens added, from
// the prefix cache or a call; see Engine for what a cache answer leaves
// out. Errors wrap ErrNoEngine or ErrEngine, or are the call's (the
// context's deadline included).
func (e *Engine) Encode(ctx context.Context, prompt string) ([]int64, error) {
	return e.tokenize(ctx, "p"+prompt, map[string]any{"model": e.model, "prompt": prompt, "add_special_tokens": true})
}

// EncodeChat returns the engine's ids of msgs rendered by its chat
// template with the generation prompt (vLLM's chat form of /tokenize), as
// Encode does.
func (e *Engine) EncodeChat(ctx context.Context, msgs []prefix.ChatMessage) ([]int64, error) {
	var key strings.Builder
	key.WriteByte('c')
	wire := make([]map[string]string, len(msgs))
	for i, m := range msgs {
		for _, s := range []string{m.Role, m.Content} {
			key.Write(binary.AppendUvarint(nil, uint64(len(s))))
			key.WriteString(s)
		}
		wire[i] = map[string]string{"role": m.Role, "content": m.Content}
	}
	return e.tokenize(ctx, key.String(), map[string]any{
		"model": e.model, "messages": wire, "add_generation_prompt": true, "add_special_tokens": false,
	})
}

// tokenize answers from the cache when it covers key, else calls the
// engine with body and caches the answer under key.
func (e *Engine) tokenize(ctx context.Context, key string, body map[string]any) ([]int64, error) {
	chain := prefix.TextBlocks(key, e.chunk, 1)
	if ids, ok := e.lookup(key, chain); ok {
		e.hits.Add(1)
		return ids, nil
	}
	ids, err := e.call(ctx, body)
	if err != nil {
		return nil, err
	}
	e.calls.Add(1)
	e.tokens.Add(int64(len(ids)))
	if k := len(chain); k > 0 {
		e.add(chain[k-1], cached{ids: slices.Clone(ids), tail: key[k*e.chunk:]})
	}
	return ids, nil
}

// add caches c under h, evicting the least recently used inputs while the
// cache holds more than maxCachedIDs ids; c is not cached when it alone
// holds more.
func (e *Engine) add(h uint64, c cached) {
	if len(c.ids) > e.maxCachedIDs {
		return
	}
	e.addMu.Lock()
	defer e.addMu.Unlock()
	e.cache.Remove(h) // a replaced value is not passed to the eviction callback
	e.cache.Add(h, c)
	e.cachedIDs += len(c.ids)
	for e.cachedIDs > e.maxCachedIDs {
		if _, _, ok := e.cache.RemoveOldest(); !ok {
			break
		}
	}
}

// lookup returns a copy of the ids of the longest cached input that key
// begins with, when it covers MinCoverage of key. Cost: linear in
// len(key).
func (e *Engine) lookup(key string, chain []uint64) ([]int64, bool) {
	for k := len(chain); k > 0; k-- {
		c, ok := e.cache.Get(chain[k-1])
		if !ok || !strings.HasPrefix(key[k*e.chunk:], c.tail) {
			continue
		}
		if covered := k*e.chunk + len(c.tail); float64(covered) < e.minCoverage*float64(len(key)) {
			return nil, false // a shorter one covers less
		}
		return slices.Clone(c.ids), true
	}
	return nil, false
}

// call posts body to the chosen engine's /tokenize and returns its ids.
func (e *Engine) call(ctx context.Context, body map[string]any) ([]int64, error) {
	base, err := e.url(ctx)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: model %q: %w: %w", e.model, ErrNoEngine, err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	url := base + "/tokenize"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, e.maxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: POST %s: reading the answer: %w", url, err)
	}
	if int64(len(data)) > e.maxAnswer {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: the answer is over %d bytes", url, ErrEngine, e.maxAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: status %d: %.200s", url, ErrEngine, resp.StatusCode, data)
	}
	var ans struct {
		Tokens *[]int64 `json:"tokens"`
		Count  *int     `json:"count"`
	}
	if err := json.Unmarshal(data, &ans); err != nil || ans.Tokens == nil {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: the answer is not {\"tokens\": [ids], ...}: %.200s", url, ErrEngine, data)
	}
	if ans.Count != nil && *ans.Count != len(*ans.Tokens) {
		return nil, fmt.Errorf("tokenizer: POST %s: %w: count %d but %d tokens", url, ErrEngine, *ans.Count, len(*ans.Tokens))
	}
	return *ans.Tokens, nil
}
