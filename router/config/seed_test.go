package config

import (
	"testing"

	"github.com/switchyard-router/switchyard/router/policy"
)

func TestSeed(t *testing.T) {
	cat := testCatalog(t)
	src := `
router { seed = 7 }
policy "a" {
  picker "p" { type = "min-cost" }
  fallback = "min-cost"
}
policy "b" {
  picker "p" {
    type = "min-cost"
    seed = 42
  }
}
worker_selection {
  aggregated = "a"
  prefill    = "b"
}
`
	seedOf := func(p *policy.Policy) (int64, bool) {
		params := p.Picker.(*testPicker).params
		return params.Int(SeedParam, 0), params.Has(SeedParam)
	}
	load := func(src string) *PolicyFile {
		t.Helper()
		b, diags := Load("t.hcl", []byte(src), cat)
		if diags.HasErrors() {
			t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
		}
		return b
	}

	b := load(src)
	a, ok := seedOf(b.Policies["a"])
	if !ok {
		t.Fatal("policy a's picker got no seed")
	}
	fb, _ := seedOf(b.Policies["a"].Fallback)
	def, _ := seedOf(b.Policies["default"])
	if a == fb || a == def || fb == def {
		t.Errorf("derived seeds collide: %d %d %d", a, fb, def)
	}
	if got, _ := seedOf(b.Policies["b"]); got != 42 {
		t.Errorf("explicit seed = %d, want 42", got)
	}
	if again, _ := seedOf(load(src).Policies["a"]); again != a {
		t.Errorf("seed not reproducible: %d then %d", a, again)
	}

	b = load(`policy "a" {
  picker "p" { type = "min-cost" }
}
worker_selection { aggregated = "a" }`)
	if _, ok := seedOf(b.Policies["a"]); ok {
		t.Error("seed set without a router seed")
	}
}

// Two roles' instances of one policy draw independently, unless the block
// sets its own seed; the draws repeat across loads.
func TestSeedPerRole(t *testing.T) {
	src := `
router { seed = 7 }
policy "a" {
  picker "p" { type = "min-cost" }
}
policy "b" {
  picker "p" {
    type = "min-cost"
    seed = 42
  }
}
worker_selection {
  aggregated = "b"
  prefill    = "a"
  decode     = "a"
}
`
	seeds := func() map[string]int64 {
		b, diags := Load("t.hcl", []byte(src), testCatalog(t))
		if diags.HasErrors() {
			t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
		}
		out := make(map[string]int64)
		for _, role := range Roles {
			p := b.Roles[role]
			out[string(role)] = p.Picker.(*testPicker).params.Int(SeedParam, 0)
		}
		return out
	}
	got := seeds()
	if got["prefill"] == got["decode"] {
		t.Errorf("prefill and decode share seed %d", got["prefill"])
	}
	if got["aggregated"] != 42 {
		t.Errorf("explicit seed = %d, want 42", got["aggregated"])
	}
	if again := seeds(); again["prefill"] != got["prefill"] || again["decode"] != got["decode"] {
		t.Errorf("seeds not reproducible: %v then %v", got, again)
	}
}

// SeedOffset moves the router seed, and so every derived seed, and every
// seed a block sets itself, by the offset; offset 0 is the file's own.
func TestSeedOffset(t *testing.T) {
	cat := testCatalog(t)
	src := `
router { seed = 7 }
policy "a" {
  picker "p" { type = "min-cost" }
}
policy "b" {
  picker "p" {
    type = "min-cost"
    seed = 42
  }
}
worker_selection {
  aggregated = "a"
  prefill    = "b"
}
`
	seedOf := func(p *policy.Policy) int64 { return p.Picker.(*testPicker).params.Int(SeedParam, 0) }
	load := func(offset int64) *PolicyFile {
		t.Helper()
		b, diags := LoadWith("t.hcl", []byte(src), cat, Options{SeedOffset: offset})
		if diags.HasErrors() {
			t.Fatalf("errors:\n%s", FormatDiagnostics(diags))
		}
		return b
	}
	base, moved := load(0), load(3)
	if *base.Seed != 7 || *moved.Seed != 10 {
		t.Errorf("router seed %d with offset 0, %d with 3; want 7 and 10", *base.Seed, *moved.Seed)
	}
	if got := seedOf(moved.Policies["b"]); got != 45 {
		t.Errorf("own seed 42 with offset 3: %d, want 45", got)
	}
	if a0, a3 := seedOf(base.Policies["a"]), seedOf(moved.Policies["a"]); a0 == a3 {
		t.Errorf("derived seed %d did not move with the offset", a0)
	}
	if again := seedOf(load(3).Policies["a"]); again != seedOf(moved.Policies["a"]) {
		t.Errorf("offset seeds not reproducible")
	}
}
