package config

import (
	"net/url"
	"os"
	"slices"
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
//	  credentials = "nats.creds"                  # or nkey, token, token_file (at most one)
//	  tls {
//	    ca_file = "nats-ca.pem"                   # and cert_file, key_file for a client certificate
//	  }
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
	// Credentials, NKey, Token and TokenFile authenticate to NATS (at
	// most one of them, and none with a user in NATS's URLs): a .creds
	// file (a user JWT and its nkey seed, nats.UserCredentials), an nkey
	// seed file (nats.NkeyOptionFromSeed), a token, or a file holding the
	// token (its surrounding white space dropped). Paths are resolved
	// against the policy file's directory and read when the replica
	// connects; "" is none.
	Credentials string
	NKey        string
	Token       string
	TokenFile   string
	// TLS, when not nil, is the tls block: the CA that signs the NATS
	// servers' certificates and this replica's client certificate.
	TLS *ClusterTLS
	// Range is the block's definition.
	Range hcl.Range
}

// ClusterTLS is the cluster block's tls block: TLS to NATS with a CA of
// its own and, when the servers verify clients, a client certificate.
// Paths are resolved against the policy file's directory; "" is none
// (the system's roots; no client certificate).
type ClusterTLS struct {
	// CAFile is a PEM file of the CA certificates that sign the NATS
	// servers' certificates (nats.RootCAs).
	CAFile string
	// CertFile and KeyFile are this replica's PEM certificate and key
	// (nats.ClientCert); both or neither.
	CertFile string
	KeyFile  string
}

// RedactNATS returns urls (the nats attribute: URLs separated by commas)
// for logs and errors: a password is replaced by "xxxxx", and so is a
// user without a password (NATS reads it as a token). A URL that does not
// parse is replaced whole.
func RedactNATS(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			parts[i] = "(a URL that does not parse)"
		case u.User == nil:
			parts[i] = u.String()
		default:
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
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
		{Name: "credentials"},
		{Name: "nkey"},
		{Name: "token"},
		{Name: "token_file"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "tls"}},
}

var clusterTLSSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "ca_file"}, {Name: "cert_file"}, {Name: "key_file"}},
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
	urlUser := false // a user (or token) in a URL
	if attr, ok := content.Attributes["nats"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			for _, srv := range strings.Split(s, ",") {
				u, err := url.Parse(strings.TrimSpace(srv))
				if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Hostname() == "" || !validPort(u.Port()) {
					l.attrErrorf(attr, "Invalid nats", "nats must be a NATS server URL such as \"nats://127.0.0.1:4222\" (a host, an optional port from 1 to 65535; several separated by commas), got %q.", RedactNATS(s))
					break
				}
				urlUser = urlUser || u.User != nil
			}
			c.NATS = s
		}
	}
	l.clusterAuth(c, content, urlUser)
	for _, b := range content.Blocks {
		if c.TLS != nil {
			l.errorf(b.DefRange, "Duplicate tls block", "The cluster block has at most one tls block.")
			continue
		}
		c.TLS = l.clusterTLS(b)
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

// clusterAuth decodes the NATS authentication attributes into c: at most
// one of credentials, nkey, token and token_file, and none with a user
// in the nats URLs (urlUser).
func (l *loader) clusterAuth(c *Cluster, content *hcl.BodyContent, urlUser bool) {
	type authAttr struct {
		name string
		dst  *string
		path bool
		attr *hcl.Attribute
	}
	var present []authAttr
	for _, f := range []authAttr{{"credentials", &c.Credentials, true, nil}, {"nkey", &c.NKey, true, nil}, {"token", &c.Token, false, nil}, {"token_file", &c.TokenFile, true, nil}} {
		if f.attr = content.Attributes[f.name]; f.attr != nil {
			present = append(present, f)
		}
	}
	// The second in the file is the one in conflict.
	slices.SortFunc(present, func(a, b authAttr) int { return a.attr.Range.Start.Byte - b.attr.Range.Start.Byte })
	var first *hcl.Attribute
	for _, f := range present {
		attr := f.attr
		s, ok := l.stringAttr(attr)
		if !ok {
			continue
		}
		switch {
		case strings.TrimSpace(s) == "" || strings.ContainsRune(s, 0):
			if f.path {
				l.attrErrorf(attr, "Invalid "+f.name, "%s must name a file, such as \"/etc/switchyard/nats.%s\".", f.name, map[string]string{"credentials": "creds", "nkey": "nk", "token_file": "token"}[f.name])
			} else {
				l.attrErrorf(attr, "Invalid token", "token must not be empty (prefer token_file: the policy file then holds no secret).")
			}
			continue
		case first != nil:
			l.attrErrorf(attr, "Conflicting NATS authentication", "%s and %s both authenticate to NATS: set one of credentials, nkey, token and token_file.", first.Name, f.name)
			continue
		case urlUser:
			l.attrErrorf(attr, "Conflicting NATS authentication", "%s and the user in the nats URL both authenticate to NATS: set one of them.", f.name)
			continue
		}
		first = attr
		if f.path {
			s = l.relPath(s)
		}
		*f.dst = s
	}
}

// clusterTLS decodes the cluster block's tls block: ca_file, or
// cert_file with key_file, or all three.
func (l *loader) clusterTLS(blk *hcl.Block) *ClusterTLS {
	t := &ClusterTLS{}
	errsBefore := len(l.diags.Errs())
	content, diags := blk.Body.Content(clusterTLSSchema)
	l.diags = append(l.diags, diags...)
	for _, f := range []struct {
		name string
		dst  *string
	}{{"ca_file", &t.CAFile}, {"cert_file", &t.CertFile}, {"key_file", &t.KeyFile}} {
		attr, ok := content.Attributes[f.name]
		if !ok {
			continue
		}
		if s, ok := l.stringAttr(attr); ok {
			if strings.TrimSpace(s) == "" || strings.ContainsRune(s, 0) {
				l.attrErrorf(attr, "Invalid "+f.name, "%s must name a PEM file, such as \"/etc/switchyard/nats-%s.pem\".", f.name, strings.TrimSuffix(f.name, "_file"))
				continue
			}
			*f.dst = l.relPath(s)
		}
	}
	switch {
	case len(l.diags.Errs()) > errsBefore:
	case (t.CertFile == "") != (t.KeyFile == ""):
		l.errorf(blk.DefRange, "Incomplete tls block", "cert_file and key_file go together: the client certificate and its key.")
	case t.CAFile == "" && t.CertFile == "" && t.KeyFile == "" && len(content.Attributes) == 0:
		l.errorf(blk.DefRange, "Empty tls block", "The tls block needs ca_file (the CA of the NATS servers' certificates), or cert_file and key_file (this replica's certificate), or both.")
	}
	return t
}
