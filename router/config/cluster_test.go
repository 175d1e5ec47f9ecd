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
	// Credentials and TLS: paths relative to the file's directory.
	b, diags = load("cluster {\n  nats = \"tls://127.0.0.1:4222\"\n  credentials = \"nats.creds\"\n  tls {\n    ca_file = \"/etc/ca.pem\"\n    cert_file = \"c.pem\"\n    key_file = \"k.pem\"\n  }\n}\n")
	if b == nil || diags != "" {
		t.Fatalf("diagnostics:\n%s", diags)
	}
	if c := b.Cluster; c.Credentials != "nats.creds" || c.TLS == nil || *c.TLS != (ClusterTLS{CAFile: "/etc/ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}) {
		t.Fatalf("credentials %q, tls %+v", c.Credentials, c.TLS)
	}
	for _, src := range []string{"nkey = \"u.nk\"", "token = \"s3cret\"", "token_file = \"tok\""} {
		if b, diags := load("cluster {\n  nats = \"nats://x:4222\"\n  " + src + "\n}\n"); b == nil || diags != "" {
			t.Errorf("%s:\n%s", src, diags)
		}
	}
	for _, tt := range []struct{ src, want string }{
		{"cluster {\n}\n", "c.hcl:1:9: error: Missing required argument"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  token = \"a\"\n  nkey = \"b\"\n}\n", "c.hcl:4:10: error: Conflicting NATS authentication; token and nkey both"},
		{"cluster {\n  nats = \"nats://u:p@x:4222\"\n  token_file = \"t\"\n}\n", "c.hcl:3:16: error: Conflicting NATS authentication"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  credentials = \"\"\n}\n", "c.hcl:3:17: error: Invalid credentials"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  tls {\n  }\n}\n", "c.hcl:3:3: error: Empty tls block"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  tls {\n    cert_file = \"c.pem\"\n  }\n}\n", "c.hcl:3:3: error: Incomplete tls block"},
		{"cluster {\n  nats = \"nats://x:4222\"\n  tls {\n    ca_file = \"a\"\n  }\n  tls {\n    ca_file = \"a\"\n  }\n}\n", "c.hcl:6:3: error: Duplicate tls block"},
		{"cluster {\n  nats = \"http://u:s3cret@x:4222\"\n}\n", "http://u:xxxxx@x:4222"},
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

// TestRedactNATS: passwords and tokens in NATS URLs are never shown.
func TestRedactNATS(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                          "nats://127.0.0.1:4222",
		"nats://router:s3cret@a:4222,tls://tok3n@b:4222": "nats://router:xxxxx@a:4222,tls://xxxxx@b:4222",
		"nats://a:4222, nats://u:p@b":                    "nats://a:4222,nats://u:xxxxx@b",
		"nats://u:p@[::1:4222":                           "(a URL that does not parse)",
	} {
		if got := RedactNATS(in); got != want {
			t.Errorf("RedactNATS(%q) = %q, want %q", in, got, want)
		}
	}
}
