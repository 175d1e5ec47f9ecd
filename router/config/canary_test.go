package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// TestCanaryBlock: a canary block with every attribute, and one with the
// defaults; the candidate and its fallback get instances of their own
// for each role.
func TestCanaryBlock(t *testing.T) {
	src := `
policy "live" {
  picker "p" { type = "round-robin" }
  canary {
    policy = "trial"
    weight = 0.1
    key    = "request"
    rollback {
      max_fallback_share = 0.2
      max_ttft_p90       = "1500ms"
      window             = "30s"
      min_requests       = 10
    }
  }
}
policy "trial" {
  picker "p" { type = "least-loaded" }
  fallback = "safe"
}
policy "safe" {
  picker "p" { type = "round-robin" }
}
policy "other" {
  picker "p" { type = "round-robin" }
  canary { policy = "trial2" }
}
policy "trial2" {
  picker "p" { type = "round-robin" }
}
worker_selection {
  prefill = "live"
  decode  = "other"
}`
	b, diags := Load("t.hcl", []byte(src), testCatalog(t))
	if diags.HasErrors() || len(diags) != 0 {
		t.Fatal(FormatDiagnostics(diags))
	}
	pre, dec := b.Roles[shared.RolePrefill], b.Roles[shared.RoleDecode]
	want := policy.CanaryRollback{MaxFallbackShare: 0.2, MaxTTFTP90: 1500 * time.Millisecond, Window: 30 * time.Second, MinRequests: 10}
	c := pre.Canary
	if c == nil || c.Policy.Name != "trial" || c.Weight != 0.1 || c.Key != policy.CanaryKeyRequest || c.Rollback != want {
		t.Fatalf("prefill canary %+v", c)
	}
	if c.Policy.Fallback == nil || c.Policy.Fallback.Name != "safe" || c.Policy.Picker == pre.Picker {
		t.Fatalf("candidate %+v", c.Policy)
	}
	d := dec.Canary
	if d == nil || d.Policy.Name != "trial2" || d.Weight != DefaultCanaryWeight || d.Key != policy.CanaryKeySession ||
		d.Rollback != DefaultCanaryRollback() {
		t.Fatalf("decode canary %+v", d)
	}
	for _, decl := range b.Decls {
		switch decl.Name {
		case "live":
			if decl.Canary != "trial" {
				t.Errorf("live decl canary %q", decl.Canary)
			}
		case "trial", "safe":
			if !decl.Used || !slices.Equal(decl.Roles, []shared.Role{shared.RolePrefill}) {
				t.Errorf("%s decl %+v", decl.Name, decl)
			}
			if decl.Name == "trial" && decl.Instances[shared.RolePrefill] != c.Policy {
				t.Error("the canary is not trial's prefill instance")
			}
		}
	}
}

func TestCanaryDiagnostics(t *testing.T) {
	cases := []struct {
		name           string
		src            string
		errors, detail []string
	}{
		{name: "unknown candidate", src: `
policy "live" {
  picker "p" { type = "round-robin" }
  canary { policy = "nope" }
}
worker_selection { aggregated = "live" }`,
			errors: []string{"t.hcl:4:21: Unknown canary policy"},
			detail: []string{`The canary of policy "live" is "nope", which is not a policy. Declared policies: "default", "live".`}},
		{name: "bad values", src: `
policy "live" {
  picker "p" { type = "round-robin" }
  canary {
    policy = "trial"
    weight = 1.5
    key    = "user"
    rollback {
      max_fallback_share = -0.1
      max_ttft_p90       = "-1s"
      window             = "10ms"
      min_requests       = 0
    }
  }
}
policy "trial" {
  picker "p" { type = "round-robin" }
}
worker_selection { aggregated = "live" }`,
			errors: []string{
				"t.hcl:6:14: Invalid canary weight",
				"t.hcl:7:14: Invalid canary key",
				"t.hcl:9:28: Invalid max_fallback_share",
				"t.hcl:10:28: Invalid max_ttft_p90",
				"t.hcl:11:28: Invalid window",
				"t.hcl:12:28: Invalid min_requests",
			},
			detail: []string{"between 0 (none) and 1 (all), got 1.5", `key must be "session"`}},
		{name: "missing policy and two canaries", src: `
policy "live" {
  picker "p" { type = "round-robin" }
  canary { weight = 0.1 }
  canary { policy = "live" }
}
worker_selection { aggregated = "live" }`,
			errors: []string{"t.hcl:4:12: Missing required argument", "t.hcl:5:3: Duplicate canary"}},
		{name: "itself", src: `
policy "live" {
  picker "p" { type = "round-robin" }
  canary { policy = "live" }
}
worker_selection { aggregated = "live" }`,
			errors: []string{"t.hcl:4:21: Policy canaries itself"}},
		{name: "chain, fallback and shadow", src: `
policy "a" {
  picker "p" { type = "round-robin" }
  canary { policy = "b" }
}
policy "b" {
  picker "p" { type = "round-robin" }
  canary { policy = "e" }
}
policy "c" {
  picker "p" { type = "round-robin" }
  fallback = "e"
  canary { policy = "e" }
}
policy "d" {
  picker "p" { type = "round-robin" }
  shadow = "e"
  canary { policy = "e" }
}
policy "e" {
  picker "p" { type = "round-robin" }
}
worker_selection {
  aggregated = "a"
  prefill    = "c"
  decode     = "d"
}`,
			errors: []string{"t.hcl:4:21: Canary chain", "t.hcl:13:21: Canary in the fallback chain", "t.hcl:18:21: Canary is the shadow"}},
	}
	cat := testCatalog(t)
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			b, diags := Load("t.hcl", []byte(tt.src), cat)
			out := FormatDiagnostics(diags)
			if diff := cmp.Diff(tt.errors, short(diags, hcl.DiagError)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\n%s", diff, out)
			}
			if b != nil {
				t.Error("a bundle despite errors")
			}
			for _, want := range tt.detail {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
