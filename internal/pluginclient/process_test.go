package pluginclient

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/shared"
)

// buildPlugin returns testdata/plugin, built once per test process
// (TestMain runs under testkit.Main).
func buildPlugin(t testing.TB) string {
	t.Helper()
	return testkit.Build(t, "./testdata/plugin")
}

// startPlugin starts the test plugin binary the way the host does and
// returns the dispensed client and go-plugin's client protocol.
func startPlugin(t testing.TB, args ...string) (*Client, plugin.ClientProtocol) {
	t.Helper()
	bin := buildPlugin(t)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  shared.Handshake(),
		VersionedPlugins: PluginSets(Options{}),
		Cmd:              exec.Command(bin, args...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn}),
	})
	t.Cleanup(client.Kill)
	proto, err := client.Client()
	if err != nil {
		t.Fatalf("starting the test plugin: %v", err)
	}
	if v := client.NegotiatedVersion(); v != shared.APIVersion {
		t.Fatalf("negotiated version %d, want %d", v, shared.APIVersion)
	}
	raw, err := proto.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	rc := raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })
	return rc, proto
}

func TestRealPluginProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a plugin binary")
	}
	rc, _ := startPlugin(t)
	ctx := context.Background()
	d, err := rc.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.PluginVersion != "0.0.1-test" || len(d.Types) != 2 || d.Types[0].Name != "test-cost" || d.Types[0].Params[0].Default != 16.0 {
		t.Fatalf("Describe = %+v", d)
	}
	_, diags, err := rc.Configure(ctx, ConfigureRequest{Info: shared.InstanceInfo{Name: "bad"}, Type: "test-cost", Params: shared.Params{"block_size": 0.0}})
	if err != nil || len(diags) != 1 || diags[0].Param != "block_size" {
		t.Fatalf("Configure with block_size 0: %v, %v; want one diagnostic for block_size", diags, err)
	}
	if in := configure(t, rc, "s", "test-cost", nil); in != shared.InputActiveRequests|shared.InputLoad|shared.InputCache {
		t.Fatalf("inputs = %v", in)
	}
	configure(t, rc, "p", "test-lowest", nil)
	c := benchCandidates()
	got, err := rc.Decide(ctx, &Task{Request: benchRequest(), Candidates: c, Stages: []Stage{{Instance: "s", Weight: 1}, {Instance: "p"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := TaskResult{Picked: -1, Costs: make([]float64, c.Len())}
	for i := range c.IDs {
		want.Costs[i] = float64(c.ActiveRequests[i]) + float64(c.Load[i].ActiveDecodeBlocks)/16 - float64(c.OverlapBlocks[i])
		if want.Picked < 0 || want.Costs[i] < want.Costs[want.Picked] {
			want.Picked = i
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Decide (-want +got):\n%s", diff)
	}
}
