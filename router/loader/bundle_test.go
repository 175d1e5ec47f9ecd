package loader

import (
	"context"
	"maps"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// accessorsHCL has a plugin that cannot start (under fallback), a
// prefill policy, a queue block, a request_classifier and two workers.
const accessorsHCL = `plugin "gone" {
  command          = "/nonexistent/switchyard-plugin"
  on_start_failure = "fallback"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  prefill = "rr"
}

queue {
  max_active_requests = 8
  class "interactive" {}
}

request_classifier {
  type = "header-priority"
}

worker "a" {
  url             = "http://127.0.0.1:1"
  models          = ["m"]
  total_kv_blocks = 10
}

worker "b" {
  url             = "http://127.0.0.1:2"
  role            = "prefill"
  models          = ["m"]
  total_kv_blocks = 20
}
`

// TestBundleAccessors: what a running router reads of a loaded bundle
// comes through its methods, and a NewBundle bundle answers them with
// its defaults.
func TestBundleAccessors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.hcl")
	writeFile(t, path, accessorsHCL)
	b, diags := LoadBundle(context.Background(), path, LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })

	if b.Filename() != path {
		t.Errorf("Filename %q, want %q", b.Filename(), path)
	}
	for role, want := range map[shared.Role]string{
		shared.RoleAggregated: config.DefaultPolicyName, shared.RolePrefill: "rr", shared.RoleDecode: config.DefaultPolicyName,
	} {
		if got := b.PolicyName(role); got != want {
			t.Errorf("PolicyName(%s) %q, want %q", role, got, want)
		}
	}
	ws := b.Workers()
	if len(ws) != 2 || ws[0].Name != "a" || ws[1].Name != "b" || ws[1].Role != shared.RolePrefill || ws[1].TotalKVBlocks != 20 {
		t.Fatalf("Workers %+v, want a then b (prefill, 20 blocks)", ws)
	}
	ws[0].Name = "changed"
	if b.Workers()[0].Name != "a" {
		t.Error("Workers returned the bundle's own slice")
	}
	q := b.Queue()
	if q.MaxActiveRequests != 8 || len(q.Classes) != 1 || q.Classes[0].Name != "interactive" {
		t.Errorf("Queue %+v, want the file's", q)
	}
	if f, err := b.Classifier(); err != nil || f == nil {
		t.Errorf("Classifier %v, %v, want header-priority's factory", f, err)
	}
	want := []PluginState{{Name: "gone", Started: false, Status: supervisor.StatusUnknown}}
	if got := b.Plugins(); !reflect.DeepEqual(got, want) {
		t.Errorf("Plugins %+v, want %+v", got, want)
	}
	f := b.PolicyFile()
	if f == nil || f.Filename != path || f.Classifier == nil || f.Classifier.Type != "header-priority" {
		t.Fatalf("PolicyFile %+v, want the loaded file", f)
	}
	roles := b.Roles()
	if len(roles) != 3 || roles[shared.RolePrefill] != f.Roles[shared.RolePrefill] || roles[shared.RolePrefill].Name != "rr" ||
		roles[shared.RoleAggregated] != f.Roles[shared.RoleAggregated] || roles[shared.RoleDecode] != f.Roles[shared.RoleDecode] {
		t.Errorf("Roles %v, want the file's instance of each role's policy", roles)
	}
	delete(roles, shared.RolePrefill)
	if b.Roles()[shared.RolePrefill] == nil {
		t.Error("Roles returned the bundle's own map")
	}
	names := b.RolePolicies()
	if len(names) != 3 || names[shared.RolePrefill] != "rr" || names[shared.RoleDecode] != config.DefaultPolicyName {
		t.Errorf("RolePolicies %v, want prefill rr, the others %s", names, config.DefaultPolicyName)
	}
	names[shared.RolePrefill] = "changed"
	if b.PolicyName(shared.RolePrefill) != "rr" {
		t.Error("RolePolicies returned the bundle's own map")
	}
	// Built-in components and the unavailable plugin's placeholders make no
	// plugin call: nothing is charged.
	if pols, cls := b.ReplayDecisionLatency(); pols != nil || cls != 0 {
		t.Errorf("ReplayDecisionLatency %v, %v; want none", pols, cls)
	}

	if b.BlockSize() != config.DefaultBlockSize || b.BlockSizeOverride() != 0 {
		t.Errorf("block size %d, override %d; want %d, none", b.BlockSize(), b.BlockSizeOverride(), config.DefaultBlockSize)
	}
	if Of(b.Bundle) != b {
		t.Error("Of(the router.Bundle) is not its loaded bundle")
	}
}

// TestLoadBundleDefaultPolicy: an empty path loads the built-in default
// policy under its name.
func TestLoadBundleDefaultPolicy(t *testing.T) {
	b, diags := LoadBundle(context.Background(), "", LoadOptions{})
	if diags.HasErrors() || b == nil {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if b.Filename() != config.DefaultPolicyName || b.PolicyName(shared.RoleAggregated) != config.DefaultPolicyName {
		t.Errorf("filename %q, aggregated policy %q, want both %q", b.Filename(), b.PolicyName(shared.RoleAggregated), config.DefaultPolicyName)
	}
	if b.BlockSize() != config.DefaultBlockSize {
		t.Errorf("block size %d, want %d", b.BlockSize(), config.DefaultBlockSize)
	}
}

// TestPluginsReportsARunningPlugin: Plugins reads the Host's state of a
// started plugin (up, breaker closed, its calls counted) and, once the
// bundle is closed, the plugin's stop.
func TestPluginsReportsARunningPlugin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.hcl")
	writeFile(t, path, pluginHCL("queue-depth"))
	b, diags := LoadBundle(context.Background(), path, LoadOptions{SimulatedTime: true})
	if diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	ps := b.Plugins()
	if len(ps) != 1 || ps[0].Name != "example" || !ps[0].Started || ps[0].Status != supervisor.StatusUp || ps[0].BreakerOpen {
		t.Fatalf("Plugins %+v, want example started, up, breaker closed", ps)
	}
	// The queue policy makes one plugin call (its scorer; the picker is
	// built in), charged the plugin's default replay_decision_latency.
	pols, cls := b.ReplayDecisionLatency()
	if want := map[string]time.Duration{"queue": config.DefaultReplayDecisionLatency}; !maps.Equal(pols, want) || cls != 0 {
		t.Errorf("ReplayDecisionLatency %v, %v; want %v, 0", pols, cls, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ps := b.Plugins(); ps[0].Status != supervisor.StatusStopped {
		t.Errorf("after Close: status %v, want stopped", ps[0].Status)
	}
}
