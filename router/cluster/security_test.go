package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// logBuffer is a logger writing into a buffer the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: writerFunc(func(p []byte) (int, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.buf.Write(p)
	})})
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestForgedBookingsBounded: anyone who can publish on the deltas
// subjects can claim bookings under a made-up replica name. A forger
// books every worker to its capacity (40 each, 120 in all) and keeps
// heartbeating: the others' bookings count on a worker only up to its
// capacity less this replica's share, so this replica still routes at
// once rather than queueing every request until the forger falls silent;
// the bookings past the bound are dropped and counted.
func TestForgedBookingsBounded(t *testing.T) {
	_, url := startNATS(t, 0)
	const capacity = 40
	a := startNodeOpts(t, url, "a", 3, 1, nodeOpts{capacity: capacity})
	b := startNodeOpts(t, url, "b", 3, 101, nodeOpts{capacity: capacity})
	joined(t, a, b)
	nc, _ := client(t, url)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = nc.Publish("switchyard.test.hb.evil", nil)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	msg := []byte{wireVersion}
	for w := range 3 {
		for i := range capacity {
			msg = appendRecord(msg, &Record{Kind: KindBooked, ID: fmt.Sprintf("f%d-%d", w, i), Worker: fmt.Sprintf("w%d", w),
				Role: shared.RoleAggregated, PromptTokens: 8, BlockSize: 4})
		}
	}
	if err := nc.Publish("switchyard.test.d.evil", msg); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{a, b} {
		testkit.Eventually(t, n.rep.self+" hears the forged bookings", func() bool {
			return counterValue(t, n.reg, "switchyard_cluster_records_received_total") >= 3*capacity
		})
	}
	// Three replicas heard (a, b, evil): each keeps ceil(40/3) = 14 of
	// each worker, the others' bookings count up to 26 of it.
	for _, n := range []*node{a, b} {
		if got := testutil.ToFloat64(n.rep.m.dropped.WithLabelValues("over_share")); got != 3*(capacity-26) {
			t.Errorf("%s dropped %v forged bookings past the bound, want %d", n.rep.self, got, 3*(capacity-26))
		}
		if got := n.active(); got["w0"] != 26 || got["w1"] != 26 || got["w2"] != 26 {
			t.Errorf("%s counts %v in flight, want 26 on each worker", n.rep.self, got)
		}
	}
	for i, n := range []*node{a, b} {
		h := admitPrompt(t, n, fmt.Sprintf("real-%d", i), 5000+uint64(i)*100)
		if h.Queued() {
			t.Fatalf("%s queued its request behind the forged bookings (active %v)", n.rep.self, n.active())
		}
		h.End(admission.Completed(1))
	}
}

// TestNATSPasswordNotLogged: a NATS URL with a user and password
// (nats://user:password@host) connects, and the password appears in no
// log line.
func TestNATSPasswordNotLogged(t *testing.T) {
	s := natskit.StartWith(t, 0, func(o *server.Options) {
		o.Users = []*server.User{{Username: "router", Password: "s3cret-pw"}}
	})
	url := strings.Replace(s.ClientURL(), "nats://", "nats://router:s3cret-pw@", 1)
	var logs logBuffer
	a := startNodeOpts(t, url, "a", 1, 1, nodeOpts{logger: logs.logger(), cfg: func(c *config.Cluster) { c.WarmTimeout = 0 }})
	testkit.Eventually(t, "a connects", a.rep.Connected)
	testkit.Eventually(t, "the connection logged", func() bool { return strings.Contains(logs.String(), "connected to NATS") })
	a.stop(t)
	if out := logs.String(); strings.Contains(out, "s3cret-pw") {
		t.Fatalf("the password is in the log:\n%s", out)
	}
}

// TestNATSAsyncErrorsLogged: NATS's asynchronous errors on a replica's
// connection (here the server refusing its heartbeats: a user without
// permission to publish them) reach the replica's logger, one line per
// cause per interval however many there are, instead of nats.go's own
// lines on stderr.
func TestNATSAsyncErrorsLogged(t *testing.T) {
	s := natskit.StartWith(t, 0, func(o *server.Options) {
		o.Users = []*server.User{{Username: "router", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"switchyard.test.hb.>"}}}}}
	})
	url := strings.Replace(s.ClientURL(), "nats://", "nats://router:pw@", 1)
	var logs logBuffer
	start := time.Now()
	a := startNodeOpts(t, url, "a", 1, 1, nodeOpts{logger: logs.logger()})
	testkit.Eventually(t, "a connects", a.rep.Connected)
	testkit.Eventually(t, "the refused heartbeats logged", func() bool {
		return strings.Contains(logs.String(), "Permissions Violation")
	})
	time.Sleep(time.Second) // ten more heartbeats refused
	a.stop(t)
	elapsed := time.Since(start)
	lines := strings.Count(logs.String(), "Permissions Violation")
	if most := 1 + int(elapsed/(10*time.Second)); lines > most {
		t.Errorf("%d lines for the refused heartbeats in %v, want at most %d:\n%s", lines, elapsed, most, logs.String())
	}
}

