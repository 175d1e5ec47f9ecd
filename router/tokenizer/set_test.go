package tokenizer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/prefix"
)

func at(line int) hcl.Range {
	return hcl.Range{Filename: "p.hcl", Start: hcl.Pos{Line: line, Column: 3}}
}

func TestFromConfig(t *testing.T) {
	fe := newFakeEngine(t, loadFile(t, "bytebpe-bos.json", nil))
	var asked []string
	chooser := func(model string) EngineURL {
		return func(ctx context.Context) (string, error) {
			asked = append(asked, model)
			return fe.URL, nil
		}
	}
	set, err := FromConfig([]config.Tokenizer{
		{Model: "chatml", Source: config.TokenizerSourceFile, Path: "testdata/bytebpe.json", Config: "testdata/chatml_config.json"},
		{Model: "llama", Source: config.TokenizerSourceFile, Path: "testdata/bytebpe-bos.json", Config: "testdata/chatml_config.json", ChatTemplate: "testdata/llama3.jinja"},
		{Model: "remote", Source: config.TokenizerSourceEngine},
	}, chooser, EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msgs := []prefix.ChatMessage{{Role: "user", Content: "hello"}}
	for _, c := range []struct {
		model string
		want  []int64
	}{
		// ChatML from tokenizer_config.json.
		{"chatml", []int64{285, 267, 10, 259, 286, 10, 285, 275, 10}},
		// The template file wins over the config's chat_template; the
		// config's bos_token is null, so the Llama 3 template writes "".
		{"llama", []int64{288, 267, 289, 284, 259, 290, 288, 275, 289, 284}},
	} {
		got, err := set.For(c.model).EncodeChat(ctx, msgs, "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: EncodeChat = %v, want %v", c.model, got, c.want)
		}
	}
	got, err := set.For("remote").Encode(ctx, "hello")
	// The chooser is asked for the learning's GET /tokenizer_info (404
	// here) and the call.
	if err != nil || !slices.Equal(got, []int64{287, 259}) || !slices.Equal(asked, []string{"remote", "remote"}) {
		t.Errorf("remote: Encode = %v, %v; chooser asked for %v", got, err, asked)
	}
	if set.For("other") != nil || (*Set)(nil).For("x") != nil {
		t.Error("a model without a block has a tokenizer")
	}
}

func TestFromConfigErrors(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(`{"pad": "`+strings.Repeat("x", MaxFileSize)+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken.jinja")
	if err := os.WriteFile(broken, []byte("{% for %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := FromConfig([]config.Tokenizer{
		{Model: "a", Source: config.TokenizerSourceFile, Path: big, AttrRanges: map[string]hcl.Range{"path": at(3)}},
		{Model: "b", Source: config.TokenizerSourceFile, Path: "testdata/bytebpe.json", ChatTemplate: broken, AttrRanges: map[string]hcl.Range{"chat_template": at(7)}},
		{Model: "c", Source: config.TokenizerSourceFile, Path: "testdata/missing.json", AttrRanges: map[string]hcl.Range{"path": at(11)}},
		{Model: "d", Source: config.TokenizerSourceEngine, Range: at(14)},
	}, nil, EngineOptions{})
	if !errors.Is(err, inputfile.ErrTooLarge) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want a too-large and a missing file", err)
	}
	for _, want := range []string{
		`p.hcl:3:3: tokenizer "a": path: `,
		`p.hcl:7:3: tokenizer "b": chat_template: ` + broken + `: invalid chat template`,
		`p.hcl:11:3: tokenizer "c": path: `,
		`p.hcl:14:3: tokenizer "d": source: no engine chooser was given`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\ndoes not contain %q", err, want)
		}
	}
}

