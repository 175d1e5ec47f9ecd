package live

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/shared"
)

// Request is one completion request as the runtime takes it in: what the
// face read of it (its id, model, session, metadata, arrival), and what
// Key made of its prompt (token count, block hashes, token ids). A face
// fills the first part and calls Key, then Admit for each hop.
type Request struct {
	// Start is the request's arrival (TTFT and duration count from it).
	Start time.Time
	// Model is the body's model; Stream whether the client asked for a
	// streamed answer; API the request's schema (its endpoint's).
	Model  string
	Stream bool
	API    API
	// ID is the client's request id (X-Request-Id), or a generated one
	// (Runtime.NewID).
	ID string
	// Label is the model's metrics label (Runtime.ModelLabel).
	Label string
	// Session is the client's X-Session-Id; Meta the request's headers as
	// shared.Request Metadata (RequestMetadata).
	Session string
	Meta    map[string]string
	// SLO is the request's latency targets from its headers (ParseSLO);
	// MaxTokens its body's cap on generated tokens
	// (CompletionRequest.MaxTokens). Admit passes both on.
	SLO       shared.SLO
	MaxTokens int

	// Set by Key.

	// Tokens is the prompt's length in tokens (its token ids, its
	// tokenizer's count, or the character estimate).
	Tokens int
	// Hashes are the prompt's block hashes, BlockSize tokens per block
	// (the model's key block size: keyBlockSize).
	Hashes    []uint64
	BlockSize int
	// IDs are the prompt's token ids: the request's own, or its
	// tokenizer's; nil when it was keyed by character blocks.
	IDs []int64
	// LoRA is the LoRA adapter the request runs with (its model, when
	// that is an adapter), Salt its cache_salt; "" for none.
	LoRA, Salt string
	// KeyedBy says how the prompt was keyed: KeyedIDs, KeyedEngine,
	// KeyedFile or KeyedChars; TokErr is why a tokenizer failed, when it
	// did and the prompt was keyed by characters.
	KeyedBy string
	TokErr  error
}

// How a prompt was keyed (Request.KeyedBy).
const (
	KeyedIDs    = "token_ids"  // the request's own token ids
	KeyedEngine = "engine"     // its engines' /tokenize
	KeyedFile   = "file"       // a tokenizer block's file
	KeyedChars  = "characters" // character blocks: no token ids
)

// credentialHeaders (canonical names) are not copied into a request's
// Metadata: classifiers and policy plugins, which may be third-party
// binaries, see the other headers but not the client's credentials. They
// are still forwarded to the engine.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key"}

// RequestMetadata is a request's shared.Request Metadata: each header's
// first value under its lower-cased name, but the client's credentials
// (Authorization, Proxy-Authorization, Cookie, X-Api-Key, Api-Key).
func RequestMetadata(h http.Header) map[string]string {
	meta := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 && !slices.Contains(credentialHeaders, k) {
			meta[strings.ToLower(k)] = v[0]
		}
	}
	return meta
}

// Key sets req's prompt length, token ids, block size and block hashes
// from its routing key. The block size is the model's (keyBlockSize:
// router.block_size when set, else its engines'). Token ids the request
// carries are hashed as they are; a text prompt of a model with a
// tokenizer (its block's, or its engines' /tokenize; a LoRA adapter's base
// model's) is tokenized (chat: the messages, rendered by the model's
// template) under ctx; otherwise, or when the tokenizer fails (counted,
// logged at debug; an engine that does not serve /tokenize is neither),
// it is keyed by character blocks. The hashes are seeded by the request's
// LoRA adapter and cache_salt (keySeed). The tokenizer runs in the
// caller's goroutine, with no lock held.
func (rt *Runtime) Key(ctx context.Context, req *Request, key RoutingKey) {
	parent := rt.engines.Parent(req.Model)
	if parent == req.Model {
		parent = ""
	}
	bs := rt.keyBlockSize(req.Model, parent)
	req.BlockSize, req.Salt = bs, key.salt
	if parent != "" {
		req.LoRA = req.Model
	}
	seed := keySeed(req.LoRA, req.Salt)
	req.KeyedBy = KeyedIDs
	if key.ids == nil {
		req.KeyedBy = KeyedChars
		if set := rt.toks.Load(); set != nil {
			if tok := set.For(req.Model); tok != nil {
				t0 := time.Now()
				hashes, ids, err := tokenizer.Blocks(ctx, tok, tokenizer.Prompt{Text: key.text, Messages: key.messages(), Tools: key.tools()}, bs, rt.cpt)
				// A call was made unless the engine's back-off answered
				// (ErrUnsupported without ErrEngine).
				called := !errors.Is(err, tokenizer.ErrUnsupported) || errors.Is(err, tokenizer.ErrEngine)
				if rt.met != nil && called {
					rt.met.tokenize.WithLabelValues(req.Label).Observe(time.Since(t0).Seconds())
				}
				if err == nil {
					req.Tokens, req.Hashes, req.IDs = len(ids), seedHashes(hashes, seed), ids
					req.KeyedBy = KeyedFile
					if _, ok := tok.(*tokenizer.Engine); ok {
						req.KeyedBy = KeyedEngine
					}
					return
				}
				req.TokErr = err
				if !errors.Is(err, tokenizer.ErrUnsupported) { // an engine without the form fails nothing
					if rt.met != nil {
						rt.met.tokFails.WithLabelValues(req.Label).Inc()
					}
					rt.log.Debug("tokenizer failed; keyed by character blocks", "model", req.Model, "request_id", req.ID, "error", err)
				}
			}
		}
	}
	req.Tokens, req.Hashes = key.hash(bs, rt.cpt, seed)
	req.IDs = key.ids
}