// writeFile writes data to a file of the test's temporary directory and
// returns its path.
func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testPKI is a CA and a server and a client certificate it signed, as PEM
// files.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	pemOf := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("EC PRIVATE KEY", b)
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "switchyard test CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("CERTIFICATE", der), keyPEM(k)
	}
	sc, sk := leaf(2, x509.ExtKeyUsageServerAuth)
	cc, ck := leaf(3, x509.ExtKeyUsageClientAuth)
	return testPKI{ca: writeFile(t, "ca.pem", pemOf("CERTIFICATE", caDER)), serverCert: writeFile(t, "server.pem", sc), serverKey: writeFile(t, "server-key.pem", sk),
		clientCert: writeFile(t, "client.pem", cc), clientKey: writeFile(t, "client-key.pem", ck)}
}

// operatorCreds configures o in operator mode (an operator, a system
// account, an account with JetStream) and returns a .creds file of a
// user of the account.
func operatorCreds(t testing.TB, o *server.Options) []byte {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, err := okp.PublicKey()
	must(err)
	account := func(js bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, err := kp.PublicKey()
		must(err)
		ac := jwt.NewAccountClaims(pub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := ac.Encode(okp)
		must(err)
		return kp, pub, tok
	}
	_, spub, sjwt := account(false)
	akp, apub, ajwt := account(true)
	oc := jwt.NewOperatorClaims(opub)
	oc.SystemAccount = spub
	resolver := &server.MemAccResolver{}
	must(resolver.Store(spub, sjwt))
	must(resolver.Store(apub, ajwt))
	o.TrustedOperators, o.AccountResolver, o.SystemAccount = []*jwt.OperatorClaims{oc}, resolver, spub
	ukp, err := nkeys.CreateUser()
	must(err)
	upub, err := ukp.PublicKey()
	must(err)
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	must(err)
	seed, err := ukp.Seed()
	must(err)
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	must(err)
	return creds
}

// TestNATSCredentials: a replica connects to NATS servers that require a
// token (token, token_file), an nkey, a user JWT (a .creds file), or TLS
// with a CA of their own and a client certificate, and shares bookings
// through each; with the wrong credentials or CA its Run fails with an
// error saying why. No secret (token, seed, password) is in its log.
func TestNATSCredentials(t *testing.T) {
	userKP, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	userPub, _ := userKP.PublicKey()
	userSeed, _ := userKP.Seed()
	otherKP, _ := nkeys.CreateUser()
	otherSeed, _ := otherKP.Seed()
	pki, otherPKI := newTestPKI(t), newTestPKI(t)
	var creds []byte
	otherCreds := operatorCreds(t, &server.Options{}) // of another operator
	const token = "t0ken-s3cret"
	for _, tt := range []struct {
		name      string
		server    func(*server.Options)
		good, bad func(*config.Cluster)
		wantErr   string
		secrets   []string
	}{
		{name: "token", server: func(o *server.Options) { o.Authorization = token },
			good: func(c *config.Cluster) { c.Token = token }, bad: func(c *config.Cluster) { c.Token = "wrong" },
			wantErr: "authorization violation", secrets: []string{token}},
		{name: "token_file", server: func(o *server.Options) { o.Authorization = token },
			good:    func(c *config.Cluster) { c.TokenFile = writeFile(t, "token", []byte(token+"\n")) },
			bad:     func(c *config.Cluster) { c.TokenFile = writeFile(t, "token", []byte("wrong")) },
			wantErr: "authorization violation", secrets: []string{token}},
		{name: "nkey", server: func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: userPub}} },
			good:    func(c *config.Cluster) { c.NKey = writeFile(t, "user.nk", userSeed) },
			bad:     func(c *config.Cluster) { c.NKey = writeFile(t, "user.nk", otherSeed) },
			wantErr: "authorization violation", secrets: []string{string(userSeed)}},
		{name: "credentials", server: func(o *server.Options) { creds = operatorCreds(t, o) },
			good:    func(c *config.Cluster) { c.Credentials = writeFile(t, "user.creds", creds) },
			bad:     func(c *config.Cluster) { c.Credentials = writeFile(t, "user.creds", otherCreds) },
			wantErr: "authorization violation", secrets: []string{"SUA"}},
		{name: "tls", server: func(o *server.Options) {
			tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey, CaFile: pki.ca, Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = tc, true, true, 5
		},
			good: func(c *config.Cluster) {
				c.TLS = &config.ClusterTLS{CAFile: pki.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey}
			},
			bad: func(c *config.Cluster) {
				c.TLS = &config.ClusterTLS{CAFile: otherPKI.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey}
			},
			wantErr: "certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := natskit.StartWith(t, 0, tt.server)
			url := s.ClientURL()
			var logs logBuffer
			a := startNodeOpts(t, url, "a", 3, 1, nodeOpts{logger: logs.logger(), cfg: tt.good})
			b := startNodeOpts(t, url, "b", 3, 101, nodeOpts{logger: logs.logger(), cfg: tt.good})
			joined(t, a, b)
			a.stop(t)
			b.stop(t)

			c := config.Cluster{NATS: url, Replica: "c", Name: "test", Heartbeat: 100 * time.Millisecond, BookingTTL: 5 * time.Second}
			tt.bad(&c)
			rep, err := New(Options{Config: c, Router: a.r, Logger: logs.logger(), Resolve: func(string) (shared.WorkerID, bool) { return 0, false }})
			if err != nil {
				t.Fatal(err)
			}
			err = rep.Run(context.Background())
			t.Logf("Run with the wrong %s: %v", tt.name, err)
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), tt.wantErr) {
				t.Errorf("Run with the wrong %s: %v, want an error saying %q", tt.name, err, tt.wantErr)
			}
			out := logs.String() + fmt.Sprint(err)
			for _, secret := range tt.secrets {
				if strings.Contains(out, secret) {
					t.Errorf("the secret %q is in the log or the error:\n%s", secret, out)
				}
			}
		})
	}
}

