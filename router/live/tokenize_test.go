package live

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
	e.rt.SetTokenizers(set)
	ctx := context.Background()
	long := "the quick brown fox jumps over the lazy dog, again and again and again"
	bs := e.r.BlockSize()

	req, err := ParseRequest([]byte(chatBody("m", false, long)), APIChat)
	if err != nil {
		t.Fatal(err)
	}
	ex := &Request{Model: "m", Label: "m"}
	e.rt.Key(ctx, ex, req.Key())
	want, err := set.For("m").EncodeChat(ctx, []prefix.ChatMessage{{Role: "user", Content: long}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ex.IDs, want) || ex.Tokens != len(want) {
		t.Fatalf("chat ids %v (tokens %d), want the template's %v", ex.IDs, ex.Tokens, want)
	}
	if wantH := prefix.TokenBlocks(want, bs); len(wantH) == 0 || !slices.Equal(ex.Hashes, wantH) {
		t.Fatalf("hashes %v, want TokenBlocks of the ids %v", ex.Hashes, wantH)
	}

	// Token ids in the request: no tokenizer call.
	req, _ = ParseRequest([]byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`), APICompletions)
	ex = &Request{Model: "m", Label: "m"}
	e.rt.Key(ctx, ex, req.Key())
	if ex.Tokens != 17 || len(ex.Hashes) != 1 || ex.IDs[16] != 17 {
		t.Fatalf("token-id prompt: tokens %d hashes %d ids %v", ex.Tokens, len(ex.Hashes), ex.IDs)
	}

	// No tokenizer block: character blocks, no ids.
	req, _ = ParseRequest([]byte(chatBody("other", false, long)), APIChat)
	ex = &Request{Model: "other", Label: "other"}
	e.rt.Key(ctx, ex, req.Key())
	if ex.IDs != nil || !slices.Equal(ex.Hashes, prefix.TextBlocks(req.Key().text, bs, DefaultCharsPerToken)) {
		t.Fatalf("no tokenizer: ids %v, hashes %v", ex.IDs, ex.Hashes)
	}

	// A failing tokenizer: character blocks, and the failure counted.
	req, _ = ParseRequest([]byte(chatBody("down", false, long)), APIChat)
	ex = &Request{Model: "down", Label: "down"}
	e.rt.Key(ctx, ex, req.Key())
	if ex.IDs != nil || !slices.Equal(ex.Hashes, prefix.TextBlocks(req.Key().text, bs, DefaultCharsPerToken)) {
		t.Fatalf("failed tokenizer: ids %v, hashes %v", ex.IDs, ex.Hashes)
	}
	if got := testutil.ToFloat64(e.rt.met.tokFails.WithLabelValues("down")); got != 1 {
		t.Errorf("switchyard_tokenize_failures_total{model=down} = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(e.rt.met.tokenize); got != 2 {
		t.Errorf("tokenize histogram has %d series, want 2 (m, down)", got)
	}
}
