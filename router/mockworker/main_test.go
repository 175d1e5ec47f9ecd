package mockworker

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no engine, handler or connection goroutine outlives
// the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