// replicaPermissions are the subject permissions docs/replicas.md
// ("Security") gives a replica (and a `router kv-relay`) of cluster name:
// the same lists, in the nats-server config's terms.
func replicaPermissions(name string) *server.Permissions {
	var pub []string
	pub = append(pub, "switchyard."+name+".>", "$KV."+name+"-leases.>", "$KV."+name+"-sessions.>", "$O."+name+"-index.>",
		"$JS.API.INFO", "$JS.FC.>")
	for _, s := range []string{name + "-deltas", name + "-kv", "KV_" + name + "-leases", "KV_" + name + "-sessions", "OBJ_" + name + "-index"} {
		pub = append(pub, "$JS.API.STREAM.*."+s, "$JS.API.STREAM.MSG.GET."+s, "$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>",
			"$JS.API.CONSUMER.*."+s, "$JS.API.CONSUMER.*."+s+".>", "$JS.API.CONSUMER.MSG.NEXT."+s+".*")
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{"switchyard." + name + ".>", "_INBOX.>"}},
	}
}

// TestReplicaPermissions: replicas whose NATS user may use only the
// subjects docs/replicas.md lists share bookings, relay and follow an
// engine's KV events, write and load the prefix-index snapshot and share
// session bindings, and NATS refuses them nothing.
func TestReplicaPermissions(t *testing.T) {
	s := natskit.StartWith(t, 0, func(o *server.Options) {
		o.Users = []*server.User{{Username: "router", Password: "pw", Permissions: replicaPermissions("test")}}
	})
	url := strings.Replace(s.ClientURL(), "nats://", "nats://router:pw@", 1)
	var logs logBuffer
	cfg := func(c *config.Cluster) { c.SnapshotInterval = 200 * time.Millisecond }
	e := startEngine(t)
	a := startNodeOpts(t, url, "a", 3, 1, nodeOpts{logger: logs.logger(), cfg: cfg})
	b := startNodeOpts(t, url, "b", 3, 101, nodeOpts{logger: logs.logger(), cfg: cfg})
	joined(t, a, b)
	pa, pb := followW0(a), followW0(b)
	a.rep.RelayKV(RelayTarget{Worker: "w0", KVEvents: e.kvEvents()})
	relaying(t, e, a)
	holdsAll(t, "both indexes follow the relay", e, pa, pb)
	testkit.Eventually(t, "a snapshot written", func() bool {
		return counterValue(t, a.reg, "switchyard_cluster_index_snapshot_writes_total")+counterValue(t, b.reg, "switchyard_cluster_index_snapshot_writes_total") > 0
	})
	c := startNodeOpts(t, url, "c", 3, 201, nodeOpts{logger: logs.logger(), cfg: cfg})
	testkit.Eventually(t, "c loads the snapshot", func() bool { return c.rep.State().Snapshot != nil })

	withLog := func(o *SessionsOptions) { o.Config.NATS, o.Logger = url, logs.logger() }
	sa := startSessions(t, url, "a", 1, []string{"w0", "w1", "w2"}, withLog)
	sb := startSessions(t, url, "b", 101, []string{"w0", "w1", "w2"}, withLog)
	bindUntilSeen(t, sa, "conv-1", "w1", time.Unix(1_700_000_000, 0), sa, sb)

	if out := logs.String(); strings.Contains(out, "Permissions Violation") || strings.Contains(out, "retrying") {
		t.Errorf("NATS refused the replicas something:\n%s", out)
	}
}
