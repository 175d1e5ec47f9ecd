package serve

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/tokenizer"
)

// A model with a tokenizer block is keyed by its token ids (chat: the
// messages through the model's template); token ids a request carries are
// used as they are; a model without one, or whose tokenizer fails, is
// keyed by character blocks, the failure counted.
func TestRoutingHashesUseTheTokenizer(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "a", url: closedURL(t)})
	noEngine := func(string) tokenizer.EngineURL {
		return func(context.Context) (string, error) { return closedURL(t), nil }
	}
	set, err := tokenizer.FromConfig([]config.Tokenizer{
		{Model: "m", Source: config.TokenizerSourceFile, Path: "../tokenizer/testdata/bytebpe.json", Config: "../tokenizer/testdata/chatml_config.json"},
		{Model: "down", Source: config.TokenizerSourceEngine},
	}, noEngine, tokenizer.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.s.SetTokenizers(set)
	ctx := context.Background()
	long := "the quick brown fox jumps over the lazy dog, again and again and again"
	bs := e.r.BlockSize()

	req, err := parseRequest([]byte(chatBody("m", false, long)), true)
	if err != nil {
		t.Fatal(err)
	}
	ex := &exchange{ctx: ctx, model: "m", label: "m"}
	e.s.routingHashes(ex, req.key())
	want, err := set.For("m").EncodeChat(ctx, []prefix.ChatMessage{{Role: "user", Content: long}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ex.ids, want) || ex.tokens != len(want) {
		t.Fatalf("chat ids %v (tokens %d), want the template's %v", ex.ids, ex.tokens, want)
	}
	if wantH := prefix.TokenBlocks(want, bs); len(wantH) == 0 || !slices.Equal(ex.hashes, wantH) {
		t.Fatalf("hashes %v, want TokenBlocks of the ids %v", ex.hashes, wantH)
	}

	// Token ids in the request: no tokenizer call.
	req, _ = parseRequest([]byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`), false)
	ex = &exchange{ctx: ctx, model: "m", label: "m"}
	e.s.routingHashes(ex, req.key())
	if ex.tokens != 17 || len(ex.hashes) != 1 || ex.ids[16] != 17 {
		t.Fatalf("token-id prompt: tokens %d hashes %d ids %v", ex.tokens, len(ex.hashes), ex.ids)
	}

	// No tokenizer block: character blocks, no ids.
	req, _ = parseRequest([]byte(chatBody("other", false, long)), true)
	ex = &exchange{ctx: ctx, model: "other", label: "other"}
	e.s.routingHashes(ex, req.key())
	if ex.ids != nil || !slices.Equal(ex.hashes, prefix.TextBlocks(req.key().text, bs, DefaultCharsPerToken)) {
		t.Fatalf("no tokenizer: ids %v, hashes %v", ex.ids, ex.hashes)
	}

	// A failing tokenizer: character blocks, and the failure counted.
	req, _ = parseRequest([]byte(chatBody("down", false, long)), true)
	ex = &exchange{ctx: ctx, model: "down", label: "down"}
	e.s.routingHashes(ex, req.key())
	if ex.ids != nil || !slices.Equal(ex.hashes, prefix.TextBlocks(req.key().text, bs, DefaultCharsPerToken)) {
		t.Fatalf("failed tokenizer: ids %v, hashes %v", ex.ids, ex.hashes)
	}
	if got := testutil.ToFloat64(e.s.met.tokFails.WithLabelValues("down")); got != 1 {
		t.Errorf("switchyard_tokenize_failures_total{model=down} = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(e.s.met.tokenize); got != 2 {
		t.Errorf("tokenize histogram has %d series, want 2 (m, down)", got)
	}
}
