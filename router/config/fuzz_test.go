package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard-router/switchyard/router/catalog"
)

// FuzzLoad feeds random bytes to Load: it may report errors, but must never
// panic, must report every problem at a position, and must return a bundle
// exactly when there is no error.
//
//	go test -fuzz=FuzzLoad -fuzztime=60s ./router/config/
func FuzzLoad(f *testing.F) {
	files, err := filepath.Glob("testdata/*.hcl")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(src)
	}
	for _, c := range diagCases {
		f.Add([]byte(c.src))
	}
	for _, c := range hostCases {
		f.Add([]byte(c.src))
	}
	f.Add([]byte(pdSrc))
	f.Add([]byte(`plugin "gone" {
  command          = "bin/gone"
  on_start_failure = "fallback"
}
policy "p" {
  filter "f" { type = "gone-filter" }
  picker "p" { type = "lowest-cost" }
  fallback = "gone-picker"
}
worker_selection { decode = "p" }`))
	cat := testCatalog(f)
	f.Fuzz(func(t *testing.T, src []byte) {
		// Without a plugin host, and with one providing plugin "pd"'s
		// types and failing plugin "gone" (which may fall back).
		checkLoad(t, src, cat, nil)
		h := pdHost()
		h.fail["gone"] = errors.New("gone")
		checkLoad(t, src, cat, h)
	})
}

// checkLoad loads src and checks the invariants FuzzLoad promises.
func checkLoad(t *testing.T, src []byte, cat *catalog.Catalog, host PluginHost) {
	b, diags := LoadWith("fuzz.hcl", src, cat, Options{Plugins: host})
	_ = FormatDiagnostics(diags)
	if diags.HasErrors() != (b == nil) {
		t.Fatalf("bundle %v with errors %v:\n%s", b != nil, diags.HasErrors(), FormatDiagnostics(diags))
	}
	for _, d := range diags {
		if d.Subject == nil {
			t.Errorf("diagnostic without subject: %s", d.Error())
		}
	}
	if b == nil {
		return
	}
	for _, r := range Roles {
		if b.Roles[r] == nil {
			t.Errorf("role %s has no policy", r)
		}
	}
	checkAcyclic(t, b)
}

// checkAcyclic fails when a fallback chain of b loops.
func checkAcyclic(t *testing.T, b *PolicyFile) {
	for name, p := range b.Policies {
		seen := 0
		for f := p; f != nil; f = f.Fallback {
			if seen++; seen > len(b.Policies)+len(Roles)+2 {
				t.Fatalf("fallback chain of %q loops", name)
			}
		}
	}
}
