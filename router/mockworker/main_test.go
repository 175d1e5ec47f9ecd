package mockworker

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no engine, handler or connection goroutine outlives
// the tests. go-zeromq/zmq4 v0.17.0 never stops a PUB socket's writer
// goroutine (socket.Close does not close pubMWriter): one per KV events
// rank, ignored here.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
