package config

import (
	"os"
	"path/filepath"
	"testing"
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
	cat := testCatalog(f)
	f.Fuzz(func(t *testing.T, src []byte) {
		b, diags := Load("fuzz.hcl", src, cat)
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
	})
}

// checkAcyclic fails when a fallback chain of b loops.
func checkAcyclic(t *testing.T, b *Bundle) {
	for name, p := range b.Policies {
		seen := 0
		for f := p; f != nil; f = f.Fallback {
			if seen++; seen > len(b.Policies)+len(Roles)+2 {
				t.Fatalf("fallback chain of %q loops", name)
			}
		}
	}
}