// PromptKey is the request's token ids as a shared.PromptKey, which a
// candidate's precise prefix index (KV events) looks up at its engine's
// block size, with the LoRA adapter and cache_salt the engine's block
// hashes carry; nil (no PromptKey) when the prompt was keyed by
// characters.
func (req *Request) PromptKey() shared.PromptKey {
	if req.IDs == nil {
		return nil
	}
	return &prefix.Key{IDs: req.IDs, LoRA: req.LoRA, Salt: req.Salt}
}

// Admit admits the first attempt of req's hop (admission.Path's: its
// role, and whether it carries the prompt's block hashes) under the id
// req.ID+tag+"0" (a unique one, Runtime.NewID's, when the client reused a
// live request's), with its SLO, MaxTokens and arrival (req.Start,
// admission.Arrival), with opts, under ctx, and records the selection's
// duration (switchyard_selection_duration_seconds). It returns the
// handle, placed or queued, or the admission's error.
func (rt *Runtime) Admit(ctx context.Context, req *Request, hop admission.Hop, tag string, opts ...admission.Option) (*admission.Handle, error) {
	sr := hop.Request(&shared.Request{
		Model:        req.Model,
		PromptTokens: req.Tokens,
		BlockSize:    req.BlockSize,
		BlockHashes:  req.Hashes,
		SessionID:    req.Session,
		Metadata:     req.Meta,
		Prompt:       req.PromptKey(),
		MaxTokens:    req.MaxTokens,
		SLO:          req.SLO,
	})
	sr.ID = req.ID + tag + "0"
	if !req.Start.IsZero() {
		// The request's time in the router counts against its TTFT
		// target (its own or its class's) from its arrival
		// (shared.SLO.Waited).
		opts = append(opts[:len(opts):len(opts)], admission.Arrival(req.Start))
	}
	if !req.Stream {
		// A whole answer's first byte is no first token: the latency
		// predictor must not learn TTFT or TPOT from it.
		opts = append(opts[:len(opts):len(opts)], admission.Untimed())
	}
	t0 := time.Now()
	h, err := rt.adm.Admit(ctx, sr, opts...)
	if errors.Is(err, admission.ErrDuplicateRequest) {
		// The client reused a live request's id: admit under a unique one.
		sr.ID = rt.NewID() + tag + "0"
		h, err = rt.adm.Admit(ctx, sr, opts...)
	}
	var policy string
	if h != nil {
		policy = h.Decision().Policy
	}
	rt.observeSelection(policy, sr.Role, time.Since(t0))
	if err != nil {
		return nil, err
	}
	return h, nil
}

// observeSelection records one selection's duration under the policy
// that decided ("" before a decision: the role's policy).
func (rt *Runtime) observeSelection(policy string, role shared.Role, d time.Duration) {
	if rt.met == nil {
		return
	}
	if policy == "" {
		if b := loader.Current(rt.r); b != nil {
			policy = b.PolicyName(role)
		}
	}
	rt.met.selection.WithLabelValues(policy, string(role)).Observe(d.Seconds())
}
