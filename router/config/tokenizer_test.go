package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestTokenizerBlocks(t *testing.T) {
	const src = `tokenizer "llama-3" {
  source        = "file"
  path          = "tok/tokenizer.json"
  config        = "tok/tokenizer_config.json"
  chat_template = "/etc/chat.jinja"
}
tokenizer "qwen" {
  source = "engine"
}
tokenizer "tiny" {
  source = "chars"
}
`
	f, diags := Load(filepath.Join("conf", "p.hcl"), []byte(src), testCatalog(t))
	if diags.HasErrors() || len(diags) > 0 {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	want := []Tokenizer{
		{Model: "llama-3", Source: TokenizerSourceFile, Path: filepath.Join("conf", "tok", "tokenizer.json"),
			Config: filepath.Join("conf", "tok", "tokenizer_config.json"), ChatTemplate: "/etc/chat.jinja"},
		{Model: "qwen", Source: TokenizerSourceEngine},
		{Model: "tiny", Source: TokenizerSourceChars},
	}
	if diff := cmp.Diff(want, f.Tokenizers, cmpopts.IgnoreFields(Tokenizer{}, "Range", "AttrRanges")); diff != "" {
		t.Fatalf("tokenizers (-want +got):\n%s", diff)
	}
	if got := pos(f.Tokenizers[0].AttrRanges["path"]); got != "conf/p.hcl:3:3" {
		t.Errorf("path range = %s, want conf/p.hcl:3:3", got)
	}
	if got := pos(f.Tokenizers[1].Range); got != "conf/p.hcl:7:1" {
		t.Errorf("qwen range = %s, want conf/p.hcl:7:1", got)
	}
}

func TestTokenizerBlockErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`tokenizer "m" { source = "hub" }`, `p.hcl:1:26: error: Invalid tokenizer source; source must be "engine"`},
		{`tokenizer "m" { source = "file" }`, `p.hcl:1:1: error: Missing tokenizer path`},
		{"tokenizer \"m\" {\n  source = \"engine\"\n  path   = \"t.json\"\n}", `p.hcl:3:12: error: Unexpected path; With source = "engine" the engine tokenizes`},
		{"tokenizer \"m\" {\n  source = \"file\"\n  path = \"\"\n}", `p.hcl:3:10: error: Invalid path`},
		{"tokenizer \"m\" {\n  source = \"chars\"\n  config = \"c.json\"\n}", `p.hcl:3:12: error: Unexpected config; With source = "chars" nothing is tokenized`},
		{`tokenizer "m" { path = "t.json" }`, `p.hcl:1:17: error: Missing required argument; The argument "source" is required`},
		{"tokenizer \"m\" { source = \"engine\" }\ntokenizer \"m\" { source = \"engine\" }", `p.hcl:2:11: error: Duplicate tokenizer; Model "m" already has a tokenizer block at p.hcl:1:1`},
		{`tokenizer "" { source = "engine" }`, `p.hcl:1:11: error: Invalid tokenizer model`},
		{"tokenizer \"m\" {\n  source = \"engine\"\n  model = \"x\"\n}", `p.hcl:3:3: error: Unsupported argument`},
	} {
		_, diags := Load("p.hcl", []byte(c.src), testCatalog(t))
		got := FormatDiagnostics(diags)
		if !diags.HasErrors() || !strings.Contains(strings.ReplaceAll(got, "\n", " "), c.want) {
			t.Errorf("%s:\ngot  %s\nwant %s", c.src, got, c.want)
		}
	}
}
