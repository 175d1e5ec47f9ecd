package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Bounds of what an Engine learns of the model's added tokens from
// /tokenizer_info: at most maxAddedTokens of them (Llama 3 has 256, Qwen
// 2.5 22, Gemma some hundreds; more and the engine offers no safe cuts),
// each at most maxAddedTokenBytes long (the longest common ones are about
// 30 bytes; the lookup around a cut reads that many more bytes).
const (
	maxAddedTokens     = 4096
	maxAddedTokenBytes = 256
)

// specials is what an Engine knows of the model's tokenizer for safe
// cuts: its added tokens and its post-processor's pre and post tokens.
type specials struct {
	byID      map[int64]string // added token id -> content
	trie      []trieNode       // the contents; node 0 is the root
	first     [256]bool        // bytes an added token starts with
	maxLen    int              // the longest content's length in bytes
	pre, post []int64          // around a prompt tokenized with special tokens
}

// trieNode is a node of the added tokens' byte trie: its children by byte
// and, when a content ends here, that content's length (0: none).
type trieNode struct {
	next map[byte]int32
	end  int
}

// newSpecials builds the specials of the added tokens byID (non-empty
// contents) and the pre and post tokens.
func newSpecials(byID map[int64]string, pre, post []int64) *specials {
	sp := &specials{byID: byID, trie: []trieNode{{}}, pre: pre, post: post}
	for _, c := range byID {
		sp.maxLen = max(sp.maxLen, len(c))
		sp.first[c[0]] = true
		n := int32(0)
		for i := 0; i < len(c); i++ {
			nx, ok := sp.trie[n].next[c[i]]
			if !ok {
				nx = int32(len(sp.trie))
				sp.trie = append(sp.trie, trieNode{})
				if sp.trie[n].next == nil {
					sp.trie[n].next = make(map[byte]int32)
				}
				sp.trie[n].next[c[i]] = nx
			}
			n = nx
		}
		sp.trie[n].end = len(c)
	}
	return sp
}

// match returns the length of the longest added token at text[i:], 0 when
// none starts there. Cost: at most maxLen steps.
func (sp *specials) match(text string, i int) int {
	if !sp.first[text[i]] {
		return 0
	}
	best, n := 0, int32(0)
	for j := i; j < len(text); j++ {
		nx, ok := sp.trie[n].next[text[j]]
		if !ok {
			break
		}
		n = nx
		if sp.trie[n].end > 0 {
			best = sp.trie[n].end
		}
	}
	return best
}

// anchors returns the safe cuts of a text prompt and its ids (tokenized
// with special tokens): the start of each added token matched in text,
// leftmost-longest as Hugging Face's tokenizers match them, paired in
// order with the added-token ids of ids between the pre and post tokens.
// nil when ids do not begin with pre and end with post, or the matches
// and the ids do not pair one to one with equal contents. Linear in
// len(text) (times the trie's depth) and len(ids).
func (sp *specials) anchors(text string, ids []int64) []anchor {
	if len(ids) < len(sp.pre)+len(sp.post) || !equalIDs(ids[:len(sp.pre)], sp.pre) || !equalIDs(ids[len(ids)-len(sp.post):], sp.post) {
		return nil
	}
	body := ids[len(sp.pre) : len(ids)-len(sp.post)]
	var out []anchor
	j := 0
	for i := 0; i < len(text); {
		l := sp.match(text, i)
		if l == 0 {
			i++
			continue
		}
		for j < len(body) && sp.byID[body[j]] == "" {
			j++
		}
		if j == len(body) || sp.byID[body[j]] != text[i:i+l] {
			return nil
		}
		out = append(out, anchor{cut: i, at: len(sp.pre) + j})
		j++
		i += l
	}
	for ; j < len(body); j++ {
		if sp.byID[body[j]] != "" {
			return nil // an added token the scan did not find
		}
	}
	return out
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// specials returns the model's specials, learning them on the first call
// and again after learnRetry (learnRetryTransient after a transport
// failure) while the engine has not told them; nil when unknown. The
// learning runs in the caller's goroutine under ctx, one caller at a
// time; the others go on without.
func (e *Engine) specials(ctx context.Context) *specials {
	if sp := e.sp.Load(); sp != nil {
		return sp
	}
	if !e.spMu.TryLock() {
		return nil
	}
	defer e.spMu.Unlock()
	if e.spDone || time.Now().Before(e.spRetryAt) {
		return nil
	}
	sp, err := e.learn(ctx)
	switch {
	case sp != nil:
		e.sp.Store(sp)
		e.spDone = true
	case err == nil:
		e.spRetryAt = time.Now().Add(learnRetry)
	default:
		e.spRetryAt = time.Now().Add(learnRetryTransient)
	}
	return sp
}

// learn asks the engine for its added tokens (GET /tokenizer_info:
// added_tokens_decoder, each id's content as a string or an object with
// "content") and its post-processor's tokens (prompt "a" tokenized with
// and without special tokens). nil and no error when the engine does not
// tell them; an error for a transport failure.
func (e *Engine) learn(ctx context.Context) (*specials, error) {
	data, status, _, err := e.do(ctx, http.MethodGet, "/tokenizer_info", nil)
	if err != nil {
		if errors.Is(err, ErrEngine) {
			return nil, nil
		}
		return nil, err
	}
	if status != http.StatusOK {
		return nil, nil
	}
	byID, ok := parseAddedTokens(data)
	if !ok {
		return nil, nil
	}
	const probe = "a"
	with, err := e.call(ctx, nil, map[string]any{"model": e.model, "prompt": probe, "add_special_tokens": true})
	if err != nil {
		return nil, transient(err)
	}
	without, err := e.call(ctx, nil, map[string]any{"model": e.model, "prompt": probe, "add_special_tokens": false})
	if err != nil {
		return nil, transient(err)
	}
	i := index(with, without)
	if i < 0 || len(without) == 0 {
		return nil, nil
	}
	return newSpecials(byID, with[:i], with[i+len(without):]), nil
}

// transient keeps a transport error and drops the engine's answers
// (which will not change without a restart).
func transient(err error) error {
	if errors.Is(err, ErrEngine) {
		return nil
	}
	return err
}

// parseAddedTokens reads added_tokens_decoder from a /tokenizer_info
// answer: {"<id>": "content" or {"content": ...}, ...}. false when it is
// absent, empty, malformed, or over maxAddedTokens entries or
// maxAddedTokenBytes per content.
func parseAddedTokens(data []byte) (map[int64]string, bool) {
	var info struct {
		Added map[string]json.RawMessage `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(data, &info); err != nil || len(info.Added) == 0 || len(info.Added) > maxAddedTokens {
		return nil, false
	}
	byID := make(map[int64]string, len(info.Added))
	for k, raw := range info.Added {
		id, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			return nil, false
		}
		content, err := tokenString(raw)
		if err != nil || content == "" || len(content) > maxAddedTokenBytes {
			return nil, false
		}
		byID[id] = content
	}
	return byID, true
}

// String describes the specials for logs and tests.
func (sp *specials) String() string {
	return fmt.Sprintf("%d added tokens (longest %d bytes), pre %v, post %v", len(sp.byID), sp.maxLen, sp.pre, sp.post)
}
