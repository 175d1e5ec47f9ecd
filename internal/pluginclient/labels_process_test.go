package pluginclient

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/shared"
)

// startLabelsPlugin starts testdata/labels as the host does.
func startLabelsPlugin(t testing.TB) *Client {
	t.Helper()
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  shared.Handshake(),
		VersionedPlugins: PluginSets(Options{}),
		Cmd:              exec.Command(testkit.Build(t, "./testdata/labels")),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn}),
	})
	t.Cleanup(client.Kill)
	proto, err := client.Client()
	if err != nil {
		t.Fatalf("starting the labels plugin: %v", err)
	}
	raw, err := proto.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	rc := raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// labelledCandidates are rows for workers named names (ids WorkerIDOf,
// sorted), each labelled zone=ZONES[i] plus the router-set role key.
func labelledCandidates(names, zones []string) *shared.Candidates {
	type row struct {
		name, zone string
	}
	rows := make([]row, len(names))
	for i := range names {
		rows[i] = row{names[i], zones[i]}
	}
	slices.SortFunc(rows, func(a, b row) int {
		if shared.WorkerIDOf(a.name) < shared.WorkerIDOf(b.name) {
			return -1
		}
		return 1
	})
	c := &shared.Candidates{}
	for _, r := range rows {
		c.IDs = append(c.IDs, shared.WorkerIDOf(r.name))
		c.Names = append(c.Names, r.name)
		c.Labels = append(c.Labels, shared.WorkerLabels(map[string]string{"zone": r.zone}, shared.RoleAggregated, nil, false, 0))
	}
	return c
}

// TestLabelsReachARealPlugin: a plugin process that declares LABELS and a
// list(string) parameter gets its list as configured, and each row's name
// (whose WorkerIDOf is the row's id) and labels, and routes by them.
func TestLabelsReachARealPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a plugin binary")
	}
	rc := startLabelsPlugin(t)
	ctx := context.Background()
	d, err := rc.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Types) != 1 || d.Types[0].Inputs != shared.InputLabels || d.Types[0].Params[0].Type != shared.StringList ||
		!slices.Equal(d.Types[0].Params[0].Default.([]string), []string{}) {
		t.Fatalf("Describe = %+v", d.Types)
	}
	if in := configure(t, rc, "by-name", "prefer-name", shared.Params{"prefer": []string{"gpu-9", "gpu-2", "gpu-1"}}); in != shared.InputLabels {
		t.Fatalf("inputs = %v, want LABELS", in)
	}
	configure(t, rc, "by-zone", "prefer-name", shared.Params{"prefer": []string{}, "label": "zone=us"})
	_, diags, err := rc.Configure(ctx, ConfigureRequest{Info: shared.InstanceInfo{Name: "bad"}, Type: "prefer-name", Params: shared.Params{"prefer": "gpu-1"}})
	if err != nil || len(diags) != 1 || diags[0].Param != "prefer" || diags[0].Summary != `parameter "prefer": got a string value, want list(string)` {
		t.Fatalf("a string for a list(string): %+v, %v", diags, err)
	}
	c := labelledCandidates([]string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, []string{"eu", "eu", "eu", "us"})
	pick := func(inst string) string {
		t.Helper()
		task := &Task{Request: benchRequest(), Candidates: c, Stages: []Stage{{Instance: inst}}}
		res, err := rc.Decide(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckResult(task, res); err != nil {
			t.Fatal(err)
		}
		return c.Names[res.Picked]
	}
	if got := pick("by-name"); got != "gpu-2" {
		t.Errorf("prefer [gpu-9 gpu-2 gpu-1] picked %s, want gpu-2", got)
	}
	if got := pick("by-zone"); got != "gpu-3" {
		t.Errorf("label zone=us picked %s, want gpu-3", got)
	}
	// A row whose id is not its name's: the plugin's own check fails the
	// task, so the contract it relies on is what travelled.
	c.IDs[0]--
	if _, err := rc.Decide(ctx, &Task{Request: benchRequest(), Candidates: c, Stages: []Stage{{Instance: "by-name"}}}); err == nil {
		t.Error("a row whose id is not WorkerIDOf its name was accepted")
	}
}
