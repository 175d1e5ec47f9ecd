package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKVRelayErrors: kv-relay refuses, in words and with status 1 or 2,
// what it cannot relay: usage errors 2, files that cannot be relayed 1.
func TestKVRelayErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	worker := "worker \"w\" {\n  url = \"http://127.0.0.1:1\"\n  kv_events {\n    endpoint = \"tcp://127.0.0.1:5557\"\n  }\n}\n"
	cluster := "cluster {\n  nats    = \"nats://127.0.0.1:1\"\n  replica = \"r\"\n}\n"
	noCluster := write("nocluster.hcl", worker)
	noEvents := write("noevents.hcl", "worker \"w\" {\n  url = \"http://127.0.0.1:1\"\n}\n"+cluster)
	ok := write("ok.hcl", worker+cluster)
	// A plugin whose binary is not on this host, and a policy of its
	// types: kv-relay reads only the cluster and worker blocks, so it
	// neither starts the plugin nor resolves the policy.
	plugin := "plugin \"gone\" {\n  command = \"/nonexistent/switchyard-plugin\"\n}\n" +
		"policy \"p\" {\n  picker \"x\" {\n    type = \"gone-picker\"\n  }\n}\n" +
		"worker_selection {\n  aggregated = \"p\"\n}\n"
	withPlugin := write("plugin.hcl", plugin+worker+cluster)
	badWorker := write("badworker.hcl", "worker \"w\" {\n  kv_events {\n    endpoint = \"tcp://127.0.0.1:5557\"\n  }\n}\n"+cluster)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"kv-relay"}, 2, "--policy FILE is required"},
		{[]string{"kv-relay", "--policy", ok, "--ranks", "0"}, 2, "--ranks 0: want a whole number from 1 to 1024"},
		{[]string{"kv-relay", "--policy", ok, "--ranks", "x"}, 2, "--ranks x: want a whole number from 1 to 1024"},
		{[]string{"kv-relay", "--policy", noCluster}, 1, "has no cluster block"},
		{[]string{"kv-relay", "--policy", noEvents}, 1, "no worker has a kv_events block"},
		{[]string{"kv-relay", "--policy", ok, "--worker", "v"}, 1, "--worker v: no worker of that name has a kv_events block"},
		{[]string{"kv-relay", "--policy", withPlugin, "--worker", "v"}, 1, "--worker v: no worker of that name has a kv_events block"},
		{[]string{"kv-relay", "--policy", badWorker}, 1, "badworker.hcl:1:"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, errb.String(), c.code, c.want)
		}
	}
}
