package config

import (
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/builtin"
)

// blockCluster is the cluster block's name.
const blockCluster = "cluster"

// Defaults of the cluster block (docs/replicas.md).
const (
	// DefaultClusterName names the cluster when the block sets no name:
	// replicas share what they know only within one cluster name.
	DefaultClusterName = "switchyard"
	// DefaultBookingTTL is how long a replica that stopped sending
	// heartbeats keeps its bookings on the others: three times the 1 s
	// heartbeat interval plus a margin for a slow NATS server, so a
	// replica that dies has its in-flight requests counted for at most
	// about 10 s.
	DefaultBookingTTL = 10 * time.Second
	// DefaultHeartbeat is how often a replica says it is alive.
	DefaultHeartbeat = time.Second
	// DefaultSnapshotInterval is how often the replica holding the
	// snapshot lease writes the prefix index to the object store: a
	// replica that (re)starts loads it and replays the deltas from its
	// sequence, so the deltas stream keeps twice this. 30 s keeps a
	// snapshot of some MB a small load on NATS while the replay after it
	// stays short (seconds of deltas).
	DefaultSnapshotInterval = 30 * time.Second
	// DefaultWarmTimeout bounds how long a (re)starting replica stays
	// unready while it loads the snapshot and catches up with the
	// streams: past it, it is ready on what it has (NATS may be away, and
	// a partition never stops routing).
	DefaultWarmTimeout = 30 * time.Second
	// DefaultSharedSessionTTL is how long a shared session binding lives
	// in the cluster's sessions bucket after its last send: the
	// session-affinity classifier's default ttl (builtin.DefaultSessionTTL).
	DefaultSharedSessionTTL = builtin.DefaultSessionTTL
)

// Cluster is the policy file's cluster block: router replicas that share
// what they know over NATS (router/cluster, docs/replicas.md). Without
// the block nothing is shared.
//
//	cluster {
//	  nats        = "nats://nats.llm.svc:4222"   # required; a comma list of servers is accepted
//	  replica     = "router-0"                    # default: the host name
//	  name        = "switchyard"                  # replicas share within one name
//	  booking_ttl = "10s"                         # a silent replica's bookings expire after it
//	  heartbeat   = "1s"
//	  snapshot_interval = "30s"                   # how often the prefix index is written for warm starts
//	  warm_timeout      = "30s"                   # most time a starting replica waits to catch up
//	  session_ttl = "10m"                         # shared session bindings expire after it
//	}
type Cluster struct {
	// NATS is the NATS server URL, or several separated by commas.
	NATS string
	// Replica names this replica, unique in the cluster: [A-Za-z0-9_-],
	// at most 64 characters.
	Replica string
	// Name is the cluster's name (same rule as Replica).
	Name string
	// BookingTTL and Heartbeat: see DefaultBookingTTL, DefaultHeartbeat.
	BookingTTL time.Duration
	Heartbeat  time.Duration
	// SnapshotInterval and WarmTimeout: see DefaultSnapshotInterval,
	// DefaultWarmTimeout.
	SnapshotInterval time.Duration
	WarmTimeout      time.Duration
	// SessionTTL is how long a shared session-affinity binding lives in
	// the sessions bucket after its last send (DefaultSharedSessionTTL);
	// set it to the classifier's ttl when that is not the default.
	SessionTTL time.Duration
	// Range is the block's definition.
	Range hcl.Range
}

var clusterSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "nats", Required: true},
		{Name: "replica"},
		{Name: "name"},
		{Name: "booking_ttl"},
		{Name: "heartbeat"},
		{Name: "snapshot_interval"},
		{Name: "warm_timeout"},
		{Name: "session_ttl"},
	},
}

// ClusterToken reports whether s names a replica or a cluster: it goes
// into NATS subjects, stream and bucket names, so only [A-Za-z0-9_-], 1 to
// 64 characters.
func ClusterToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// clusterBlock decodes the cluster block into the PolicyFile.
func (l *loader) clusterBlock(blk *hcl.Block) {
	c := &Cluster{Name: DefaultClusterName, BookingTTL: DefaultBookingTTL, Heartbeat: DefaultHeartbeat,
		SnapshotInterval: DefaultSnapshotInterval, WarmTimeout: DefaultWarmTimeout, SessionTTL: DefaultSharedSessionTTL, Range: blk.DefRange}
	content, diags := blk.Body.Content(clusterSchema)
	l.diags = append(l.diags, diags...)
	if attr, ok := content.Attributes["nats"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			for _, srv := range strings.Split(s, ",") {
				u, err := url.Parse(strings.TrimSpace(srv))
				if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Hostname() == "" || !validPort(u.Port()) {
					l.attrErrorf(attr, "Invalid nats", "nats must be a NATS server URL such as \"nats://127.0.0.1:4222\" (a host, an optional port from 1 to 65535; several separated by commas), got %q.", s)
					break
				}
			}
			c.NATS = s
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"replica", &c.Replica}, {"name", &c.Name}} {
		if attr, ok := content.Attributes[f.name]; ok {
			if s, ok := l.stringAttr(attr); ok {
				if !ClusterToken(s) {
					l.attrErrorf(attr, "Invalid "+f.name, "%s must be 1 to 64 letters, digits, '_' or '-' (it goes into NATS subjects), got %q.", f.name, s)
				} else {
					*f.dst = s
				}
			}
		}
	}
	if c.Replica == "" {
		// The host name: a Kubernetes pod's name, unique among replicas.
		host, err := os.Hostname()
		host = strings.Map(func(r rune) rune {
			if ClusterToken(string(r)) {
				return r
			}
			return '-'
		}, host)
		if err != nil || !ClusterToken(host) {
			l.errorf(blk.DefRange, "No replica name", "Set replica: the host name %q cannot name a replica.", host)
		}
		c.Replica = host
	}
	for _, f := range []struct {
		name    string
		dst     *time.Duration
		lo, hi  time.Duration
		example string
	}{{"booking_ttl", &c.BookingTTL, time.Second, time.Hour, "10s"}, {"heartbeat", &c.Heartbeat, 10 * time.Millisecond, time.Minute, "1s"},
		{"snapshot_interval", &c.SnapshotInterval, 100 * time.Millisecond, time.Hour, "30s"},
		{"warm_timeout", &c.WarmTimeout, 0, time.Hour, "30s"},
		{"session_ttl", &c.SessionTTL, time.Second, 24 * time.Hour, "10m"}} {
		if attr, ok := content.Attributes[f.name]; ok {
			if d, ok := l.durationAttr(attr); ok {
				if d < f.lo || d > f.hi {
					l.attrErrorf(attr, "Invalid "+f.name, "%s must be a duration from %s to %s such as %q, got %q.", f.name, f.lo, f.hi, f.example, d.String())
				} else {
					*f.dst = d
				}
			}
		}
	}
	if c.Heartbeat*2 > c.BookingTTL {
		at := blk.DefRange
		if attr, ok := content.Attributes["booking_ttl"]; ok {
			at = attr.Expr.Range()
		} else if attr, ok := content.Attributes["heartbeat"]; ok {
			at = attr.Expr.Range()
		}
		l.errorf(at, "booking_ttl too short", "booking_ttl (%s) must be at least twice the heartbeat (%s): a replica missing one heartbeat must not lose its bookings.", c.BookingTTL, c.Heartbeat)
	}
	l.file.Cluster = c
}
