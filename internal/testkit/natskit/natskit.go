// Package natskit runs NATS servers with JetStream inside a test's
// process, for the tests of router replicas (router/cluster and the
// daemons and commands that use it), from the nats-server module.
package natskit

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a NATS server with JetStream on 127.0.0.1:port (0: a free
// port) until the test ends, storing in a temporary directory of the
// test, and returns it once it accepts connections (ClientURL is its
// URL). It fails the test when the server does not start within 30 s.
//
// JetStream may use 1 GiB of memory, set explicitly: NATS otherwise sizes
// it from GOMEMLIMIT, which a replay test earlier in the same process may
// have set to 256 MiB, too little for the replicas' streams and buckets.
// A server stopped by the test (Shutdown) can be started again on its
// port with another Start.
func Start(t testing.TB, port int) *server.Server {
	t.Helper()
	return StartWith(t, port, nil)
}

// StartWith is Start with configure, when not nil, called on the
// server's options before the server is made: to add users, tokens,
// nkeys, accounts or TLS (docs/replicas.md, "Security").
func StartWith(t testing.TB, port int, configure func(*server.Options)) *server.Server {
	t.Helper()
	if port == 0 {
		port = -1
	}
	o := &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, JetStreamMaxMemory: 1 << 30,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	if configure != nil {
		configure(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("the NATS server did not accept connections within 30 s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
