package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/hcl/v2"
)

func TestClusterBlock(t *testing.T) {
	load := func(src string) (*PolicyFile, string) {
		b, diags := Load("c.hcl", []byte(src), testCatalog(t))
		return b, FormatDiagnostics(diags)
	}
	if b, diags := load(""); b == nil || b.Cluster != nil {
		t.Fatalf("no cluster block: %+v %s", b, diags)
	}
	b, diags := load("cluster {\n  nats = \"nats://10.0.0.1:4222,nats://10.0.0.2:4222\"\n  replica = \"router-0\"\n  name = \"llm\"\n  booking_ttl = \"30s\"\n  heartbeat = \"500ms\"\n  snapshot_interval = \"5s\"\n  warm_timeout = \"0s\"\n  session_ttl = \"30m\"\n}\n")
	if b == nil || diags != "" {
		t.Fatalf("diagnostics:\n%s", diags)
	}
	want := &Cluster{NATS: "nats://10.0.0.1:4222,nats://10.0.0.2:4222", Replica: "router-0", Name: "llm", BookingTTL: 30 * time.Second, Heartbeat: 500 * time.Millisecond,
		SnapshotInterval: 5 * time.Second, SessionTTL: 30 * time.Minute}
	if diff := cmp.Diff(want, b.Cluster, cmpopts.IgnoreTypes(hcl.Range{})); diff != "" {
		t.Fatalf("cluster (-want +got):\n%s", diff)
	}
	// Defaults: the host name, the default name, TTL and heartbeat.
	b, diags = load("cluster {\n  nats = \"nats://127.0.0.1:4222\"\n}\n")
	host, _ := os.Hostname()
	if b == nil || diags != "" || b.Cluster.Name != DefaultClusterName || b.Cluster.BookingTTL != DefaultBookingTTL ||
		b.Cluster.Heartbeat != DefaultHeartbeat || b.Cluster.SnapshotInterval != DefaultSnapshotInterval ||
		b.Cluster.WarmTimeout != DefaultWarmTimeout || b.Cluster.SessionTTL != 10*time.Minute || (ClusterToken(host) && b.Cluster.Replica != host) {
		t.Fatalf("defaults: %+v\n%s", b.Cluster, diags)
	}
	for _, tt := range []struct{ src, want string }{
		{"cluster {\n}\n", "c.hcl:1:9: error: Missing required argument"},
		{"cluster {\n  nats = \"http://x:4222\"\n}\n", "c.hcl:2:10: error: Invalid nats"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  replica = \"a.b\"\n}\n", "c.hcl:3:13: error: Invalid replica"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  name = \"\"\n}\n", "c.hcl:3:10: error: Invalid name"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  booking_ttl = \"100ms\"\n}\n", "c.hcl:3:17: error: Invalid booking_ttl"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  booking_ttl = \"2s\"\n  heartbeat = \"1500ms\"\n}\n", "c.hcl:3:17: error: booking_ttl too short"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  heartbeat = \"6s\"\n}\n", "c.hcl:3:15: error: booking_ttl too short"},
		{"cluster {\n  nats = \"nats://x:99999\"\n}\n", "c.hcl:2:10: error: Invalid nats"},
		{"cluster {\n  nats = \"nats://x:0,nats://y:4222\"\n}\n", "c.hcl:2:10: error: Invalid nats"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  snapshot_interval = \"1ms\"\n}\n", "c.hcl:3:23: error: Invalid snapshot_interval"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  warm_timeout = \"-1s\"\n}\n", "error: Invalid warm_timeout"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  session_ttl = \"0s\"\n}\n", "c.hcl:3:17: error: Invalid session_ttl"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  port = 1\n}\n", "c.hcl:3:3: error: Unsupported argument"},
		{"cluster {\n  nats = \"nats://x:4222\"\n}\ncluster {\n  nats = \"nats://x:4222\"\n}\n", "c.hcl:4:1: error: Duplicate cluster block"},
	} {
		if _, diags := load(tt.src); !strings.Contains(diags, tt.want) {
			t.Errorf("%q:\n%s\nwant %q", tt.src, diags, tt.want)
		}
	}
}