func TestBlocks(t *testing.T) {
	ctx := context.Background()
	f := chatmlFile(t)
	msgs := []prefix.ChatMessage{{Role: "user", Content: "hello world"}}
	// With a tokenizer: the ids, cut in blocks of 4 (10 ids: 2 blocks).
	hashes, ids, err := Blocks(ctx, f, Prompt{Messages: msgs}, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := f.EncodeChat(ctx, msgs, "")
	if !slices.Equal(ids, want) || !slices.Equal(hashes, prefix.TokenBlocks(want, 4)) || len(hashes) != 2 {
		t.Errorf("Blocks = %v, %v; want the hashes of %v", hashes, ids, want)
	}
	hashes, ids, err = Blocks(ctx, f, Prompt{Text: "hello world"}, 2, 4)
	if err != nil || !slices.Equal(ids, []int64{287, 259, 264}) || !slices.Equal(hashes, prefix.TokenBlocks(ids, 2)) {
		t.Errorf("Blocks(text) = %v, %v, %v", hashes, ids, err)
	}
	// Without: the character fallback, as before tokenizers ("user: hello
	// world\n" is 18 bytes: 3 blocks of 2×3).
	hashes, ids, err = Blocks(ctx, nil, Prompt{Messages: msgs}, 2, 3)
	if err != nil || ids != nil || !slices.Equal(hashes, prefix.TextBlocks(prefix.RenderChat(msgs), 2, 3)) || len(hashes) != 3 {
		t.Errorf("Blocks(nil, chat) = %v, %v, %v", hashes, ids, err)
	}
	hashes, _, _ = Blocks(ctx, nil, Prompt{Text: "hello world!"}, 1, 4)
	if !slices.Equal(hashes, prefix.TextBlocks("hello world!", 1, 4)) || len(hashes) != 3 {
		t.Errorf("Blocks(nil, text) = %v", hashes)
	}
	// A tokenizer's error is returned.
	if _, _, err := Blocks(ctx, loadFile(t, "bytebpe.json", nil), Prompt{Messages: msgs}, 4, 4); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("err = %v, want ErrNoChatTemplate", err)
	}
}

// With Defaults, a model without a block that engines serve gets its
// engines' /tokenize; a LoRA adapter takes its base model's tokenizer
// (the base's block, or the base's default Engine, shared); a "chars"
// block turns the default off; a model nobody serves has none.
func TestSetDefaults(t *testing.T) {
	fe := newFakeEngine(t, loadFile(t, "bytebpe-bos.json", nil))
	var asked []string
	chooser := func(model string) EngineURL {
		asked = append(asked, model)
		return func(context.Context) (string, error) { return fe.URL, nil }
	}
	served := map[string]bool{"base": true, "base-lora": true, "filed": true, "filed-lora": true, "off": true}
	parents := map[string]string{"base-lora": "base", "filed-lora": "filed"}
	set, err := NewSet([]config.Tokenizer{
		{Model: "filed", Source: config.TokenizerSourceFile, Path: "testdata/bytebpe.json"},
		{Model: "off", Source: config.TokenizerSourceChars},
	}, chooser, EngineOptions{}, Defaults{
		Served: func(m string) bool { return served[m] },
		Parent: func(m string) string { return parents[m] },
	})
	if err != nil {
		t.Fatal(err)
	}
	base, ok := set.For("base").(*Engine)
	if !ok || base.model != "base" {
		t.Fatalf("base: %T %v, want its engines' Engine", set.For("base"), set.For("base"))
	}
	if set.For("base-lora") != Tokenizer(base) || set.For("base") != Tokenizer(base) {
		t.Error("the adapter does not share its base model's default Engine")
	}
	if _, ok := set.For("filed-lora").(*File); !ok || set.For("filed-lora") != set.For("filed") {
		t.Errorf("filed-lora: %T, want its base model's File", set.For("filed-lora"))
	}
	if set.For("off") != nil || set.For("nobody") != nil {
		t.Errorf("off: %v, nobody: %v; want no tokenizer for a chars block and a model no engine serves", set.For("off"), set.For("nobody"))
	}
	if !slices.Equal(asked, []string{"base"}) {
		t.Errorf("engine choosers made for %v, want [base] once", asked)
	}
	got, err := set.For("base-lora").Encode(context.Background(), "hello")
	if err != nil || !slices.Equal(got, []int64{287, 259}) {
		t.Errorf("adapter Encode = %v, %v", got, err)
	}
	if b := fe.sent()[len(fe.sent())-1]; b["model"] != "base" {
		t.Errorf("the adapter's prompt was tokenized as model %v, want its base model", b["model"])
	}
	plain, err := FromConfig(nil, chooser, EngineOptions{})
	if err != nil || plain.For("base") != nil {
		t.Errorf("FromConfig (no Defaults): For(base) = %v, %v; want none", plain.For("base"), err)
	}
}
